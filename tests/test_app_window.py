"""The main window driven by real key presses, checked against a headless engine run."""

from __future__ import annotations

import os
import sys
import threading
import time

import numpy as np
import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox

from kvviz.app.grid_view import COMPUTED, EMPTY, PENDING, REUSED
from kvviz.app.main_window import MainWindow
from kvviz.app.run_info import chip_text
from kvviz.app.settings import app_settings

PROMPT = "Time flies fast"  # 3 GPT-2 tokens
N = 12


@pytest.fixture
def window(qtbot, app_model):
    win = MainWindow(app_model, PROMPT, settings=app_settings())
    qtbot.addWidget(win)
    win.show()
    qtbot.waitUntil(lambda: win.run_info is not None, timeout=60_000)
    yield win
    win.close()


def engine_run(app_model, prompt: str, n: int, use_cache: bool = True):
    from kvviz.engine import Engine, generate_ids
    from kvviz.weights import load_model

    engine = Engine(load_model(app_model).model)
    return generate_ids(engine, engine.encode_prompt(prompt), n, use_cache)


def press(qtbot, win, key, times: int = 1) -> None:
    for _ in range(times):
        qtbot.keyClick(win, key)


def wait_tokens(qtbot, win, n: int, final: bool = False) -> None:
    def done() -> bool:
        rec = win.last_record
        return rec is not None and rec.new_tokens == n and (rec.final or not final)

    qtbot.waitUntil(done, timeout=60_000)
    win.redraw()


def test_prompt_has_three_tokens():
    from kvviz.tokenizer import get_tokenizer

    assert len(get_tokenizer().encode(PROMPT)) == 3


def test_space_steps_match_engine(qtbot, window, app_model):
    assert window.run_info.prompt_tokens == 3 and window.run_info.budget == N
    states = window.grid.cell_states()
    assert (states[:, :3] == PENDING).all() and (states[:, 3:] == EMPTY).all()

    press(qtbot, window, Qt.Key.Key_Space)
    wait_tokens(qtbot, window, 1)
    window.redraw()
    frame_at_step_1 = window.chart.work_plot.getViewBox().viewRange()
    press(qtbot, window, Qt.Key.Key_Space, 4)
    wait_tokens(qtbot, window, 5)
    states = window.grid.cell_states()
    # Step 5 fed position 6 (token 4) only: computed; 0..5 reused; 7 holds token 5, no K/V yet.
    assert (states[:, :6] == REUSED).all()
    assert (states[:, 6] == COMPUTED).all()
    assert (states[:, 7] == PENDING).all() and (states[:, 8:] == EMPTY).all()
    assert "reused 4 times since" in window.grid.cell_info(0, 2)

    press(qtbot, window, Qt.Key.Key_Right, 4)
    press(qtbot, window, Qt.Key.Key_PageDown, 3)
    wait_tokens(qtbot, window, N, final=True)
    values = window.counter.values()
    assert (values["with_cache"], values["without_cache"], values["avoided"]) == (15, 102, 87)
    assert values["ratio"] == pytest.approx(6.8)
    assert values["with_cache_all_layers"] == 15 * window.run_info.n_layer
    assert window.counter._per_layer["without_cache"].text().replace("\u2009", "") == "102"

    ids, records = engine_run(app_model, PROMPT, N)
    from kvviz.tokenizer import get_tokenizer

    labels = [get_tokenizer().token_label(i) for i in ids]
    assert window.token_strip.tokens()[3:] == [chip_text(lab) for lab in labels]
    assert window.token_strip.newest_index == 3 + N - 1
    data = window.chart.curve_data()
    assert data["with_cache"][1].tolist() == [r.with_cache_total for r in records]
    assert data["without_cache"][1].tolist() == [r.without_cache_total for r in records]
    assert data["with_cache"][0].tolist() == list(range(1, N + 2))
    assert len(data["ms_per_step"][1]) == N + 1 and (data["ms_per_step"][1] > 0).all()
    assert data["cache_mib"][1][-1] == pytest.approx(records[-1].cache_bytes / 2**20)
    # The frame was fixed when the run started (to the run's whole budget: 102 without cache at
    # step 12) and did not move while the curves grew into it, so the axes never repainted mid-run.
    (x_low, x_high), (y_low, y_high) = window.chart.work_plot.getViewBox().viewRange()
    assert x_low < 1 and N + 1 <= x_high < N + 2
    assert y_low < 0 < 102 <= y_high < 102 * 1.2
    assert window.chart.work_plot.getViewBox().viewRange() == frame_at_step_1
    states = window.grid.cell_states()
    # The final pass fills the cache with the last token: computed; everything before reused.
    assert (states[:, :14] == REUSED).all() and (states[:, 14] == COMPUTED).all()
    qtbot.waitUntil(lambda: not window.step_button.isEnabled(), timeout=5_000)  # run_finished follows the record
    press(qtbot, window, Qt.Key.Key_Space)  # past the end: nothing happens
    qtbot.wait(100)
    assert window.last_record.step == N


