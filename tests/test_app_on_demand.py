"""Compare mode's view and the memory view are built the first time they are needed: the window opens
without them, and once built they show what one built with the window would (the run so far, the zoom,
the colour-blind patterns, the plots' menus)."""

from __future__ import annotations

import numpy as np
from PySide6.QtCore import QPoint, Qt, QTimer

from kvviz.app.views.compare.compare_view import CompareView
from kvviz.app.views.memory_view import MemoryView


def steps(qtbot, win, n: int) -> None:
    for _ in range(n):
        before = win.session.steps_done
        win.session.step()
        qtbot.waitUntil(lambda b=before: win.session.steps_done == b + 1, timeout=30_000)
    qtbot.waitUntil(lambda: not win.scheduler.pending, timeout=30_000)


def test_the_window_opens_without_compare_mode_or_memory_built(qtbot, window):
    assert window.findChildren(CompareView) == [] and window.findChildren(MemoryView) == []
    steps(qtbot, window, 2)
    window.actions["colour_blind"].setChecked(False)  # a toggle that reaches every built grid
    window.actions["memory"].setChecked(False)  # hiding a view never built does not build it
    assert window.findChildren(CompareView) == [] and window.findChildren(MemoryView) == []


def test_the_memory_view_built_mid_run_shows_the_run_so_far_at_the_zoom(qtbot, window):
    window.presentation.set_zoom(1.4)
    steps(qtbot, window, 3)
    qtbot.keyClick(window, Qt.Key.Key_M)
    assert len(window.findChildren(MemoryView)) == 1
    memory = window.workspace.memory_view
    assert memory.isVisible()
    window.redraw()
    positions, measured = memory.points()
    assert positions.tolist() == [3, 4, 5]  # "Time flies fast": the prefill's 3 positions, then one a pass
    assert measured[-1] == window.session.last_record.cache_bytes
    assert memory.heading.font().pointSizeF() == 9.0 * 1.4
    assert memory.mapTo(window, QPoint()).x() > window.run_view.mapTo(window, QPoint()).x()  # a column beside them
    steps(qtbot, window, 1)
    window.redraw()
    assert memory.points()[0].tolist() == [3, 4, 5, 6]


def test_compare_mode_built_late_has_the_patterns_and_the_menus(qtbot, window):
    from PySide6.QtWidgets import QGraphicsView

    qtbot.keyClick(window, Qt.Key.Key_B)  # colour-blind patterns, before compare mode exists
    steps(qtbot, window, 3)
    window.redraw()
    patterned = np.array(window.grid.image_item.image, copy=True)
    qtbot.keyClick(window, Qt.Key.Key_T)
    qtbot.waitUntil(lambda: window.session.plan is not None and window.session.plan.twin is not None
                    and window.session.steps_done == 3 and not window.scheduler.pending, timeout=60_000)
    window.redraw()
    compare = window.workspace.compare_view
    assert len(window.findChildren(CompareView)) == 1 and compare.isVisibleTo(window)
    assert np.array_equal(compare.cached_grid.image_item.image, patterned)  # the same run, with the patterns
    for view in (compare.cached_grid, compare.uncached_grid, compare.time_plot):
        for plot in view.findChildren(QGraphicsView):
            assert plot.contextMenuPolicy() == Qt.ContextMenuPolicy.CustomContextMenu  # "Copy image"
    menu = window.copier.context_menu(compare.uncached_grid)
    assert [a.text() for a in menu.actions()] == ["Copy image", "Export view\u2026"]


def test_compare_mode_built_late_still_draws_each_of_its_views_in_its_own_slice(qtbot, window):
    """The scheduler draws a view group view by view, one pass of the event loop each: compare mode's
    six views drawn in one pass blocked the window for 16-26 ms at 1600x1000."""
    qtbot.keyClick(window, Qt.Key.Key_T)
    qtbot.waitUntil(lambda: window.workspace.comparing and not window.scheduler.pending, timeout=60_000)
    compare = window.workspace.compare_view
    loop_passes = [0]  # passes of the event loop, counted by a zero timer
    ticker = QTimer(window, interval=0, timeout=lambda: loop_passes.__setitem__(0, loop_passes[0] + 1))
    drawn: list[tuple[str, int]] = []  # (view, the pass it drew a piece in)

    def counted(name: str, draw):
        return lambda: (drawn.append((name, loop_passes[0])), draw())

    for view in compare.views():  # banner, both grids, time plot, counts, identity strip
        name = f"{type(view).__name__}@{id(view)}"
        if hasattr(view, "redraw_slices"):
            pieces = view.redraw_slices
            view.redraw_slices = lambda pieces=pieces, name=name: [counted(name, draw) for draw in pieces()]
        else:
            view.refresh = counted(name, view.refresh)
    ticker.start()
    window.session.step()
    qtbot.waitUntil(lambda: window.session.steps_done == 1 and not window.scheduler.pending
                    and len({name for name, _ in drawn}) == len(compare.views()), timeout=30_000)
    ticker.stop()
    passes = [loop_pass for _, loop_pass in drawn]
    assert len(passes) == len(set(passes)), drawn  # never two pieces in one pass of the event loop
