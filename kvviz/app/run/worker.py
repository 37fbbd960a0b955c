"""The one background worker: loads models and steps every mode's stream (a run, a serving batch), one step per
command, on a QThread.

The GUI never touches torch: it sends commands through queued signals and receives frozen records
(kvviz.core.records, kvviz.core.batch_records) back. torch, the engine and the weights are imported inside the
worker thread, so the window shows before they load.

Why not superqt's GeneratorWorker (thread_worker), which runs a generator on Qt's thread pool: a lecturer's Step
must compute exactly one token, and the model must stay loaded on one thread across runs, batches and loads.
GeneratorWorker has no "one step" command: Step as resume-then-pause-at-the-next-yield computed 24 token steps for
20 presses (the pause lands after the next step has begun: tokens nobody asked for), a press took 16.5 ms to its
record against 10.5 ms here (median), and a paused worker polls (27 ms of CPU in 2 s, none here). Measured on the
embedded model, 2026-12-04, by `python docs/measure_worker.py`.
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, QThread, QTimer, Signal, Slot

from kvviz.app.run.worker_failures import (
    check_dtype_runs,
    describe_load_error,
    describe_run_error,
    log_unexpected,
)
from kvviz.core.errors import DownloadCancelled, as_sentence, first_line
from kvviz.core.records import ModelInfo, RunRequest

if TYPE_CHECKING:
    from kvviz.app.run.streams import Stream
    from kvviz.engine.engine import Engine

WORKER_THREADS: weakref.WeakSet[QThread] = weakref.WeakSet()  # every worker thread started (controller.py adds them)


def running_threads() -> list[QThread]:
    """Worker threads still running (tests fail if any outlives its test)."""
    return [t for t in list(WORKER_THREADS) if t.isRunning()]


class StepAborted(Exception):
    """Raised inside a forward pass when the window is closing."""


class GenerationWorker(QObject):
    """Owns the Engine. Slots run in the worker thread; results go out through signals.

    Every mode's stream goes through the same four commands (`start`, `step`, `play`, `pause`) under a lane name
    ("run": the single run and compare mode; "serving": the batch or the trace), each lane keeping its stream until
    its last step, and one autoplay steps the lane it was asked for. Signals carry the lane and the `run_id` of the
    request that planned the stream, so the GUI can drop records of a run it has already replaced.
    """

    model_loading = Signal(str)  # source being loaded
    download_progressed = Signal(int, int)  # bytes done, bytes total
    model_loaded = Signal(str, object)  # source as requested, ModelInfo
    model_load_failed = Signal(str, str)  # source, one-sentence message
    model_load_cancelled = Signal(str)  # source
    # a stream's (a run's, a batch's): its lane first, then the run_id of the request that planned it
    started = Signal(str, object)  # lane, plan (RunPlan, BatchPlan, ServePlan: its run_id is the request's)
    failed = Signal(str, int, str)  # lane, run_id, one-sentence message
    computed = Signal(str, int, object)  # lane, run_id, record (StepRecord, BatchRecord, ServeRecord)
    finished = Signal(str, int, object)  # lane, run_id, the final record
    measured = Signal(str, int, object)  # lane, run_id, measured after its last step (BatchSpeed, ServeMeasure)
    playing_changed = Signal(str, bool)  # the lane autoplay steps, playing

    def __init__(self) -> None:
        super().__init__()
        self.abort = threading.Event()  # set from the GUI thread when closing: stop mid-pass
        self.cancel_download = threading.Event()  # set from the GUI thread: stop a hub download
        # What a stream measures after its last step (a batch's speed: up to a minute on a big model) gives way to
        # any command the GUI sent after that step (a model switch, R, a Step): the GUI counts the commands it posts
        # (`posted`, kvviz.app.run.controller), the worker those it has taken (`taken`).
        self.posted = 0
        self.taken = 0
        self._measuring = False
        self._engine: Engine | None = None
        self._loaded = None  # kvviz.sources.weights.LoadedModel
        self._dtype = "float32"  # the loaded model's, which its draft model is loaded in
        self._draft_source: str | None = None  # the draft model beside the current engine (engine.draft), if any
        self._streams: dict[str, Stream] = {}  # each lane's stream being stepped, until its last step
        self._play_lane = "run"  # the lane autoplay steps
        self._interval_ms = 0
        self._play_timer = QTimer(self)
        self._play_timer.setSingleShot(True)
        self._play_timer.timeout.connect(self._on_play_tick)
        self._playing = False
        self._compute_threads_set = False

    @property
    def loaded_model(self):
        """The current kvviz.sources.weights.LoadedModel (read it only while the worker is idle)."""
        return self._loaded

    @property
    def engine(self):
        """The current kvviz.engine.engine.Engine, or None (touch it only while the worker is idle)."""
        return self._engine

    # ----- model -----
    @Slot(str, str)
    def load_model(self, source: str, dtype: str = "float32") -> None:
        self.taken += 1
        self._set_playing(False)
        self.model_loading.emit(source)
        self.cancel_download.clear()
        try:
            import torch

            from kvviz.engine.engine import Engine
            from kvviz.sources.weights import load_model

            if not self._compute_threads_set:
                # a new thread starts with OpenMP/MKL's per-thread defaults: re-applying torch's thread count
                # makes decoding on this thread as fast as on the main thread (it was ~10% slower)
                torch.set_num_threads(torch.get_num_threads())
                self._compute_threads_set = True
            loaded = load_model(source or None, progress=self._on_download_progress, dtype=getattr(torch, dtype))
            engine = Engine(loaded.model, loaded.tokenizer)
            check_dtype_runs(loaded.model, dtype)
            engine.warm_up()  # the first step of the first run is timed like every other
        except Exception as exc:  # any failure keeps the previous model; the GUI says why in one sentence
            if isinstance(exc, DownloadCancelled):
                self.model_load_cancelled.emit(source)
            else:
                log_unexpected(f"loading {source or 'the embedded model'}", exc)
                self.model_load_failed.emit(source, describe_load_error(source, exc))
            return
        self._release_model()
        self._engine, self._loaded, self._dtype, self._draft_source = engine, loaded, dtype, None
        self._streams.clear()
        engine.before_block = self._check_abort
        config = loaded.config
        self.model_loaded.emit(source, ModelInfo(
            name=loaded.name, source=loaded.source, num_parameters=loaded.num_parameters,
            n_layer=config.n_layer, n_head=config.n_head, n_embd=config.n_embd, n_ctx=config.n_ctx, dtype=dtype,
        ))

    def _on_download_progress(self, done: int, total: int) -> None:
        if self.cancel_download.is_set() or self.abort.is_set():
            raise DownloadCancelled()
        self.download_progressed.emit(done, total)

    def _check_abort(self, layer: int) -> None:
        if self.abort.is_set() or (self._measuring and self.posted > self.taken):
            raise StepAborted()

    def _release_model(self) -> None:
        """Detach the current engine: it stops calling into this worker (its model's packed copies go with it)."""
        if self._engine is not None:
            self._engine.before_block = None

    # ----- streams: a run, a batch, a trace -----
    @Slot(str, object)
    def start(self, lane: str, request) -> None:
        """Plan a fresh stream in `lane` ("run": a RunRequest; "serving": a BatchRequest or a ServeRequest); no pass
        happens until `step`. A request the engine refuses leaves the lane's stream as it was (the session gives the
        run that was going back to the window). Autoplay stops."""
        self.taken += 1
        self._set_playing(False)
        if self._engine is None:
            self.failed.emit(lane, request.run_id, "No model is loaded yet.")
            return
        from kvviz.app.run.streams import open_stream
        from kvviz.engine.engine import GenerationError

        try:
            self._attach_draft(request)
        except Exception as exc:  # the run that was going on goes on; the window says why in one sentence
            draft = f"the draft model {request.draft_model}"
            log_unexpected(f"loading {draft}", exc)
            self.failed.emit(lane, request.run_id, describe_load_error(draft, exc))
            return
        try:  # every check runs here, before `started`: a bad request never resets the views
            stream = open_stream(self._engine, request, self._loaded.name)
        except GenerationError as exc:
            self.failed.emit(lane, request.run_id, as_sentence(first_line(exc)))
            return
        self._streams[lane] = stream
        self.started.emit(lane, stream.plan)

    def _attach_draft(self, request) -> None:
        """Load the draft model a speculative request names beside the target (engine.draft), once: the next run
        with it finds it there. Nothing for prompt lookup, plain decoding or a batch."""
        source = request.draft_model if isinstance(request, RunRequest) else ""  # a batch drafts nothing
        if not source or source == self._draft_source:
            return
        import torch

        from kvviz.sources.weights import attach_draft

        self._engine.draft, self._draft_source = None, None
        attach_draft(self._engine, source, getattr(torch, self._dtype))
        self._draft_source = source

    @Slot(str)
    def step(self, lane: str) -> None:
        """One step of the lane's stream: a token step of a run, a pass of a batch; after its last, its end."""
        self.taken += 1
        self._advance(lane)

    def _advance(self, lane: str) -> None:
        stream = self._streams.get(lane)
        if stream is None:
            self._set_playing(False)
            return
        plan = stream.plan
        try:
            records = stream.advance()
        except StepAborted:
            self._streams.pop(lane, None)
            return
        except StopIteration:
            self._streams.pop(lane, None)
            self._set_playing(False)
            return
        except Exception as exc:  # out of memory mid-run, for instance
            self._streams.pop(lane, None)
            self._set_playing(False)
            log_unexpected(f"a {lane} on {plan.model_name}", exc)
            self.failed.emit(lane, plan.run_id, describe_run_error(plan.model_name, exc))
            return
        for record in records:
            self.computed.emit(lane, plan.run_id, record)
        if records[-1].final:
            self._streams.pop(lane, None)
            self._set_playing(False)
            self.finished.emit(lane, plan.run_id, records[-1])
            self._measure(lane, stream)

    def _measure(self, lane: str, stream) -> None:
        """What the stream measures after its last step (a batch's speed), given way to any other command."""
        self._measuring = True
        try:
            measured = stream.after_last()
        except StepAborted:  # closing, or the GUI asked for something else: the figure is not wanted any more
            return
        except Exception as exc:
            log_unexpected(f"measuring a {lane} on {stream.plan.model_name}", exc)
            self.failed.emit(lane, stream.plan.run_id, describe_run_error(stream.plan.model_name, exc))
            return
        finally:
            self._measuring = False
        if measured is not None:
            self.measured.emit(lane, stream.plan.run_id, measured)

    @Slot(str)
    def drop(self, lane: str) -> None:
        """Forget the lane's stream (its session has let it go)."""
        if lane == self._play_lane:
            self._set_playing(False)
        self._streams.pop(lane, None)

    @Slot(str, int)
    def play(self, lane: str, interval_ms: int) -> None:
        """Step the lane's stream on its own, a step every `interval_ms` at most (0: as fast as it computes): the
        one autoplay of every mode."""
        self._interval_ms = max(0, interval_ms)
        if self._streams.get(lane) is None:
            return
        if lane != self._play_lane:
            self._set_playing(False)
            self._play_lane = lane
        self._set_playing(True)
        self._play_timer.start(0)

    @Slot()
    def pause(self) -> None:
        self._set_playing(False)

    @Slot(int)
    def set_interval(self, interval_ms: int) -> None:
        self._interval_ms = max(0, interval_ms)

    def _on_play_tick(self) -> None:
        if not self._playing or self.abort.is_set():
            return
        started = time.perf_counter()
        self._advance(self._play_lane)
        if self._playing:
            spent_ms = (time.perf_counter() - started) * 1000
            self._play_timer.start(max(0, int(self._interval_ms - spent_ms)))

    def _set_playing(self, playing: bool) -> None:
        if not playing:
            self._play_timer.stop()
        if playing != self._playing:
            self._playing = playing
            self.playing_changed.emit(self._play_lane, playing)

    @Slot()
    def shut_down(self) -> None:
        """Runs in the worker thread as its last job: stop timers, drop the model."""
        self._set_playing(False)
        self._release_model()
        self._streams.clear()
        self._engine = None
        self._loaded = None
