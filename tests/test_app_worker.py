"""The worker side: loading states, download cancel, error sentences, and no torch before the window."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from helpers_qt import download_until_cancelled
from PySide6.QtWidgets import QMessageBox

from kvviz.app.assembly import open_window
from kvviz.app.run.worker_failures import describe_load_error
from kvviz.app.settings import app_settings


def test_the_window_is_on_screen_before_torch_is_imported(tmp_path):
    """Importing torch takes seconds: the window shows first (the model loads on the worker thread after)."""
    code = ("import sys\n"
            "from PySide6.QtWidgets import QApplication\n"
            "app = QApplication([])\n"
            "from kvviz.app.assembly import open_window\n"
            "window = open_window(lesson='')\n"
            "window.show()\n"
            "app.processEvents()\n"
            "status = 2 if not window.isVisible() else 1 if 'torch' in sys.modules else 0\n"
            "window.close()\n"
            "sys.exit(status)\n")
    env = {"QT_QPA_PLATFORM": "offscreen", "PATH": "", "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr


def test_error_sentences():
    from kvviz.sources.weights import ModelLoadError

    assert describe_load_error("x", ModelLoadError("x: tensor a is missing")) == "x: tensor a is missing."
    assert describe_load_error("gpt2-xl", MemoryError()) == "Not enough memory to load gpt2-xl; choose a smaller model."
    oom = RuntimeError("[enforce fail] DefaultCPUAllocator: can't allocate memory: you tried to allocate 6 GB")
    assert describe_load_error("gpt2-xl", oom).startswith("Not enough memory")


def test_download_progress_and_cancel_keep_previous_model(qtbot, app_model, monkeypatch):
    import kvviz.sources.weights

    monkeypatch.setattr(kvviz.sources.weights, "download_hub_model", download_until_cancelled(lambda: win))
    errors: list[str] = []
    monkeypatch.setattr(QMessageBox, "critical", lambda parent, title, text, *a, **k: errors.append(text))
    win = open_window(app_model, "Time flies fast", settings=app_settings())
    qtbot.addWidget(win)
    win.show()
    qtbot.waitUntil(lambda: win.session.plan is not None, timeout=60_000)
    before = win.session.model_info
    win.picker.activated.emit(win.picker.findData("gpt2"))
    bar = win.loading.progress_bar
    qtbot.waitUntil(lambda: bar.isVisible() and bar.maximum() == 1000, timeout=30_000)
    assert win.loading.cancel_button.isVisible() and not win.controls.step_button.isEnabled()
    assert win.banner.isVisible() and "Loading gpt2" in win.banner.text()
    win.loading.cancel_button.click()
    qtbot.waitUntil(lambda: not win.loading.progress_bar.isVisible(), timeout=10_000)
    assert "cancelled" in win.status.text()
    assert win.session.model_info == before and not errors
    assert win.picker.currentData() == win.session.source
    assert win.controls.step_button.isEnabled()
    win.close()


def test_gui_bench_alternates_runs_and_reports_every_key(qtbot, app_model):
    from kvviz.app.gui_bench import format_report, run_gui_bench

    result = run_gui_bench(app_model, "Time flies", 6, repeat=2)
    assert result["repeat"] == 2 and result["new_tokens"] == 6 and result["identical"]
    for key in ("gui_runs_tokens_per_second", "headless_runs_tokens_per_second"):
        assert len(result[key]) == 2 and all(rate > 0 for rate in result[key])
    assert result["gui_tokens_per_second"] == max(result["gui_runs_tokens_per_second"])
    assert result["headless_tokens_per_second"] == max(result["headless_runs_tokens_per_second"])
    assert result["window_shown_seconds"] > 0
    assert 0 < result["max_slice_ms"] <= result["max_redraw_ms"]
    assert "best of" in format_report(result) and "one more GUI run with the probe" in format_report(result)
    from kvviz.app.run.worker import running_threads

    qtbot.waitUntil(lambda: not running_threads(), timeout=5_000)


def test_gui_bench_measures_a_stall_of_the_event_loop(qtbot, app_model, monkeypatch):
    """A redraw that blocks the GUI thread for 60 ms: the probe timer fires that much late (the stall), and
    the gap between its ticks counts its own interval on top."""
    from kvviz.app.gui_bench import run_gui_bench
    from kvviz.app.run.redraw import RedrawScheduler

    start_redraw = RedrawScheduler._start_sliced_redraw

    def blocking_redraw(self) -> None:
        time.sleep(0.060)
        start_redraw(self)

    monkeypatch.setattr(RedrawScheduler, "_start_sliced_redraw", blocking_redraw)
    result = run_gui_bench(app_model, "Time flies", 6, repeat=1)
    assert 50 <= result["max_stall_ms"] < 1000 and result["stalls_over_50ms"] >= 1
    assert result["max_tick_gap_ms"] >= result["max_stall_ms"] + 0.9 * result["stall_timer_ms"]
    from kvviz.app.run.worker import running_threads

    qtbot.waitUntil(lambda: not running_threads(), timeout=5_000)


def test_gui_bench_fails_when_the_window_cannot_run_at_the_size_asked_for(qtbot, app_model):
    """The tests' offscreen screen is 800x800, and the window shrinks to fit its screen a moment after it is
    shown: a run "at 1920x1080" would be timed in a 796x796 window. It is an error, not a figure."""
    from kvviz.app.gui_bench import GuiBenchError, run_gui_bench

    with pytest.raises(GuiBenchError, match=r"not at the 1920x1080 asked for: the screen is smaller"):
        run_gui_bench(app_model, "Time flies", 2, repeat=1, window_size=(1920, 1080))
    from kvviz.app.run.worker import running_threads

    qtbot.waitUntil(lambda: not running_threads(), timeout=5_000)


def test_gui_bench_makes_its_offscreen_screen_hold_the_window(tmp_path, app_model):
    """Run as `kvviz bench --gui` is, in a process of its own: the window is timed at the size asked for."""
    import json

    env = {k: v for k, v in os.environ.items() if k != "QT_QPA_PLATFORM"}
    env["XDG_CONFIG_HOME"] = str(tmp_path)
    done = subprocess.run([sys.executable, "-m", "kvviz", "bench", "--gui", "--window-size", "1920x1080",
                           "--prompt", "Time flies", "--new-tokens", "2", "--repeat", "1", "--json",
                           *(["--model", app_model] if app_model else [])],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["window_size"] == [1920, 1080]


def test_abort_reaches_inside_a_forward_pass(qtbot, app_model):
    """Closing sets the worker's abort flag; the model checks it before every block, so a pass stops
    mid-way: here the flag is set at layer 2 of a decode step, and the layers after it never run."""
    win = open_window(app_model, "Time flies", settings=app_settings())
    qtbot.addWidget(win)
    win.show()
    session = win.session
    qtbot.waitUntil(lambda: session.plan is not None, timeout=60_000)
    with qtbot.waitSignal(session.record_computed, timeout=30_000):
        session.step()  # the prefill
    worker = session.controller.worker
    engine = worker.engine
    worker_hook = engine.before_block
    entered: list[int] = []

    def abort_at_layer_2(layer: int) -> None:
        entered.append(layer)
        if layer == 2:
            worker.abort.set()  # as closing the window does, from the middle of the pass
        worker_hook(layer)

    engine.before_block = abort_at_layer_2  # the worker is idle: nothing runs the model now
    with qtbot.assertNotEmitted(session.record_computed, wait=500):
        session.step()  # the decode step: aborted inside the fast decode step
        qtbot.waitUntil(lambda: entered == [0, 1, 2], timeout=30_000)
    assert entered == [0, 1, 2]  # layer 2 and the ones after it never ran
    worker.abort.clear()
    win.close()
    assert engine.before_block is None  # the shut-down worker lets go of the engine


def test_cli_bench_gui_takes_five_turns_by_default(qtbot, app_model, capsys):
    import json

    from kvviz.cli.commands import main

    args = ["bench", "--gui", "--prompt", "Time flies", "--new-tokens", "4", "--json"]
    if app_model is not None:
        args += ["--model", app_model]
    assert main(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["repeat"] == 5 and len(result["gui_runs_tokens_per_second"]) == 5
    assert result["identical"] and result["new_tokens"] == 4
    assert 0 < result["gui_thread_cpu_share"] < 1
    from kvviz.app.run.worker import running_threads

    qtbot.waitUntil(lambda: not running_threads(), timeout=5_000)


def test_cli_bench_gui_with_a_bad_model_says_why_in_one_line(qtbot, tmp_path, capsys, monkeypatch):
    """Unattended: no dialog to wait on (it would hang the run) and no silent switch to the embedded model."""
    from kvviz.cli.commands import main

    dialogs: list[str] = []
    monkeypatch.setattr(QMessageBox, "critical", lambda parent, title, text, *a, **k: dialogs.append(text))
    (tmp_path / "model.safetensors").write_bytes(b"not a checkpoint")
    assert main(["bench", "--gui", "--model", str(tmp_path), "--new-tokens", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "corrupt or truncated" in err[0] and "Traceback" not in err[0]
    assert not dialogs
    from kvviz.app.run.worker import running_threads

    qtbot.waitUntil(lambda: not running_threads(), timeout=5_000)
