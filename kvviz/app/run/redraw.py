"""Coalesced redraws: records queue up and the views draw them in slices, within a time budget."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from pyqtgraph import GraphicsView
from PySide6.QtCore import QEvent, QObject, QTimer
from PySide6.QtWidgets import QApplication, QWidget

from kvviz.app.views.base import RunViewProtocol, redraw_slices
from kvviz.core.records import RunPlan, StepRecord

REDRAW_MS = 30  # views redraw at most this often, with the latest records
REDRAW_MAX_MS = 250  # ... and at least this often while records arrive
REDRAW_BUDGET = 0.1  # the share of time redraws may take: a slow redraw spaces the next ones out
# At full-speed autoplay the worker never waits, and every redraw (Python painting, holding the GIL)
# slows it down about as much as it takes: there the views redraw less often (a 7 ms redraw every 0.7 s),
# and at least once a second.
REDRAW_BUDGET_FULL_SPEED = 0.01
REDRAW_MAX_MS_FULL_SPEED = 1000


class Painter:
    """Paints what the views in `window` just changed, now (the scheduler calls it after each slice, so that
    the time a redraw takes is its whole cost). Call `find_plots()` again when a panel with plots joins.

    Without it Qt paints on its own schedule, outside the redraws the scheduler times and spaces: GUI autoplay
    then ran at 105 and 101 tokens/s against 116 and 115 with it (the embedded model, `kvviz bench --gui
    --repeat 3`, best of 3, 2026-12-04), the stall alike (5.0, 5.6 ms against 8.9, 5.0 ms)."""

    def __init__(self, window: QWidget) -> None:
        self._window = window
        self._scenes: list = []
        self.find_plots()

    def find_plots(self) -> None:
        self._scenes = [view.scene() for view in self._window.findChildren(GraphicsView)]

    def __call__(self) -> None:
        if not self._window.isVisible():
            return
        for scene in self._scenes:
            QApplication.sendPostedEvents(scene, QEvent.Type.MetaCall.value)  # a plot posts its scene's changes
        QApplication.sendPostedEvents(self._window, QEvent.Type.UpdateRequest.value)  # the dirty regions only


class RedrawScheduler(QObject):
    """Hands records to the views at redraw time and draws them in slices.

    `add(record)` only queues; a single-shot timer, spaced so that drawing takes at most a budgeted
    share of the time, starts a redraw. A redraw is a list of slices: the first gives every view
    the queued records, then each view draws its part (`redraw_slices`), each slice in its own pass
    of the event loop, so no single pass blocks the GUI for a whole redraw. `paint_now` is called
    after each slice, so that the time measured includes the painting. `flush()` draws everything
    at once (tests, exports, the end of a run).
    """

    def __init__(self, views: Sequence[RunViewProtocol], paint_now: Callable[[], None],
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.views = list(views)
        self.full_speed = False  # set by the window while autoplay runs as fast as it can
        self.max_redraw_ms = 0.0  # the slowest redraw so far, painting included
        self.max_slice_ms = 0.0  # the slowest single pass of the event loop spent drawing so far
        self._paint_now = paint_now
        self._pending: list[StepRecord] = []
        self._slices_left: list[Callable[[], None]] = []
        self._slices_seconds = 0.0
        self._last_redraw = 0.0
        self._interval_ms = REDRAW_MS
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.timeout.connect(self._start_sliced_redraw)
        # The next slice waits on a zero timer, not a posted call: timers that fell due during a slice
        # (input, autoplay, the GUI benchmark's stall probe) fire before it, instead of after the redraw.
        self._slice_timer = QTimer(self)
        self._slice_timer.setSingleShot(True)
        self._slice_timer.setInterval(0)
        self._slice_timer.timeout.connect(self._draw_next_slice)
        self._when_drawn: list[Callable[[], None]] = []

    @property
    def pending(self) -> bool:
        """Records queued, or a redraw under way."""
        return bool(self._pending) or bool(self._slices_left)

    def reset(self, plan: RunPlan) -> None:
        """A new run: drop what is queued, reset every view, draw."""
        self.stop()
        self._pending = []
        for view in self.views:
            view.reset(plan)
        self.flush()

    def add(self, record: StepRecord) -> None:
        self._pending.append(record)
        self._schedule()

    def _schedule(self) -> None:
        if not self._timer.isActive() and not self._slices_left:
            since = (time.perf_counter() - self._last_redraw) * 1000
            self._timer.start(max(0, int(self._interval_ms - since)))

    def redraw_soon(self, then: Callable[[], None] | None = None) -> None:
        """Start a sliced redraw now (the end of a run); call `then` once everything queued is drawn."""
        if then is not None:
            self._when_drawn.append(then)
        if not self._slices_left:
            self._timer.stop()
            self._start_sliced_redraw()

    def catch_up(self) -> None:
        """Draw the queued records soon (autoplay paused), not after a full-speed interval."""
        if self._pending and not self._slices_left:
            self._timer.start(0)

    def forget(self) -> None:
        """Drop the records queued and any redraw under way: the run they belong to is gone."""
        self.stop()
        self._pending = []

    def stop(self) -> None:
        self._timer.stop()
        self._slice_timer.stop()
        self._slices_left = []
        self._when_drawn = []

    def flush(self) -> None:
        """Draw the latest state of every view now, all at once."""
        self._timer.stop()
        self._slice_timer.stop()
        started = time.perf_counter()
        self._slices_left = []
        for draw in self._slices():
            draw()
        self._paint_now()
        spent = time.perf_counter() - started
        self.max_slice_ms = max(self.max_slice_ms, spent * 1000)  # one pass of the event loop, all of it
        self._account(spent)
        self._call_when_drawn()

    def _apply_pending(self) -> None:
        records, self._pending = self._pending, []
        if records:
            for view in self.views:
                view.apply(records)

    def _slices(self) -> list[Callable[[], None]]:
        """Taking the records, then every shown view's drawing. A hidden view (the panel of the other
        mode) takes the records but draws nothing; it draws when a run starts with it shown."""
        slices: list[Callable[[], None]] = [self._apply_pending]
        for view in self.views:
            if not isinstance(view, QWidget) or view.isWindow() or view.isVisibleTo(view.window()):
                slices.extend(redraw_slices(view))
        return slices

    def _start_sliced_redraw(self) -> None:
        self._slices_left = self._slices()
        self._slices_seconds = 0.0
        self._draw_next_slice()

    def _draw_next_slice(self) -> None:
        if not self._slices_left:
            return
        started = time.perf_counter()
        self._slices_left.pop(0)()
        self._paint_now()
        spent = time.perf_counter() - started
        self.max_slice_ms = max(self.max_slice_ms, spent * 1000)
        self._slices_seconds += spent
        if self._slices_left:
            self._slice_timer.start()
        else:
            self._account(self._slices_seconds)
            if self._pending and self._when_drawn:  # the end of a run arrived during the slices: go on now
                self._timer.start(0)
            elif self._pending:  # records arrived during the slices
                self._schedule()
            else:
                self._call_when_drawn()

    def _call_when_drawn(self) -> None:
        callbacks, self._when_drawn = self._when_drawn, []
        for callback in callbacks:
            callback()

    def _account(self, cost_seconds: float) -> None:
        """Space the next redraws so that drawing takes at most the budgeted share of the time."""
        self._last_redraw = time.perf_counter()
        cost_ms = cost_seconds * 1000
        self.max_redraw_ms = max(self.max_redraw_ms, cost_ms)
        budget, longest = ((REDRAW_BUDGET_FULL_SPEED, REDRAW_MAX_MS_FULL_SPEED) if self.full_speed
                           else (REDRAW_BUDGET, REDRAW_MAX_MS))
        self._interval_ms = int(min(longest, max(REDRAW_MS, cost_ms / budget)))
