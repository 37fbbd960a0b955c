"""The main window driven by real key presses, checked against a headless engine run."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from helpers_qt import geometries, settle_layouts
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox

from kvviz.app.assembly import open_window
from kvviz.app.settings import app_settings
from kvviz.app.views.grid.cell_states import COMPUTED, EMPTY, PENDING, REUSED
from kvviz.app.views.labels import chip_text

PROMPT = "Time flies fast"  # 3 GPT-2 tokens
N = 12


def engine_run(app_model, prompt: str, n: int, use_cache: bool = True):
    from kvviz.engine.engine import Engine, generate_ids
    from kvviz.sources.weights import load_model

    engine = Engine(load_model(app_model).model)
    return generate_ids(engine, engine.encode_prompt(prompt), n, use_cache)


def press(qtbot, win, key, times: int = 1, modifier=Qt.KeyboardModifier.NoModifier) -> None:
    for _ in range(times):
        qtbot.keyClick(win, key, modifier)


def wait_tokens(qtbot, win, n: int, final: bool = False, redraw: bool = True) -> None:
    def done() -> bool:
        rec = win.session.last_record
        return rec is not None and rec.new_tokens == n and (rec.final or not final)

    qtbot.waitUntil(done, timeout=60_000)
    if redraw:
        win.redraw()


def test_prompt_has_three_tokens():
    from kvviz.core.tokenizer import get_tokenizer

    assert len(get_tokenizer().encode(PROMPT)) == 3


def test_space_steps_match_engine(qtbot, window, app_model):
    assert window.session.plan.prompt_tokens == 3 and window.session.plan.budget == N
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
    assert values["with_cache_all_layers"] == 15 * window.session.plan.n_layer
    assert window.counter.table.labels["without_cache"][1].text().replace("\u2009", "") == "102"

    ids, records = engine_run(app_model, PROMPT, N)
    from kvviz.core.tokenizer import get_tokenizer

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
    # run_finished follows the record
    qtbot.waitUntil(lambda: not window.controls.step_button.isEnabled(), timeout=5_000)
    with qtbot.assertNotEmitted(window.session.controller.worker.computed, wait=300):
        press(qtbot, window, Qt.Key.Key_Space)  # past the end: the worker is not even asked
    assert window.session.last_record.step == N


def test_cache_off_recomputes_every_cell(qtbot, window, app_model):
    press(qtbot, window, Qt.Key.Key_Space, 5)
    wait_tokens(qtbot, window, 5)
    press(qtbot, window, Qt.Key.Key_C)  # cache off: a fresh run replayed to the same step
    qtbot.waitUntil(lambda: window.session.plan is not None and not window.session.plan.use_cache, timeout=10_000)
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
    from kvviz.core.tokenizer import get_tokenizer

    return [get_tokenizer().token_label(i) for i in ids]


def test_timer_redraws_draw_the_chart_in_a_later_slice(qtbot, window):
    press(qtbot, window, Qt.Key.Key_Space, 3)
    wait_tokens(qtbot, window, 3, redraw=False)
    steps = window.session.last_record.step + 1
    # no explicit redraw(): the coalescing timer draws the grid first, then the chart in a later pass
    def drawn_steps() -> int:
        x, _y = window.chart.with_curve.getData()
        return 0 if x is None else len(x)

    qtbot.waitUntil(lambda: drawn_steps() == steps and not window.scheduler.pending, timeout=10_000)
    assert window.chart.with_curve.getData()[1][-1] == window.session.last_record.with_cache_total
    assert window.grid.cell_states()[0, : window.session.last_record.sequence_length].tolist().count(EMPTY) == 0
    assert window.scheduler.max_redraw_ms > 0


def test_full_speed_run_shows_its_final_state_when_it_ends(qtbot, window):
    """At full speed the views take records in bursts, about once a second; the end of a run draws at once."""
    window.controls.speed_slider.setValue(window.controls.speed_slider.maximum())
    with qtbot.waitSignal(window.run_done, timeout=60_000) as finished:
        press(qtbot, window, Qt.Key.Key_P)
    final = finished.args[0]
    assert not window.scheduler.pending
    x, y = window.chart.with_curve.getData()
    assert len(x) == final.step + 1 and y[-1] == final.with_cache_total
    assert window.counter.values()["without_cache"] == final.without_cache_total
    assert len(window.token_strip.tokens()) == final.sequence_length


def test_the_run_plays_on_while_other_programs_keep_every_core_busy(qtbot, window):
    """A video call or a screen recorder beside the lecture: here, a busy process on every core. The run still
    plays to its end in seconds (a worker in Linux's idle scheduling class got a core only when nothing else wanted
    one, and took minutes)."""
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        window.controls.speed_slider.setValue(window.controls.speed_slider.maximum())
        with qtbot.waitSignal(window.run_done, timeout=30_000):
            press(qtbot, window, Qt.Key.Key_P)
    finally:
        for process in busy:
            process.kill()
            process.wait()


def test_steps_of_a_run_move_nothing_around_the_views(qtbot, window):
    """New numbers and captions change their labels only: nothing around them moves or changes its size (a
    label that grew resized, and fully repainted, the plots beside it)."""
    press(qtbot, window, Qt.Key.Key_Space)
    wait_tokens(qtbot, window, 1)
    watched = [window, window.centralWidget(), window.run_view, window.run_view.main_splitter,
               window.run_view.bottom_splitter, window.counter, window.grid, window.chart, window.statusBar()]
    window.redraw()
    settle_layouts()
    before = geometries(watched)
    for n in range(2, 12):
        press(qtbot, window, Qt.Key.Key_Space)
        wait_tokens(qtbot, window, n)
        window.redraw()
        settle_layouts()
        assert geometries(watched) == before, n
    assert window.counter.values()["without_cache"] == 11 * 3 + 11 * 10 // 2  # N*P + N(N-1)/2 by hand


def test_keys_typed_in_prompt_do_not_step(qtbot, window):
    window.controls.prompt_edit.setFocus()
    qtbot.waitUntil(window.controls.prompt_edit.hasFocus)
    window.controls.prompt_edit.clear()
    worker = window.session.controller.worker
    with qtbot.assertNotEmitted(worker.computed, wait=300), qtbot.assertNotEmitted(worker.started):
        qtbot.keyClicks(window.controls.prompt_edit, "Pp Rr Cc [] ")
        qtbot.keyClick(window.controls.prompt_edit, Qt.Key.Key_Right)
    assert window.controls.prompt_edit.text() == "Pp Rr Cc [] "
    assert window.session.last_record is None and window.session.plan.use_cache
    window.controls.prompt_edit.setText("Time flies fast")
    with qtbot.waitSignal(window.run_prepared, timeout=10_000):
        qtbot.keyClick(window.controls.prompt_edit, Qt.Key.Key_Return)
    assert not window.controls.prompt_edit.hasFocus()
    press(qtbot, window, Qt.Key.Key_Space)
    wait_tokens(qtbot, window, 1)


def test_close_during_autoplay_stops_the_thread(qtbot, app_model):
    win = open_window(app_model, PROMPT, settings=app_settings())
    qtbot.addWidget(win)
    win.show()
    qtbot.waitUntil(lambda: win.session.plan is not None, timeout=60_000)
    win.controls.max_new_spin.setValue(60)
    qtbot.waitUntil(lambda: win.session.plan is not None and win.session.plan.max_new_tokens == 60, timeout=10_000)
    win.controls.speed_slider.setValue(win.controls.speed_slider.maximum())
    press(qtbot, win, Qt.Key.Key_P)
    qtbot.waitUntil(lambda: win.session.steps_done >= 2, timeout=30_000)
    assert win.controls.play_button.text() == "Pause"
    thread = win.session.controller.thread
    started = time.perf_counter()
    win.close()
    assert time.perf_counter() - started < 1.0
    assert thread.isFinished()


@pytest.mark.parametrize("kind", ["not-safetensors", "llama-yarn-rope"])
def test_bad_checkpoint_keeps_previous_model(qtbot, window, tmp_path, monkeypatch, kind):
    """A file that is no checkpoint, and a Llama folder kvviz cannot run (YaRN's rope scaling): a dialog
    of one sentence naming it, and the model before stays."""
    bad = tmp_path / "broken"
    bad.mkdir()
    if kind == "not-safetensors":
        (bad / "model.safetensors").write_bytes(b"this is not a safetensors file")
    else:
        import torch
        from safetensors.torch import save_file

        save_file({"model.embed_tokens.weight": torch.zeros(4, 4)}, str(bad / "model.safetensors"))
        (bad / "config.json").write_text('{"model_type": "llama", "rope_scaling": {"rope_type": "yarn", '
                                         '"factor": 8.0}, "rope_theta": 500000.0}')
    messages: list[str] = []
    monkeypatch.setattr(QMessageBox, "critical", lambda parent, title, text, *a, **k: messages.append(text))
    before = window.session.model_info
    window.load_model(str(bad))
    qtbot.waitUntil(lambda: bool(messages), timeout=30_000)
    assert len(messages) == 1
    assert "broken" in messages[0] and messages[0].count(". ") == 0 and "\n" not in messages[0]
    assert kind != "llama-yarn-rope" or 'rope_type "yarn" is not supported' in messages[0]
    assert window.session.model_info == before
    assert window.picker.currentData() == window.session.source
    press(qtbot, window, Qt.Key.Key_Space)
    wait_tokens(qtbot, window, 1)


def test_context_full_is_shown(qtbot, window):
    n_ctx = window.session.model_info.n_ctx
    window.controls.prompt_edit.setText(" x" * (n_ctx - 4))
    window.controls.max_new_spin.setValue(50)
    with qtbot.waitSignal(window.run_prepared, timeout=10_000):
        window.reset_run()
    assert window.session.plan.budget == 4
    with qtbot.waitSignal(window.run_done, timeout=60_000):  # the banner follows the final record
        press(qtbot, window, Qt.Key.Key_Space, 4)
    window.redraw()
    assert window.session.last_record.final and window.session.last_record.stop_reason == "context_full"
    assert window.banner.isVisible() and "Context full" in window.banner.text()
    assert window.counter.progress.text().endswith(f"; context full ({n_ctx} positions)")


def test_help_dialogs_and_export_hooks(qtbot, window):
    from kvviz.app.window.dialogs import ShortcutsDialog, about_text

    dialog = ShortcutsDialog(window.actions.values(), window)
    qtbot.addWidget(dialog)
    rows = dict(dialog.rows())
    for name in ("Step (one new token)", "Play / pause", "Reset run", "Export", "Quit", "Presenter mode",
                 "Zoom in", "Zoom out", "Toggle KV cache", "Keyboard shortcuts"):
        assert name in rows, name
    assert "Space" in rows["Step (one new token)"] and "PgDown" in rows["Step (one new token)"]
    about = about_text(window.session.model_info)
    assert window.session.model_info.name in about and f"{window.session.model_info.num_parameters:,}" in about
    assert set(window.export_targets()) == {"chart", "grid", "view"}


def test_export_dialog_gets_the_caption_and_the_step_from_the_run(qtbot, window, monkeypatch):
    import kvviz.app.export.window_export as export  # where File > Export... finds the dialog

    opened = []

    class FakeDialog:
        def __init__(self, targets, caption, parent=None, step=None, **_kwargs):
            opened.append((set(targets), caption, step))

        def exec(self):
            return 0

    monkeypatch.setattr(export, "ExportDialog", FakeDialog)
    window.controls.prompt_edit.setText("the step 5 of a prompt")
    with qtbot.waitSignal(window.run_prepared, timeout=10_000):
        qtbot.keyClick(window.controls.prompt_edit, Qt.Key.Key_Return)
    press(qtbot, window, Qt.Key.Key_Space, 2)
    wait_tokens(qtbot, window, 2)
    press(qtbot, window, Qt.Key.Key_E, modifier=Qt.KeyboardModifier.ControlModifier)
    assert len(opened) == 1
    targets, caption, step = opened[0]
    assert targets == {"chart", "grid", "view"} and step == 2
    assert "the step 5 of a prompt" in caption and window.session.model_info.name in caption
    assert "step 2, 2 new tokens, with KV cache" in caption


def test_presenter_mode_and_zoom(qtbot, window):
    font_before = window.counter.table.labels["with_cache"][1].font().pointSizeF()
    press(qtbot, window, Qt.Key.Key_F11)
    assert window.presentation.presenter and window.menuBar().isHidden()
    assert all(w.isHidden() for w in window.controls.settings_widgets)
    assert window.counter.table.labels["with_cache"][1].font().pointSizeF() > font_before
    press(qtbot, window, Qt.Key.Key_Space)  # stepping still works without the menu bar
    wait_tokens(qtbot, window, 1)
    press(qtbot, window, Qt.Key.Key_Escape)
    assert not window.presentation.presenter and not window.menuBar().isHidden()
    qtbot.keyClick(window, Qt.Key.Key_Equal, Qt.KeyboardModifier.ControlModifier)
    assert window.presentation.zoom > 1.0
    qtbot.keyClick(window, Qt.Key.Key_Minus, Qt.KeyboardModifier.ControlModifier)
    assert window.presentation.zoom == pytest.approx(1.0)


def test_settings_are_remembered(qtbot, app_model, _isolated_qt_settings):
    first = open_window(app_model, "Once upon a", settings=app_settings())
    qtbot.addWidget(first)
    first.show()
    qtbot.waitUntil(lambda: first.session.plan is not None, timeout=60_000)
    first.controls.cache_check.setChecked(False)
    first.controls.max_new_spin.setValue(7)
    first.actions['colour_blind'].setChecked(True)
    first.close()
    assert any(_isolated_qt_settings.rglob("*.json"))
    second = open_window(app_model, None, settings=app_settings())
    qtbot.addWidget(second)
    assert second.controls.prompt_edit.text() == "Once upon a"
    assert not second.controls.cache_check.isChecked() and second.controls.max_new_spin.value() == 7
    assert second.actions['colour_blind'].isChecked()
    second.close()


def test_grid_view_handles_gpt2_xl_size(qtbot):
    """48 layers x 1024 positions: records apply and draw (`kvviz bench --gui` measures the time)."""
    from kvviz.app.views.grid.kv_grid import KVGridView
    from kvviz.core.records import RunPlan, StepRecord

    grid = KVGridView()
    qtbot.addWidget(grid)
    grid.resize(1400, 600)
    grid.show()
    plan = RunPlan(prompt="x", prompt_ids=(1,) * 24, prompt_labels=("x",) * 24, model_name="random:gpt2-xl",
                   n_layer=48, n_ctx=1024, use_cache=True, max_new_tokens=1000, budget=1000, passes=1001,
                   width=1024, final_with_cache=1024, final_without_cache=1000 * 24 + 1000 * 999 // 2,
                   cache_bytes_per_position=2 * 48 * 1600 * 4, stop_reason="context_full", sampling="greedy")
    grid.reset(plan)
    for step in range(40):
        start = 0 if step == 0 else 23 + step
        rec = StepRecord(step, True, 24, start, 24 + step, (1,) * (24 + step - start), (24 + step - start,) * 48,
                         (start,) * 48, 2, "y", (), step + 1, 25 + step, 0.01, 0, 0, 0, 0, 0, 48, False)
        grid.apply([rec])
        grid.refresh()
    states = grid.cell_states()
    assert states.shape == (48, 1024)
    assert (states[:, :62] == REUSED).all() and (states[:, 62] == COMPUTED).all()
    assert (states[:, 63] == PENDING).all() and (states[:, 64:] == EMPTY).all()
    grid.set_colour_blind(True)
    assert grid.cell_states().shape == (48, 1024)


def test_the_first_launch_fills_the_screen(qtbot, app_model, monkeypatch):
    """No geometry remembered: the window takes the whole available screen (it opened at 1600x1000 on a 1920x1080
    screen, leaving a band)."""
    from PySide6.QtCore import QRect
    from PySide6.QtGui import QScreen

    from kvviz.app.settings import app_settings as fresh_settings
    from kvviz.app.window.main_window import MainWindow as Window

    monkeypatch.setattr(QScreen, "availableGeometry", lambda _screen: QRect(0, 0, 1920, 1050))  # a taskbar below
    win = Window(app_model, "Time flies", settings=fresh_settings())
    qtbot.addWidget(win)
    assert (win.width(), win.height()) == (1920, 1050)
    win.close()


def test_the_shortcuts_dialog_fits_a_720p_screen_with_its_close_button(qtbot, app_model, monkeypatch):
    from PySide6.QtCore import QRect
    from PySide6.QtGui import QScreen
    from PySide6.QtWidgets import QDialogButtonBox

    from kvviz.app.settings import app_settings as fresh_settings
    from kvviz.app.window.dialogs import ShortcutsDialog
    from kvviz.app.window.main_window import MainWindow as Window

    monkeypatch.setattr(QScreen, "availableGeometry", lambda _screen: QRect(0, 0, 1280, 690))  # 720p less a bar
    win = Window(app_model, "Time flies", settings=fresh_settings())
    qtbot.addWidget(win)
    dialog = ShortcutsDialog(win.actions.values(), win)
    dialog.show()
    close = dialog.findChild(QDialogButtonBox)
    assert dialog.height() <= 690 - 30  # its title bar too
    assert close.geometry().bottom() <= dialog.height() and close.isVisible()
    dialog.close()
    win.close()
