"""State that changes the numbers is on screen, and one rule for a changed run: the precision in the status
line and beside the model (presenter mode too), the status line up to date after presenter mode, Break the
cache on a key with its late write in the grid, and every change of a run setting (the cache, compare mode,
the precision) replays the new run to the token the old one was at or on its way to."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QWidget

from kvviz.app.views.grid.cell_states import COMPUTED, REUSED, STALE, STATE_NAMES
from kvviz.app.window.dialogs import ShortcutsDialog

P, N = 3, 12  # "Time flies fast": 3 prompt tokens, 12 new ones (the window fixture's run)


def _step_to(qtbot, win, n: int) -> None:
    for _ in range(n - win.session.steps_done):
        win.session.step()
    qtbot.waitUntil(lambda: win.session.steps_done == n and not win.scheduler.pending, timeout=30_000)


def _run_at(qtbot, win, n: int, **plan) -> None:
    """Wait until the current run (with these plan fields) has generated `n` tokens and is drawn."""
    def there() -> bool:
        p = win.session.plan
        return (p is not None and all(getattr(p, k) == v for k, v in plan.items()) and win.session.steps_done == n
                and not win.session.loading and not win.scheduler.pending)
    qtbot.waitUntil(there, timeout=60_000)


def test_the_status_line_is_current_after_presenter_mode(qtbot, window):
    window.presentation.set_presenter(True)  # the status bar is hidden: its line takes records, draws nothing
    _step_to(qtbot, window, 3)
    window.presentation.set_presenter(False)
    assert window.statusBar().isVisible()
    assert "3/12 tokens \u00b7 step 3 took" in window.status.text()  # not "0/12 tokens · ready"


def test_the_precision_is_on_screen_in_the_status_line_and_in_presenter_mode(qtbot, window):
    c = window.controls
    assert "\u00b7 float32 \u00b7" in window.status.text() and c.precision_label.text() == "float32"
    window.actions["dtype_bfloat16"].trigger()
    _run_at(qtbot, window, 0)
    qtbot.waitUntil(lambda: window.session.model_info.dtype == "bfloat16", timeout=60_000)
    assert "\u00b7 bfloat16 \u00b7" in window.status.text() and c.precision_label.text() == "bfloat16"
    window.presentation.set_presenter(True)  # the status bar goes; the precision beside the model stays
    assert not window.statusBar().isVisible() and c.precision_label.isVisibleTo(window)
    window.presentation.set_presenter(False)


def test_a_precision_change_keeps_the_step_as_the_cache_switch_does(qtbot, window):
    _step_to(qtbot, window, 3)
    window.actions["toggle_cache"].trigger()  # C
    _run_at(qtbot, window, 3, use_cache=False)
    window.actions["dtype_bfloat16"].trigger()  # another precision: the same rule
    qtbot.waitUntil(lambda: window.session.model_info.dtype == "bfloat16", timeout=60_000)
    _run_at(qtbot, window, 3, use_cache=False)
    assert window.counter.values()["without_cache"] == 3 + 4 + 5  # the replayed run's count: passes of 3, 4, 5


def test_leaving_compare_mode_during_its_replay_lands_where_the_replay_was_going(qtbot, window):
    _step_to(qtbot, window, N)
    left_at: list[int] = []

    def leave_part_way(record) -> None:  # T again while compare mode's replay is at token 5 of 12
        if window.session.plan.twin is not None and record.new_tokens == 5 and not left_at:
            left_at.append(record.new_tokens)
            window.actions["compare"].trigger()

    window.session.record_computed.connect(leave_part_way)
    window.actions["compare"].trigger()  # T: compare mode replays both runs to token 12
    qtbot.waitUntil(lambda: bool(left_at), timeout=30_000)
    _run_at(qtbot, window, N, twin=None)
    window.session.record_computed.disconnect(leave_part_way)
    assert not window.actions["compare"].isChecked() and window.session.finished


def test_ctrl_b_breaks_the_cache_and_the_grid_shows_the_late_write(qtbot, window):
    _step_to(qtbot, window, 1)  # the prefill
    qtbot.keyClick(window, Qt.Key.Key_B, Qt.KeyboardModifier.ControlModifier)
    assert window.actions["break_cache"].isChecked()
    _run_at(qtbot, window, 1, cache_fault="late_write")
    _step_to(qtbot, window, 2)  # the first decode pass feeds position 3 and writes its K/V one slot late
    window.redraw()
    states = window.grid.cell_states()
    assert (states[:, :P] == REUSED).all() and (states[:, P] == STALE).all() and (states[:, P + 1] == COMPUTED).all()
    assert _legend_entry(window.grid, STATE_NAMES[STALE]).isVisible()  # shown for a broken run only
    window.actions["compare"].trigger()  # compare mode: the legend under its two grids says it too
    _run_at(qtbot, window, 2, cache_fault="late_write")
    qtbot.waitUntil(lambda: window.session.plan.twin is not None and window.workspace.comparing, timeout=30_000)
    compare = window.workspace.compare_view
    assert any(_legend_entry(g, STATE_NAMES[STALE]).isVisible() for g in (compare.cached_grid, compare.uncached_grid))
    window.actions["compare"].trigger()
    _run_at(qtbot, window, 2, twin=None)
    rows = ShortcutsDialog(window.actions.values(), window).rows()
    assert ("Break the cache (teaching switch: plants an indexing bug)", "Ctrl+B") in rows  # F1 lists it
    qtbot.keyClick(window, Qt.Key.Key_B, Qt.KeyboardModifier.ControlModifier)  # and back
    _run_at(qtbot, window, 2, cache_fault="")
    assert not (window.grid.cell_states() == STALE).any()
    assert not _legend_entry(window.grid, STATE_NAMES[STALE]).isVisible()


def _legend_entry(grid, name: str) -> QWidget:
    legend = grid.legend_row
    entries = [legend.itemAt(i).widget() for i in range(legend.count())]
    return next(e for e in entries if any(label.text() == name for label in e.findChildren(QLabel)))
