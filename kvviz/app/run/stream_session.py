"""The session protocol every mode keeps: a run (or a batch) started, stepped, played and paused through the one
worker, its records kept in order, and anything of a run already replaced dropped.

kvviz.app.run.session.RunSession (the single run and compare mode: a step is a token) and the serving batch's
session (a step is a pass) are both a StreamSession; each has a lane of its own in the worker, so that leaving a
mode and coming back finds its run where it was.
"""

from __future__ import annotations

import dataclasses

from PySide6.QtCore import QObject, Signal

from kvviz.app.run.controller import WorkerController
from kvviz.app.run.shared_interpreter import worker_thread_guards


class StreamSession(QObject):
    """One run at a time in `lane`: `start(request)` plans it (its run_id replaced), `step()` asks for one step,
    `toggle_play(interval_ms)` has the worker step on its own (the one autoplay); records of a run already replaced
    are dropped. A plan tells its steps (`plan.steps`, `plan.steps_done(record)`), a record whether it is the
    last (`record.final`)."""

    run_started = Signal(object)  # the plan (RunPlan, BatchPlan, ServePlan)
    record_computed = Signal(object)  # a record of the current run (StepRecord, BatchRecord, ServeRecord)
    run_finished = Signal(object)  # the current run's last record
    run_failed = Signal(str)  # one sentence
    run_measured = Signal(object)  # what the worker measured after the last step (BatchSpeed, ServeMeasure)
    playing_changed = Signal(bool)
    state_changed = Signal()  # can_step, playing or finished changed

    def __init__(self, controller: WorkerController, lane: str, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.controller = controller
        self.lane = lane
        self.plan = None
        self.records: list = []  # the current run's, in order: its one history
        self.measured = None  # run_measured's, for the current run
        self.playing = False
        self._play_asked = False  # Play sent to the worker, which has not said it plays yet (see pause)
        self.finished = False
        self._run_id = 0
        self._steps_requested = 0
        w = controller.worker
        w.started.connect(self._on_started)
        w.failed.connect(self._on_failed)
        w.computed.connect(self._on_computed)
        w.finished.connect(self._on_finished)
        w.measured.connect(self._on_measured)
        w.playing_changed.connect(self._on_playing_changed)

    # ----- state -----
    @property
    def can_step(self) -> bool:
        return self.plan is not None and not self.finished

    @property
    def last_record(self):
        """The current run's latest record."""
        return self.records[-1] if self.records else None

    @property
    def steps_done(self) -> int:
        """Steps the current run has taken so far."""
        return self.plan.steps_done(self.records[-1]) if self.records and self.plan is not None else 0

    # ----- commands -----
    def start(self, request) -> None:
        """Plan a fresh run of `request` (its run_id replaced); nothing is computed until `step` or `toggle_play`."""
        self.pause()
        self._run_id += 1
        self._steps_requested = 0
        self.finished = False
        self.plan, self.records, self.measured = None, [], None
        self.controller.start(self.lane, dataclasses.replace(request, run_id=self._run_id))
        self.state_changed.emit()

    def forget(self) -> None:
        """Drop the run (its model was replaced): nothing to step until the next `start`."""
        self.pause()
        self._run_id += 1  # a step still on its way belongs to the old run
        self.plan, self.records, self.measured, self.finished = None, [], None, False
        self.controller.drop(self.lane)
        self.state_changed.emit()

    def step(self) -> None:
        """One step; pauses autoplay first. Each press is sent at once and the worker takes them in turn, so a
        press during a step is never lost, and none goes past the run's last step."""
        if not self.can_step:
            return
        self.pause()
        if self._steps_requested < self.plan.steps:
            self._steps_requested += 1
            self.controller.step(self.lane)

    def toggle_play(self, interval_ms: int) -> None:
        if self.playing or self._play_asked:
            self.pause()
        elif self.can_step:
            self._play_asked = True  # until the worker says it plays: a Step pressed meanwhile still pauses it
            self.controller.play(self.lane, interval_ms)

    def pause(self) -> None:
        if self.playing or self._play_asked:
            self._play_asked = False
            self.controller.pause()

    def set_interval(self, interval_ms: int) -> None:
        self.controller.set_interval(interval_ms)

    # ----- what the worker says -----
    def _ours(self, lane: str, run_id: int) -> bool:
        return lane == self.lane and run_id == self._run_id

    def _on_started(self, lane: str, plan) -> None:
        if self._ours(lane, plan.run_id):
            self.plan = plan
            self.run_started.emit(plan)
            self.state_changed.emit()

    def _on_failed(self, lane: str, run_id: int, message: str) -> None:
        if self._ours(lane, run_id):
            self.pause()
            self.plan = None
            self.run_failed.emit(message)
            self.state_changed.emit()

    def _on_computed(self, lane: str, run_id: int, record) -> None:
        if not self._ours(lane, run_id):
            return
        self.records.append(record)
        self._steps_requested = max(self._steps_requested, self.plan.steps_done(record))  # autoplay's steps too
        self.record_computed.emit(record)

    def _on_finished(self, lane: str, run_id: int, record) -> None:
        if self._ours(lane, run_id):
            self.finished = True
            self.run_finished.emit(record)
            self.state_changed.emit()

    def _on_measured(self, lane: str, run_id: int, measured) -> None:
        if self._ours(lane, run_id):
            self.measured = measured
            self.run_measured.emit(measured)

    def _on_playing_changed(self, lane: str, playing: bool) -> None:
        if lane != self.lane or playing == self.playing and not self._play_asked:
            return
        worker_thread_guards.hold_old_generations(playing)
        self.playing = playing
        self._play_asked = False  # the worker's own word from now on
        self.playing_changed.emit(playing)
        self.state_changed.emit()
