"""`kvviz bench --gui`: the real main window autoplaying offscreen, next to a headless engine run."""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator

from kvviz.core.counting import plural

STALL_TIMER_MS = 2  # a probe timer on the GUI thread: how late it fires is how long the event loop was stalled
# (a stall that begins just after the probe fired shows up to STALL_TIMER_MS less: the gap between ticks, up to
# STALL_TIMER_MS more, is the bound from above)
WARMUP_TOKENS = 3
POLL_MS = 20
SLOW_POLL_MS = 500
DEFAULT_WINDOW = (1600, 1000)
SCREEN_MARGIN = 64  # the offscreen screen is this much larger than the window, for its (simulated) frame


class GuiBenchError(Exception):
    """The benchmark could not run: the model did not load, or a run failed (one sentence)."""


def run_gui_bench(
    model: str | None,
    prompt: str,
    new_tokens: int,
    timeout_s: float = 3600.0,
    launched_at: float | None = None,
    repeat: int = 1,
    window_size: tuple[int, int] | None = None,
    compare: bool = False,
    attention: bool = False,
) -> dict:
    """Autoplay `new_tokens` tokens at full speed with the cache on in the real MainWindow (offscreen
    unless a display platform is already chosen), then run the same generation headless in this process.

    `window_shown_seconds` counts from `launched_at` (a time.perf_counter() value; `kvviz bench --gui`
    passes the moment its command line module was imported), or else from the start of this call,
    to the window being shown and its first events processed; `torch_loaded_when_shown`
    says whether torch had been imported by then. Token rates count new tokens over the wall time from
    the first step command to the final record (the cache-filling pass included), in both runs; the
    headless run makes the same records as the window's worker (five candidates a step).

    `window_size` (width, height) sizes the window; by default it takes the screen's size up to 1600x1000.
    Offscreen, the screen is made to hold the window (1600x1000 by default); `window_size` in the result is
    the window's size during the timed runs, and a run at another size than the one asked for is an error.

    With `repeat` > 1 the GUI and headless runs alternate `repeat` times, with the window open; the
    rates are the best of each (as `timeit` takes the best); `paired_median_ratio` is the median of each
    GUI turn's rate over the headless turn right after it, which a machine whose speed drifts between
    turns moves less. The stall is measured in one more GUI run after them (`stall_run_tokens_per_second`):
    its probe wakes the GUI thread every STALL_TIMER_MS (about 2% of a core here), which would slow the runs
    it measures, so the timed runs go without it.

    With `compare`, the window runs in compare mode (the cached and the uncached run in lockstep) and the
    headless run is the same lockstep loop (kvviz.engine.compare.Lockstep); rates count token steps. With
    `attention`, the window has View > Attention open and both runs record the newest query's attention.
    """
    started = time.perf_counter() if launched_at is None else launched_at
    from kvviz.app.export.headless import without_offscreen_chatter

    with _screen_for(window_size or DEFAULT_WINDOW), without_offscreen_chatter():
        return _run_gui_bench(model, prompt, new_tokens, timeout_s, started, repeat, window_size, compare, attention)


@contextlib.contextmanager
def _screen_for(window_size: tuple[int, int]) -> Iterator[None]:
    """Without a running QApplication or a chosen platform: the offscreen platform, with a screen that
    holds a window of `window_size` (its default screen is 800x800, and the window shrinks to fit its
    screen). The environment is put back once the QApplication exists."""
    from PySide6.QtWidgets import QApplication

    platform = os.environ.get("QT_QPA_PLATFORM")
    if QApplication.instance() is not None or platform not in (None, "", "offscreen"):
        yield
        return
    width, height = window_size
    screen = {"name": "kvviz-bench", "x": 0, "y": 0, "width": width + SCREEN_MARGIN,
              "height": height + SCREEN_MARGIN, "logicalDpi": 96, "logicalBaseDpi": 96, "dpr": 1}
    with tempfile.TemporaryDirectory(prefix="kvviz-screen-") as folder:
        config = os.path.join(folder, "offscreen.json")
        with open(config, "w", encoding="utf-8") as file:
            json.dump({"synchronousWindowSystemEvents": False, "windowFrameMargins": True, "screens": [screen]}, file)
        os.environ["QT_QPA_PLATFORM"] = f"offscreen:configfile={config}"
        try:
            QApplication(sys.argv[:1])
        finally:
            if platform is None:
                del os.environ["QT_QPA_PLATFORM"]
            else:
                os.environ["QT_QPA_PLATFORM"] = platform
    yield


