"""Lesson mode: walks the window through a lesson's steps, a question and its measured answer at a time."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

from PySide6.QtCore import QObject, QSignalBlocker, QTimer

from kvviz.app.lesson.focus import LessonFocus
from kvviz.app.lesson.free_app import FreeApp, give_back, keep_free_app
from kvviz.app.lesson.host import LessonHost
from kvviz.app.lesson.panel import LessonPanel
from kvviz.app.lesson.perplexity_answers import Key, PerplexityAnswers
from kvviz.app.lesson.serving_steps import ServingSteps
from kvviz.app.lesson.step_state import plan_is_step, put_step_controls, show_serving, shows_step
from kvviz.app.theme import Theme
from kvviz.app.window.actions import set_lesson_keys
from kvviz.app.window.dialogs import show_error
from kvviz.core.records import ModelInfo, StepRecord
from kvviz.lessons.lesson import (
    Answer,
    Lesson,
    LessonError,
    LessonStep,
    format_answer,
    load_lesson,
    measured_answer,
)

BUILTIN = ("", "builtin")  # lesson sources that mean the built-in lesson


def lesson_path(source: str) -> str | None:
    """The path load_lesson takes for a --lesson value: None for the built-in lesson."""
    return None if source in BUILTIN else source


class LessonMode(QObject):
    """Puts `window` into each slide of a lesson: a step, or a step's measured answer.

    A step sets the prompt, the model (when it names one), the cache mode and the budget, greedy
    sampling, and replays the run to its `advance_to`. A step with a question shows the question
    first; the next press takes one generation step and shows, beside the audience's guess, the answer
    measured from the step's last record (the one the counter shows: after the last token, the pass
    that fills the cache) and the record before the step; a perplexity question's, on the held-out text in the
    background, from the question on (PerplexityAnswers). Any slide reached backwards (or after free
    steps) is replayed, so it looks as it did. A question's guess field has the keyboard focus, so
    typed digits go in (Enter reveals). Leaving gives the keys back and the free app its own state: its
    prompt and run settings, compare mode and Break the cache, its model, and its run at the token it was at.
    """

    def __init__(self, window: LessonHost, panel: LessonPanel, source: str | None = None) -> None:
        super().__init__(window)
        self._window = window
        self.panel = panel
        self.focus = LessonFocus(window.workspace, window.centralWidget(), lambda: window.actions["memory"],
                                 window.speed, lambda: window.show_speed(activate=False), window.session, self)
        self.source = source  # what L opens: the lesson given at launch, else the built-in one
        self.lesson: Lesson | None = None
        self.active = False
        self.slide = 0
        self.measured: Answer | None = None  # the current slide's measured answer, once it is in
        self._guesses: dict[int, str] = {}  # step index -> the audience's guess
        self._nexts_when_measured = 0  # Page Down presses while the revealed answer was being measured
        self._revealing = False  # waiting for the record that answers the question
        self._model_asked: str | None = None
        self._free: FreeApp | None = None  # the free app's state while a lesson is on
        s = window.session
        s.record_computed.connect(self._on_record_computed)
        s.model_loaded.connect(self._on_model_loaded)
        self.serving_steps = ServingSteps(window, self)  # a serving step's batch or trace, and its answer
        self.serving_steps.measured.connect(self._set_measured)  # only while its answer's slide shows (leave)
        window.speed.sweeper.finished.connect(self._on_speed_measured)
        panel.guess_entered.connect(self.next)
        panel.guess_edited.connect(self._on_guess_edited)
        panel.placed.connect(self._on_placed)
        self.perplexity = PerplexityAnswers(window, self)  # a perplexity question's, measured in the background
        self.perplexity.measured.connect(self._on_perplexity_measured)
        self.perplexity.failed.connect(lambda key, message: self._on_perplexity_measured(key, float("nan"), message))

    # ----- entering and leaving -----
    def open(self, source: str | None = None) -> bool:
        """Read the lesson in `source` (None, "" or "builtin": the built-in one) and start it at its first
        step; a lesson that cannot be read gets an error dialog and the app stays as it is."""
        try:
            lesson = load_lesson(lesson_path(source or ""))
        except LessonError as exc:
            show_error(self._window, "Lesson not loaded", str(exc))
            self._show_active(False)
            return False
        self.lesson, self.slide, self._guesses = lesson, 0, {}
        self.focus.lesson = lesson
        self.source = source
        self.start()
        return True

    def switch(self, source: str) -> None:
        """Start the lesson `source` (a file or a built-in lesson's name) at its first step, leaving the one on."""
        self.stop()
        self.open(source)

    def set_active(self, on: bool) -> None:
        """Help > Lesson (L): start the lesson (where it was left, or the first step), or leave it."""
        if not on:
            self.stop()
        elif self.lesson is None:
            self.open(self.source)
        else:
            self.start()

    def start(self) -> None:
        if self.lesson is None or self.active:
            return
        w = self._window
        self._free = keep_free_app(w)
        self.active = True
        set_lesson_keys(w.actions, True)
        self.panel.lecturer_notes.set_action(w.actions["lesson_notes"])
        self.panel.show()
        self._on_placed(self.panel.beside)
        self._show_active(True)
        self.focus.start_sweep_soon()
        self._show_slide(forward=False)

    def stop(self) -> None:
        """Back to the free app, as it was when the lesson began (see the class)."""
        if not self.active:
            return
        w = self._window
        self.active = False
        self._revealing = False
        self.serving_steps.leave()
        self.perplexity.shut_down()
        show_serving(self._window, False)
        set_lesson_keys(w.actions, False)
        self.panel.hide()
        w.controls.show()
        self.focus.clear()
        self._show_active(False)
        w.focus_grid()
        free, self._free = self._free, None
        if free is not None:
            give_back(w, free)

    def escape(self) -> bool:
        """Esc: out of the lesson (a question's guess field too); False when there was nothing to leave."""
        leaving = self.active
        self.stop()
        return leaving

    def _on_placed(self, beside: bool) -> None:
        if self.active:  # a strip above the views takes the run controls' place (the lesson sets them)
            self._window.controls.setVisible(beside)

    def _show_active(self, on: bool) -> None:
        action = self._window.actions["lesson"]
        with QSignalBlocker(action):
            action.setChecked(on)

    # ----- moving -----
    @property
    def step(self) -> LessonStep | None:
        """The current slide's lesson step."""
        if self.lesson is None:
            return None
        return self.lesson.steps[self.lesson.slides()[self.slide][0]]

    @property
    def revealed(self) -> bool:
        """Whether the current slide is a question's answer."""
        return self.lesson is not None and self.lesson.slides()[self.slide][1]

    def next(self) -> None:
        """Page Down, Right: the answer to the question, else the next step. On a revealed question whose answer
        is still being measured the lesson waits, saying so, and goes on once it is measured: no step is passed
        with its answer missing."""
        if not (self.active and self.lesson is not None and self.slide + 1 < len(self.lesson.slides())):
            return
        if self.revealed and self.step.question and self.measured is None:
            self._nexts_when_measured += 1  # each press counts: a clicker pressed twice goes on twice
            self.panel.hint.setText("measuring\u2026 then the next step")
            self.panel.hint.show()
            return
        self.slide += 1
        queued = self._nexts_when_measured
        self._show_slide(forward=True)  # (it forgets the presses queued on the slide before)
        if queued > 0:  # more presses were waiting: they go on as they came
            self._nexts_when_measured = queued - 1
            QTimer.singleShot(0, self, self.next)

    def _set_measured(self, value: Answer, precision: str = "") -> None:
        """The revealed question's answer is in: shown, and a Page Down pressed while it was measured goes on now."""
        self._revealing = False
        self.measured = value
        self.panel.set_answer(format_answer(self.step.question, value, precision))
        if self._nexts_when_measured:
            self._nexts_when_measured -= 1
            QTimer.singleShot(0, self, self.next)  # after the answer is drawn

    def back(self) -> None:
        """Page Up, Left: the slide before, as it was."""
        if self.active and self.slide > 0:
            self.slide -= 1
            self._show_slide(forward=False)

    def _show_slide(self, forward: bool) -> None:
        self._nexts_when_measured = 0
        step, revealed, w = self.step, self.revealed, self._window
        self._show_step_text()
        self.measured = None
        self._revealing = revealed
        show_serving(self._window, step.serving)
        if not step.serving:
            self.serving_steps.leave()
        else:
            self.focus.point_at(step)
            if step.model is not None and step.model not in (w.session.source, self._model_asked):
                self._model_asked = step.model
                w.load_model(step.model)  # the batch follows once it is loaded (_on_model_loaded)
                return
            self.serving_steps.show(step, revealed, forward)
            w.focus_grid()
            return
        self._set_controls(step)
        self.focus.point_at(step)
        w.focus_grid()  # the keys step the lesson and the run, none of them types
        if step.question and not revealed:
            self.panel.focus_guess()  # ... but digits go into the guess (GuessEdit passes the other keys on)
        if step.measures_perplexity:  # measured from the question on; at once when known
            known = self.perplexity.ask(self._perplexity_key(step), step)
            if known is not None and revealed:
                self._set_measured(known)
        if step.model is not None and step.model not in (w.session.source, self._model_asked):
            self._model_asked = step.model
            w.load_model(step.model)  # the step's run follows once it is loaded (_on_model_loaded)
            w.session.start_run(w.controls.request(), step.advance_to + int(revealed))  # if the load fails
            return
        if forward and revealed and self._at_question(step):
            w.session.step()  # one generation step: its record holds the answer
        else:
            self._start_run()

    @property
    def step_number(self) -> int:
        """The current slide's step, counted from 1 (as the panel shows it)."""
        return self.lesson.slides()[self.slide][0] + 1 if self.lesson is not None else 0

    def take_focus(self) -> bool:
        """The keyboard to the guess field while the slide asks a question not yet answered (True), so that
        typed digits go in however the slide was reached: a serving step, a compare step, a model load."""
        if not (self.active and self.step is not None and self.step.question and not self.revealed):
            return False
        self.panel.focus_guess()
        return self.panel.guess_edit.hasFocus() or not self._window.isActiveWindow()

    def _show_step_text(self) -> None:
        """The panel shows the current slide, its text saying what the speed sweep measured (or that it is
        still being measured)."""
        step, index = self.step, self.lesson.slides()[self.slide][0]
        if step.needs_speed:
            result = self._window.speed.result
            step = replace(step, text=step.text_with(result.headline() if result is not None else None))
        self.panel.show_step(step, index + 1, len(self.lesson.steps), self.revealed, self._guesses.get(index, ""))

    def _start_run(self) -> None:
        w = self._window
        if self.step.serving:
            self.serving_steps.show(self.step, self.revealed, forward=False)
            return
        w.session.start_run(w.controls.request(), self.step.advance_to + int(self.revealed))

    def _at_question(self, step: LessonStep) -> bool:
        """Whether the current run is the step's, at its `advance_to` (its records there in), and can step."""
        s = self._window.session
        if not (plan_is_step(s.plan, step) and s.can_step and s.steps_done == step.advance_to):
            return False
        return step.advance_to == 0 or s.record_at(step.advance_to) is not None

    def _set_controls(self, step: LessonStep) -> None:
        w = self._window
        attention = self.focus.attention_for(step, w.actions["attention"].isChecked())
        put_step_controls(w.controls, w.actions, step, attention)
        w.workspace.run_view.show_attention(attention)

    def _on_speed_measured(self, _result: object) -> None:
        if self.active and self.step is not None and self.step.needs_speed:
            self._show_step_text()

    def set_theme(self, chosen: Theme) -> None:
        self.focus.set_theme(chosen)

    # ----- the session -----
    def _on_record_computed(self, record: StepRecord) -> None:
        step, plan = self.step, self._window.session.plan
        if not (self.active and self._revealing and step is not None and step.question
                and not step.measures_perplexity and record.new_tokens > step.advance_to and plan_is_step(plan, step)):
            return
        if record.token_id is not None and plan.pass_follows_in_step(record):
            return  # the last token: the pass that fills the cache belongs to the step, and the answer is after it
        previous = self._window.session.record_at(step.advance_to)  # None at the first step
        self._set_measured(measured_answer(step.question, previous, record, step.sinks), record.cache_precision)

    def _perplexity_key(self, step: LessonStep) -> Key:
        s = self._window.session
        return (s.latest_source if step.model is None else step.model, s.dtype, step)

    def _on_perplexity_measured(self, key: Key, answer: Answer, failure: str = "") -> None:
        step = self.step
        if (self.active and self._revealing and step is not None and step.measures_perplexity
                and key == self._perplexity_key(step)):
            if failure:
                show_error(self._window, "Perplexity not measured", failure)
            self._set_measured(answer)

    def _on_model_loaded(self, _info: ModelInfo) -> None:
        self._model_asked = None
        if self.active:
            self.focus.start_sweep_soon()
            self._start_run()  # the step's state on the model just loaded

    def _on_guess_edited(self, text: str) -> None:
        if self.lesson is not None:
            self._guesses[self.lesson.slides()[self.slide][0]] = text

    # ----- tests and screenshots -----
    @property
    def ready(self) -> bool:
        """Whether the window shows the current slide's state: its run at its step, its answer measured."""
        step = self.step
        shown = self.serving_steps.shows if step is not None and step.serving else partial(shows_step, self._window)
        return (self.active and step is not None and shown(step, self.revealed)
                and (not self.revealed or self.measured is not None))
