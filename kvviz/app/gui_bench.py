"""`kvviz bench --gui`: the real main window autoplaying offscreen, next to a headless engine run."""

from __future__ import annotations

import os
import sys
import tempfile
import time

STALL_TIMER_MS = 10  # a timer on the GUI thread; the largest gap between its ticks is the worst stall
WARMUP_TOKENS = 3
POLL_MS = 20


def run_gui_bench(
    model: str | None, prompt: str, new_tokens: int, timeout_s: float = 3600.0, launched_at: float | None = None
) -> dict:
    """Autoplay `new_tokens` tokens at full speed with the cache on in the real MainWindow (offscreen
    unless a display platform is already chosen), then run the same generation headless in this process.

    `window_shown_seconds` counts from `launched_at` (a time.perf_counter() value; `kvviz bench --gui`
    passes the moment its command line module was imported), or else from the start of this call,
    to the window being shown and its first events processed; `torch_loaded_when_shown`
    says whether torch had been imported by then. Token rates count new tokens over the wall time from
    the first step command to the final record (the cache-filling pass included), in both runs.
    """
    started = time.perf_counter() if launched_at is None else launched_at
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    torch_before = "torch" in sys.modules
    from PySide6.QtCore import QElapsedTimer, QEventLoop, QSettings, QTimer
    from PySide6.QtWidgets import QApplication

    from kvviz.app.main_window import SPEEDS, MainWindow

    app = QApplication.instance() or QApplication(sys.argv[:1])
    with tempfile.TemporaryDirectory(prefix="kvviz-bench-") as settings_dir:
        settings = QSettings(os.path.join(settings_dir, "bench.ini"), QSettings.Format.IniFormat)
        window = MainWindow(model, prompt, settings=settings)
        window.show()
        app.processEvents()
        window_shown_seconds = time.perf_counter() - started
        torch_loaded_when_shown = "torch" in sys.modules and not torch_before

        def wait(condition, what: str) -> None:
            """Run the event loop (sleeping when idle, as app.exec() does) until `condition()` holds."""
            deadline = time.perf_counter() + timeout_s
            loop = QEventLoop()
            poll = QTimer()
            poll.setInterval(POLL_MS)
            poll.timeout.connect(lambda: loop.quit() if condition() or time.perf_counter() > deadline else None)
            poll.start()
            if not condition():
                loop.exec()
            poll.stop()
            if not condition():
                raise TimeoutError(f"gui bench: timed out waiting for {what}")

        try:
            wait(lambda: window.model_info is not None or window.banner.property("alert") == "true", "the model")
            if window.model_info is None:
                raise RuntimeError(f"gui bench: {window.banner.text()}")
            window._applying_settings = True
            window.cache_check.setChecked(True)
            window.temperature_spin.setValue(0.0)
            window.max_new_spin.setValue(new_tokens)
            window.speed_slider.setValue(SPEEDS.index(0.0))
            window._applying_settings = False

            def prepared_run(n: int) -> None:
                window.max_new_spin.blockSignals(True)
                window.max_new_spin.setValue(n)
                window.max_new_spin.blockSignals(False)
                window.run_info = None
                window.reset_run()
                wait(lambda: window.run_info is not None or window.banner.isVisible(), "the run")
                if window.run_info is None:
                    raise RuntimeError(f"gui bench: {window.banner.text()}")

            prepared_run(WARMUP_TOKENS)  # first passes allocate; keep them out of both measurements
            window.toggle_play()
            wait(lambda: window._finished, "the warm-up run")
            prepared_run(new_tokens)

            gaps: list[float] = []
            clock = QElapsedTimer()
            stall_timer = QTimer()
            stall_timer.setInterval(STALL_TIMER_MS)

            def tick() -> None:
                gaps.append(clock.nsecsElapsed() / 1e6)
                clock.restart()

            stall_timer.timeout.connect(tick)
            records = []
            window.controller.worker.step_computed.connect(lambda run_id, rec: records.append(rec))
            window.max_redraw_ms = 0.0
            t0 = time.perf_counter()
            clock.start()
            stall_timer.start()
            window.toggle_play()
            wait(lambda: window._finished, "the autoplay run")
            gui_seconds = time.perf_counter() - t0
            stall_timer.stop()
            window.redraw()
            gui_tokens = [r.token_id for r in records if r.token_id is not None and r.use_cache]
            loaded = window.controller.worker.loaded_model
            max_stall_ms = max(gaps[1:], default=0.0)
            stalls_over_50 = sum(1 for g in gaps[1:] if g > 50)
            max_redraw_ms = window.max_redraw_ms
            stop_reason = window.last_record.stop_reason if window.last_record else ""
        finally:
            window.close()
            window.deleteLater()  # while Qt is alive: left to interpreter teardown it can segfault
            app.processEvents()

    from kvviz.engine import Engine, generate_ids

    engine = Engine(loaded.model)
    prompt_ids = engine.encode_prompt(prompt)
    generate_ids(engine, prompt_ids, WARMUP_TOKENS)
    t0 = time.perf_counter()
    headless_tokens, _records = generate_ids(engine, prompt_ids, new_tokens)
    headless_seconds = time.perf_counter() - t0
    generated = len(gui_tokens)
    gui_rate = generated / gui_seconds if gui_seconds > 0 else 0.0
    headless_rate = len(headless_tokens) / headless_seconds if headless_seconds > 0 else 0.0
    return {
        "model": loaded.name,
        "prompt": prompt,
        "prompt_tokens": len(prompt_ids),
        "new_tokens": generated,
        "stop_reason": stop_reason,
        "gui_seconds": round(gui_seconds, 4),
        "headless_seconds": round(headless_seconds, 4),
        "gui_tokens_per_second": round(gui_rate, 3),
        "headless_tokens_per_second": round(headless_rate, 3),
        "ratio": round(gui_rate / headless_rate, 4) if headless_rate else 0.0,
        "max_stall_ms": round(max_stall_ms, 2),
        "stall_timer_ms": STALL_TIMER_MS,
        "max_redraw_ms": round(max_redraw_ms, 2),
        "stalls_over_50ms": stalls_over_50,
        "window_shown_seconds": round(window_shown_seconds, 4),
        "torch_loaded_when_shown": torch_loaded_when_shown,
        "identical": gui_tokens == headless_tokens,
    }


def format_report(result: dict) -> str:
    """The bench result as a few readable lines."""
    return "\n".join([
        f"model {result['model']}, prompt of {result['prompt_tokens']} tokens, {result['new_tokens']} new tokens",
        f"GUI autoplay   {result['gui_tokens_per_second']:.2f} tokens/s",
        f"headless       {result['headless_tokens_per_second']:.2f} tokens/s",
        f"ratio          {result['ratio']:.3f} (GUI / headless)",
        f"max GUI stall  {result['max_stall_ms']:.1f} ms "
        f"(largest gap between ticks of a {result['stall_timer_ms']} ms timer)",
        f"window shown   {result['window_shown_seconds']:.2f} s after start"
        f"{' (torch already imported)' if result['torch_loaded_when_shown'] else ' (before torch was imported)'}",
        f"same tokens    {'yes' if result['identical'] else 'NO'}",
    ])