def _run_gui_bench(model: str | None, prompt: str, new_tokens: int, timeout_s: float, started: float, repeat: int,
                   window_size: tuple[int, int] | None, compare: bool, attention: bool) -> dict:
    torch_before = "torch" in sys.modules
    from PySide6.QtCore import QEventLoop, QTimer
    from PySide6.QtWidgets import QApplication

    from kvviz.app.assembly import open_window
    from kvviz.app.settings import SettingsFile
    from kvviz.app.window.controls import SPEEDS

    app = QApplication.instance() or QApplication(sys.argv[:1])
    with tempfile.TemporaryDirectory(prefix="kvviz-bench-") as settings_dir:
        settings = SettingsFile(os.path.join(settings_dir, "bench.json"))
        window = open_window(model, prompt, settings=settings, unattended=True)
        if window_size is not None:
            window.resize(*window_size)
        window.show()
        app.processEvents()
        window_shown_seconds = time.perf_counter() - started
        torch_loaded_when_shown = "torch" in sys.modules and not torch_before

        def wait(condition, what: str, signal=None) -> None:
            """Run the event loop (sleeping when idle, as app.exec() does) until `condition()` holds,
            checking it when `signal` fires and on a poll (a slow one when a signal is given, so that
            the poll itself does not wake the GUI thread during a timed run)."""
            deadline = time.perf_counter() + timeout_s
            loop = QEventLoop()

            def check(*_args) -> None:
                if condition() or time.perf_counter() > deadline:
                    loop.quit()

            poll = QTimer()
            poll.setInterval(POLL_MS if signal is None else SLOW_POLL_MS)
            poll.timeout.connect(check)
            poll.start()
            if signal is not None:
                signal.connect(check)
            if not condition():
                loop.exec()
            poll.stop()
            if signal is not None:
                signal.disconnect(check)
            if not condition():
                raise GuiBenchError(f"the GUI benchmark timed out waiting for {what}")

        try:
            session = window.session
            wait(lambda: session.model_info is not None or window.banner.alert, "the model")
            if session.model_info is None:
                raise GuiBenchError(window.banner.text())
            window.controls.set_speed_index(SPEEDS.index(0.0))
            window.actions["attention"].setChecked(attention)

            def prepared_run(n: int) -> None:
                window.controls.set_run_settings(use_cache=True, max_new_tokens=n, temperature=0.0, compare=compare)
                window.reset_run()
                wait(lambda: session.plan is not None or window.banner.isVisible(), "the run")
                if session.plan is None:
                    raise GuiBenchError(window.banner.text())

            prepared_run(WARMUP_TOKENS)  # first passes allocate; keep them out of both measurements
            window.toggle_play()
            wait(lambda: session.finished, "the warm-up run")
            from kvviz.core.records import RunRequest
            from kvviz.engine.engine import Engine
            from kvviz.engine.run import start_run

            loaded = session.controller.worker.loaded_model
            # the same weights, driven from this thread while the worker idles
            headless_engine = Engine(loaded.model, loaded.tokenizer)
            prompt_ids = headless_engine.encode_prompt(prompt)

            def headless_tokens(n: int) -> list[int]:
                """The worker's records (same settings, same candidates per step), with no window in the loop."""
                request = RunRequest(0, prompt, max_new_tokens=n, compare=compare, attention=attention)
                records = list(start_run(headless_engine, request, prompt_ids=prompt_ids).passes())
                return [r.token_id for r in records if r.token_id is not None]

            headless_tokens(WARMUP_TOKENS)

            gui_runs: list[dict] = []
            headless_runs: list[dict] = []
            for _ in range(repeat):
                gui_runs.append(_timed_gui_run(window, wait, prepared_run, new_tokens, probe=False))
                t0 = time.perf_counter()
                tokens = headless_tokens(new_tokens)
                headless_runs.append({"seconds": time.perf_counter() - t0, "tokens": tokens})
            stall_run = _timed_gui_run(window, wait, prepared_run, new_tokens, probe=True)
            run_size = sorted({tuple(run["window_size"]) for run in (*gui_runs, stall_run)})
            if window_size is not None and run_size != [tuple(window_size)]:
                sizes = ", ".join(f"{w}x{h}" for w, h in run_size)
                raise GuiBenchError(f"the window ran at {sizes}, not at the {window_size[0]}x{window_size[1]} asked "
                                    "for: the screen is smaller")
            window.redraw()
            stop_reason = session.last_record.stop_reason if session.last_record else ""
        finally:
            window.close()
            window.deleteLater()  # while Qt is alive: left to interpreter teardown it can segfault
            app.processEvents()

    best_gui = max(gui_runs, key=lambda run: len(run["tokens"]) / run["seconds"])
    best_headless = max(headless_runs, key=lambda run: len(run["tokens"]) / run["seconds"])
    gui_rate = len(best_gui["tokens"]) / best_gui["seconds"] if best_gui["seconds"] > 0 else 0.0
    headless_rate = len(best_headless["tokens"]) / best_headless["seconds"] if best_headless["seconds"] > 0 else 0.0
    reference = headless_runs[0]["tokens"]
    return {
        "model": loaded.name,
        "mode": "compare" if compare else "cached",
        "attention": attention,
        "prompt": prompt,
        "prompt_tokens": len(prompt_ids),
        "new_tokens": len(best_gui["tokens"]),
        "stop_reason": stop_reason,
        "repeat": repeat,
        "gui_seconds": round(best_gui["seconds"], 4),
        "headless_seconds": round(best_headless["seconds"], 4),
        "gui_tokens_per_second": round(gui_rate, 3),
        "headless_tokens_per_second": round(headless_rate, 3),
        "ratio": round(gui_rate / headless_rate, 4) if headless_rate else 0.0,
        "paired_median_ratio": round(_paired_median_ratio(gui_runs, headless_runs), 4),
        "gui_runs_tokens_per_second": [round(len(r["tokens"]) / r["seconds"], 3) for r in gui_runs],
        "headless_runs_tokens_per_second": [round(len(r["tokens"]) / r["seconds"], 3) for r in headless_runs],
        "max_stall_ms": round(stall_run["max_stall_ms"], 2),
        "max_tick_gap_ms": round(stall_run["max_tick_gap_ms"], 2),
        "stall_timer_ms": STALL_TIMER_MS,
        "stalls_over_50ms": stall_run["stalls_over_50ms"],
        "stall_run_tokens_per_second": round(len(stall_run["tokens"]) / stall_run["seconds"], 3),
        "max_redraw_ms": round(max(r["max_redraw_ms"] for r in (*gui_runs, stall_run)), 2),
        "max_slice_ms": round(max(r["max_slice_ms"] for r in (*gui_runs, stall_run)), 2),
        "gui_thread_cpu_share": round(best_gui["gui_thread_cpu_seconds"] / best_gui["seconds"], 4),
        "window_size": list(best_gui["window_size"]),
        "window_shown_seconds": round(window_shown_seconds, 4),
        "torch_loaded_when_shown": torch_loaded_when_shown,
        "identical": all(r["tokens"] == reference for r in (*gui_runs, *headless_runs, stall_run)),
    }


