"""What a lesson slide shows of the app: the views of the step's focus, laid out for a 16:9 slide, with fonts large
enough to read from the back of a lecture hall.

A slide's text is at least SLIDE_FONT_SCALE times the app's: a 9-point tick label becomes 22.8 of the slide's 900
logical pixels (2.5 % of its height). The whole window does not fit a slide at that size (its views need about
820 pixels at that scale, a slide has 584 to 672 under its text), so a slide shows the part of the window that
its step's `focus` names, as the app frames it:

- "grid": the token strip over the K/V grid (compare mode: both grids and the identity strip);
- "chart" and "counter": the chart beside the counter (compare mode: the time plot beside the counts);
- "all": the token strip and the grid beside the counter (compare mode: both grids side by side over the
  identity strip);
- "memory": the memory view;
- "speed": the speed view, showing the sweep measured for the slide (not the run);
- a serving step's "serving": the serving view of its batch, its speed measured once the batch is done; "blocks":
  the view's block pool and block tables; "chart": its memory chart and that speed;
- a trace step's "serving": the serving view of its trace (the decision, the timeline, the pool, the radix tree),
  each request's figures once the trace is done; "timeline", "blocks", "tree": the pass's decision over that part.

Each arrangement is built once, from the app's own views, and fed the step's plan and records as the window
feeds them. An arrangement that still needs more height than the slide has (a long prompt's tokens, many
layers) gets smaller fonts until it fits, never smaller than the app's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from PySide6.QtCore import QRectF, Qt
from PySide6.QtWidgets import QBoxLayout, QHBoxLayout, QLabel, QLayout, QVBoxLayout, QWidget

from kvviz.app import theme as themes
from kvviz.app.views.base import ViewGroup
from kvviz.app.views.flow_layout import FlowLayout

if TYPE_CHECKING:
    from PySide6.QtWidgets import QApplication

    from kvviz.app.views.serving.trace_view import TraceView
    from kvviz.core.batch_records import BatchSpeed
    from kvviz.core.records import RunPlan, StepRecord
    from kvviz.core.serve_records import ServeMeasure
    from kvviz.lessons.lesson import LessonStep
    from kvviz.measure.speed import SweepResult

SLIDE_FONT_SCALE = 1.9  # the views' font scale on a slide: 9 points at 96 dpi are 22.8 px, 2.5 % of 900
SMALLEST_FONT_SCALE = 1.0  # an arrangement too tall for its slide shrinks its fonts down to this
SPACING = 10  # logical pixels between the views of an arrangement


class Arrangement(ViewGroup, QWidget):
    """Views laid out for a slide, acting as one view (views.base.ViewGroup); `views()` in redraw order."""

    def __init__(self, views: Sequence[QWidget], build: Callable[[QBoxLayout], None], horizontal: bool) -> None:
        super().__init__()
        self.setObjectName("central")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)  # the theme's background between the views
        self._views = tuple(views)
        layout = QHBoxLayout(self) if horizontal else QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(SPACING)
        build(layout)

    def views(self) -> tuple:
        return self._views


def _column(*items: tuple[QWidget, int]) -> QVBoxLayout:
    column = QVBoxLayout()
    column.setSpacing(SPACING)
    for widget, stretch in items:
        column.addWidget(widget, stretch)
    return column


def _run_grid() -> Arrangement:
    from kvviz.app.views.grid.kv_grid import KVGridView
    from kvviz.app.views.token_strip import TokenStrip

    strip, grid = TokenStrip(), KVGridView()
    return Arrangement((strip, grid), lambda box: (box.addWidget(strip), box.addWidget(grid, 1)), horizontal=False)


def _run_work() -> Arrangement:
    from kvviz.app.views.counter import CounterPanel
    from kvviz.app.views.work_chart import WorkChart

    chart, counter = WorkChart(), CounterPanel()
    return Arrangement((chart, counter), lambda box: (box.addWidget(chart, 3), box.addWidget(counter, 2)),
                       horizontal=True)


def _run_all() -> Arrangement:
    from kvviz.app.views.counter import CounterPanel
    from kvviz.app.views.grid.kv_grid import KVGridView
    from kvviz.app.views.token_strip import TokenStrip

    strip, grid, counter = TokenStrip(), KVGridView(), CounterPanel()

    def build(box: QBoxLayout) -> None:
        box.addLayout(_column((strip, 0), (grid, 1)), 2)
        box.addWidget(counter, 1)

    return Arrangement((strip, grid, counter), build, horizontal=True)


def _compare_grids() -> tuple:
    from kvviz.app.views.compare.divergence_banner import DivergenceBanner
    from kvviz.app.views.compare.identity_strip import IdentityStrip
    from kvviz.app.views.grid.kv_grid import KVGridView

    return (DivergenceBanner(), KVGridView(lockstep="cached", legend=False), KVGridView(lockstep="uncached"),
            IdentityStrip())


def _compare_grid() -> Arrangement:
    banner, cached, uncached, identity = views = _compare_grids()
    return Arrangement(views, lambda box: [box.addWidget(w, s) for w, s in
                                           ((banner, 0), (cached, 1), (uncached, 1), (identity, 0))],
                       horizontal=False)


def _compare_work() -> Arrangement:
    from kvviz.app.views.compare.compare_counts import CompareCounts
    from kvviz.app.views.compare.compare_time import CompareTimePlot

    time_plot, counts = CompareTimePlot(), CompareCounts()
    return Arrangement((time_plot, counts), lambda box: (box.addWidget(time_plot, 3), box.addWidget(counts, 2)),
                       horizontal=True)


def _compare_all() -> Arrangement:
    banner, cached, uncached, identity = views = _compare_grids()
    identity.set_scroll_bar_shown(False)  # a slide shows what fits; a printed scroll bar would say nothing

    def build(box: QBoxLayout) -> None:
        grids = QHBoxLayout()
        grids.setSpacing(2 * SPACING)
        grids.addWidget(cached, 1)
        grids.addWidget(uncached, 1)
        box.addWidget(banner)
        box.addLayout(grids, 1)
        box.addLayout(uncached.take_legend_out())  # under both grids, on one line: it wrapped under the one
        box.addWidget(identity)

    return Arrangement(views, build, horizontal=False)


def _memory() -> QWidget:
    from kvviz.app.views.memory_view import MemoryView

    return MemoryView()


def _speed() -> QWidget:
    from kvviz.app.views.speed_view import SpeedView

    view = SpeedView()
    view.set_controls_shown(False)  # a slide carries no button to press
    return view


def _serving(part: str) -> Callable[[], QWidget]:
    def make() -> QWidget:
        from kvviz.app.views.serving.serving_view import ServingView

        view = ServingView()
        view.show_part(part)
        return view

    make.__name__ = f"_serving_{part}"
    return make


SERVING = {part: _serving(part) for part in ("serving", "blocks", "chart")}  # a serving step's focus


def _trace(part: str) -> Callable[[], QWidget]:
    def make() -> QWidget:
        from kvviz.app.views.serving.trace_view import TraceView

        return TraceView()

    make.__name__ = f"_trace_{part}"
    return make


TRACE = {part: _trace(part) for part in ("serving", "timeline", "blocks", "tree")}  # a trace step's focus


def show_trace_part(view: TraceView, part: str) -> None:
    """What a trace step's slide shows of the trace view (its step's `focus`), in type large enough to read:
    "serving" all of it; "timeline" the pass's decision over the requests' timeline (and their figures once the
    trace is done); "blocks" the decision over the block pool; "tree" the decision over the radix tree. The other
    parts are hidden after each reset, which shows the tree in radix mode (each part has a view of its own)."""
    if part == "serving":
        return
    shown = {"timeline": (view.decision, view.timeline, view.figures_line),
             "blocks": (view.decision, view.pool_title, view.pool_legend, view.pool),
             "tree": (view.decision, view.tree_title, view.tree, view.tree_note)}[part]
    for widget in view.findChildren(QWidget, options=Qt.FindChildOption.FindDirectChildrenOnly):
        if widget not in shown:
            widget.hide()


ARRANGEMENTS: dict[tuple[bool, str], Callable[[], QWidget]] = {
    (False, "grid"): _run_grid, (False, "chart"): _run_work, (False, "counter"): _run_work,
    (False, "all"): _run_all, (False, "memory"): _memory,
    (True, "grid"): _compare_grid, (True, "chart"): _compare_work, (True, "counter"): _compare_work,
    (True, "all"): _compare_all, (True, "memory"): _memory,
    (False, "speed"): _speed, (True, "speed"): _speed,
}


def _squeezed(layout: QLayout) -> bool:
    """Whether a part of `layout`, as laid out, got less height than it needs at the width it got (a widget its
    least height, the grids' following their width; a wrapping label or legend its height for that width), or lies
    below the layout's bottom (their least heights add up to more than it has)."""
    outer = layout.geometry()
    for index in range(layout.count()):
        item = layout.itemAt(index)
        box = item.geometry()
        widget, inner = item.widget(), item.layout()
        if widget is not None and widget.isHidden():
            continue
        if not box.isEmpty() and box.bottom() > outer.bottom() + 1:  # least heights that add up to more than it has
            return True
        if widget is not None:
            need = widget.heightForWidth(box.width()) if isinstance(widget, QLabel) and widget.wordWrap() \
                else max(widget.minimumSizeHint().height(), widget.minimumHeight())
        elif isinstance(inner, FlowLayout):
            need = inner.heightForWidth(box.width())
        elif inner is not None:
            if _squeezed(inner):
                return True
            continue
        else:
            continue
        if box.height() < need - 1:
            return True
    return False


class SlideStage:
    """The arrangements slides show, each made the first time a slide needs it, styled, and shown offscreen at
    the size of the slide's view."""

    def __init__(self, app: QApplication) -> None:
        self.app = app
        self._made: dict[Callable[[], QWidget], QWidget] = {}
        self.font_scale = SLIDE_FONT_SCALE  # of the arrangement shown last

    def arrangement(self, step: LessonStep) -> QWidget:
        """The arrangement of `step`'s focus (and cache mode), made once."""
        make = TRACE[step.focus] if step.serves_trace else SERVING[step.focus] if step.serving else \
            ARRANGEMENTS[(bool(step.compare), step.focus)]
        view = self._made.get(make)
        if view is None:
            view = self._made[make] = make()
            view.setStyleSheet(themes.stylesheet())
            view.setAttribute(Qt.WidgetAttribute.WA_DontShowOnScreen, True)  # even when a display is there
        return view

    def show(self, step: LessonStep, plan: RunPlan, records: tuple[StepRecord, ...], region: QRectF,
             speed: SweepResult | None = None, batch_speed: BatchSpeed | None = None,
             measured: ServeMeasure | None = None) -> QWidget:
        """`step`'s arrangement in the state of `records` (a speed step's: of the sweep `speed`), laid out at
        the size of `region`, its fonts at SLIDE_FONT_SCALE or, when it does not fit `region` at that size,
        as large as fits. A batch shows `batch_speed`, a trace its figures `measured`, once they are done."""
        view = self.arrangement(step)
        width, height = round(region.width()), round(region.height())
        view.resize(width, height)
        of_run = step.focus != "speed"
        if of_run:
            view.reset(plan)
            view.apply(records)
            done = bool(records) and records[-1].final
            if step.serves_trace:  # its figures per request once the trace is done, as the app shows them
                view.show_measure(measured if done else None)
                show_trace_part(view, step.focus)
            elif step.serving:  # its speed once the batch is done, as the app shows it
                view.show_speed(batch_speed if done else None)
        elif speed is not None:
            view.show_result(speed)
        scale = SLIDE_FONT_SCALE
        while True:
            view.set_font_scale(scale)
            view.show()
            self.app.processEvents()
            if of_run:
                view.refresh()
            self.app.processEvents()
            fits = view.minimumSizeHint().height() <= height
            if fits and view.layout() is not None:  # laid out at the slide's size: nothing squeezed below what
                view.resize(width, height)  # its wrapped titles, tables and legends need at the width they got
                self.app.processEvents()
                fits = not _squeezed(view.layout())
            if fits or scale <= SMALLEST_FONT_SCALE:
                break
            scale = max(SMALLEST_FONT_SCALE, scale * 0.92)
        self.font_scale = scale
        view.resize(width, height)
        self.app.processEvents()
        return view

    def close(self) -> None:
        for view in self._made.values():
            view.close()
            view.deleteLater()
        self.app.processEvents()
