"""The serving view's chart: the KV cache's bytes pass by pass, paged (the blocks in use) against one contiguous
buffer per request at the longest length (reserved from the start) and the bytes the requests' positions take."""

from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QFont

from kvviz.app import theme as themes
from kvviz.app.theme import Theme
from kvviz.app.views.base import style_plot
from kvviz.core.batch_records import BatchPlan, BatchRecord

MIB = 1024 * 1024
LINES = (("contiguous", "contiguous, reserved"), ("used", "positions held"), ("paged", "paged: blocks in use"))


LEGEND_ROOM = 1.4  # the y range's top, in contiguous reservations, at the least: a legend's row above the lines
MAX_ROOM = 4.0  # and at the most (a chart so short that its legend takes most of it)


class ServingChart(pg.PlotWidget):
    """Bytes against the pass; `reset(plan)` frames the run, `show(records)` draws every pass so far."""

    def __init__(self) -> None:
        super().__init__()
        self.setObjectName("servingChart")
        self.setMinimumHeight(150)
        self.setMenuEnabled(False)
        self.setMouseEnabled(x=False, y=False)
        self.hideButtons()
        self._theme = themes.current()
        self._scale = 1.0
        self._headroom = LEGEND_ROOM  # the y range over the contiguous line: room for the legend above the lines
        self._plan: BatchPlan | None = None
        self.curves = {key: self.plot([], [], name=label) for key, label in LINES}
        self.legend = self.addLegend(offset=(10, 5))
        self.legend.setColumnCount(3)  # one row over the lines, in the room the y range leaves above them
        for key, label in LINES:
            self.legend.addItem(self.curves[key], label)
        self._style()

    def _style(self) -> None:
        t, scale = self._theme, self._scale
        self.setBackground(t.background)
        plot = self.getPlotItem()
        style_plot(plot, t)
        font = QFont()
        font.setPointSizeF(max(7.0, 9.0 * scale))
        for name in ("left", "bottom"):
            plot.getAxis(name).setTickFont(font)
        size = f"{max(8, round(10 * scale))}pt"
        plot.setLabel("left", "KV cache (MiB)", color=t.muted, size=size)
        plot.setLabel("bottom", "pass", color=t.muted, size=size)
        label_font = QFont()
        label_font.setPointSizeF(max(8.0, 10.0 * scale))  # the axis titles' own font (the size above is the HTML's)
        for name in ("left", "bottom"):
            plot.getAxis(name).label.setFont(label_font)
        plot.setTitle("KV cache memory", color=t.foreground,
                      size=f"{max(9, round(12 * scale))}pt")
        pens = {"contiguous": pg.mkPen(t.alert, width=2.5, style=Qt.PenStyle.DashLine),
                "used": pg.mkPen(t.muted, width=2, style=Qt.PenStyle.DotLine), "paged": pg.mkPen(t.teal, width=3)}
        for key, curve in self.curves.items():
            curve.setPen(pens[key])
            curve.setSymbol("o" if key == "paged" else None)
            curve.setSymbolBrush(t.teal)
            curve.setSymbolPen(None)
            curve.scatter.setBrush(t.teal)  # the legend's sample reads it
        self.legend.setBrush(pg.mkBrush(*themes.rgba(t.background, 200)))
        for _sample, label in self.legend.items:
            label.setText(label.text, size=size, color=t.foreground)
        self._fit_legend()

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._fit_legend()

    def _fit_legend(self) -> None:
        """The legend in three columns where the plot is wide enough, else two or one: at 720p its third name
        ran past the plot's right edge ("paged: l")."""
        if getattr(self, "legend", None) is None or self.getPlotItem() is None:  # a resize while pyqtgraph builds it
            return
        room = self.getPlotItem().getViewBox().width() - 16
        for columns in (3, 2, 1):
            self.legend.setColumnCount(columns)
            self.legend.updateSize()
            if self.legend.boundingRect().width() <= room or columns == 1:
                break
        # the contiguous line (the highest) stays under the legend: the share of the plot's height the legend and
        # its offset take sets how far above that line the y range goes
        height = self.getPlotItem().getViewBox().height()
        share = (self.legend.boundingRect().height() + 12) / height if height > 0 else 0.0
        headroom = round(min(MAX_ROOM, max(LEGEND_ROOM, 1.0 / max(0.05, 1.0 - share - 0.04))), 2)
        if headroom != self._headroom:
            self._headroom = headroom
            self._frame_y()

    def sizeHint(self) -> QSize:
        return QSize(600, self.minimumHeight())  # it takes what room is left: the page fits a 720p screen

    def reset(self, plan: BatchPlan) -> None:
        self._plan = plan
        for curve in self.curves.values():
            curve.setData([], [])
        self.setXRange(0.5, plan.passes + 0.5, padding=0)
        self._frame_y()

    def _frame_y(self) -> None:
        if self._plan is not None:
            self.setYRange(0, self._plan.contiguous_reserved_bytes / MIB * self._headroom, padding=0)

    def clear_lines(self) -> None:
        self._plan = None
        for curve in self.curves.values():
            curve.setData([], [])

    def show(self, records: list[BatchRecord]) -> None:
        if self._plan is None:
            return
        xs = [r.step + 1 for r in records]
        self.curves["paged"].setData(xs, [r.paged_bytes / MIB for r in records])
        self.curves["used"].setData(xs, [r.used_bytes / MIB for r in records])
        self.curves["contiguous"].setData([0.5, self._plan.passes + 0.5],
                                          [self._plan.contiguous_reserved_bytes / MIB] * 2)

    def set_font_scale(self, scale: float) -> None:
        self._scale = scale
        self._style()

    def set_theme(self, theme: Theme) -> None:
        self._theme = theme
        self._style()
