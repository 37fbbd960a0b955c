"""A lesson's serving steps in the window: a batch of prompts (kvviz.app.lesson.step_state.start_batch), or a trace
served pass by pass (ServingMode.run_trace), each taken to the step's pass and, for its question's answer, on to the
record that answers it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Signal

from kvviz.app.lesson.step_state import shows_step, start_batch
from kvviz.core.errors import KvvizError
from kvviz.core.serve_records import ServePlan
from kvviz.lessons.lesson import LessonStep, measured_batch_answer
from kvviz.lessons.trace_answers import find_trace_answer, reached
from kvviz.lessons.trace_step import read_step_trace

if TYPE_CHECKING:
    from kvviz.app.lesson.host import LessonHost


class ServingSteps(QObject):
    """Shows a serving step (`show`) and measures its question's answer (`measured`, NaN when its trace ended without
    it). A batch runs to `advance_to` passes, its answer's slide to its end, answered by its last pass. A trace is
    planned by ServingMode.run_trace and stepped here a pass at a time until `advance_to` passes are done (a pass where
    nothing runs has no record: the step shows the next that runs, as kvviz.lessons.trace_answers.reached says, and
    as the slides do); its answer's slide goes on to the first pass whose record holds the answer."""

    measured = Signal(object)  # the revealed question's answer

    def __init__(self, window: LessonHost, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._window = window
        self.step: LessonStep | None = None  # the serving step shown (None: none)
        self.revealed = False
        self._waiting = False  # for the record that answers the question
        self._prompts: tuple[str, ...] = ()  # the step's trace's prompts: its plan is the step's
        batch = window.serving.batch
        batch.run_started.connect(self._on_started)
        batch.record_computed.connect(self._on_record)

    def show(self, step: LessonStep, revealed: bool, forward: bool) -> None:
        """`step`'s batch or trace, at its pass (`revealed`: its question's answer, measured); `forward` from its
        question, with the trace there, only the passes after it are taken."""
        self.step, self.revealed = step, revealed
        self._waiting = revealed and step.question is not None
        if step.batch:
            start_batch(self._window, step, revealed)
            return
        if self._window.session.model_info is None:
            return  # the lesson shows the step again once the model is loaded (LessonMode._on_model_loaded)
        try:
            self._prompts = tuple(request.prompt for request in read_step_trace(step.trace_path))
        except KvvizError:
            self._prompts = ()  # gone since the lesson was read: the serving view says why it cannot serve it
        batch = self._window.serving.batch
        if forward and revealed and self.is_step(batch.plan) and self.shows(step, False):
            self._go_on()  # on from the question's pass
            return
        self._window.serving.run_trace(step.serve_request(), 0)  # this class takes the passes (see the class)

    def leave(self) -> None:
        """No serving step shown: nothing waits for its passes."""
        self.step, self._waiting = None, False

    def is_step(self, plan: object) -> bool:
        """`plan` serves the current trace step's trace on its server."""
        step = self.step
        return (isinstance(plan, ServePlan) and step is not None and step.serves_trace
                and (plan.prefix_cache, plan.chunk, plan.block_size, plan.num_blocks, plan.max_batched_tokens)
                == (step.prefix_cache, step.chunk, step.block_size, step.num_blocks, step.max_batched_tokens)
                and tuple(r.prompt for r in plan.requests) == self._prompts)

    def shows(self, step: LessonStep, revealed: bool) -> bool:
        """The window shows `step` where its slide is: its batch (step_state.shows_step), or its trace at its
        `advance_to` passes, or, for the answer, at the pass that answered it."""
        if step.batch:
            return shows_step(self._window, step, revealed)
        batch = self._window.serving.batch
        if step is not self.step or not self.is_step(batch.plan):
            return False
        plan, records = batch.plan, batch.records
        shown = reached(plan, records, step.advance_to)
        if not revealed:
            return shown == len(records)
        found = find_trace_answer(step.question, plan, records, shown, step.request) if shown is not None else None
        return found is not None and found[0] == len(records)

    def _on_started(self, plan: object) -> None:
        if self.step is not None and self.step.serves_trace and self.is_step(plan):
            self._go_on()

    def _on_record(self, record) -> None:
        step = self.step
        if step is None:
            return
        if step.batch:
            if self._waiting and step.question and record.final:
                self._waiting = False
                self.measured.emit(measured_batch_answer(step.question, record))
        elif self.is_step(self._window.serving.batch.plan):
            self._go_on()

    def _go_on(self) -> None:
        """One more pass of the step's trace, until `advance_to` passes are done and, on its answer's slide, until
        the record that answers its question is in (then `measured`)."""
        step, batch = self.step, self._window.serving.batch
        shown = reached(batch.plan, batch.records, step.advance_to)
        if shown is not None and not self._waiting:
            return
        found = find_trace_answer(step.question, batch.plan, batch.records, shown, step.request) if (
            shown is not None) else None
        if found is None:
            self._window.serving.step()  # not there yet
            return
        self._waiting = False
        self.measured.emit(found[1])  # NaN: the trace ended without it
