"""A lesson's perplexity answers, measured in the background (kvviz.lessons.perplexity names what to measure).

A worker on a QThread of its own measures them with its own copy of the step's model, loaded once and kept for the
next question: the run's worker goes on stepping the step's run meanwhile, and the GUI thread never touches torch.
A question's answer is asked for as soon as its question is shown, so that it is usually in by the reveal; answers
are kept by model, precision and step, so a slide shown again has its answer at once. Leaving the lesson or closing
the window aborts a measurement mid-pass and ends the thread.
"""

from __future__ import annotations

import threading

from PySide6.QtCore import QEvent, QObject, QThread, Signal, Slot

from kvviz.app.run.shared_interpreter import worker_thread_guards
from kvviz.app.run.worker import WORKER_THREADS, StepAborted
from kvviz.app.run.worker_failures import describe_load_error, describe_run_error, log_unexpected
from kvviz.lessons.lesson import LessonStep
from kvviz.lessons.perplexity import Perplexities

Key = tuple[str, str, LessonStep]  # (model source, precision, step): what an answer was measured for


class PerplexityWorker(QObject):
    """Lives on the measuring thread: `measure(key, step)` loads the key's model when it is not the one loaded, then
    measures the step's perplexities (kvviz.app.export.slides.measure_perplexities: the slides' own measurement)."""

    measured = Signal(object, object)  # key, Perplexities
    failed = Signal(object, str)  # key, one sentence

    def __init__(self) -> None:
        super().__init__()
        self.abort = threading.Event()  # set from the GUI thread: stop mid-pass
        self._engine = None
        self._loaded: tuple[str, str] | None = None  # (source, dtype) of _engine
        self._known: dict = {}  # what was measured on _engine, by policy and tokens

    @Slot(object, object)
    def measure(self, key: Key, step: LessonStep) -> None:
        if self.abort.is_set():
            return
        source, dtype, _step = key
        try:
            engine = self._engine_for(source, dtype)
        except StepAborted:
            return
        except Exception as exc:  # the lesson says why in one sentence, and goes on
            log_unexpected(f"loading {source or 'the embedded model'} to measure perplexity", exc)
            self.failed.emit(key, describe_load_error(source, exc))
            return
        from kvviz.app.export.slides import measure_perplexities

        try:
            answer = measure_perplexities(engine, step, known=self._known)
        except StepAborted:
            return
        except Exception as exc:
            log_unexpected("measuring a lesson's perplexity", exc)
            self.failed.emit(key, describe_run_error(source or "the embedded model", exc))
            return
        self.measured.emit(key, answer)

    def _engine_for(self, source: str, dtype: str):
        if self._loaded != (source, dtype):
            import torch

            from kvviz.engine.engine import Engine
            from kvviz.sources.weights import load_model

            torch.set_num_threads(torch.get_num_threads())  # as the run's worker: a new thread's defaults are slower
            loaded = load_model(source or None, dtype=getattr(torch, dtype))
            self._engine, self._loaded, self._known = Engine(loaded.model, loaded.tokenizer), (source, dtype), {}
            self._engine.before_block = self._check_abort
        return self._engine

    def _check_abort(self, _layer: int) -> None:
        if self.abort.is_set():
            raise StepAborted()


class PerplexityAnswers(QObject):
    """The GUI side: `ask(key, step)` gives a known answer at once, else starts measuring it (the thread starts with
    the first question) and `measured(key, answer)` follows; `failed(key, sentence)` if it cannot be measured.
    `shut_down()` aborts and ends the thread; closing `window` does too."""

    measured = Signal(object, object)  # key, Perplexities
    failed = Signal(object, str)  # key, one sentence
    _asked = Signal(object, object)  # key, step: to the worker

    def __init__(self, window: QObject, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._answers: dict[Key, Perplexities] = {}
        self._asking: set[Key] = set()
        self._thread: QThread | None = None
        self._worker: PerplexityWorker | None = None
        window.installEventFilter(self)

    def ask(self, key: Key, step: LessonStep) -> Perplexities | None:
        if key in self._answers:
            return self._answers[key]
        if key not in self._asking:
            self._asking.add(key)
            self._start()
            self._asked.emit(key, step)
        return None

    def _start(self) -> None:
        if self._thread is not None:
            return
        worker_thread_guards.acquire()  # the GUI thread collects Python's garbage while a worker thread runs
        self._thread, self._worker = QThread(), PerplexityWorker()
        self._thread.setObjectName("kvviz-lesson-perplexity")
        self._worker.moveToThread(self._thread)
        self._asked.connect(self._worker.measure)
        self._worker.measured.connect(self._on_measured)
        self._worker.failed.connect(self._on_failed)
        self._thread.finished.connect(self._worker.deleteLater)
        WORKER_THREADS.add(self._thread)
        self._thread.start()

    def shut_down(self) -> None:
        """Abort the measurement under way, end the thread and wait for it (what was measured stays known)."""
        thread, worker = self._thread, self._worker
        if thread is None or worker is None:
            return
        self._thread = self._worker = None
        self._asked.disconnect(worker.measure)
        worker.abort.set()
        thread.quit()
        thread.wait()
        worker_thread_guards.release()
        self._asking.clear()

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if event.type() == QEvent.Type.Close:
            self.shut_down()
        return False

    def _on_measured(self, key: Key, answer: Perplexities) -> None:
        self._asking.discard(key)
        self._answers[key] = answer
        self.measured.emit(key, answer)

    def _on_failed(self, key: Key, message: str) -> None:
        self._asking.discard(key)
        self.failed.emit(key, message)
