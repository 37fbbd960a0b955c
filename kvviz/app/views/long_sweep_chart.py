"""The long sweep's chart: ms per cached token step against the length (a log axis), one solid line per kind of
cache and its prediction by the bandwidth bound dashed in the same colour, and the crossover, where the exact
cache holds as many bytes as the weights, marked by a vertical line or named in a note when it lies further."""

from __future__ import annotations

import html
import math

import pyqtgraph as pg
from PySide6.QtGui import QFont
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from kvviz.app import theme as themes
from kvviz.app.theme import Theme
from kvviz.app.views.base import style_plot
from kvviz.app.views.line_names import line_pen
from kvviz.measure.cache_speed import CacheSweepResult

MEASURED_WIDTH = 3.0  # pixels
PREDICTED_WIDTH = 2.0
PREDICTED_DASHES = (4.0, 3.0)  # in pen widths
CROSSOVER_DASHES = (2.0, 3.0)
HEADROOM = 1.3  # the y range's top over the highest point: room for the crossover's label over the lines


def variant_colours(theme: Theme) -> tuple[str, ...]:
    """A colour for each variant, in the sweep's order: teal (the app's "with the cache") for the baseline, then
    the theme's series colours and amber, told apart from one another in both themes."""
    s = theme.series
    return theme.teal, s[0], theme.amber, s[2], s[3], s[6], s[5], s[4]


def length_text(length: float) -> str:
    """'64', '512', '1k', '32k', '1.5k'."""
    if length < 1000:
        return f"{length:g}"
    return f"{length / 1024:g}k" if length % 1024 == 0 else f"{length / 1000:.3g}k"


def share_text(fraction: float) -> str:
    """'83%', '4.2%', '0.31%': a share the bound's speed, with two figures where it is small."""
    return f"{fraction:.0%}" if fraction >= 0.1 else f"{fraction * 100:.2g}%"


def colour_of(theme: Theme, index: int) -> str:
    colours = variant_colours(theme)
    return colours[index % len(colours)]


def long_headline(result: CacheSweepResult, theme: Theme, final: bool = True) -> str:
    """The text line over the chart (rich text): the result's headline, the read rate it measured and each
    variant's share of the bound's speed at the longest length, its name in its line's colour."""
    last = result.lengths[-1]
    shares = ", ".join(f"<span style='color:{colour_of(theme, i)}'>{html.escape(curve.name)}</span> "
                       f"{share_text(curve.fraction_of_prediction[-1])}" for i, curve in enumerate(result.variants))
    said = f"<b>{html.escape(result.headline())}</b>" if final else \
        f"Measured so far, up to {last:,} positions (every turn's median comes at the end)."
    return (f"{said} Read rate measured: {result.read_bytes_per_second / 1e9:.1f} GB/s. At {last:,} positions each "
            f"step ran at this share of the speed the bandwidth bound predicts: {shares}.")


def crossover_note(result: CacheSweepResult) -> str:
    """Where the baseline's cache holds as many bytes as the weights: right of the line on the chart, or at what
    length it would, beyond the longest."""
    curve, last = result.baseline, result.lengths[-1]
    weights = f"the weights ({result.weight_bytes / 1e6:,.1f} MB)"
    if curve.crossover_length is None:
        return (f"The {curve.name} cache never holds as many bytes as {weights}: the weights are most of what a "
                f"step reads.")
    if curve.crossover_length > last:
        return (f"The {curve.name} cache would hold as many bytes as {weights} at {curve.crossover_length:,} "
                f"positions, beyond the longest length measured ({last:,}): here the weights are most of what a "
                f"step reads.")
    return (f"Right of the dotted line ({curve.crossover_length:,} positions) the {curve.name} cache holds more bytes "
            f"than {weights}: the cache is most of what a step reads, and a cache of fewer bytes steps faster.")


