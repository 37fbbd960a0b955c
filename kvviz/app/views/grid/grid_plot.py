"""The K/V grid's plot: its cells as one image framed to the rows shown, its layer and position axes, the outline
of the selected layer's rows, and the mouse on the cells (the hover tooltip, a click or a double click on a row)."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QEvent, QObject, QPointF, QRectF, Qt, Signal
from PySide6.QtGui import QColor, QMouseEvent, QPen
from PySide6.QtWidgets import QGraphicsRectItem

from kvviz.app.theme import Theme
from kvviz.app.views.base import CellTooltips, cache_axes, cell_plot, cell_under, style_plot
from kvviz.app.views.grid.grid_cells import CellTiles
from kvviz.app.views.grid.grid_rows import GridAxes, GridRows
from kvviz.app.views.grid.grid_state import GridState


class GridPlot(QObject):
    """The plot of a K/V grid (`plot_widget`, `plot_item`, `image_item`, and `axes`, the layer and position labels)
    and what it draws and hears.

    `draw` paints the cells of the rows shown and labels them, `outline` frames the selected layer's rows.
    `shown()` gives the cells and rows on show (None when no run is shown): the tooltip says what a cell holds,
    and a left click on a row emits `layer_pressed`, a double click `layer_double_clicked`, with the row's layer
    (a head row's too).
    """

    layer_pressed = Signal(int)
    layer_double_clicked = Signal(int)

    def __init__(self, min_height: int, shown: Callable[[], tuple[GridState, GridRows] | None],
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._shown = shown
        self.plot_widget, self.plot_item, self.image_item = cell_plot(min_height)
        self.axes = GridAxes(self.plot_widget, self.plot_item)
        self._tiles = CellTiles()
        self._framed_shape: tuple[int, int] | None = None  # (rows, width) the view box was last framed to
        self._outline = QGraphicsRectItem()
        self._outline.setZValue(self.image_item.zValue() + 1)
        self._outline.setVisible(False)
        self.plot_item.addItem(self._outline, ignoreBounds=True)
        self.plot_item.setLabel("left", "layer")
        self.plot_item.setLabel("bottom", "token position")
        self.plot_item.showGrid(False, False)
        cache_axes(self.plot_item)
        self.tooltips = CellTooltips(self.plot_widget, self.plot_item, self._tooltip_text)
        self.plot_widget.viewport().installEventFilter(self)  # clicks on rows

    def set_theme(self, theme: Theme) -> None:
        self.plot_widget.setBackground(theme.background)
        pen = QPen(QColor(theme.frame))
        pen.setWidthF(2.0)
        pen.setCosmetic(True)  # 2 pixels at any zoom
        self._outline.setPen(pen)
        style_plot(self.plot_item, theme)

    def draw(self, cells: GridState, rows: GridRows, colour_blind: bool, theme: Theme, scores: bool = False) -> None:
        """Paint `cells` in `rows` (framing the view box to them when their shape changed), and label them; with
        `scores` (View > Scores), the cells an importance method keeps shaded by their score."""
        n_rows, width = len(rows), cells.width
        shades = cells.score_shades() if scores and cells.eviction is not None else None
        image = self._tiles.image(cells.states, rows, colour_blind, theme, shades)
        self.image_item.setImage(image, autoLevels=False, levels=(0, 255))
        if self._framed_shape != (n_rows, width):  # a new frame repaints the axes: only when the shape changes
            self._framed_shape = (n_rows, width)
            self.image_item.setRect(QRectF(0, 0, width, n_rows))
            self.plot_item.getViewBox().setRange(xRange=(0, width), yRange=(0, n_rows), padding=0)
        self.axes.update(cells, rows)

    def outline(self, rect: QRectF | None) -> None:
        """Frame the cells in `rect` (rows and positions), a pixel inside it; None hides the frame."""
        if rect is None:
            self._outline.setVisible(False)
            return
        px, py = self.plot_item.getViewBox().viewPixelSize()  # one pixel, in cells: the pen inside the plot's edge
        self._outline.setRect(rect.adjusted(px, py, -px, -py))
        self._outline.setVisible(True)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if "plot_widget" not in self.__dict__:  # torn down: the GC cleared this object before Qt deleted its filter
            return False
        if (watched is self.plot_widget.viewport() and isinstance(event, QMouseEvent)
                and event.type() in (QEvent.Type.MouseButtonPress, QEvent.Type.MouseButtonDblClick)
                and event.button() == Qt.MouseButton.LeftButton):
            cell = self._cell_at(self.plot_widget.mapToScene(event.position().toPoint()))
            if cell is not None:
                double = event.type() == QEvent.Type.MouseButtonDblClick
                (self.layer_double_clicked if double else self.layer_pressed).emit(cell[0])
        return super().eventFilter(watched, event)

    def _cell_at(self, scene_pos: QPointF) -> tuple[int, int] | None:
        """(layer, position) of the cell at `scene_pos`, or None off the cells."""
        shown = self._shown()
        cell = cell_under(self.plot_item, scene_pos) if shown is not None else None
        if cell is None:
            return None
        (cells, rows), (row, position) = shown, cell
        if not (0 <= row < len(rows) and 0 <= position < cells.width):
            return None
        return int(rows.layers[row]), position

    def _tooltip_text(self, row: int, position: int) -> str:
        shown = self._shown()
        if shown is None or not 0 <= row < len(shown[1]):
            return ""
        cells, rows = shown
        head = int(rows.heads[row])
        return cells.cell_info(int(rows.layers[row]), position, None if head < 0 else head)
