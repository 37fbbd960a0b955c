"""The speed view: ms per token step against the sequence length, with and without the cache, as measured on
this machine by a speed sweep, with the ratio and why the curves look as they do; or the long sweep: every kind
of cache against the bandwidth bound (views.long_sweep_chart)."""

from __future__ import annotations

import time

import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QFont
from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QPushButton, QStackedWidget, QVBoxLayout, QWidget

from kvviz.app import theme as themes
from kvviz.app.theme import Theme
from kvviz.app.views.base import style_plot
from kvviz.app.views.long_sweep_chart import LongSweepChart, long_headline
from kvviz.measure.cache_speed import CACHE_SWEEP_WHY, CacheSweepResult
from kvviz.measure.speed import SWEEP_WHY, SweepResult

WAITING = "Not measured yet: press Measure to time both modes on this machine."


class SpeedView(QWidget):
    """One speed sweep (kvviz.measure.speed.SweepResult): two curves of the median ms per token step against the
    sequence length, teal with the cache and amber without, each labelled at its end; above them the measured
    ratio in words (`headline`), below them why the curves look so. While a sweep runs it shows its progress
    and a Cancel button; `measure_requested` and `cancel_requested` ask for a sweep or its end.

    The long sweep (kvviz.measure.cache_speed.CacheSweepResult, asked for by `long_requested`) is drawn by its
    own chart in the same place (`long_chart`); the view shows whichever sweep ran last, `show_long_*` the long
    one's start, parts, result, failure and end.

    Reads results only: the sweep runs elsewhere (app.speed_runner)."""

    measure_requested = Signal()
    long_requested = Signal()
    cancel_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("speedView")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        self._theme = themes.current()
        self._font_scale = 1.0
        self._controls_shown = True
        self.result: SweepResult | None = None
        self.long_result: CacheSweepResult | None = None
        self._pace: tuple[float, int, float] | None = None  # (when, steps timed then, seconds paused since)
        self._paused_at: float | None = None

        self.heading = QLabel()
        self.headline = QLabel(WAITING)
        self.headline.setWordWrap(True)
        self.why = QLabel(SWEEP_WHY)
        self.why.setWordWrap(True)
        self.progress = QProgressBar()
        self.progress.setTextVisible(True)
        self.progress.hide()
        self.measure_button = QPushButton("&Measure")
        self.measure_button.setToolTip("Time a token step at several lengths, both modes taking turns")
        self.long_button = QPushButton("&Long sweep\u2026")
        self.long_button.setToolTip("Time a cached token step of every kind of cache the model runs, at lengths "
                                    "doubling from 64, beside what the bandwidth bound predicts (Shift+S)")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.hide()
        self.measure_button.clicked.connect(self.measure_requested)
        self.long_button.clicked.connect(self.long_requested)
        self.cancel_button.clicked.connect(self.cancel_requested)

        self.plot_widget = pg.PlotWidget()
        self.plot_item = self.plot_widget.getPlotItem()
        self.plot_item.setMenuEnabled(False)
        self.plot_item.hideButtons()
        self.plot_item.getViewBox().setMouseEnabled(x=False, y=False)
        self.plot_item.setLabel("bottom", "sequence length (positions)")
        self.plot_item.setLabel("left", "ms per token step")
        self.plot_item.getAxis("left").enableAutoSIPrefix(False)
        self.cached_curve = self.plot_item.plot([], [], symbol="o")
        self.uncached_curve = self.plot_item.plot([], [], symbol="t")
        # at the ends of the lines, right of the last points: the slower line's label above, the other's below
        self.cached_label = pg.TextItem("with cache", anchor=(0.0, 0.0))
        self.uncached_label = pg.TextItem("without cache", anchor=(0.0, 1.0))
        for label in (self.cached_label, self.uncached_label):
            self.plot_item.addItem(label, ignoreBounds=True)
            label.hide()

        controls = QHBoxLayout()
        controls.addWidget(self.progress, 1)
        controls.addStretch(0)
        controls.addWidget(self.measure_button)
        controls.addWidget(self.long_button)
        controls.addWidget(self.cancel_button)
        self.long_chart = LongSweepChart()
        self.charts = QStackedWidget()  # the cached/uncached sweep's plot, or the long sweep's chart
        self.charts.addWidget(self.plot_widget)
        self.charts.addWidget(self.long_chart)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 8, 8)
        layout.addWidget(self.heading)
        layout.addWidget(self.headline)
        layout.addWidget(self.charts, 1)
        layout.addWidget(self.why)
        layout.addLayout(controls)
        self.setMinimumSize(420, 320)
        self._apply_theme()
        self._apply_fonts()

    # ----- what the sweep says -----
    def show_started(self, model: str) -> None:
        self.heading.setText(f"<b>Speed</b> of {model}, measured on this machine")
        self._begin_progress(long=False)
        if self.result is not None:
            self.headline.setText(f"<b>{self.result.headline()}</b>")
        else:
            self.headline.setText("Measuring: both modes take turns at every length.")

    def show_long_started(self, model: str) -> None:
        self.heading.setText(f"<b>Long sweep</b> of {model}: every kind of cache, measured on this machine")
        self._begin_progress(long=True)
        self.long_result = None
        self.long_chart.clear()
        self.headline.setText("Measuring: every kind of cache takes turns at every length, from 64 positions.")

    def _begin_progress(self, long: bool) -> None:
        self.show_long(long)
        self._pace, self._paused_at = None, None
        self.progress.setRange(0, 0)
        self.progress.setFormat("loading the model\u2026")
        self.progress.setVisible(self._controls_shown)
        self.cancel_button.setVisible(self._controls_shown)
        self.measure_button.setEnabled(False)
        self.long_button.setEnabled(False)

    def show_long(self, on: bool) -> None:
        """The long sweep's chart (`on`) or the cached/uncached sweep's plot, each with its why."""
        self.charts.setCurrentWidget(self.long_chart if on else self.plot_widget)
        self.why.setText(CACHE_SWEEP_WHY if on else SWEEP_WHY)

    @property
    def showing_long(self) -> bool:
        return self.charts.currentWidget() is self.long_chart

    def show_progress(self, done: int, total: int) -> None:
        """`done` of `total` steps timed, and the time left at the pace so far (pauses for the live run not
        counted)."""
        now = time.monotonic()
        if done <= 1 or self._pace is None:
            self._pace = (now, done, 0.0)
        started, first, paused = self._pace
        left = ""
        if done > first:
            per_step = max(now - started - paused, 0.0) / (done - first)
            left = f", about {_duration(per_step * (total - done))} left"
        self.progress.setRange(0, total)
        self.progress.setValue(done)
        if self._paused_at is not None:  # a step the sweep timed before it was paused, read after: still paused
            self.progress.setFormat(f"paused while the run steps: {done} of {total} steps timed")
        else:
            self.progress.setFormat(f"measuring: {done} of {total} steps timed{left}")

    def show_paused(self, on: bool) -> None:
        """The sweep stops while the live run computes, and goes on after (its time left does not count it)."""
        if self._pace is not None:
            started, first, paused = self._pace
            if on:
                self._paused_at = time.monotonic()
            elif self._paused_at is not None:
                self._pace = (started, first, paused + time.monotonic() - self._paused_at)
        if not on:
            self._paused_at = None
        if on:
            self.progress.setFormat(f"paused while the run steps: {self.progress.value()} of "
                                    f"{self.progress.maximum()} steps timed")

    def show_partial(self, result: SweepResult) -> None:
        """The curves as far as the first turn has measured them (the final result takes the median of every
        turn)."""
        if self.result is not None:
            return
        self.cached_curve.setData(list(result.lengths), list(result.cached_ms))
        self.uncached_curve.setData(list(result.lengths), list(result.uncached_ms))

    def show_result(self, result: SweepResult) -> None:
        self.result = result
        self._end_progress()
        self.heading.setText(f"<b>Speed</b> of {result.model} ({result.dtype}), measured on this machine")
        self.headline.setText(f"<b>{result.headline()}</b>")
        self.cached_curve.setData(list(result.lengths), list(result.cached_ms))
        self.uncached_curve.setData(list(result.lengths), list(result.uncached_ms))
        last = result.lengths[-1]
        self.cached_label.setPos(last, result.cached_ms[-1])
        self.uncached_label.setPos(last, result.uncached_ms[-1])
        for label in (self.cached_label, self.uncached_label):
            label.show()
        top = max(max(result.uncached_ms), max(result.cached_ms))
        self.plot_item.setXRange(0, last * 1.3, padding=0.02)  # room for the labels at the lines' ends
        self.plot_item.setYRange(0, top * 1.15, padding=0.0)

    def show_long_partial(self, result: CacheSweepResult) -> None:
        """The lines as far as the sweep has measured them."""
        if self.long_result is None:
            self.long_chart.show_result(result)
            self.headline.setText(long_headline(result, self._theme, final=False))

    def show_long_result(self, result: CacheSweepResult) -> None:
        self.long_result = result
        self._end_progress()
        self.show_long(True)
        self.heading.setText(f"<b>Long sweep</b> of {result.model} ({result.dtype}): every kind of cache, measured "
                             f"on this machine")
        self.long_chart.show_result(result)
        self.headline.setText(long_headline(result, self._theme))

    def show_failure(self, sentence: str) -> None:
        self._end_progress()
        self.headline.setText(sentence)

    def show_cancelled(self) -> None:
        self._end_progress()
        if self.showing_long and self.long_result is None:
            self.long_chart.clear()
            self.headline.setText("The long sweep was cancelled. Press Long sweep to measure it again.")
        elif self.result is None and not self.showing_long:
            self.headline.setText("The sweep was cancelled. " + WAITING)

    def _end_progress(self) -> None:
        self.progress.hide()
        self.cancel_button.hide()
        self.measure_button.setEnabled(True)
        self.long_button.setEnabled(True)
        if self.result is not None or not self.showing_long:
            self.measure_button.setText("&Measure again")

    def set_controls_shown(self, shown: bool) -> None:
        """Show or hide the Measure and Cancel buttons and the progress (a slide has no buttons)."""
        self._controls_shown = shown
        self.measure_button.setVisible(shown)
        self.long_button.setVisible(shown)
        if not shown:
            self.progress.hide()
            self.cancel_button.hide()

    @property
    def measuring(self) -> bool:
        return not self.progress.isHidden()

    # ----- looks -----
    def set_font_scale(self, scale: float) -> None:
        self._font_scale = scale
        self._apply_fonts()
        self.long_chart.set_font_scale(scale)

    def set_theme(self, theme: Theme) -> None:
        self._theme = theme
        self._apply_theme()
        self._apply_fonts()
        self.long_chart.set_theme(theme)
        if self.showing_long and self.long_result is not None:  # the variants' names in their new colours
            self.headline.setText(long_headline(self.long_result, theme))

    def _apply_theme(self) -> None:
        theme = self._theme
        self.plot_widget.setBackground(theme.background)
        style_plot(self.plot_item, theme)
        for curve, label, colour in ((self.cached_curve, self.cached_label, theme.teal),
                                     (self.uncached_curve, self.uncached_label, theme.amber)):
            curve.setPen(pg.mkPen(colour, width=3))
            curve.setSymbolBrush(colour)
            curve.setSymbolPen(pg.mkPen(colour))
            label.setColor(colour)
        self.setStyleSheet(f"QWidget#speedView {{ background: {theme.background}; }} "
                           f"QWidget#speedView QLabel {{ color: {theme.foreground}; background: transparent; }}")
        self.why.setStyleSheet(f"color: {theme.muted};")

    def _apply_fonts(self) -> None:
        scale = self._font_scale
        base = QFont(self.font())
        for label, points in ((self.heading, 12.0), (self.headline, 12.0), (self.why, 10.0)):
            font = QFont(base)
            font.setPointSizeF(points * scale)
            label.setFont(font)
        tick = QFont(base)
        tick.setPointSizeF(10.0 * scale)
        for name in ("bottom", "left"):
            axis = self.plot_item.getAxis(name)
            axis.setTickFont(tick)
            axis.label.setFont(tick)
        ends = QFont(base)
        ends.setPointSizeF(11.0 * scale)
        ends.setBold(True)
        for label in (self.cached_label, self.uncached_label):
            label.setFont(ends)
        size = max(6, round(8 * scale))
        for curve in (self.cached_curve, self.uncached_curve):
            curve.setSymbolSize(size)


def _duration(seconds: float) -> str:
    """'40 s', '3 min'."""
    return f"{max(1, round(seconds))} s" if seconds < 90 else f"{round(seconds / 60)} min"

