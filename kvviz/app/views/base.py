"""The protocol every view of a run follows, and the plot and text helpers the views share."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import pyqtgraph as pg
from PySide6.QtCore import QEvent, QObject, QPointF, QRect
from PySide6.QtGui import QCursor, QHelpEvent
from PySide6.QtWidgets import QSizePolicy, QToolTip

from kvviz.app.theme import Theme
from kvviz.core.records import RunPlan, StepRecord


@runtime_checkable
class RunViewProtocol(Protocol):
    """A view of one run. It reads the plan and the records, and never re-derives them.

    - `reset(plan)`: a new run is planned; show it before its first pass.
    - `apply(records)`: take these records, in order; draw nothing yet.
    - `refresh()`: draw what changed since the last draw (cheap when nothing did).
    - `set_font_scale(scale)`: zoom and presenter mode.
    - `set_theme(theme)`: draw in this theme's colours from now on (a view starts in the current one).

    A view whose drawing is costly may also offer `redraw_slices()`: its refresh in pieces, which
    the redraw scheduler draws in separate passes of the event loop.
    """

    def reset(self, plan: RunPlan) -> None: ...

    def apply(self, records: Sequence[StepRecord]) -> None: ...

    def refresh(self) -> None: ...

    def set_font_scale(self, scale: float) -> None: ...

    def set_theme(self, theme: Theme) -> None: ...


class ViewGroup:
    """Several views laid out together (RunView, CompareView) act as one: each call goes to every view of
    `views()`, in redraw order."""

    def views(self) -> tuple:
        raise NotImplementedError

    def reset(self, plan: RunPlan) -> None:
        for view in self.views():
            view.reset(plan)

    def apply(self, records: Sequence[StepRecord]) -> None:
        for view in self.views():
            view.apply(records)

    def refresh(self) -> None:
        for view in self.views():
            view.refresh()

    def set_font_scale(self, scale: float) -> None:
        for view in self.views():
            view.set_font_scale(scale)

    def set_theme(self, theme) -> None:
        for view in self.views():
            view.set_theme(theme)

    def redraw_slices(self) -> list[Callable[[], None]]:
        """Each view's drawing in its own slices: a group is never drawn in one pass."""
        return [draw for view in self.views() for draw in redraw_slices(view)]


def redraw_slices(view: RunViewProtocol) -> list[Callable[[], None]]:
    """The pieces `view` draws in, one pass of the event loop each."""
    slices = getattr(view, "redraw_slices", None)
    return list(slices()) if slices is not None else [view.refresh]


def cache_axes(plot_item: object) -> None:
    """Paint `plot_item`'s axes (with their grid lines) once into a bitmap, and blit it on repaints.

    The frames are fixed for a whole run, so the axes rarely change; without the cache every
    repaint of a curve replays the axes' text and grid (two thirds of a chart redraw). Exports
    switch the cache off while they draw, so vector files keep vector axes.
    """
    from PySide6.QtWidgets import QGraphicsItem

    for name in ("left", "bottom", "right", "top"):
        axis = plot_item.getAxis(name)
        axis.setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)


def cell_plot(min_height: int) -> tuple[pg.PlotWidget, pg.PlotItem, pg.ImageItem]:
    """A plot of cells (the K/V grid, the attention strip): one row-major ImageItem, rows downwards from 0,
    no menu, no buttons, no panning or zooming by mouse, no padding, the mouse tracked for tooltips."""
    plot_widget = pg.PlotWidget()
    plot_widget.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)
    plot_widget.setMouseTracking(True)
    plot_widget.setMinimumHeight(min_height)
    plot_item = plot_widget.getPlotItem()
    plot_item.setMenuEnabled(False)
    plot_item.hideButtons()
    vb = plot_item.getViewBox()
    vb.setMouseEnabled(x=False, y=False)
    vb.invertY(True)
    vb.setDefaultPadding(0.0)
    image_item = pg.ImageItem(axisOrder="row-major")
    plot_item.addItem(image_item)
    return plot_widget, plot_item, image_item


