"""The memory view: KV-cache bytes against context length, the run's measured bytes on its model's line, every
line told apart by colour and dash and named at its end, on log or linear axes."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, QSize, Qt
from PySide6.QtGui import QFont, QFontMetricsF, QPen
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QSpinBox, QVBoxLayout, QWidget

from kvviz.app import theme as themes
from kvviz.app.theme import Theme
from kvviz.app.views.base import nice_ceiling, style_plot
from kvviz.core.memory import DTYPE_BYTES, MEMORY_BUDGETS_GB, format_bytes, reference_architectures
from kvviz.core.records import RunPlan, StepRecord

MAX_CONTEXT = 131072  # the x axis ends at 128k tokens
# the log axes in the plot's log10 coordinates, labelled in tokens and in decimal bytes (as the GB lines)
X_TICKS = [(0.0, "1"), (1.0, "10"), (2.0, "100"), (3.0, "1k"), (4.0, "10k"), (5.0, "100k")]
Y_TICKS = [(3.0, "1 kB"), (6.0, "1 MB"), (9.0, "1 GB"), (12.0, "1 TB")]
LINEAR_X_TICKS = [(float(k * 32768), f"{32 * k}k" if k else "0") for k in range(5)]
SHOWN_REFERENCES = ("gpt2-xl", "Llama-3-8B", "Llama-3-70B", "Mistral-7B", "Falcon-7B", "DeepSeek-V2")
# each reference's dash pattern, in pen widths (() solid), in SHOWN_REFERENCES' order: lines that lie on one
# another (gpt2-xl and Llama-3-70B; Llama-3-8B and Mistral-7B up to its window) are told apart without colour
SERIES_DASHES = ((), (7.0, 2.5), (3.0, 2.0), (1.0, 1.8), (5.0, 1.8, 1.0, 1.8), (5.0, 1.8, 1.0, 1.8, 1.0, 1.8))
REFERENCE_WIDTH = 2.5  # pixels
MODEL_WIDTH = 4.5  # the loaded model's line, over the others
LABEL_GAP = 6  # pixels from a line's end to its name
SCALES = ("log", "linear")
PLOT_HEIGHT = 300  # pixels the plot asks for: a short column fits the view whole; a taller one gives it more


class MemoryPlot(pg.PlotWidget):
    """The memory view's plot, which asks for PLOT_HEIGHT (a plot widget asks 480, from its scene): in a scrolled
    column, the view's height for its width is its texts' and this."""

    def sizeHint(self) -> QSize:
        return QSize(super().sizeHint().width(), PLOT_HEIGHT)


def _contexts(extra: Sequence[int] = ()) -> np.ndarray:
    """Context lengths from 1 to MAX_CONTEXT, log-spaced, with `extra` ones (a sliding window's edge) in."""
    points = {int(round(v)) for v in np.logspace(0, math.log10(MAX_CONTEXT), 64)} | {MAX_CONTEXT, *extra}
    return np.array(sorted(p for p in points if 1 <= p <= MAX_CONTEXT), dtype=np.float64)


def byte_ticks(top: float) -> list[tuple[float, str]]:
    """Linear ticks from 0 to `top` bytes (a `nice_ceiling`), five steps, in decimal units as the GB lines."""
    step = top / 5
    unit, size = next(((u, s) for u, s in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)) if top >= 2 * s),
                      ("B", 1.0))
    return [(k * step, f"{k * step / size:g} {unit}" if k else "0") for k in range(6)]


def spread(targets: Sequence[float], height: float, low: float, high: float) -> list[float]:
    """Label centres as near `targets` (pixels, downwards) as they can be with `height` between any two, between
    `low` and `high`: labels that would overlap are stacked around their targets' mean."""
    order = sorted(range(len(targets)), key=lambda i: targets[i])
    clusters: list[tuple[float, list[int]]] = []  # (first centre, members from the top)
    for i in order:
        members = [i]
        while True:
            n = len(members)
            mean = sum(targets[j] for j in members) / n
            first = min(max(mean - (n - 1) * height / 2, low + height / 2), high - height / 2 - (n - 1) * height)
            if clusters and clusters[-1][0] + len(clusters[-1][1]) * height > first:
                members = clusters.pop()[1] + members  # overlaps the cluster above: one stack
                continue
            clusters.append((first, members))
            break
    centres = [0.0] * len(targets)
    for first, members in clusters:
        for k, i in enumerate(members):
            centres[i] = first + k * height
    return centres


