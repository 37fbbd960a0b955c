"""The one background worker: loads models and runs the engine, one step per command, on a QThread.

The GUI never touches torch: it sends commands through queued signals and receives frozen
records (ModelInfo, RunPlan, StepRecord from kvviz.core.records) back. torch, the engine and the weights are
imported inside the worker thread, so the window shows before they load.
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
    from kvviz.engine.engine import Engine
    from kvviz.engine.run import Run

WORKER_THREADS: weakref.WeakSet[QThread] = weakref.WeakSet()  # every worker thread started (controller.py adds them)


def running_threads() -> list[QThread]:
    """Worker threads still running (tests fail if any outlives its test)."""
    return [t for t in list(WORKER_THREADS) if t.isRunning()]


class StepAborted(Exception):
    """Raised inside a forward pass when the window is closing."""


class GenerationWorker(QObject):
    """Owns the Engine. Slots run in the worker thread; results go out through signals.

    Signals carry the `run_id` of the RunRequest that produced them, so the GUI can drop
    records of a run it has already replaced.
    """

    model_loading = Signal(str)  # source being loaded
    download_progressed = Signal(int, int)  # bytes done, bytes total
    model_loaded = Signal(str, object)  # source as requested, ModelInfo
    model_load_failed = Signal(str, str)  # source, one-sentence message
    model_load_cancelled = Signal(str)  # source
    run_started = Signal(object)  # RunPlan (its run_id is the request's)
    run_failed = Signal(int, str)  # run_id, one-sentence message
    step_computed = Signal(int, object)  # run_id, StepRecord
    run_finished = Signal(int, object)  # run_id, final StepRecord
    playing_changed = Signal(bool)
    batch_started = Signal(object)  # BatchPlan (its run_id is the request's)
    batch_failed = Signal(int, str)  # run_id, one-sentence message
    batch_computed = Signal(int, object)  # run_id, BatchRecord
    batch_measured = Signal(int, object)  # run_id, BatchSpeed

    def __init__(self) -> None:
        super().__init__()
        self.abort = threading.Event()  # set from the GUI thread when closing: stop mid-pass
        self.cancel_download = threading.Event()  # set from the GUI thread: stop a hub download
        # set from the GUI thread when it asks for anything else: a batch's speed, measured after its last pass for
        # up to a minute, gives way (a model switch, R or Step waited behind it); cleared when a batch starts
        self.stop_measuring = threading.Event()
        self._measuring = False
        self._engine: Engine | None = None
        self._loaded = None  # kvviz.sources.weights.LoadedModel
        self._run: Run | None = None  # the run being stepped, until its last pass
        self._batch = None  # (BatchPlan, its records' iterator) of the serving view, until its last pass
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
        self._engine, self._loaded = engine, loaded
        self._run = None
        self._batch = None
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
        if self.abort.is_set() or (self._measuring and self.stop_measuring.is_set()):
            raise StepAborted()

    def _release_model(self) -> None:
        """Detach the current engine: it stops calling into this worker (its model's packed copies go with it)."""
        if self._engine is not None:
            self._engine.before_block = None

    # ----- runs -----
    @Slot(object)
    def start_run(self, request: RunRequest) -> None:
        """Prepare a fresh run; no forward pass happens until `step`. A request the engine refuses leaves the
        run that was going as it was (the session gives it back to the window)."""
        self._set_playing(False)
        if self._engine is None:
            self.run_failed.emit(request.run_id, "No model is loaded yet.")
            return
        from kvviz.engine.engine import GenerationError
        from kvviz.engine.run import start_run

        try:  # every check runs here, before run_started: a bad request never resets the views
            run = start_run(self._engine, request, self._loaded.name)
        except GenerationError as exc:
            self.run_failed.emit(request.run_id, as_sentence(first_line(exc)))
            return
        self._run = run
        self.run_started.emit(run.plan)

    @Slot()
    def step(self) -> None:
        """Compute one new token; after the last one, also the pass that fills the cache."""
        if self._run is None:
            self._set_playing(False)
            return
        run = self._run
        run_id = run.plan.run_id
        try:
            passes = run.next_token_step()
        except StepAborted:
            self._run = None
            return
        except StopIteration:
            self._run = None
            self._set_playing(False)
            return
        except Exception as exc:  # out of memory mid-run, for instance
            self._run = None
            self._set_playing(False)
            log_unexpected(f"a run on {run.plan.model_name}", exc)
            self.run_failed.emit(run_id, describe_run_error(run.plan.model_name, exc))
            return
        for record in passes:
            self.step_computed.emit(run_id, record)
        if passes[-1].final:
            self._run = None
            self._set_playing(False)
            self.run_finished.emit(run_id, passes[-1])

    # ----- a batch (the serving view) -----
    @Slot(object)
    def start_batch(self, request) -> None:
        """Plan a batch of kvviz.core.batch_records.BatchRequest; no pass happens until `step_batch`."""
        self._batch = None
        self.stop_measuring.clear()  # this batch's speed is wanted once its last pass is in
        if self._engine is None:
            self.batch_failed.emit(request.run_id, "No model is loaded yet.")
            return
        from kvviz.engine.engine import GenerationError
        from kvviz.engine.serving import plan_batch, run_batch

        engine = self._engine
        try:
            ids = [engine.encode_prompt(p) for p in request.prompts]
            plan = plan_batch(engine, ids, request.new_tokens, request.block_size, request.share_prefixes,
                              texts=list(request.prompts), model_name=self._loaded.name, run_id=request.run_id)
        except GenerationError as exc:
            self.batch_failed.emit(request.run_id, as_sentence(first_line(exc)))
            return
        self._batch = (plan, run_batch(engine, plan))
        self.batch_started.emit(plan)

    @Slot()
    def step_batch(self) -> None:
        """One pass of the batch: a request's prefill, or a decode step of all; after the last, its speed."""
        if self._batch is None:
            return
        plan, records = self._batch
        try:
            record = next(records)
        except StopIteration:
            self._batch = None
            return
        except StepAborted:
            self._batch = None
            return
        except Exception as exc:
            self._batch = None
            log_unexpected(f"a batch on {plan.model_name}", exc)
            self.batch_failed.emit(plan.run_id, describe_run_error(plan.model_name, exc))
            return
        self.batch_computed.emit(plan.run_id, record)
        if record.final:
            self._batch = None
            self._measure_batch(plan)

    def _measure_batch(self, plan) -> None:
        """Time the batch against its requests one at a time (not while stepping: a click's wait is no pass's time)."""
        from kvviz.engine.serving import measure_speed

        self._measuring = True
        try:
            speed = measure_speed(self._engine, plan)
        except StepAborted:  # closing, or the GUI asked for something else: the speed is not wanted any more
            return
        except Exception as exc:
            log_unexpected(f"a batch on {plan.model_name}", exc)
            self.batch_failed.emit(plan.run_id, describe_run_error(plan.model_name, exc))
            return
        finally:
            self._measuring = False
        self.batch_measured.emit(plan.run_id, speed)

    @Slot(int)
    def play(self, interval_ms: int) -> None:
        self._interval_ms = max(0, interval_ms)
        if self._run is None:
            return
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
        self.step()
        if self._playing:
            spent_ms = (time.perf_counter() - started) * 1000
            self._play_timer.start(max(0, int(self._interval_ms - spent_ms)))

    def _set_playing(self, playing: bool) -> None:
        if not playing:
            self._play_timer.stop()
        if playing != self._playing:
            self._playing = playing
            self.playing_changed.emit(playing)

    @Slot()
    def shut_down(self) -> None:
        """Runs in the worker thread as its last job: stop timers, drop the model."""
        self._set_playing(False)
        self._release_model()
        self._run = None
        self._batch = None
        self._engine = None
        self._loaded = None
