"""The main window's central widget: the controls and the banner on top, the run's views below, and the
memory column and a side panel (lesson mode's, which the app attaches) beside them."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QApplication, QFrame, QHBoxLayout, QScrollArea, QStackedWidget, QVBoxLayout, QWidget

from kvviz.app.views.compare.compare_view import CompareView
from kvviz.app.views.grid.kv_grid import KVGridView
from kvviz.app.views.memory_view import MemoryView
from kvviz.app.views.on_demand import OnDemandView
from kvviz.app.views.run_view import RunView
from kvviz.app.window.banner import Banner
from kvviz.app.window.controls import RunControls
from kvviz.app.window.serving_page import ServingPage
from kvviz.app.window.stale_cover import StaleCover


class Workspace(QWidget):
    """Lays out what the window shows and switches between its modes' pages.

    The modes' pages, `run_view` (exported as "view"), `compare_view` and the serving page, take turns in one
    scrolled stack (`modes`), so that on a screen too small for every panel's useful size the panels scroll;
    `memory_view` (View > Memory) and a side panel (`set_side_panel`: lesson mode's) are columns beside them, or the
    side panel a strip above when a column does not fit.
    Compare mode's view, the serving page and the memory view are built the first time they are asked for
    (`panel_built` then says so of the first and the last): the window opens without them.
    """

    panel_built = Signal(QWidget)  # compare_view or memory_view, just built and laid out (hidden)

    def __init__(self, controls: RunControls, banner: Banner) -> None:
        super().__init__()
        self.setObjectName("central")
        self.run_view = RunView()
        self.modes = QStackedWidget()  # the modes' pages, one shown at a time
        self.modes.setObjectName("modes")
        self.modes.addWidget(self.run_view)
        self._compare = OnDemandView(lambda: self._add_page(CompareView()))
        self._memory = OnDemandView(self._build_memory)
        self.serving: OnDemandView[ServingPage] = OnDemandView(lambda: self._add_page(ServingPage()))
        self._run_page: QWidget = self.run_view  # the run's page (or compare mode's): serving goes back to it
        # who takes the keyboard instead of the grid, when someone does (a lesson's unanswered question: its guess
        # field); returns True when it took it
        self.focus_elsewhere: Callable[[], bool] = lambda: False
        self._memory_scroll: QScrollArea | None = None
        self._side: QWidget | None = None  # set_side_panel's
        for panel in (self._compare, self._memory):
            panel.on_built(self.panel_built.emit)
        scroll = _scrolled(self.modes, "runScroll")
        self.stale_cover = StaleCover(scroll)  # over the run's views while what they show is being replaced
        self._beside = QHBoxLayout()  # the side panel's column beside the views, so that they keep their height
        self._beside.setSpacing(8)
        self._beside.addWidget(scroll, 1)  # the memory view goes after it
        self._layout = layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 6, 8, 4)
        layout.setSpacing(6)
        layout.addWidget(controls)
        layout.addWidget(banner)
        layout.addLayout(self._beside, 1)

    def set_side_panel(self, panel: QWidget) -> None:
        """A column after the views (and the memory view), which may move itself to a strip above them:
        `panel.set_places(layout, index, beside)` gives it both places, `set_columns_beside(width)` the width other
        columns take (lesson mode's panel, kvviz.app.lesson.panel.LessonPanel)."""
        self._side = panel
        self._beside.addWidget(panel)
        panel.set_places(self._layout, 2, self._beside)

    def _add_page(self, page: QWidget) -> QWidget:
        self.modes.addWidget(page)  # hidden until it is the shown page
        return page

    def _build_memory(self) -> MemoryView:
        """The memory view, in a scrolled column of its own (at a large zoom it may need more than the screen)
        at its preferred width: the run's views take the rest."""
        view = MemoryView()
        self._memory_scroll = scroll = _scrolled(view, "memoryScroll")
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)
        scroll.hide()
        self._beside.insertWidget(1, scroll)
        return view

    @property
    def compare_view(self) -> CompareView:
        """Compare mode's view, in place of run_view when shown; fed the same records (built on first use)."""
        return self._compare.get()

    @property
    def memory_view(self) -> MemoryView:
        """View > Memory, a column beside the views (built on first use)."""
        return self._memory.get()

    def views(self) -> tuple:
        """Every view the redraw scheduler feeds: the run's, its attention strip, compare mode's, memory.
        A new view joins here (and in the layout above; as an OnDemandView if it starts hidden)."""
        return (*self.run_view.views(), self.run_view.attention, self._compare, self._memory)

    def grids(self) -> tuple[KVGridView, ...]:
        """The K/V grids built so far: the run's, and compare mode's two once it has been used."""
        compare = self._compare.view
        return (self.run_view.grid,) if compare is None else (self.run_view.grid, compare.cached_grid,
                                                              compare.uncached_grid)

    @property
    def comparing(self) -> bool:
        """Compare mode is the one shown."""
        return self._compare.view is not None and self.modes.currentWidget() is self._compare.view

    @property
    def _serving_shown(self) -> bool:
        return self.serving.view is not None and self.modes.currentWidget() is self.serving.view

    def show_memory(self, on: bool) -> None:
        """Show or hide the memory view: a column at its preferred width, the run's views taking the rest; where
        the side panel's column would leave them too little beside it, the side panel goes above them."""
        if on or self._memory.built:
            memory = self.memory_view
            scroll = self._memory_scroll
            bar = scroll.verticalScrollBar().sizeHint().width()
            scroll.setMinimumWidth(max(memory.minimumWidth(), memory.minimumSizeHint().width()) + bar)
            scroll.setVisible(on)
            if self._side is not None:
                self._side.set_columns_beside(scroll.minimumWidth() + self._beside.spacing() if on else 0)

    def show_serving(self, on: bool) -> None:
        """View > Serving: the serving page in place of the run's views (or compare mode's), and back."""
        if on != self._serving_shown:
            self.modes.setCurrentWidget(self.serving.get() if on else self._run_page)

    def show_compare(self, comparing: bool) -> None:
        """Compare mode's page, or the single run's; the keyboard focus follows if it was in the other. While the
        serving page shows, the run's page is the one it goes back to."""
        self._run_page = self.compare_view if comparing else self.run_view
        shown = self.modes.currentWidget()
        if self._serving_shown or shown is self._run_page:
            return
        focus = QApplication.focusWidget()
        focus_was_there = shown.isAncestorOf(focus) if focus is not None else True
        self.modes.setCurrentWidget(self._run_page)
        if focus_was_there:  # else Qt hands the focus to the prompt field, and Space types into it
            self.focus_grid()

    def focus_grid(self) -> None:
        """Keyboard focus on the shown K/V grid (keys step the run, none of them types), unless a lesson's open
        question takes it for its guess (`focus_elsewhere`): every path that puts the focus back goes here."""
        if self.focus_elsewhere():
            return
        if self._serving_shown:
            self.serving.get().focus_view()
            return
        grid = self.compare_view.cached_grid if self.comparing else self.run_view.grid
        grid.plot_widget.setFocus()

    def export_targets(self) -> dict[str, QWidget]:
        """What File > Export... can render: the chart, the grid, the whole view and, with View > Attention
        open, the attention strip; in compare mode the compare view and its two grids; in serving mode the serving
        view and its parts (a batch's pool and chart, a trace's timeline, pool and radix tree)."""
        if self._serving_shown:
            page = self.serving.get()
            if page.shown_view is page.trace_view:
                trace = page.trace_view
                tree = {"radix_tree": trace.tree} if trace.tree.isVisibleTo(trace) else {}
                return {"serving": trace, "timeline": trace.timeline, "pool": trace.pool, **tree}
            view = page.view
            return {"serving": view, "pool": view.pool, "serving_chart": view.chart}
        if self.comparing:
            compare = self.compare_view
            return {"compare": compare, "cached_grid": compare.cached_grid, "uncached_grid": compare.uncached_grid}
        run = self.run_view
        attention = {"attention": run.attention} if run.attention.isVisibleTo(self) else {}
        return {"chart": run.chart, "grid": run.grid, "view": run, **attention}


def _scrolled(widget: QWidget, name: str) -> QScrollArea:
    """`widget` in a frameless scroll area that sizes it to the area, or to its least size when that is larger."""
    scroll = QScrollArea()
    scroll.setWidget(widget)
    scroll.setWidgetResizable(True)
    scroll.setFrameShape(QFrame.Shape.NoFrame)
    scroll.setObjectName(name)
    return scroll
