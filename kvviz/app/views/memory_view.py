"""The memory view: KV-cache bytes against context length, the run's measured bytes on its model's line, every
line told apart by colour and dash and named at its end, on log or linear axes."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QFont
from PySide6.QtWidgets import QComboBox, QLabel, QSpinBox, QVBoxLayout, QWidget

from kvviz.app import theme as themes
from kvviz.app.theme import Theme
from kvviz.app.views.base import nice_ceiling, style_plot
from kvviz.app.views.flow_layout import FlowLayout
from kvviz.app.views.line_names import LineNames, line_end, line_pen
from kvviz.app.views.memory_state import MAX_CONTEXT, MemoryState, byte_ticks, reference_bytes
from kvviz.core.memory import MEMORY_BUDGETS_GB, PRECISIONS
from kvviz.core.records import RunPlan, StepRecord

# the log axes in the plot's log10 coordinates, labelled in tokens and in decimal bytes (as the GB lines)
X_TICKS = [(0.0, "1"), (1.0, "10"), (2.0, "100"), (3.0, "1k"), (4.0, "10k"), (5.0, "100k")]
Y_TICKS = [(3.0, "1 kB"), (6.0, "1 MB"), (9.0, "1 GB"), (12.0, "1 TB")]
LINEAR_X_TICKS = [(float(k * 32768), f"{32 * k}k" if k else "0") for k in range(5)]
SHOWN_REFERENCES = ("gpt2-xl", "Llama-3-8B", "Llama-3-70B", "Mistral-7B", "Falcon-7B", "DeepSeek-V2",
                    "DeepSeek-V2-Lite")
# each reference's dash pattern, in pen widths (() solid), in SHOWN_REFERENCES' order: lines that lie on one
# another (gpt2-xl and Llama-3-70B; Llama-3-8B and Mistral-7B up to its window) are told apart without colour
SERIES_DASHES = ((), (7.0, 2.5), (3.0, 2.0), (1.0, 1.8), (5.0, 1.8, 1.0, 1.8), (5.0, 1.8, 1.0, 1.8, 1.0, 1.8),
                 (2.0, 3.0))
REFERENCE_WIDTH = 2.5  # pixels
MODEL_WIDTH = 4.5  # the loaded model's line, over the others
SCALES = ("log", "linear")
PART_NAMES = ("its growing part", "its flat part")  # a model whose layers differ: its line's two parts
PLOT_HEIGHT = 300  # pixels the plot asks for: a short column fits the view whole; a taller one gives it more


class MemoryPlot(pg.PlotWidget):
    """The memory view's plot, which asks for PLOT_HEIGHT (a plot widget asks 480, from its scene): in a scrolled
    column, the view's height for its width is its texts' and this."""

    def sizeHint(self) -> QSize:
        return QSize(super().sizeHint().width(), PLOT_HEIGHT)


class MemoryView(QWidget):
    """KV-cache bytes against context length (to 128k tokens), on log-log axes or linear ones (`set_scale`).

    Every line is drawn in one precision and batch, the chosen ones (a run starts the view at its own
    precision), and the left axis names them: like is compared with like. The loaded model's line is its cache
    as its family states it (the run plan's `cache_shape`, the figures `kvviz memory` prints); the run's measured
    points are its records' `cache_bytes`, read from the cache's tensors, at the positions filled, drawn when the
    chosen precision and batch are the run's. Reference architectures from their published configs
    (kvviz.core.memory) are drawn each in its colour and dash, and horizontal lines mark 8, 24 and 80 GB. Every
    line is named at its right end (`end_labels()`), the names stacked where the lines meet. A view
    (views.base.RunViewProtocol); `points()`, `model_line()` and `reference_line(name)` return what is drawn.
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("memoryView")
        self._theme = themes.current()
        self._state = MemoryState()  # the run's plan and measured bytes
        self._dirty = False
        self._font_scale = 1.0
        self._framed: tuple | None = None  # (scale, share of the width for the lines, top) framed for

        self.heading = QLabel("<b>KV-cache memory</b>")
        self.formula = QLabel("")
        self.formula.setWordWrap(True)
        self.dtype_box = QComboBox()
        self.dtype_box.addItems(list(PRECISIONS))
        self.dtype_box.setCurrentText("bfloat16")
        self.dtype_box.setToolTip("The number type every line's cache is stored in, this model's included (a run "
                                  "starts at its own); int8, int4 and fp8 with a 4-byte scale per vector")
        self.batch_spin = QSpinBox()
        self.batch_spin.setRange(1, 4096)
        self.batch_spin.setToolTip("Sequences cached side by side, on every line (the run's measured points are "
                                   "one sequence's)")
        self.scale_box = QComboBox()
        self.scale_box.addItems(list(SCALES))
        self.scale_box.setToolTip("log axes: every model from 1 token to 128k; linear axes: the cache grows by "
                                  "the same bytes with every token, a straight line")
        self.dtype_box.currentTextChanged.connect(self._references_changed)
        self.batch_spin.valueChanged.connect(self._references_changed)
        self.scale_box.currentTextChanged.connect(self._scale_changed)
        controls = FlowLayout(spacing=6)  # wraps onto a second line where a zoomed slide or a narrow column needs it
        self.controls = [QLabel("precision"), self.dtype_box, QLabel("batch"), self.batch_spin, QLabel("axes"),
                         self.scale_box]  # sized with the texts (set_font_scale): readable on a slide too
        for widget in self.controls:
            controls.addWidget(widget)

        self.plot_widget = MemoryPlot()
        self.plot_item = self.plot_widget.getPlotItem()
        self.plot_item.setMenuEnabled(False)
        self.plot_item.hideButtons()
        vb = self.plot_item.getViewBox()
        vb.setMouseEnabled(x=False, y=False)
        self.plot_item.setLabel("bottom", "tokens of context")
        self._label_axes()
        self.plot_item.getAxis("left").enableAutoSIPrefix(False)  # the tick labels carry the units
        self.plot_item.getAxis("bottom").enableAutoSIPrefix(False)
        self.reference_curves: dict[str, pg.PlotDataItem] = {}
        for name in SHOWN_REFERENCES:
            self.reference_curves[name] = self.plot_item.plot([], [])
        for z, curve in enumerate(self.reference_curves.values()):
            curve.setZValue(z + 1)  # dashed lines over the solid one they may lie on
        self.model_curve = self.plot_item.plot([], [])
        self.model_curve.setZValue(0)  # wide, under the thin lines that may lie on it (Falcon-7B does)
        # a model whose layers differ: the part of its line that grows (full layers) and the flat part (windows once
        # full, linear-attention states), each named; they sum to the model's line
        self.part_curves = {name: self.plot_item.plot([], []) for name in PART_NAMES}
        self.points_curve = self.plot_item.plot([], [], pen=None, symbol="o", symbolSize=8)
        self.points_curve.setZValue(len(SHOWN_REFERENCES) + 1)
        self.line_names = LineNames(vb, ("this model", *PART_NAMES, *SHOWN_REFERENCES), len(SHOWN_REFERENCES) + 2,
                                    QFont(self.font()))  # over the lines and the points
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

    def sizeHint(self) -> QSize:
        return QSize(460, 480)  # a column: the run's views keep most of the width

    # ----- the view protocol -----
    def reset(self, plan: RunPlan) -> None:
        self._state = MemoryState(plan)
        self._dirty = True
        if self._state.precision:  # the run's own precision: its measured points on its line, every line alike
            self.dtype_box.setCurrentText(self._state.precision)
        self.refresh()

    def apply(self, records: Sequence[StepRecord]) -> None:
        for record in records:
            if self._state.apply(record):
                self._dirty = True

    def refresh(self) -> None:
        if not self._dirty:
            return
        self._dirty = False
        plan = self._state.plan
        per_position = plan.cache_bytes_per_position if plan is not None else 0
        parts = None
        if plan is None or per_position == 0:
            self.model_curve.setData([], [])
            self.points_curve.setData([], [])
        else:
            x, y = self.model_line()
            self.model_curve.setData(x, y)
            self.points_curve.setData(*self.points())
            parts = self.model_parts()
        for curve, part in zip(self.part_curves.values(), parts[1:] if parts is not None else (None, None),
                               strict=True):
            curve.setData(*((parts[0], part) if part is not None else ([], [])))
        self.formula.setText(self._state.formula_text(self.scale(), self._theme, self.precision()))
        self._label_axes()
        self._frame()

    def set_font_scale(self, scale: float) -> None:
        self._font_scale = scale
        font = QFont(self.font())
        font.setPointSizeF(9.0 * scale)
        for widget in (self.heading, self.formula):
            widget.setFont(font)
        label_font = QFont(self.font())
        label_font.setPointSizeF(10.0 * scale)  # the lines' names and the axis titles: a little larger than ticks
        for name in ("left", "bottom"):
            axis = self.plot_item.getAxis(name)
            axis.setStyle(tickFont=font)
            axis.label.setFont(label_font)
        for widget in self.controls:
            widget.setFont(font)
        self.line_names.set_font(label_font)
        for line in self.budget_lines:
            line.label.setFont(font)
        margins = self.plot_item.getContentsMargins()  # room left of the axis title, which pyqtgraph puts 5 px out
        self.plot_item.setContentsMargins(round(6 * scale), margins[1], margins[2], margins[3])
        self._framed = None
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
        self.line_names.points_label.setVisible(log)  # on linear axes the run's few positions sit at the origin
        self._frame()

    # ----- what is drawn -----
    def precision(self) -> str:
        """The precision every line is drawn in."""
        return self.dtype_box.currentText()

    def model_line(self) -> tuple[np.ndarray, np.ndarray]:
        """The loaded model's line in the chosen precision and batch: positions, and its cache's bytes there."""
        x, y = self._state.model_line(self.precision())
        return x, y * self.batch_spin.value()

    def model_parts(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """A model whose layers differ: positions, its line's growing part and its flat part (they sum to
        `model_line`), in the chosen precision and batch; None where the model's line is one kind of growth."""
        parts = self._state.parts(self.precision())
        if parts is None:
            return None
        x, growing, flat = parts
        batch = self.batch_spin.value()
        return x, growing * batch, flat * batch

    def points(self) -> tuple[np.ndarray, np.ndarray]:
        """The run's measured points (positions filled, bytes read from the cache's tensors), where the chosen
        precision and batch are the run's (else none: they would not lie on a line of another precision)."""
        if self.precision() != self._state.precision or self.batch_spin.value() != 1:
            return np.zeros(0), np.zeros(0)
        return self._state.measured()

    def reference_line(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """A reference architecture's bytes at each context, for the chosen dtype and batch."""
        return reference_bytes(name, self.dtype_box.currentText(), self.batch_spin.value())

    def end_labels(self) -> dict[str, pg.TextItem]:
        """Each drawn line's name at its right end: "this model" and the references, by name."""
        return self.line_names.shown()

    def curves(self) -> dict[str, pg.PlotDataItem]:
        """Each line's curve by the name it is labelled with."""
        return {"this model": self.model_curve, **self.part_curves, **self.reference_curves}

    def _references_changed(self) -> None:
        self._draw_references()
        self._dirty = True  # this model's line and points follow the precision and batch
        self.refresh()

    def _label_axes(self) -> None:
        """The left axis names the precision (and a batch) every line is drawn in: short, to fit a slide's axis."""
        batch = self.batch_spin.value()
        sequences = f" \u00d7 {batch}" if batch != 1 else ""
        self.plot_item.setLabel("left", f"bytes, {self.precision()}{sequences}")  # short: whole at any zoom

    def _draw_references(self) -> None:
        for name, curve in self.reference_curves.items():
            curve.setData(*self.reference_line(name))
        self._frame()

    def _frame(self, *_args: object) -> None:
        """The axes' ranges and ticks for the scale, with room on the right for the lines' names."""
        vb = self.plot_item.getViewBox()
        room = max(vb.width() - self.line_names.widest(), vb.width() / 2)  # pixels for the lines
        share = vb.width() / room if room > 0 else 1.0
        ends = [end[1] for end in map(line_end, self.curves().values()) if end is not None]
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
        """Each line's name at its end, and "measured" by the last point on log axes; the GB lines' labels one
        after the other from the left, so that none prints over another where the lines are close."""
        self.line_names.place(self.curves(), self.points_curve, self.scale() == "log")
        width = self.plot_item.getViewBox().width()
        left = 6.0  # pixels from the plot's left edge
        for line in self.budget_lines:
            if width > 0:
                line.label.setPosition(min(left / width, 0.95))
            left += line.label.boundingRect().width() + 12.0

    def _apply_theme(self) -> None:
        theme = self._theme
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)  # its own background, in a column or a slide
        self.setStyleSheet(f"QWidget#memoryView {{ background: {theme.background}; }} "
                           f"QWidget#memoryView QLabel {{ color: {theme.foreground}; background: transparent; }}")
        self.plot_widget.setBackground(theme.background)
        style_plot(self.plot_item, theme)
        self.model_curve.setPen(line_pen(theme.teal, MODEL_WIDTH))
        colours = {"this model": theme.teal}
        for name, curve, dashes in zip(PART_NAMES, self.part_curves.values(), ((4.0, 2.0), (1.0, 2.0)), strict=True):
            curve.setPen(line_pen(theme.teal, REFERENCE_WIDTH, dashes))  # the model's colour, its parts dashed
            colours[name] = theme.teal
        for (name, curve), colour, dashes in zip(self.reference_curves.items(), theme.series, SERIES_DASHES,
                                                 strict=True):
            curve.setPen(line_pen(colour, REFERENCE_WIDTH, dashes))
            colours[name] = colour
        self.line_names.set_colours(colours, theme.background, theme.amber)
        self.points_curve.setSymbolBrush(pg.mkBrush(theme.amber))
        self.points_curve.setSymbolPen(pg.mkPen(theme.foreground, width=1))
        for line in self.budget_lines:
            line.setPen(pg.mkPen(theme.muted, width=1, style=Qt.PenStyle.DashLine))
            line.label.setColor(theme.muted)
        self.formula.setTextFormat(Qt.TextFormat.RichText)