class LongSweepChart(QWidget):
    """One long sweep (kvviz.measure.cache_speed.CacheSweepResult), drawn by `show_result(result)` (a partial one as it
    comes): the plot, a legend of the lines under it (each variant's `label` in its colour), and the crossover's
    note. Its lines are made once per variant and updated in place; `clear()` empties it."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._theme = themes.current()
        self._font_scale = 1.0
        self.result: CacheSweepResult | None = None
        self.plot_widget = pg.PlotWidget()
        self.plot_item = self.plot_widget.getPlotItem()
        self.plot_item.setMenuEnabled(False)
        self.plot_item.hideButtons()
        self.plot_item.getViewBox().setMouseEnabled(x=False, y=False)
        self.plot_item.setLogMode(x=True, y=False)
        self.plot_item.setLabel("bottom", "sequence length (positions, log scale)")
        self.plot_item.setLabel("left", "ms per cached token step")
        self.plot_item.getAxis("left").enableAutoSIPrefix(False)
        self.plot_item.setContentsMargins(0, 10, 12, 0)  # the top tick's label and the last length's stay whole
        self.measured: list[pg.PlotDataItem] = []  # a solid line per variant
        self.predicted: list[pg.PlotDataItem] = []  # its prediction, dashed
        self.crossover_line = pg.InfiniteLine(angle=90, movable=False, label="",
                                              labelOpts={"position": 0.96, "anchors": [(0, 0), (0, 0)]})
        self.plot_item.addItem(self.crossover_line, ignoreBounds=True)
        self.crossover_line.hide()
        self.legend = QLabel()
        self.legend.setWordWrap(True)
        self.note = QLabel()
        self.note.setWordWrap(True)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.plot_widget, 1)
        layout.addWidget(self.legend)
        layout.addWidget(self.note)
        self._apply_theme()
        self._apply_fonts()

    # ----- what it shows -----
    def clear(self) -> None:
        self.result = None
        for curve in (*self.measured, *self.predicted):
            curve.setData([], [])
        self.crossover_line.hide()
        self.legend.setText("")
        self.note.setText("")

    def show_result(self, result: CacheSweepResult) -> None:
        self.result = result
        self._draw()

    def _draw(self) -> None:
        result = self.result
        if result is None:
            return
        while len(self.measured) < len(result.variants):
            self.measured.append(self.plot_item.plot([], [], symbol="o"))
            self.predicted.append(self.plot_item.plot([], []))
            self._style_lines()
        lengths = list(result.lengths)
        for i, (measured, predicted) in enumerate(zip(self.measured, self.predicted, strict=True)):
            curve = result.variants[i] if i < len(result.variants) else None
            measured.setData(lengths if curve else [], list(curve.ms) if curve else [])
            predicted.setData(lengths if curve else [], list(curve.predicted_ms) if curve else [])
        self._frame(result)
        self._show_legend()

    def _frame(self, result: CacheSweepResult) -> None:
        """The axes: a tick at every length measured; from 0 ms to above the highest point; the crossover's
        line where it lies within (or before) the lengths measured."""
        first, last = result.lengths[0], result.lengths[-1]
        crossover = result.baseline.crossover_length
        inside = crossover is not None and crossover <= last
        low = min(first, crossover) if inside else first
        self.plot_item.getAxis("bottom").setTicks([[(math.log10(n), length_text(n)) for n in result.lengths]])
        span = max(math.log10(last) - math.log10(low), 0.3)
        self.plot_item.setXRange(math.log10(low) - 0.04 * span, math.log10(last) + 0.04 * span, padding=0.0)
        top = max(max(max(c.ms), max(c.predicted_ms)) for c in result.variants)
        self.plot_item.setYRange(0, top * HEADROOM, padding=0.0)
        self.crossover_line.setVisible(inside)
        if inside:
            x = math.log10(crossover)
            self.crossover_line.setPos(x)
            right_half = (x - math.log10(low)) / span > 0.55  # the label on the side with room
            self.crossover_line.label.anchors = [(1.0, 0.0), (1.0, 0.0)] if right_half else [(0.0, 0.0), (0.0, 0.0)]
            self.crossover_line.label.setFormat(f" cache bytes = weight bytes \n at {crossover:,} positions ")
            self.crossover_line.label.updatePosition()
        self.note.setText(crossover_note(result))

    def _show_legend(self) -> None:
        result, t = self.result, self._theme
        if result is None:
            return
        entries = [f"<span style='color:{colour_of(t, i)}'><b>\u2501\u2501</b></span>&nbsp;"
                   f"{html.escape(curve.label).replace(' ', '&nbsp;')}" for i, curve in enumerate(result.variants)]
        entries.append(f"<span style='color:{t.muted}'>\u2504\u2504&nbsp;dashed:&nbsp;what&nbsp;the&nbsp;bandwidth"
                       f"&nbsp;bound&nbsp;predicts,&nbsp;in&nbsp;the&nbsp;line's&nbsp;colour</span>")
        self.legend.setText(" &nbsp;&nbsp; ".join(entries))

    # ----- looks -----
    def set_theme(self, theme: Theme) -> None:
        self._theme = theme
        self._apply_theme()
        self._show_legend()

    def set_font_scale(self, scale: float) -> None:
        self._font_scale = scale
        self._apply_fonts()

    def _apply_theme(self) -> None:
        t = self._theme
        self.plot_widget.setBackground(t.background)
        style_plot(self.plot_item, t)
        self.crossover_line.setPen(line_pen(t.foreground, 1.5, CROSSOVER_DASHES))
        self.crossover_line.label.setColor(t.foreground)
        self.note.setStyleSheet(f"color: {t.muted};")
        self.legend.setStyleSheet(f"color: {t.foreground};")
        self._style_lines()

    def _style_lines(self) -> None:
        t, size = self._theme, max(5, round(7 * self._font_scale))
        for i, (measured, predicted) in enumerate(zip(self.measured, self.predicted, strict=True)):
            colour = colour_of(t, i)
            measured.setPen(line_pen(colour, MEASURED_WIDTH))
            measured.setSymbolBrush(colour)
            measured.setSymbolPen(None)
            measured.setSymbolSize(size)
            predicted.setPen(line_pen(colour, PREDICTED_WIDTH, PREDICTED_DASHES))

    def _apply_fonts(self) -> None:
        scale = self._font_scale
        tick = QFont(self.font())
        tick.setPointSizeF(10.0 * scale)
        for name in ("bottom", "left"):
            axis = self.plot_item.getAxis(name)
            axis.setTickFont(tick)
            axis.label.setFont(tick)
        self.crossover_line.label.setFont(tick)
        for label, points in ((self.legend, 10.5), (self.note, 10.0)):
            font = QFont(self.font())
            font.setPointSizeF(points * scale)
            label.setFont(font)
        self._style_lines()