def _timed_gui_run(window, wait, prepared_run, new_tokens: int, probe: bool) -> dict:
    """One autoplay run at full speed in the window, timed. With `probe`, a probe timer runs on the GUI
    thread: each time it fires it is started again, STALL_TIMER_MS ahead, and how late it fires past that
    moment is how long the event loop could not answer (the event-loop delay, as Node's
    monitorEventLoopDelay measures it). The gaps between its ticks are kept too: a gap also counts the
    timer's own interval."""
    from PySide6.QtCore import QElapsedTimer, Qt, QTimer

    prepared_run(new_tokens)
    delays: list[float] = []
    gaps: list[float] = []
    clock = QElapsedTimer()
    stall_timer = QTimer()
    stall_timer.setSingleShot(True)
    stall_timer.setTimerType(Qt.TimerType.PreciseTimer)
    stall_timer.setInterval(STALL_TIMER_MS)
    due = [0.0]

    def tick() -> None:
        now = clock.nsecsElapsed() / 1e6
        delays.append(max(0.0, now - due[0]))
        gaps.append(now - (due[0] - STALL_TIMER_MS))
        due[0] = now + STALL_TIMER_MS
        stall_timer.start()

    stall_timer.timeout.connect(tick)
    records = []
    finished_at: list[float] = []
    session = window.session

    def keep(record) -> None:
        records.append(record)

    def done(_record) -> None:  # emitted on the GUI thread once it has taken the final record
        finished_at.append(time.perf_counter())

    window.run_done.connect(done)

    session.record_computed.connect(keep)
    window.scheduler.max_redraw_ms = window.scheduler.max_slice_ms = 0.0
    t0 = time.perf_counter()
    cpu0 = time.thread_time()
    clock.start()
    due[0] = STALL_TIMER_MS
    if probe:
        stall_timer.start()
    window.toggle_play()
    wait(lambda: bool(finished_at), "the autoplay run", window.run_done)  # run_done comes after `finished`
    gui_cpu_seconds = time.thread_time() - cpu0
    seconds = finished_at[-1] - t0  # to the GUI thread taking the final record, not to the next poll
    stall_timer.stop()
    session.record_computed.disconnect(keep)
    window.run_done.disconnect(done)
    return {
        "seconds": seconds,
        "tokens": [r.token_id for r in records if r.token_id is not None and r.use_cache],
        "max_stall_ms": max(delays, default=0.0),
        "max_tick_gap_ms": max(gaps, default=0.0),
        "stalls_over_50ms": sum(1 for d in delays if d > 50),
        "max_redraw_ms": window.scheduler.max_redraw_ms,
        "max_slice_ms": window.scheduler.max_slice_ms,
        "gui_thread_cpu_seconds": gui_cpu_seconds,
        "window_size": [window.width(), window.height()],  # at the end of the run, not only when shown
    }