def test_cache_off_recomputes_every_cell(qtbot, window, app_model):
    press(qtbot, window, Qt.Key.Key_Space, 5)
    wait_tokens(qtbot, window, 5)
    press(qtbot, window, Qt.Key.Key_C)  # cache off: a fresh run replayed to the same step
    qtbot.waitUntil(lambda: window.run_info is not None and not window.run_info.use_cache, timeout=10_000)
    wait_tokens(qtbot, window, 5)
    states = window.grid.cell_states()
    assert (states[:, :7] == COMPUTED).all(), "without cache every existing K/V is recomputed"
    assert (states[:, 7] == PENDING).all() and (states[:, 8:] == EMPTY).all()
    assert not (states == REUSED).any()
    values = window.counter.values()
    # "with cache" is what a cached run has computed by step 5: every token but the newest
    assert (values["without_cache"], values["with_cache"]) == (3 + 4 + 5 + 6 + 7, 3 + 5 - 1)

    press(qtbot, window, Qt.Key.Key_Space, N - 5)
    wait_tokens(qtbot, window, N, final=True)
    values = window.counter.values()
    assert (values["with_cache"], values["without_cache"]) == (15, 102)
    ids_cached, _ = engine_run(app_model, PROMPT, N, use_cache=True)
    assert window.token_strip.tokens()[3:] == [chip_text(t) for t in _labels(ids_cached)]
    assert window.chart.curve_data()["without_cache"][1].tolist()[-1] == 102


def _labels(ids):
    from kvviz.tokenizer import get_tokenizer

    return [get_tokenizer().token_label(i) for i in ids]


def test_timer_redraws_draw_the_chart_in_a_later_slice(qtbot, window):
    press(qtbot, window, Qt.Key.Key_Space, 3)
    qtbot.waitUntil(lambda: window.last_record is not None and window.last_record.new_tokens == 3, timeout=60_000)
    steps = window.last_record.step + 1
    # no explicit redraw(): the coalescing timer draws the grid first, then the chart in a later pass
    def drawn_steps() -> int:
        x, _y = window.chart.with_curve.getData()
        return 0 if x is None else len(x)

    qtbot.waitUntil(lambda: drawn_steps() == steps and not window._redraw_pending, timeout=10_000)
    assert window.chart.with_curve.getData()[1][-1] == window.last_record.with_cache_total
    assert window.grid.cell_states()[0, : window.last_record.sequence_length].tolist().count(EMPTY) == 0
    assert window.max_redraw_ms > 0


def test_full_speed_run_shows_its_final_state_when_it_ends(qtbot, window):
    """At full speed the views take records in bursts, about once a second; the end of a run draws at once."""
    window.speed_slider.setValue(window.speed_slider.maximum())
    with qtbot.waitSignal(window.run_done, timeout=60_000) as finished:
        press(qtbot, window, Qt.Key.Key_P)
    final = finished.args[0]
    assert not window._pending_records
    x, y = window.chart.with_curve.getData()
    assert len(x) == final.step + 1 and y[-1] == final.with_cache_total
    assert window.counter.values()["without_cache"] == final.without_cache_total
    assert len(window.token_strip.tokens()) == final.sequence_length


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread priorities are a Linux feature")
def test_worker_runs_below_the_gui_priority(window):
    from kvviz.app.worker import WORKER_NICENESS

    worker_id = window.controller.worker.native_thread_id
    assert worker_id is not None and worker_id != threading.get_native_id()
    expected = min(19, os.getpriority(os.PRIO_PROCESS, os.getpid()) + WORKER_NICENESS)
    assert os.getpriority(os.PRIO_PROCESS, worker_id) == expected
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == os.getpriority(os.PRIO_PROCESS, os.getpid())


