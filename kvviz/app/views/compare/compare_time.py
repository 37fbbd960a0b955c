"""Compare mode's time plot: measured milliseconds per token step and cumulative seconds of both runs."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QFont, QFontMetrics
from PySide6.QtWidgets import QVBoxLayout, QWidget

from kvviz.app import theme as themes
from kvviz.app.theme import Theme
from kvviz.app.views.base import cache_axes, nice_ceiling, style_plot
from kvviz.app.views.live_label import LiveLabel
from kvviz.core.ratios import RatioEstimate, paired_ratio
from kvviz.core.records import RunPlan, StepRecord

RUNS = ("cached", "uncached")  # row 0 and row 1 of the arrays
# beside a quantized cache's time: its cost here is kvviz's plain dequantizing, not the format's
DEQUANTIZE_NOTE = "kvviz dequantizes every stored row at each step; engines use fused kernels: not an engine's times"
TIME_PLOT_MIN_HEIGHT = 200  # pixels at zoom 1: two small plots and the ratio line stay readable


class CompareTimePlot(QWidget):
    """The time each run of a lockstep took, measured: ms per token step (above) and cumulative
    seconds (below), teal with the cache and amber without, and the ratio of the two: the median of the
    steps' ratios, said in words only when it stands out of the noise.

    A view (views.base.RunViewProtocol). A step's time is the `seconds` of that run's passes in the
    step (the cached run's cache-filling pass counts in its last step). The arrays are sized by the
    plan's budget at `reset`; `refresh` only hands them to the curves. `curve_data()` and
    `time_ratio()` return what is drawn. A plan without a twin leaves it empty.
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._plan: RunPlan | None = None
        self._font_scale = 1.0
        self._x = np.zeros(0, dtype=np.int64)
        self._ms = np.zeros((2, 0))  # (run, step): measured ms of each token step, cached run first
        self._cumulative = np.zeros((2, 0))  # (run, step): seconds so far
        self._steps = [0, 0]  # token steps each run has reached
        self._tops: tuple[float, float] | None = None  # the y frames last given to the plots
        self._dirty = False
        self._theme = themes.current()

        self.ratio = LiveLabel("", wrap=True)
        self.layout_widget = pg.GraphicsLayoutWidget()
        self.layout_widget.ci.setSpacing(4)
        self.ms_plot = self.layout_widget.addPlot(row=0, col=0)
        self.seconds_plot = self.layout_widget.addPlot(row=1, col=0)
        self.ms_curves = (self.ms_plot.plot([], []), self.ms_plot.plot([], []))  # cached, uncached
        self.seconds_curves = (self.seconds_plot.plot([], []), self.seconds_plot.plot([], []))
        for plot in (self.ms_plot, self.seconds_plot):
            plot.setMenuEnabled(False)
            plot.hideButtons()
            plot.getViewBox().setMouseEnabled(x=False, y=False)
            plot.disableAutoRange()
            cache_axes(plot)
        self.ms_plot.hideAxis("bottom")  # the plots share their x axis, drawn once below both
        self.seconds_plot.setXLink(self.ms_plot)
        self.seconds_plot.setLabel("bottom", "token step")

        self.setObjectName("compareTime")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 0)
        layout.setSpacing(2)
        layout.addWidget(self.ratio)
        layout.addWidget(self.layout_widget, 1)
        self._apply_theme()
        self._apply_fonts()
        self._frame(1, 1.0, 1.0)

    # ----- public interface -----
    def reset(self, plan: RunPlan) -> None:
        self._plan = plan if plan.twin is not None else None
        budget = plan.budget if self._plan is not None else 0
        self._x = np.arange(1, budget + 1, dtype=np.int64)
        self._ms = np.zeros((2, budget))
        self._cumulative = np.zeros((2, budget))
        self._steps = [0, 0]
        self._tops = None
        self._reserve_ratio()  # a quantized cache's line says more
        self._dirty = True
        self.refresh()

    def apply(self, records: Sequence[StepRecord]) -> None:
        if self._plan is None:
            return
        budget = self._ms.shape[1]
        for record in records:
            for run, passes in enumerate(record.lockstep_passes()):
                for run_pass in passes:
                    index = run_pass.new_tokens - 1  # a filling pass has its run's last step's new_tokens
                    if 0 <= index < budget:
                        self._ms[run, index] += run_pass.seconds * 1000.0
                        self._steps[run] = max(self._steps[run], index + 1)
                        self._dirty = True

    def redraw_slices(self) -> list:
        """The ms plot, then the seconds plot with the ratio line: two passes of the event loop."""
        return [self._refresh_ms, self._refresh_seconds]

    def refresh(self) -> None:
        for draw in self.redraw_slices():
            draw()

    def _refresh_ms(self) -> None:
        if not self._dirty:
            return
        if self._plan is None:
            self._refresh_seconds()
            return
        for run in range(2):
            n = self._steps[run]
            self.ms_curves[run].setData(self._x[:n], self._ms[run, :n])
        self._refresh_frame()

    def _refresh_seconds(self) -> None:
        if not self._dirty:
            return
        self._dirty = False
        plan = self._plan
        if plan is None:
            for curve in (*self.ms_curves, *self.seconds_curves):
                curve.setData([], [])
            self.ratio.setText(f"<span style='color:{self._theme.muted}'>measured time: no compare run</span>")
            return
        for run in range(2):
            n = self._steps[run]
            np.cumsum(self._ms[run, :n], out=self._cumulative[run, :n])
            self._cumulative[run, :n] /= 1000.0
            self.seconds_curves[run].setData(self._x[:n], self._cumulative[run, :n])
        self._refresh_frame()
        self.ratio.setText(self._ratio_text())

    def _refresh_frame(self) -> None:
        cumulative_top = max(float(self._ms[run].sum()) for run in range(2)) / 1000.0
        tops = (nice_ceiling(float(self._ms.max(initial=0.0))), nice_ceiling(cumulative_top))
        if tops != self._tops:  # 1-2-2.5-5 steps: a rare change, and a repaint of the axes
            self._tops = tops
            self._frame(max(1, self._plan.budget), *tops)

    def set_font_scale(self, scale: float) -> None:
        self._font_scale = scale
        self._apply_fonts()

    def set_theme(self, theme: Theme) -> None:
        if theme == self._theme:
            return
        self._theme = theme
        self._apply_theme()
        self._apply_fonts()  # the titles carry their colour
        if self.ratio.text():  # and the ratio line, once it says something
            self._dirty = True
            self.refresh()

    def _apply_theme(self) -> None:
        theme = self._theme
        self.layout_widget.setBackground(theme.background)
        for plot in (self.ms_plot, self.seconds_plot):
            style_plot(plot, theme)
        for curves in (self.ms_curves, self.seconds_curves):
            for curve, colour in zip(curves, (theme.teal, theme.amber), strict=True):
                curve.setPen(pg.mkPen(colour, width=2))
        self.setStyleSheet(f"QWidget#compareTime {{ background: {theme.background}; }} "
                           f"QWidget#compareTime QLabel {{ color: {theme.foreground}; background: transparent; }}")

    def curve_data(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """The drawn series as (x, y), x the 1-based token step: `cached_ms` / `uncached_ms` the measured
        ms of each step, `cached_seconds` / `uncached_seconds` the seconds so far."""
        data = {}
        for run, name in enumerate(RUNS):
            n = self._steps[run]
            data[f"{name}_ms"] = (self._x[:n].copy(), self._ms[run, :n].copy())
            data[f"{name}_seconds"] = (self._x[:n].copy(), np.cumsum(self._ms[run, :n]) / 1000.0)
        return data

    def totals(self) -> tuple[float, float]:
        """(cached, uncached) seconds measured so far."""
        return float(self._ms[0].sum()) / 1000.0, float(self._ms[1].sum()) / 1000.0

    def time_ratio(self) -> RatioEstimate | None:
        """Uncached over cached time of the token steps both runs have reached: the median of the
        per-step ratios with its interval (kvviz.measure.speed.paired_ratio); None before a step has both."""
        n = min(self._steps)
        return paired_ratio(self._ms[0, :n], self._ms[1, :n]) if n else None

    # ----- drawing -----
    def _ratio_text(self, cached: float | None = None, uncached: float | None = None,
                    sentence: str | None = None, step_ms: tuple[float, float] | None = None) -> str:
        """The ratio line for the times so far (or for the given ones): against a lossy cache both runs' seconds;
        with and without the cache, a token step's median time of each beside the sentence the median of the
        steps' ratios makes, so that no figure beside it reads otherwise (the totals did: one slow step of the
        cached run made its total the larger under "without the cache this run took 1.4x as long")."""
        if cached is None or uncached is None:
            cached, uncached = self.totals()
            estimate = self.time_ratio()
            sentence = None if estimate is None else estimate.sentence()
            n = min(self._steps)
            step_ms = (float(np.median(self._ms[0, :n])), float(np.median(self._ms[1, :n]))) if n else None
        if sentence is None:
            return f"<b>measured time</b> <span style='color:{self._theme.muted}'>appears with the first step</span>"
        teal, amber = self._theme.teal, self._theme.amber
        if self._plan is not None and self._plan.against_lossy:
            first, second = self._plan.lockstep_names
            return (f"<b>measured time</b> &nbsp; <span style='color:{teal}'>{first} {cached:.3g} s</span>, "
                    f"<span style='color:{amber}'>{second} {uncached:.3g} s</span>"
                    + (f"<br><span style='color:{self._theme.muted}'>{DEQUANTIZE_NOTE}</span>"
                       if self._plan.policy.quantized or self._plan.twin.policy.quantized else ""))
        with_ms, without_ms = step_ms if step_ms is not None else (cached * 1000.0, uncached * 1000.0)
        return (f"<b>a token step</b> (median) &nbsp; <span style='color:{teal}'>with cache {_ms(with_ms)}</span>, "
                f"<span style='color:{amber}'>without {_ms(without_ms)}</span>: <b>{sentence}</b>")

    def _frame(self, last_x: int, ms_top: float, seconds_top: float) -> None:
        for plot, top in ((self.ms_plot, ms_top), (self.seconds_plot, seconds_top)):
            plot.setXRange(0.5, last_x + 0.5, padding=0.02)
            plot.setYRange(0, top, padding=0.05)
            # three labels: these plots are short, and large fonts (presenter mode) crowd more
            plot.getAxis("left").setTicks([[(v, f"{v:g}") for v in (0.0, top / 2, top)], []])

    def _apply_fonts(self) -> None:
        self.setMinimumHeight(int(TIME_PLOT_MIN_HEIGHT * self._font_scale))
        font = QFont(self.font())
        font.setPointSizeF(max(6.0, 9.0 * self._font_scale))
        metrics = QFontMetrics(font)
        for plot in (self.ms_plot, self.seconds_plot):
            for name in ("left", "bottom"):
                axis = plot.getAxis(name)
                axis.setStyle(tickFont=font)
                axis.label.setFont(font)
            # a fixed width: tick labels that change width would re-layout (and repaint) the plots
            plot.getAxis("left").setWidth(metrics.horizontalAdvance("00000") + metrics.height())
        small = f"{max(7, round(9 * self._font_scale))}pt"
        self.ms_plot.setTitle("ms per token step", color=self._theme.muted, size=small)
        self.seconds_plot.setTitle("seconds so far", color=self._theme.muted, size=small)
        label_font = QFont(self.font())
        label_font.setPointSizeF(10.0 * self._font_scale)
        self.ratio.setFont(label_font)
        self._reserve_ratio()

    def _reserve_ratio(self) -> None:
        # room for the widest line ("%.3g" is widest below 1 s): new numbers never move the plots
        # the widest texts: ".3g" seconds under a millisecond ("0.000888"), the longest sentence
        self.ratio.reserve(self._ratio_text(0.000888, 0.000888, "too few steps to tell the two apart (88 so far)",
                                            (8888.8, 8888.8)))


def _ms(value: float) -> str:
    """A step's time: 5.2 ms, 88.8 ms, 1234 ms."""
    return f"{value:.1f} ms" if value < 100 else f"{value:.0f} ms"
