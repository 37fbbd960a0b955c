"""The memory plot's line names: each at its line's right end, stacked with a leader where ends meet."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, Qt
from PySide6.QtGui import QFont, QFontMetricsF, QPen

from kvviz.app.views.memory_state import spread

LABEL_GAP = 6  # pixels from a line's end to its name


def line_pen(colour: str, width: float, dashes: Sequence[float] = ()) -> QPen:
    """A cosmetic pen `width` pixels wide, solid or dashed with `dashes` (in pen widths)."""
    pen = pg.mkPen(colour, width=width)
    pen.setCosmetic(True)
    if dashes:
        pen.setCapStyle(Qt.PenCapStyle.FlatCap)
        pen.setDashPattern(list(dashes))
    return pen


def line_end(curve: pg.PlotDataItem) -> tuple[float, float] | None:
    """The last point of `curve` as drawn (in the plot's coordinates: log10 on log axes), or None."""
    x, y = curve.getData()
    if x is None or len(x) == 0 or not np.isfinite(y[-1]):
        return None
    return float(x[-1]), float(y[-1])


class LineNames:
    """`names` drawn in `view_box` over its lines at `z`, the first (the loaded model's) in bold, each with a
    leader from its line's end; and "measured" below the run's last point. `place` puts them where the lines end."""

    def __init__(self, view_box: pg.ViewBox, names: Sequence[str], z: float, font: QFont) -> None:
        self._view_box = view_box
        self._z = z
        self._bold = names[0]
        self.font = QFont(font)
        self.labels: dict[str, tuple[pg.TextItem, pg.PlotCurveItem]] = {}  # line -> its name and leader
        for name in names:
            self.labels[name] = (self._add_text(name, (0, 0.5)), pg.PlotCurveItem())
            view_box.addItem(self.labels[name][1], ignoreBounds=True)
        self.points_label = self._add_text("measured", (0, 0))  # below the line, right of the last point

    def _add_text(self, text: str, anchor: tuple[float, float]) -> pg.TextItem:
        """A name drawn on the plot, over its lines, on the background's colour (the GB lines pass under it)."""
        item = pg.TextItem(text, anchor=anchor)
        item.textItem.document().setDocumentMargin(0)  # its box is its line of text: stacked names never cover
        item.setZValue(self._z)
        self._view_box.addItem(item, ignoreBounds=True)
        return item

    def shown(self) -> dict[str, pg.TextItem]:
        return {name: text for name, (text, _leader) in self.labels.items() if text.isVisible()}

    def widest(self) -> float:
        """Pixels right of the lines' ends for the widest name."""
        metrics = QFontMetricsF(self.font)
        return max(metrics.horizontalAdvance(f" {name} ") for name in self.labels) + 2 * LABEL_GAP

    def set_font(self, font: QFont) -> None:
        self.font = QFont(font)
        for name, (text, _leader) in self.labels.items():
            name_font = QFont(font)
            name_font.setBold(name == self._bold)
            text.setFont(name_font)
        self.points_label.setFont(font)

    def set_colours(self, colours: dict[str, str], background: str, measured: str) -> None:
        """Each name in its line's colour, on `background`; "measured" in `measured`."""
        for name, (text, leader) in self.labels.items():
            text.setColor(colours[name])
            text.fill = pg.mkBrush(background)
            leader.setPen(line_pen(colours[name], 1.0))
        self.points_label.setColor(measured)
        self.points_label.fill = pg.mkBrush(background)

    def place(self, curves: dict[str, pg.PlotDataItem], points_curve: pg.PlotDataItem, log: bool) -> None:
        """Each line's name just right of its end, level with it, or stacked with a leader where ends meet;
        "measured" at `points_curve`'s last point, on `log` axes only."""
        vb = self._view_box
        box = vb.sceneBoundingRect()
        ends: dict[str, QPointF] = {}
        for name, curve in curves.items():
            end = line_end(curve)
            text, leader = self.labels[name]
            text.setVisible(end is not None)
            leader.setVisible(end is not None)
            if end is not None:
                ends[name] = vb.mapViewToScene(QPointF(*end))
        height = QFontMetricsF(self.font).height() * 1.05
        names = list(ends)
        centres = spread([ends[n].y() for n in names], height, box.top(), box.bottom())
        for name, centre in zip(names, centres, strict=True):
            text, leader = self.labels[name]
            end = ends[name]
            at = vb.mapSceneToView(QPointF(end.x() + LABEL_GAP, centre))
            text.setPos(at)
            text.updateTransform()  # its size on screen, now (it follows the view only when painted)
            start = vb.mapSceneToView(QPointF(end.x() + 1, end.y()))
            leader.setData([start.x(), at.x()], [start.y(), at.y()])
        last = line_end(points_curve)
        if last is not None:
            self.points_label.setPos(*last)
        self.points_label.setVisible(log and last is not None)