def format_report(result: dict) -> str:
    """The bench result as a few readable lines."""
    mode = " (compare mode: cached and uncached in lockstep)" if result.get("mode") == "compare" else ""
    mode += ", attention recorded and shown" if result.get("attention") else ""
    return "\n".join([
        f"model {result['model']}, prompt of {plural(result['prompt_tokens'], 'token')}, "
        f"{plural(result['new_tokens'], 'new token')}{mode}",
        f"GUI autoplay   {result['gui_tokens_per_second']:.2f} tokens/s{_runs(result['gui_runs_tokens_per_second'])}",
        f"headless       {result['headless_tokens_per_second']:.2f} tokens/s"
        f"{_runs(result['headless_runs_tokens_per_second'])}",
        f"ratio          {result['ratio']:.3f} (GUI / headless; turn by turn, the median is "
        f"{result['paired_median_ratio']:.3f})",
        f"max GUI stall  {result['max_stall_ms']:.1f} ms (how late a {result['stall_timer_ms']} ms timer fired at "
        f"worst; largest gap between its ticks {result['max_tick_gap_ms']:.1f} ms), in one more GUI run with the "
        f"probe: {result['stall_run_tokens_per_second']:.2f} tokens/s",
        f"slowest redraw {result['max_redraw_ms']:.1f} ms, slowest slice of it {result['max_slice_ms']:.1f} ms",
        f"GUI thread     {100 * result['gui_thread_cpu_share']:.1f}% of a core during the fastest GUI run",
        f"window shown   {result['window_shown_seconds']:.2f} s after start"
        f"{' (torch already imported)' if result['torch_loaded_when_shown'] else ' (before torch was imported)'}",
        f"same tokens    {'yes' if result['identical'] else 'NO'}",
    ])


def _paired_median_ratio(gui_runs: list[dict], headless_runs: list[dict]) -> float:
    ratios = [(len(g["tokens"]) / g["seconds"]) / (len(h["tokens"]) / h["seconds"])
              for g, h in zip(gui_runs, headless_runs, strict=True) if g["seconds"] > 0 and h["seconds"] > 0]
    return statistics.median(ratios) if ratios else 0.0


def _runs(rates: list[float]) -> str:
    return "" if len(rates) < 2 else f" (best of {', '.join(f'{r:.2f}' for r in rates)})"
