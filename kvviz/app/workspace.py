"""The main window's central widget: the controls and the banner on top, the run's views below, and the
memory and lesson columns beside them."""

from __future__ import annotations

from PySide6.QtWidgets import QApplication, QFrame, QHBoxLayout, QScrollArea, QVBoxLayout, QWidget

from kvviz.app.banner import Banner
from kvviz.app.controls import RunControls
from kvviz.app.lesson_panel import LessonPanel
from kvviz.app.views.compare_view import CompareView
from kvviz.app.views.kv_grid import KVGridView
from kvviz.app.views.memory_view import MemoryView
from kvviz.app.views.run_view import RunView


class Workspace(QWidget):
    """Lays out what the window shows and switches between the single run and compare mode.

    `run_view` (exported as "view") and `compare_view` take turns in one scrolled place, so that on a
    screen too small for every panel's useful size the panels scroll; `memory_view` (View > Memory) and
    the lesson's panel are columns beside them, or the lesson a strip above when a column does not fit.
    """

    def __init__(self, controls: RunControls, banner: Banner, lesson_panel: LessonPanel) -> None:
        super().__init__()
        self.setObjectName("central")
        self.run_view = RunView()
        self.compare_view = CompareView()  # in place of run_view; fed the same records
        self.compare_view.hide()
        self.memory_view = MemoryView()
        self.memory_view.hide()
        panels = QWidget()
        panels_layout = QVBoxLayout(panels)  # the hidden panel takes no room, and sets no minimum size
        panels_layout.setContentsMargins(0, 0, 0, 0)
        panels_layout.addWidget(self.run_view)
        panels_layout.addWidget(self.compare_view)
        scroll = QScrollArea()
        scroll.setWidget(panels)
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setObjectName("runScroll")
        beside = QHBoxLayout()  # the lesson's column beside the views, so that they keep their height
        beside.setSpacing(8)
        beside.addWidget(scroll, 1)
        beside.addWidget(self.memory_view)
        beside.addWidget(lesson_panel)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 6, 8, 4)
        layout.setSpacing(6)
        layout.addWidget(controls)
        layout.addWidget(banner)
        layout.addLayout(beside, 1)
        lesson_panel.set_places(layout, 2, beside)

    def views(self) -> tuple:
        """Every view the redraw scheduler feeds: the run's, its attention strip, compare mode's, memory.
        A new view joins here (and in the layout above)."""
        return (*self.run_view.views(), self.run_view.attention, *self.compare_view.views(), self.memory_view)

    def grids(self) -> tuple[KVGridView, ...]:
        return self.run_view.grid, self.compare_view.cached_grid, self.compare_view.uncached_grid

    @property
    def comparing(self) -> bool:
        """Compare mode is the one shown."""
        return self.compare_view.isVisibleTo(self)

    def show_compare(self, comparing: bool) -> None:
        """Show compare mode's view, or the single run's; the keyboard focus follows if it was in the other."""
        if comparing == self.comparing:
            return
        leaving = self.run_view if comparing else self.compare_view
        focus = QApplication.focusWidget()
        focus_was_there = leaving.isAncestorOf(focus) if focus is not None else True
        self.run_view.setVisible(not comparing)
        self.compare_view.setVisible(comparing)
        if focus_was_there:  # else Qt hands the focus to the prompt field, and Space types into it
            self.focus_grid()

    def focus_grid(self) -> None:
        """Keyboard focus on the shown K/V grid (keys step the run, none of them types)."""
        grid = self.compare_view.cached_grid if self.comparing else self.run_view.grid
        grid.plot_widget.setFocus()

    def export_targets(self) -> dict[str, QWidget]:
        """What File > Export... can render: the chart, the grid, the whole view and, with View > Attention
        open, the attention strip; in compare mode the compare view and its two grids."""
        if self.comparing:
            compare = self.compare_view
            return {"compare": compare, "cached_grid": compare.cached_grid, "uncached_grid": compare.uncached_grid}
        run = self.run_view
        attention = {"attention": run.attention} if run.attention.isVisibleTo(self) else {}
        return {"chart": run.chart, "grid": run.grid, "view": run, **attention}