def _line_end(curve: pg.PlotDataItem) -> tuple[float, float] | None:
    """The last point of `curve` as drawn (in the plot's coordinates: log10 on log axes), or None."""
    x, y = curve.getData()
    if x is None or len(x) == 0 or not np.isfinite(y[-1]):
        return None
    return float(x[-1]), float(y[-1])


def line_pen(colour: str, width: float, dashes: Sequence[float] = ()) -> QPen:
    """A cosmetic pen `width` pixels wide, solid or dashed with `dashes` (in pen widths)."""
    pen = pg.mkPen(colour, width=width)
    pen.setCosmetic(True)
    if dashes:
        pen.setCapStyle(Qt.PenCapStyle.FlatCap)
        pen.setDashPattern(list(dashes))
    return pen


class MemoryView(QWidget):
    """KV-cache bytes against context length (to 128k tokens), on log-log axes or linear ones (`set_scale`).

    The loaded model's line is the run plan's bytes per cached position times the positions (the
    engine planned it from the model's shape and dtype); the run's measured points are its records'
    `cache_bytes`, read from the cache's tensors, at the positions filled. Reference architectures from
    their published configs (kvviz.core.memory) are drawn for the chosen dtype and batch, each in its colour and
    dash, and horizontal lines mark 8, 24 and 80 GB. Every line is named at its right end (`end_labels()`),
    the names stacked where the lines meet. A view (views.base.RunViewProtocol); `points()`, `model_line()`
    and `reference_line(name)` return what is drawn.
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("memoryView")
        self._theme = themes.current()
        self._plan: RunPlan | None = None
        self._points: dict[int, int] = {}  # positions filled -> measured bytes
        self._dirty = False
        self._font_scale = 1.0
        self._label_font = QFont(self.font())
        self._framed: tuple | None = None  # (scale, share of the width for the lines, top) framed for

        self.heading = QLabel("<b>KV-cache memory</b>")
        self.formula = QLabel("")
        self.formula.setWordWrap(True)
        self.dtype_box = QComboBox()
        self.dtype_box.addItems(list(DTYPE_BYTES))
        self.dtype_box.setCurrentText("bfloat16")
        self.dtype_box.setToolTip("The number type of the reference architectures' caches")
        self.batch_spin = QSpinBox()
        self.batch_spin.setRange(1, 4096)
        self.batch_spin.setToolTip("Sequences cached side by side (the reference architectures)")
        self.scale_box = QComboBox()
        self.scale_box.addItems(list(SCALES))
        self.scale_box.setToolTip("log axes: every model from 1 token to 128k; linear axes: the cache grows by "
                                  "the same bytes with every token, a straight line")
        self.dtype_box.currentTextChanged.connect(self._references_changed)
        self.batch_spin.valueChanged.connect(self._references_changed)
        self.scale_box.currentTextChanged.connect(self._scale_changed)
        controls = QHBoxLayout()
        controls.addWidget(QLabel("references in"))
        controls.addWidget(self.dtype_box)
        controls.addWidget(QLabel("batch"))
        controls.addWidget(self.batch_spin)
        controls.addWidget(QLabel("axes"))
        controls.addWidget(self.scale_box)
        controls.addStretch(1)

        self.plot_widget = MemoryPlot()
        self.plot_item = self.plot_widget.getPlotItem()
        self.plot_item.setMenuEnabled(False)
        self.plot_item.hideButtons()
        vb = self.plot_item.getViewBox()
        vb.setMouseEnabled(x=False, y=False)
        self.plot_item.setLabel("bottom", "context length (tokens)")
        self.plot_item.setLabel("left", "KV-cache bytes")
        self.plot_item.getAxis("left").enableAutoSIPrefix(False)  # the tick labels carry the units
        self.plot_item.getAxis("bottom").enableAutoSIPrefix(False)
        self.reference_curves: dict[str, pg.PlotDataItem] = {}
        for name in SHOWN_REFERENCES:
            self.reference_curves[name] = self.plot_item.plot([], [])
        for z, curve in enumerate(self.reference_curves.values()):
            curve.setZValue(z + 1)  # dashed lines over the solid one they may lie on
        self.model_curve = self.plot_item.plot([], [])
        self.model_curve.setZValue(0)  # wide, under the thin lines that may lie on it (Falcon-7B does)
        self.points_curve = self.plot_item.plot([], [], pen=None, symbol="o", symbolSize=8)
        self.points_curve.setZValue(len(SHOWN_REFERENCES) + 1)
        self._labels: dict[str, tuple[pg.TextItem, pg.PlotCurveItem]] = {}  # line -> its name and leader
        for name in ("this model", *SHOWN_REFERENCES):
            self._labels[name] = (self._add_text(name, (0, 0.5)), pg.PlotCurveItem())
            vb.addItem(self._labels[name][1], ignoreBounds=True)
        self.points_label = self._add_text("measured", (0, 0))  # below the line, right of the last point
        self.budget_lines = []
        for gigabytes in MEMORY_BUDGETS_GB:
            line = pg.InfiniteLine(pos=math.log10(gigabytes * 1e9), angle=0, movable=False,
                                   label=f"{gigabytes} GB", labelOpts={"position": 0.04, "anchors": [(0, 1), (0, 1)]})
            self.plot_item.addItem(line)
            self.budget_lines.append(line)
        vb.sigResized.connect(self._frame)
        vb.sigTransformChanged.connect(self._place_labels)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.heading)
        layout.addWidget(self.formula)
        layout.addLayout(controls)
        layout.addWidget(self.plot_widget, 1)
        self.setMinimumWidth(380)
        self._apply_scale()
        self._apply_theme()
        self.set_font_scale(1.0)
        self._draw_references()

    def _add_text(self, text: str, anchor: tuple[float, float]) -> pg.TextItem:
        """A name drawn on the plot, over its lines, on the background's colour (the GB lines pass under it)."""
        item = pg.TextItem(text, anchor=anchor)
        item.textItem.document().setDocumentMargin(0)  # its box is its line of text: stacked names never cover
        item.setZValue(len(SHOWN_REFERENCES) + 2)
        self.plot_item.getViewBox().addItem(item, ignoreBounds=True)
        return item

    def sizeHint(self) -> QSize:
        return QSize(460, 480)  # a column: the run's views keep most of the width

    # ----- the view protocol -----
    def reset(self, plan: RunPlan) -> None:
        self._plan = plan.cached_plan if plan.twin is not None else plan
        self._points = {}
        self._dirty = True
        self.refresh()

    def apply(self, records: Sequence[StepRecord]) -> None:
        for record in records:
            passes = record.lockstep_passes()[0] if record.twin is not None else (record,)
            for run_pass in passes:
                if run_pass.use_cache and run_pass.cache_bytes > 0:
                    self._points[run_pass.fed_stop] = run_pass.cache_bytes
                    self._dirty = True

    def refresh(self) -> None:
        if not self._dirty:
            return
        self._dirty = False
        plan = self._plan
        per_position = plan.cache_bytes_per_position if plan is not None else 0
        if plan is None or per_position == 0:
            self.model_curve.setData([], [])
            self.points_curve.setData([], [])
            self.formula.setText(self._formula_text(None))
        else:
            x, y = self.model_line()
            self.model_curve.setData(x, y)
            px, py = self.points()
            self.points_curve.setData(px, py)
            self.formula.setText(self._formula_text(plan))
        self._frame()

    def set_font_scale(self, scale: float) -> None:
        self._font_scale = scale
        font = QFont(self.font())
        font.setPointSizeF(9.0 * scale)
        for widget in (self.heading, self.formula):
            widget.setFont(font)
        for name in ("left", "bottom"):
            self.plot_item.getAxis(name).setStyle(tickFont=font)
        self._label_font = QFont(self.font())
        self._label_font.setPointSizeF(10.0 * scale)  # the lines' names: a little larger than the ticks
        for name, (text, _leader) in self._labels.items():
            name_font = QFont(self._label_font)
            name_font.setBold(name == "this model")
            text.setFont(name_font)
        self.points_label.setFont(self._label_font)
        for line in self.budget_lines:
            line.label.setFont(font)
        self._frame()

    def set_theme(self, theme: Theme) -> None:
        if theme != self._theme:
            self._theme = theme
            self._apply_theme()
            self._dirty = True
            self.refresh()

    # ----- log or linear axes -----
    def set_scale(self, scale: str) -> None:
        """"log" (log-log axes, every model from 1 token to 128k) or "linear" (the growth as a straight line)."""
        if scale not in SCALES:
            raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
        self.scale_box.setCurrentText(scale)

    def scale(self) -> str:
        return self.scale_box.currentText()

    def _scale_changed(self) -> None:
        self._apply_scale()
        self._dirty = True
        self.refresh()

    def _apply_scale(self) -> None:
        log = self.scale() == "log"
        self.plot_item.setLogMode(x=log, y=log)
        for line, gigabytes in zip(self.budget_lines, MEMORY_BUDGETS_GB, strict=True):
            line.setPos(math.log10(gigabytes * 1e9) if log else gigabytes * 1e9)
        self.points_label.setVisible(log)  # on linear axes the run's few positions sit at the origin
        self._frame()

    # ----- what is drawn -----
    def model_line(self) -> tuple[np.ndarray, np.ndarray]:
        """The loaded model's line: positions, and the plan's bytes per cached position times them."""
        if self._plan is None or self._plan.cache_bytes_per_position == 0:
            return np.zeros(0), np.zeros(0)
        x = _contexts(sorted(self._points))
        return x, x * self._plan.cache_bytes_per_position

    def points(self) -> tuple[np.ndarray, np.ndarray]:
        """The run's measured points: positions filled, bytes read from the cache's tensors."""
        positions = sorted(self._points)
        return (np.array(positions, dtype=np.float64),
                np.array([self._points[p] for p in positions], dtype=np.float64))

    def reference_line(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """A reference architecture's bytes at each context, for the chosen dtype and batch."""
        arch = next(a for a in reference_architectures() if a.name == name)
        x = _contexts([arch.sliding_window] if arch.sliding_window else [])
        dtype, batch = self.dtype_box.currentText(), self.batch_spin.value()
        return x, np.array([arch.cache_bytes(int(c), dtype, batch) for c in x], dtype=np.float64)

    def end_labels(self) -> dict[str, pg.TextItem]:
        """Each drawn line's name at its right end: "this model" and the references, by name."""
        return {name: text for name, (text, _leader) in self._labels.items() if text.isVisible()}

    def curves(self) -> dict[str, pg.PlotDataItem]:
        """Each line's curve by the name it is labelled with."""
        return {"this model": self.model_curve, **self.reference_curves}

    def _references_changed(self) -> None:
        self._draw_references()

    def _draw_references(self) -> None:
        for name, curve in self.reference_curves.items():
            curve.setData(*self.reference_line(name))
        self._frame()

    def _frame(self, *_args: object) -> None:
        """The axes' ranges and ticks for the scale, with room on the right for the lines' names."""
        vb = self.plot_item.getViewBox()
        metrics = QFontMetricsF(self._label_font)
        widest = max(metrics.horizontalAdvance(f" {name} ") for name in self._labels) + 2 * LABEL_GAP
        room = max(vb.width() - widest, vb.width() / 2)  # pixels for the lines
        share = vb.width() / room if room > 0 else 1.0
        ends = [end[1] for end in map(_line_end, self.curves().values()) if end is not None]
        top = nice_ceiling(max(ends, default=1e9)) if self.scale() == "linear" else 0.0
        key = (self.scale(), round(share, 4), top)
        if key == self._framed:  # setting the same ranges and ticks again would repaint the axes
            self._place_labels()
            return
        self._framed = key
        if self.scale() == "log":
            span = math.log10(MAX_CONTEXT)
            left = -0.02 * span
            self.plot_item.setXRange(left, left + (span - left) * share, padding=0)
            self.plot_item.setYRange(3, math.log10(2e12), padding=0.02)
            self.plot_item.getAxis("bottom").setTicks([X_TICKS, []])
            self.plot_item.getAxis("left").setTicks([Y_TICKS, []])
        else:
            self.plot_item.setXRange(0, MAX_CONTEXT * share, padding=0)
            self.plot_item.setYRange(0, top * 1.03, padding=0)  # room for the top tick's label
            self.plot_item.getAxis("bottom").setTicks([LINEAR_X_TICKS, []])
            self.plot_item.getAxis("left").setTicks([byte_ticks(top), []])
        self._place_labels()

    def _place_labels(self, *_args: object) -> None:
        """Each line's name just right of its end, level with it, or stacked with a leader where ends meet."""
        vb = self.plot_item.getViewBox()
        box = vb.sceneBoundingRect()
        ends: dict[str, QPointF] = {}
        for name, curve in self.curves().items():
            end = _line_end(curve)
            text, leader = self._labels[name]
            text.setVisible(end is not None)
            leader.setVisible(end is not None)
            if end is not None:
                ends[name] = vb.mapViewToScene(QPointF(*end))
        height = QFontMetricsF(self._label_font).height() * 1.05
        names = list(ends)
        centres = spread([ends[n].y() for n in names], height, box.top(), box.bottom())
        for name, centre in zip(names, centres, strict=True):
            text, leader = self._labels[name]
            end = ends[name]
            at = vb.mapSceneToView(QPointF(end.x() + LABEL_GAP, centre))
            text.setPos(at)
            text.updateTransform()  # its size on screen, now (it follows the view only when painted)
            start = vb.mapSceneToView(QPointF(end.x() + 1, end.y()))
            leader.setData([start.x(), at.x()], [start.y(), at.y()])
        last = _line_end(self.points_curve)
        if last is not None:
            self.points_label.setPos(*last)
        self.points_label.setVisible(self.scale() == "log" and last is not None)

    def _formula_text(self, plan: RunPlan | None) -> str:
        muted = self._theme.muted
        general = ("bytes per token = 2 \u00d7 layers \u00d7 KV heads \u00d7 head dim \u00d7 bytes per element "
                   "(\u00d7 batch)")
        if plan is None:
            return f"{general}<br><span style='color:{muted}'>no cache in this run: no measured points</span>"
        last = max(self._points) if self._points else 0
        measured = (f"; measured {format_bytes(self._points[last])} at {last} positions" if last else "")
        axes = ("log axes: every line rises 10\u00d7 per 10\u00d7 tokens (linear growth), the gaps between them are "
                "ratios" if self.scale() == "log" else
                "linear axes: each token adds the same bytes, so every line is straight")
        return (f"{general}<br><span style='color:{self._theme.teal}'>{plan.model_name}: "
                f"{plan.cache_bytes_per_position:,} bytes per token{measured}</span> "
                f"<span style='color:{muted}'>(lines for other models: their published configs; {axes})</span>")

    def _apply_theme(self) -> None:
        theme = self._theme
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)  # its own background, in a column or a slide
        self.setStyleSheet(f"QWidget#memoryView {{ background: {theme.background}; }} "
                           f"QWidget#memoryView QLabel {{ color: {theme.foreground}; background: transparent; }}")
        self.plot_widget.setBackground(theme.background)
        style_plot(self.plot_item, theme)
        self.model_curve.setPen(line_pen(theme.teal, MODEL_WIDTH))
        colours = {"this model": theme.teal}
        for (name, curve), colour, dashes in zip(self.reference_curves.items(), theme.series, SERIES_DASHES,
                                                 strict=True):
            curve.setPen(line_pen(colour, REFERENCE_WIDTH, dashes))
            colours[name] = colour
        for name, (text, leader) in self._labels.items():
            text.setColor(colours[name])
            text.fill = pg.mkBrush(theme.background)
            leader.setPen(line_pen(colours[name], 1.0))
        self.points_curve.setSymbolBrush(pg.mkBrush(theme.amber))
        self.points_curve.setSymbolPen(pg.mkPen(theme.foreground, width=1))
        self.points_label.setColor(theme.amber)
        self.points_label.fill = pg.mkBrush(theme.background)
        for line in self.budget_lines:
            line.setPen(pg.mkPen(theme.muted, width=1, style=Qt.PenStyle.DashLine))
            line.label.setColor(theme.muted)
        self.formula.setTextFormat(Qt.TextFormat.RichText)
