"""Compare mode in the window: T switches to it and back at the same step, it is remembered, and the
teaching switch that breaks the cache is never remembered and always shown."""

from __future__ import annotations

from helpers_qt import geometries, settle_layouts

from kvviz.app.assembly import open_window
from kvviz.app.settings import AppSettings, app_settings

PROMPT = "Time flies fast"


def steps(qtbot, win, n: int) -> None:
    for _ in range(n):
        before = win.session.steps_done
        win.session.step()
        qtbot.waitUntil(lambda b=before: win.session.steps_done == b + 1, timeout=30_000)
    win.redraw()


def wait_plan(qtbot, win, comparing: bool, steps_done: int) -> None:
    def ready() -> bool:
        plan = win.session.plan
        return (plan is not None and (plan.twin is not None) == comparing
                and win.session.steps_done == steps_done and not win.scheduler.pending)

    qtbot.waitUntil(ready, timeout=60_000)
    win.redraw()


def test_t_switches_to_compare_mode_at_the_same_step_and_back(qtbot, window):
    steps(qtbot, window, 3)
    single_cells = window.grid.cell_states()
    window.actions["compare"].trigger()  # T
    wait_plan(qtbot, window, True, 3)
    compare = window.workspace.compare_view
    assert compare.isVisibleTo(window) and not window.run_view.isVisibleTo(window)
    record = window.session.last_record
    assert record.twin and record.max_abs_logit_diff is not None
    assert [e.step for e in compare.identity_strip.entries()] == [1, 2, 3]
    assert all(e.same for e in compare.identity_strip.entries())
    assert (compare.cached_grid.cell_states() == single_cells).all()  # the same cached run, step for step
    assert compare.uncached_grid.cell_states().shape == single_cells.shape
    assert window.export_targets().keys() == {"compare", "cached_grid", "uncached_grid"}

    window.actions["compare"].trigger()  # T again
    wait_plan(qtbot, window, False, 3)
    assert window.run_view.isVisibleTo(window) and not compare.isVisibleTo(window)
    assert (window.grid.cell_states() == single_cells).all()
    assert window.export_targets().keys() == {"chart", "grid", "view"}


def test_compare_mode_is_remembered_and_the_broken_cache_never_is(qtbot, app_model):
    store = app_settings()
    first = open_window(app_model, PROMPT, settings=store)
    qtbot.addWidget(first)
    first.actions["compare"].setChecked(True)
    first.actions["break_cache"].setChecked(True)
    first.close()
    remembered = AppSettings.load(store)
    assert remembered.compare
    assert not any("break" in key.lower() for key in store.values())
    second = open_window(app_model, PROMPT, settings=store)
    qtbot.addWidget(second)
    try:
        assert second.actions["compare"].isChecked() and second.controls.request().compare
        assert not second.actions["break_cache"].isChecked() and not second.controls.request().break_cache
    finally:
        second.close()


def test_a_broken_cache_is_shown_everywhere_and_diverges(qtbot, window):
    window.actions["compare"].trigger()
    wait_plan(qtbot, window, True, 0)
    window.actions["break_cache"].trigger()
    qtbot.waitUntil(lambda: window.session.plan is not None and window.session.plan.cache_broken, timeout=30_000)
    assert "BROKEN" in window.windowTitle()
    window.redraw()
    assert "BROKEN" in window.status.text()
    assert "BROKEN" in window.workspace.compare_view.cached_grid.title.text()
    assert "BROKEN" not in window.workspace.compare_view.uncached_grid.title.text()
    records = []
    window.session.record_computed.connect(records.append)
    for _ in range(window.session.plan.budget):
        window.session.step()
    qtbot.waitUntil(lambda: window.session.finished, timeout=60_000)
    window.redraw()
    parted = [r.new_tokens for r in records if r.token_id is not None and r.token_id != r.twin_token_id]
    assert parted, "the broken cache should change the tokens within the run"
    banner = window.workspace.compare_view.banner
    assert banner.shown and banner.first_divergence == parted[0]
    assert f"step {parted[0]}" in banner.text()
    assert max(r.max_abs_logit_diff for r in records if r.max_abs_logit_diff is not None) > 1e-2

    window.actions["break_cache"].trigger()  # off: the title and the status say so at once
    qtbot.waitUntil(lambda: window.session.plan is not None and not window.session.plan.cache_broken,
                    timeout=30_000)
    window.redraw()
    assert "BROKEN" not in window.windowTitle() and "BROKEN" not in window.status.text()


def test_a_broken_cache_in_the_single_view_says_so_on_its_grid(qtbot, window):
    window.actions["break_cache"].trigger()
    qtbot.waitUntil(lambda: window.session.plan is not None and window.session.plan.cache_broken, timeout=30_000)
    window.redraw()
    assert "BROKEN" in window.grid.title.text() and "BROKEN" in window.windowTitle()
    window.controls.cache_check.setChecked(False)  # without the cache there is nothing to break
    qtbot.waitUntil(lambda: window.session.plan is not None and not window.session.plan.use_cache, timeout=30_000)
    window.redraw()
    assert not window.session.plan.cache_broken
    assert "BROKEN" not in window.grid.title.text() and "BROKEN" not in window.windowTitle()


def test_switching_panels_keeps_the_keys_on_the_grid(qtbot, window):
    """Hiding the focused grid would hand the focus to the prompt field, where Space types a space."""
    from PySide6.QtWidgets import QApplication

    window.activateWindow()
    window.focus_grid()
    qtbot.waitUntil(lambda: QApplication.focusWidget() is window.grid.plot_widget, timeout=5_000)
    window.actions["compare"].trigger()
    wait_plan(qtbot, window, True, 0)
    assert QApplication.focusWidget() is window.workspace.compare_view.cached_grid.plot_widget
    window.actions["compare"].trigger()
    wait_plan(qtbot, window, False, 0)
    assert QApplication.focusWidget() is window.grid.plot_widget


def test_compare_steps_move_nothing_around_the_views(qtbot, window):
    """As in the single view: the identity strip grows, numbers and captions change, and nothing around
    them moves or changes its size."""
    window.actions["compare"].trigger()
    wait_plan(qtbot, window, True, 0)
    steps(qtbot, window, 1)
    compare = window.workspace.compare_view
    watched = [window, window.centralWidget(), compare, compare.main_splitter, compare.grid_splitter,
               compare.side_splitter, compare.time_plot, compare.counts, compare.cached_grid,
               compare.uncached_grid, compare.identity_strip, window.statusBar()]
    before = geometries(watched)
    steps(qtbot, window, 8)
    window.redraw()
    settle_layouts()
    assert [e.step for e in compare.identity_strip.entries()] == list(range(1, 10))
    assert geometries(watched) == before