def cell_under(plot_item: pg.PlotItem, scene_pos: QPointF) -> tuple[int, int] | None:
    """(row, column) of the cell of a `cell_plot` at `scene_pos`, or None off its view box."""
    vb = plot_item.getViewBox()
    if not vb.sceneBoundingRect().contains(scene_pos):
        return None
    point = vb.mapSceneToView(scene_pos)
    return int(math.floor(point.y())), int(math.floor(point.x()))


TOOLTIP_MS = 600_000  # a cell's tooltip stays while the mouse rests on it (Qt's own would go after ~10 s)


class CellTooltips(QObject):
    """Tooltips on the cells of a `cell_plot`: what `text_at(row, column)` says about the cell under the mouse
    ("" for none). The tooltip changes from cell to cell and stays while the mouse rests on one; it leaves with
    the mouse. `refresh()` says it again for new data under a still mouse, `forget()` drops the cell when the
    cells moved under it.

    The tooltip is shown as the mouse moves; when the mouse then rests, Qt asks the view for a tooltip
    (QEvent.ToolTip), and the graphics scene would answer that no item has one and hide it: that request is
    answered here with the cell's text.
    """

    def __init__(self, plot_widget: pg.PlotWidget, plot_item: pg.PlotItem,
                 text_at: Callable[[int, int], str]) -> None:
        super().__init__(plot_widget)
        self._plot_widget, self._plot_item, self._text_at = plot_widget, plot_item, text_at
        self.cell: tuple[int, int] | None = None  # (row, column) under the mouse
        plot_widget.scene().sigMouseMoved.connect(self._on_mouse_moved)
        plot_widget.installEventFilter(self)
        plot_widget.viewport().installEventFilter(self)  # the resting mouse's tooltip request goes to the viewport

    def refresh(self) -> None:
        if self.cell is not None:
            self._show(*self.cell)

    def forget(self) -> None:
        self.cell = None

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if "_plot_widget" not in self.__dict__:  # torn down: the GC cleared this object before Qt deleted its filter
            return False
        if event.type() == QEvent.Type.Leave and watched is self._plot_widget:
            self.cell = None
            QToolTip.hideText()
        elif event.type() == QEvent.Type.ToolTip and isinstance(event, QHelpEvent):
            cell = cell_under(self._plot_item, self._plot_widget.mapToScene(event.pos()))
            text = self._text_at(*cell) if cell is not None else ""
            if text:
                self.cell = cell
                QToolTip.showText(event.globalPos(), text, self._plot_widget, QRect(), TOOLTIP_MS)
                return True  # answered: the scene, which knows no tooltip here, would hide it
        return False

    def _on_mouse_moved(self, scene_pos: QPointF) -> None:
        cell = cell_under(self._plot_item, scene_pos)
        if cell is None:
            self.cell = None
            QToolTip.hideText()
        elif cell != self.cell:
            self.cell = cell
            self._show(*cell)

    def _show(self, row: int, column: int) -> None:
        text = self._text_at(row, column)
        if text:
            QToolTip.showText(QCursor.pos(), text, self._plot_widget, QRect(), TOOLTIP_MS)
        else:
            QToolTip.hideText()


def style_plot(plot_item: object, theme: Theme) -> None:
    """`plot_item`'s axes, tick labels, axis titles and grid lines in `theme`'s muted colour."""
    for name in ("left", "bottom", "right", "top"):
        axis = plot_item.getAxis(name)
        axis.setPen(theme.muted)
        axis.setTextPen(theme.muted)


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 times a power of ten that is >= `value`: axis ranges that rarely change."""
    if value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    for factor in (1.0, 2.0, 2.5, 5.0, 10.0):
        if factor * power >= value:
            return float(factor * power)
    return float(10 * power)
