"""The memory view: KV-cache bytes against context length, the run's measured bytes on its model's line."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QFont
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QSpinBox, QVBoxLayout, QWidget

from kvviz.app import theme as themes
from kvviz.app.theme import Theme
from kvviz.app.views.base import style_plot
from kvviz.memory import DTYPE_BYTES, MEMORY_BUDGETS_GB, format_bytes, reference_architectures
from kvviz.records import RunPlan, StepRecord

MAX_CONTEXT = 131072  # the x axis ends at 128k tokens
# the axes in the plot's log10 coordinates, labelled in tokens and in decimal bytes (as the GB lines)
X_TICKS = [(0.0, "1"), (1.0, "10"), (2.0, "100"), (3.0, "1k"), (4.0, "10k"), (5.0, "100k")]
Y_TICKS = [(3.0, "1 kB"), (6.0, "1 MB"), (9.0, "1 GB"), (12.0, "1 TB")]
SHOWN_REFERENCES = ("gpt2-xl", "Llama-3-8B", "Llama-3-70B", "Mistral-7B", "Falcon-7B", "DeepSeek-V2")


def _contexts(extra: Sequence[int] = ()) -> np.ndarray:
    """Context lengths from 1 to MAX_CONTEXT, log-spaced, with `extra` ones (a sliding window's edge) in."""
    points = {int(round(v)) for v in np.logspace(0, math.log10(MAX_CONTEXT), 64)} | {MAX_CONTEXT, *extra}
    return np.array(sorted(p for p in points if 1 <= p <= MAX_CONTEXT), dtype=np.float64)


class MemoryView(QWidget):
    """KV-cache bytes (log) against context length (log, to 128k tokens).

    The loaded model's line is the run plan's bytes per cached position times the positions (the
    engine planned it from the model's shape and dtype); the run's measured points are its records'
    `cache_bytes`, read from the cache's tensors, at the positions filled. Reference architectures from
    their published configs (kvviz.memory) are drawn for the chosen dtype and batch, and horizontal
    lines mark 8, 24 and 80 GB. A view (views.base.RunViewProtocol); `points()`, `model_line()` and
    `reference_line(name)` return what is drawn.
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("memoryView")
        self._theme = themes.current()
        self._plan: RunPlan | None = None
        self._points: dict[int, int] = {}  # positions filled -> measured bytes
        self._dirty = False
        self._font_scale = 1.0

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
        self.dtype_box.currentTextChanged.connect(self._references_changed)
        self.batch_spin.valueChanged.connect(self._references_changed)
        controls = QHBoxLayout()
        controls.addWidget(QLabel("references in"))
        controls.addWidget(self.dtype_box)
        controls.addWidget(QLabel("batch"))
        controls.addWidget(self.batch_spin)
        controls.addStretch(1)

        self.plot_widget = pg.PlotWidget()
        self.plot_item = self.plot_widget.getPlotItem()
        self.plot_item.setLogMode(x=True, y=True)
        self.plot_item.setMenuEnabled(False)
        self.plot_item.hideButtons()
        self.plot_item.getViewBox().setMouseEnabled(x=False, y=False)
        self.plot_item.setLabel("bottom", "context length (tokens)")
        self.plot_item.setLabel("left", "KV-cache bytes")
        self.legend = self.plot_item.addLegend(offset=(-8, -30), labelTextSize="8pt")  # bottom right: empty
        self.plot_item.getAxis("bottom").setTicks([X_TICKS, []])
        self.plot_item.getAxis("left").setTicks([Y_TICKS, []])
        self.plot_item.getAxis("left").enableAutoSIPrefix(False)  # the tick labels carry the units
        self.model_curve = self.plot_item.plot([], [], name="this model")
        self.points_curve = self.plot_item.plot([], [], pen=None, symbol="o", symbolSize=7, name="measured")
        self.reference_curves: dict[str, pg.PlotDataItem] = {}
        for name in SHOWN_REFERENCES:
            self.reference_curves[name] = self.plot_item.plot([], [], name=name)
        self.budget_lines = []
        for gigabytes in MEMORY_BUDGETS_GB:
            line = pg.InfiniteLine(pos=math.log10(gigabytes * 1e9), angle=0, movable=False,
                                   label=f"{gigabytes} GB", labelOpts={"position": 0.04, "anchors": [(0, 1), (0, 1)]})
            self.plot_item.addItem(line)
            self.budget_lines.append(line)
        self.plot_item.setXRange(0, math.log10(MAX_CONTEXT), padding=0.02)
        self.plot_item.setYRange(3, math.log10(2e12), padding=0.02)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.heading)
        layout.addWidget(self.formula)
        layout.addLayout(controls)
        layout.addWidget(self.plot_widget, 1)
        self.setMinimumWidth(380)
        self._apply_theme()
        self._draw_references()

    def sizeHint(self) -> QSize:  # noqa: N802
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
            return
        x, y = self.model_line()
        self.model_curve.setData(x, y)
        px, py = self.points()
        self.points_curve.setData(px, py)
        self.formula.setText(self._formula_text(plan))

    def set_font_scale(self, scale: float) -> None:
        self._font_scale = scale
        font = QFont(self.font())
        font.setPointSizeF(9.0 * scale)
        for widget in (self.heading, self.formula):
            widget.setFont(font)
        for name in ("left", "bottom"):
            self.plot_item.getAxis(name).setStyle(tickFont=font)

    def set_theme(self, theme: Theme) -> None:
        if theme != self._theme:
            self._theme = theme
            self._apply_theme()
            self._dirty = True
            self.refresh()

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

    def _references_changed(self) -> None:
        self._draw_references()

    def _draw_references(self) -> None:
        for name, curve in self.reference_curves.items():
            curve.setData(*self.reference_line(name))

    def _formula_text(self, plan: RunPlan | None) -> str:
        muted = self._theme.muted
        general = ("bytes per token = 2 \u00d7 layers \u00d7 KV heads \u00d7 head dim \u00d7 bytes per element "
                   "(\u00d7 batch)")
        if plan is None:
            return f"{general}<br><span style='color:{muted}'>no cache in this run: no measured points</span>"
        last = max(self._points) if self._points else 0
        measured = (f"; measured {format_bytes(self._points[last])} at {last} positions" if last else "")
        return (f"{general}<br><span style='color:{self._theme.teal}'>{plan.model_name}: "
                f"{plan.cache_bytes_per_position:,} bytes per token{measured}</span> "
                f"<span style='color:{muted}'>(lines for other models: their published configs)</span>")

    def _apply_theme(self) -> None:
        theme = self._theme
        self.plot_widget.setBackground(theme.background)
        style_plot(self.plot_item, theme)
        self.model_curve.setPen(pg.mkPen(theme.teal, width=3))
        for curve, colour in zip(self.reference_curves.values(), theme.series, strict=False):
            curve.setPen(pg.mkPen(colour, width=1.5))
        self.points_curve.setSymbolBrush(pg.mkBrush(theme.amber))
        self.points_curve.setSymbolPen(pg.mkPen(theme.foreground, width=1))
        self.legend.setLabelTextColor(theme.foreground)
        for _sample, label in self.legend.items:
            label.setText(label.text, color=theme.foreground)
        for line in self.budget_lines:
            line.setPen(pg.mkPen(theme.muted, width=1, style=Qt.PenStyle.DashLine))
            line.label.setColor(theme.muted)
        self.formula.setTextFormat(Qt.TextFormat.RichText)
