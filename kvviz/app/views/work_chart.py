"""The chart: cumulative K/V computations per step with and without cache, and what each step cost."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Signal
from PySide6.QtGui import QAction, QFont, QFontMetrics, QResizeEvent
from PySide6.QtWidgets import QVBoxLayout, QWidget

from kvviz.app import theme as themes
from kvviz.app.theme import Theme
from kvviz.app.views.base import cache_axes, nice_ceiling, style_plot
from kvviz.app.views.passes_series import PASSES_AXES, PASSES_TITLE, PassesSeries
from kvviz.core.records import RunPlan, StepRecord

SERIES = ("without_cache", "with_cache", "ms_per_step", "cache_mib")
SYMBOL_LIMIT = 40  # draw point markers while the run is this short
WORK_PLOT_MIN_HEIGHT = 180  # pixels at zoom 1: the cumulative-work plot never gets smaller
SMALL_PLOTS_MIN_HEIGHT = 290  # below this height (at zoom 1) the two small plots give their room to the work plot
WORK_TITLE = "Cumulative K/V computations per layer"
WORK_AXES = ("K/V computed", "step")  # (left, bottom)


class WorkChart(QWidget):
    """Cumulative K/V computations per layer (amber without cache, teal with), growing live,
    and below them the measured milliseconds per step and the KV-cache memory.

    A view (views.base.RunViewProtocol), drawn in three slices (`redraw_slices`): the work plot,
    the time plot, the memory plot. The frames come from the plan, fixed for the whole run (the
    time plot's height follows the measured times, in 1-2-2.5-5 steps).
    `curve_data()` returns what is drawn.
    The x axis is the forward pass ("step"); a cached run's last step fills the cache without
    emitting a token.

    A speculative run (a plan with a drafter) shows in the work plot, instead of its K/V curves, `passes`
    (PassesSeries): target passes against tokens generated, plain decoding's one a token beside the run's;
    `passes_data()` returns them, `curve_data()` still the K/V counts.
    """

    export_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._plan: RunPlan | None = None
        self._font_scale = 1.0
        self._x: list[int] = []
        self._with: list[int] = []
        self._without: list[int] = []
        self._ms: list[float] = []
        self._mib: list[float] = []
        self._dirty_work = self._dirty_time = self._dirty_memory = False
        self._ms_top: float | None = None
        self._theme = themes.current()

        self.layout_widget = pg.GraphicsLayoutWidget()
        self.layout_widget.ci.setSpacing(6)
        self.work_plot = self.layout_widget.addPlot(row=0, col=0, colspan=2)
        self.ms_plot = self.layout_widget.addPlot(row=1, col=0)
        self.mem_plot = self.layout_widget.addPlot(row=1, col=1)
        self.layout_widget.ci.layout.setRowStretchFactor(0, 5)
        self.layout_widget.ci.layout.setRowStretchFactor(1, 2)

        self.legend = self.work_plot.addLegend(offset=(10, 10))
        self.without_curve = self.work_plot.plot([], [], name="without cache", symbolPen=None, symbolSize=6)
        self.with_curve = self.work_plot.plot([], [], name="with cache", symbolPen=None, symbolSize=6)
        self.passes = PassesSeries(self.work_plot)  # a speculative run's, instead of the K/V curves
        self._speculative = False
        self.work_plot.setLabel("left", WORK_AXES[0])
        self.work_plot.setLabel("bottom", WORK_AXES[1])
        self.ms_curve = self.ms_plot.plot([], [], stepMode=None)
        self.ms_plot.setLabel("bottom", "step")
        self.mem_curve = self.mem_plot.plot([], [], fillLevel=0)
        self.mem_plot.setLabel("bottom", "step")
        self.mem_note = pg.TextItem("", anchor=(0.5, 0.5))
        self.mem_plot.addItem(self.mem_note, ignoreBounds=True)
        for plot in (self.work_plot, self.ms_plot, self.mem_plot):
            plot.setMenuEnabled(False)
            plot.hideButtons()
            plot.getViewBox().setMouseEnabled(x=False, y=False)
            plot.disableAutoRange()
        self._export_action = QAction("Export view\u2026", self)
        self._export_action.triggered.connect(self.export_requested.emit)
        self.layout_widget.scene().contextMenu = [self._export_action]
        self.work_plot.showGrid(x=False, y=True, alpha=0.15)  # grid lines are costly to paint: one set only
        for plot in (self.work_plot, self.ms_plot, self.mem_plot):
            cache_axes(plot)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.layout_widget)
        self._small_plots_shown = True
        self._apply_theme()
        self._apply_fonts()

    # ----- public interface -----
    def reset(self, plan: RunPlan) -> None:
        self._plan = plan
        self._x, self._with, self._without, self._ms, self._mib = [], [], [], [], []
        self.without_curve.opts["name"] = "without cache" + ("" if plan.use_cache else " (measured)")
        self.with_curve.opts["name"] = "with cache" + (" (measured)" if plan.use_cache else "")
        self._show_passes(plan.drafter is not None)
        self.passes.reset()
        self.legend.clear()
        for curve in self._work_curves():
            self.legend.addItem(curve, curve.opts["name"])
        self._style_legend()
        # Fixed frames for the whole run: the curves grow into them, and the axes never repaint mid-run.
        last_x = self._last_x()
        for plot in (self.work_plot, self.ms_plot, self.mem_plot):
            plot.setXRange(0, last_x, padding=0.02)
        top = max(1, plan.final_without_cache, plan.final_with_cache)  # with one new token, P + N is the larger
        self.work_plot.setYRange(0, top, padding=0.05)
        if self._speculative:
            self.passes.frame(self.work_plot, plan)
        mem_top = nice_ceiling(plan.final_cache_bytes / 2**20) if plan.use_cache else 1.0
        self._frame_small_plot(self.mem_plot, mem_top)
        self.mem_note.setText("" if plan.use_cache else "no cache in this run")
        self.mem_note.setPos(last_x / 2, mem_top / 2)
        self._ms_top = None
        self._dirty_work = self._dirty_time = self._dirty_memory = True
        self.refresh()

    def apply(self, records: Sequence[StepRecord]) -> None:
        for record in records:
            self._x.append(record.step + 1)
            self._with.append(record.with_cache_total)
            self._without.append(record.without_cache_total)
            self._ms.append(record.seconds * 1000.0)
            self._mib.append(record.cache_bytes / 2**20)
        self.passes.apply(records)
        if records:
            self._dirty_work = self._dirty_time = self._dirty_memory = True

    def redraw_slices(self) -> list:
        return [self.refresh_work, self.refresh_time, self.refresh_memory]

    def refresh(self) -> None:
        """Draw whatever changed since the last draw."""
        for draw in self.redraw_slices():
            draw()

    def refresh_work(self) -> None:
        """Update the cumulative work plot (the main one) if it changed since the last draw."""
        if not self._dirty_work:
            return
        self._dirty_work = False
        if self._speculative:  # the K/V curves are hidden: only the passes are drawn
            self.passes.refresh()
            return
        data = self.curve_data()
        symbols = "o" if len(self._x) <= SYMBOL_LIMIT else None
        for curve, key in ((self.without_curve, "without_cache"), (self.with_curve, "with_cache")):
            curve.setSymbol(symbols)
            curve.setData(*data[key])

    def refresh_time(self) -> None:
        """Update the measured-time plot if it changed since the last draw."""
        if not self._dirty_time:
            return
        self._dirty_time = False
        self.ms_curve.setData(np.asarray(self._x, dtype=np.int64), np.asarray(self._ms, dtype=np.float64))
        top = nice_ceiling(max(self._ms, default=1.0))
        if top != self._ms_top:  # 1-2-2.5-5 steps: a rare change, and a repaint of the axis
            self._ms_top = top
            self._frame_small_plot(self.ms_plot, top)

    def refresh_memory(self) -> None:
        """Update the cache-memory plot (framed by the plan's final cache size) if it changed."""
        if not self._dirty_memory:
            return
        self._dirty_memory = False
        self.mem_curve.setData(np.asarray(self._x, dtype=np.int64), np.asarray(self._mib, dtype=np.float64))

    @staticmethod
    def _frame_small_plot(plot: pg.PlotItem, top: float) -> None:
        plot.setYRange(0, top, padding=0.05)
        # three labels: these plots are short, and large fonts (presenter mode) crowd more
        plot.getAxis("left").setTicks([[(v, f"{v:g}") for v in (0.0, top / 2, top)], []])

    def _last_x(self) -> int:
        return max(1, self._plan.passes) if self._plan is not None else 1

    def curve_data(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """The drawn series as (x, y): x is the step number (forward pass, from 1).

        `without_cache` and `with_cache` are K/V computations per layer; `ms_per_step` the
        measured time of each pass; `cache_mib` the filled KV cache after it.
        """
        x = np.asarray(self._x, dtype=np.int64)
        return {
            "without_cache": (x, np.asarray(self._without, dtype=np.int64)),
            "with_cache": (x, np.asarray(self._with, dtype=np.int64)),
            "ms_per_step": (x, np.asarray(self._ms, dtype=np.float64)),
            "cache_mib": (x, np.asarray(self._mib, dtype=np.float64)),
        }

    def passes_data(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """A speculative run's passes as (tokens generated, target passes), from the origin: "plain" (one pass a
        token) and "speculative" (the rounds' recorded passes)."""
        return self.passes.data()

    @property
    def passes_shown(self) -> bool:
        """Whether the work plot shows target passes against tokens (a speculative run) instead of K/V counts."""
        return self._speculative

    def _work_curves(self) -> tuple:
        return self.passes.curves if self._speculative else (self.without_curve, self.with_curve)

    def _show_passes(self, on: bool) -> None:
        """The work plot's series, axes and title: target passes against tokens (a speculative run), or the K/V
        computed each step."""
        if on == self._speculative:
            return
        self._speculative = on
        self.passes.show(on)
        for curve in (self.without_curve, self.with_curve):
            curve.setVisible(not on)
        left, bottom = PASSES_AXES if on else WORK_AXES
        self.work_plot.setLabel("left", left)
        self.work_plot.setLabel("bottom", bottom)
        self._apply_fonts()  # the title

    def set_font_scale(self, scale: float) -> None:
        self._font_scale = scale
        self._apply_fonts()
        self._fit_small_plots()

    def set_theme(self, theme: Theme) -> None:
        """Draw the background, axes, curves, titles and legend in `theme`'s colours."""
        if theme != self._theme:
            self._theme = theme
            self._apply_theme()
            self._apply_fonts()  # the titles and the legend's labels carry their colour

    def _apply_theme(self) -> None:
        theme = self._theme
        self.layout_widget.setBackground(theme.background)
        for plot in (self.work_plot, self.ms_plot, self.mem_plot):
            style_plot(plot, theme)
        self.legend.setBrush(pg.mkBrush(*themes.rgba(theme.background, 200)))
        self.legend.setLabelTextColor(theme.foreground)
        for curve, colour in ((self.without_curve, theme.amber), (self.with_curve, theme.teal)):
            curve.setPen(pg.mkPen(colour, width=3))
            curve.setSymbolBrush(colour)
            curve.scatter.setBrush(colour)  # the legend's sample reads it, before the first point too
        self.ms_curve.setPen(pg.mkPen(theme.foreground, width=2))
        self.mem_curve.setPen(pg.mkPen(theme.teal, width=2))
        self.mem_curve.setBrush(pg.mkBrush(*themes.rgba(theme.teal, 60)))
        self.mem_note.setColor(theme.muted)
        self.passes.set_theme(theme)

    @property
    def small_plots_shown(self) -> bool:
        """Whether the time and memory plots are on screen (a short chart gives their room to the work plot)."""
        return self._small_plots_shown

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._fit_small_plots()

    def _fit_small_plots(self) -> None:
        show = self.height() >= SMALL_PLOTS_MIN_HEIGHT * self._font_scale
        if show == self._small_plots_shown:
            return
        self._small_plots_shown = show
        grid = self.layout_widget.ci
        for col, plot in enumerate((self.ms_plot, self.mem_plot)):
            if show:
                grid.addItem(plot, row=1, col=col)
            else:
                grid.removeItem(plot)
            plot.setVisible(show)
        grid.layout.setRowStretchFactor(1, 2 if show else 0)
        grid.layout.setRowMaximumHeight(1, 1e6 if show else 0)  # an empty row takes no room

    def _apply_fonts(self) -> None:
        self.setMinimumHeight(int(WORK_PLOT_MIN_HEIGHT * self._font_scale))
        font = QFont(self.font())
        font.setPointSizeF(max(6.0, 9.0 * self._font_scale))
        for plot in (self.work_plot, self.ms_plot, self.mem_plot):
            for name in ("left", "bottom"):
                axis = plot.getAxis(name)
                axis.setStyle(tickFont=font)
                axis.label.setFont(font)
        metrics = QFontMetrics(font)
        for plot, widest in ((self.work_plot, "0000000"), (self.ms_plot, "0000"), (self.mem_plot, "000.0")):
            # a fixed width: tick labels that change width would re-layout (and repaint) the chart
            plot.getAxis("left").setWidth(metrics.horizontalAdvance(widest) + 2 * metrics.height())
        size = f"{max(8, round(11 * self._font_scale))}pt"
        small = f"{max(7, round(9 * self._font_scale))}pt"
        theme = self._theme
        self.work_plot.setTitle(PASSES_TITLE if self._speculative else WORK_TITLE, color=theme.foreground, size=size)
        self.ms_plot.setTitle("measured ms per step", color=theme.muted, size=small)
        self.mem_plot.setTitle("KV cache memory (MiB)", color=theme.muted, size=small)
        self._style_legend()
        self.mem_note.setFont(font)

    def _style_legend(self) -> None:
        size = f"{max(8, round(10 * self._font_scale))}pt"
        for _sample, label in self.legend.items:
            label.setText(label.text, size=size, color=self._theme.foreground)