def test_gui_and_worker_hand_the_gil_over_quickly(window):
    from kvviz.app.worker import GIL_SWITCH_INTERVAL_S

    assert sys.getswitchinterval() <= GIL_SWITCH_INTERVAL_S < 0.005  # Python's default is 5 ms


def test_keys_typed_in_prompt_do_not_step(qtbot, window):
    window.prompt_edit.setFocus()
    qtbot.waitUntil(window.prompt_edit.hasFocus)
    window.prompt_edit.clear()
    qtbot.keyClicks(window.prompt_edit, "Pp Rr Cc [] ")
    qtbot.keyClick(window.prompt_edit, Qt.Key.Key_Right)
    qtbot.wait(200)
    assert window.prompt_edit.text() == "Pp Rr Cc [] "
    assert window.last_record is None and window.run_info.use_cache
    window.prompt_edit.setText("Time flies fast")
    with qtbot.waitSignal(window.run_prepared, timeout=10_000):
        qtbot.keyClick(window.prompt_edit, Qt.Key.Key_Return)
    assert not window.prompt_edit.hasFocus()
    press(qtbot, window, Qt.Key.Key_Space)
    wait_tokens(qtbot, window, 1)


def test_close_during_autoplay_stops_the_thread(qtbot, app_model):
    win = MainWindow(app_model, PROMPT, settings=app_settings())
    qtbot.addWidget(win)
    win.show()
    qtbot.waitUntil(lambda: win.run_info is not None, timeout=60_000)
    win.max_new_spin.setValue(60)
    qtbot.waitUntil(lambda: win.run_info is not None and win.run_info.max_new_tokens == 60, timeout=10_000)
    win.speed_slider.setValue(win.speed_slider.maximum())
    press(qtbot, win, Qt.Key.Key_P)
    qtbot.waitUntil(lambda: win.last_record is not None and win.last_record.new_tokens >= 2, timeout=30_000)
    assert win.play_button.text() == "Pause"
    thread = win.controller.thread
    started = time.perf_counter()
    win.close()
    assert time.perf_counter() - started < 1.0
    assert thread.isFinished()


def test_bad_checkpoint_keeps_previous_model(qtbot, window, tmp_path, monkeypatch):
    bad = tmp_path / "broken"
    bad.mkdir()
    (bad / "model.safetensors").write_bytes(b"this is not a safetensors file")
    messages: list[str] = []
    monkeypatch.setattr(QMessageBox, "critical", lambda parent, title, text, *a, **k: messages.append(text))
    before = window.model_info
    window.load_model(str(bad))
    qtbot.waitUntil(lambda: bool(messages), timeout=30_000)
    assert len(messages) == 1
    assert "broken" in messages[0] and messages[0].count(". ") == 0 and "\n" not in messages[0]
    assert window.model_info == before
    assert window.model_combo.currentData() == window._source
    press(qtbot, window, Qt.Key.Key_Space)
    wait_tokens(qtbot, window, 1)


def test_context_full_is_shown(qtbot, window):
    n_ctx = window.model_info.n_ctx
    window.prompt_edit.setText(" x" * (n_ctx - 4))
    window.max_new_spin.setValue(50)
    with qtbot.waitSignal(window.run_prepared, timeout=10_000):
        window.reset_run()
    assert window.run_info.budget == 4
    with qtbot.waitSignal(window.run_done, timeout=60_000):  # the banner follows the final record
        press(qtbot, window, Qt.Key.Key_Space, 4)
    window.redraw()
    assert window.last_record.final and window.last_record.stop_reason == "context_full"
    assert window.banner.isVisible() and "Context full" in window.banner.text()
    assert "Context full" in window.counter.stop.text()


