"""The serving view's batch on the GUI side: it asks the worker for a batch and its passes, keeps the records,
and plays them by a timer that asks for the next pass only once the last one has arrived."""

from __future__ import annotations

import dataclasses

from PySide6.QtCore import QObject, QTimer, Signal

from kvviz.app.run.controller import WorkerController
from kvviz.core.batch_records import BatchPlan, BatchRecord, BatchRequest, BatchSpeed


class BatchSession(QObject):
    """One batch at a time. `start(request)` plans it (its run_id replaced), `step()` asks for one pass,
    `toggle_play(interval_ms)` steps on its own; records of a batch already replaced are dropped."""

    started = Signal(object)  # BatchPlan
    computed = Signal(object)  # BatchRecord
    measured = Signal(object)  # BatchSpeed
    failed = Signal(str)  # one sentence
    state_changed = Signal()

    def __init__(self, controller: WorkerController, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.controller = controller
        self.plan: BatchPlan | None = None
        self.records: list[BatchRecord] = []
        self.speed: BatchSpeed | None = None
        self.playing = False
        self._run_id = 0
        self._waiting = False  # a pass was asked for and has not arrived
        self._queued = 0  # presses of Step while a pass was computing: each asks for one more pass, in turn
        self._interval_ms = 300
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.timeout.connect(self._ask)
        w = controller.worker
        w.batch_started.connect(self._on_started)
        w.batch_computed.connect(self._on_computed)
        w.batch_measured.connect(self._on_measured)
        w.batch_failed.connect(self._on_failed)

    @property
    def finished(self) -> bool:
        return bool(self.records) and self.records[-1].final

    @property
    def can_step(self) -> bool:
        return self.plan is not None and not self.finished

    def start(self, request: BatchRequest) -> None:
        self.pause()
        self._run_id += 1
        self.plan, self.records, self.speed, self._waiting, self._queued = None, [], None, False, 0
        self.controller.start_batch(dataclasses.replace(request, run_id=self._run_id))
        self.state_changed.emit()

    def step(self) -> None:
        """One more pass; pressed while a pass computes, it is counted and asked for once that one arrives."""
        self.pause()
        if self._waiting and self.can_step:
            self._queued += 1
        self._ask()

    def forget(self) -> None:
        """Drop the batch (its model was replaced): nothing to step until the next `start`."""
        self.pause()
        self._run_id += 1  # a pass still on its way belongs to the old batch
        self.plan, self.records, self.speed, self._waiting, self._queued = None, [], None, False, 0
        self.state_changed.emit()

    def toggle_play(self, interval_ms: int) -> None:
        if self.playing:
            self.pause()
        elif self.can_step:
            self._interval_ms = interval_ms
            self.playing = True
            self._ask()
            self.state_changed.emit()

    def pause(self) -> None:
        self._timer.stop()  # (presses already counted still get their passes)
        if self.playing:
            self.playing = False
            self.state_changed.emit()

    def _ask(self) -> None:
        if self.can_step and not self._waiting:
            self._waiting = True
            self.controller.step_batch()

    def _on_started(self, plan: BatchPlan) -> None:
        if plan.run_id == self._run_id:
            self.plan = plan
            self.started.emit(plan)
            self.state_changed.emit()

    def _on_computed(self, run_id: int, record: BatchRecord) -> None:
        if run_id != self._run_id:
            return
        self._waiting = False
        self.records.append(record)
        self.computed.emit(record)
        if record.final:
            self._queued = 0
            self.pause()
            self.state_changed.emit()
        elif self._queued:
            self._queued -= 1
            self._ask()
        elif self.playing:
            self._timer.start(self._interval_ms)

    def _on_measured(self, run_id: int, speed: BatchSpeed) -> None:
        if run_id == self._run_id:
            self.speed = speed
            self.measured.emit(speed)

    def _on_failed(self, run_id: int, message: str) -> None:
        if run_id == self._run_id:
            self._waiting, self._queued = False, 0
            self.pause()
            self.plan = None
            self.failed.emit(message)
            self.state_changed.emit()