def test_help_dialogs_and_export_hooks(qtbot, window):
    from kvviz.app.dialogs import ShortcutsDialog, about_text

    dialog = ShortcutsDialog(window.actions_for_help(), window)
    qtbot.addWidget(dialog)
    rows = dict(dialog.rows())
    for name in ("Step (one new token)", "Play / pause", "Reset run", "Export", "Quit", "Presenter mode",
                 "Zoom in", "Zoom out", "Toggle KV cache", "Keyboard shortcuts"):
        assert name in rows, name
    assert "Space" in rows["Step (one new token)"] and "PgDown" in rows["Step (one new token)"]
    about = about_text(window.model_info)
    assert window.model_info.name in about and f"{window.model_info.num_parameters:,}" in about
    assert set(window.export_targets()) == {"chart", "grid", "view"}
    assert PROMPT in window.export_caption() and window.model_info.name in window.export_caption()


def test_presenter_mode_and_zoom(qtbot, window):
    font_before = window.counter._per_layer["with_cache"].font().pointSizeF()
    press(qtbot, window, Qt.Key.Key_F11)
    assert window.presenter_mode and window.menuBar().isHidden() and window.settings_row.isHidden()
    assert window.counter._per_layer["with_cache"].font().pointSizeF() > font_before
    press(qtbot, window, Qt.Key.Key_Space)  # stepping still works without the menu bar
    wait_tokens(qtbot, window, 1)
    press(qtbot, window, Qt.Key.Key_Escape)
    assert not window.presenter_mode and not window.menuBar().isHidden()
    qtbot.keyClick(window, Qt.Key.Key_Equal, Qt.KeyboardModifier.ControlModifier)
    assert window._zoom > 1.0
    qtbot.keyClick(window, Qt.Key.Key_Minus, Qt.KeyboardModifier.ControlModifier)
    assert window._zoom == pytest.approx(1.0)


def test_settings_are_remembered(qtbot, app_model, _isolated_qt_settings):
    first = MainWindow(app_model, "Once upon a", settings=app_settings())
    qtbot.addWidget(first)
    first.show()
    qtbot.waitUntil(lambda: first.run_info is not None, timeout=60_000)
    first.cache_check.setChecked(False)
    first.max_new_spin.setValue(7)
    first.colour_blind_action.setChecked(True)
    first.close()
    assert any(_isolated_qt_settings.rglob("*.ini"))
    second = MainWindow(app_model, None, settings=app_settings())
    qtbot.addWidget(second)
    assert second.prompt_edit.text() == "Once upon a"
    assert not second.cache_check.isChecked() and second.max_new_spin.value() == 7
    assert second.colour_blind_action.isChecked()
    second.close()


def test_grid_view_handles_gpt2_xl_size(qtbot):
    """48 layers x 1024 positions: a record applies and redraws in well under a frame."""
    from kvviz.app.grid_view import KVGridView
    from kvviz.app.run_info import RunInfo
    from kvviz.engine import StepRecord

    grid = KVGridView()
    qtbot.addWidget(grid)
    grid.resize(1400, 600)
    grid.show()
    info = RunInfo(0, "x", (1,) * 24, ("x",) * 24, "random:gpt2-xl", 48, 1024, True, 1000, 1000, "greedy")
    grid.reset(info)
    timings = []
    for step in range(40):
        start = 0 if step == 0 else 23 + step
        rec = StepRecord(step, True, 24, start, 24 + step, (1,) * (24 + step - start), (24 + step - start,) * 48,
                         (start,) * 48, 2, "y", (), step + 1, 25 + step, 0.01, 0, 0, 0, 0, 0, 48, False)
        t = time.perf_counter()
        grid.apply_record(rec)
        timings.append(time.perf_counter() - t)
    states = grid.cell_states()
    assert states.shape == (48, 1024)
    assert (states[:, :62] == REUSED).all() and (states[:, 62] == COMPUTED).all()
    assert (states[:, 63] == PENDING).all() and (states[:, 64:] == EMPTY).all()
    assert float(np.median(timings)) < 0.03
    grid.set_colour_blind(True)
    assert grid.cell_states().shape == (48, 1024)
