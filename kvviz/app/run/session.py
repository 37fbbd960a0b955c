"""The run session: which model is loaded or loading, which run is current, and where it stands. The single run's
mode (and compare mode's) of the session protocol every mode keeps (kvviz.app.run.stream_session)."""

from __future__ import annotations

import dataclasses

from PySide6.QtCore import QObject, Signal

from kvviz.app.run.controller import WorkerController
from kvviz.app.run.shared_interpreter import worker_thread_guards
from kvviz.app.run.stream_session import StreamSession
from kvviz.core.records import ModelInfo, RunPlan, RunRequest, StepRecord

EMBEDDED = ""  # model source meaning the embedded default


class RunSession(StreamSession):
    """The only owner of run state: run ids, replay, playing and finished, the loaded model's source.

    It has no widgets. It sends commands to the worker thread and passes on what comes back for
    the current run only (records of a replaced run are dropped here). Loads are queued in order;
    `source` is the source of the model really loaded, whatever is still queued. A run asked for
    while a model loads (a setting changed, Enter in the prompt) starts if the load fails or is
    cancelled; a load that succeeds starts its own.

    A speculative run's step is a round (one target pass), which adds 1 to k + 1 tokens: its replay to a token asks
    for one round at a time until its records reach that token (`replaying`), and keys pressed meanwhile wait for it.
    """

    model_loading = Signal(str)  # source
    download_progressed = Signal(int, int)  # bytes done, bytes total
    model_loaded = Signal(object)  # ModelInfo
    model_load_failed = Signal(str, str)  # source, one sentence
    model_load_cancelled = Signal(str)  # source
    run_refused = Signal(str, object)  # one sentence, the request of the run that goes on (its settings to show)
    # and StreamSession's: run_started (RunPlan), record_computed (StepRecord), run_finished, run_failed,
    # playing_changed, state_changed (also when loading changes)

    def __init__(self, parent: QObject | None = None, fall_back_to_embedded: bool = True) -> None:
        controller = WorkerController()
        super().__init__(controller, "run", parent)
        controller.setParent(self)
        self.fall_back_to_embedded = fall_back_to_embedded
        self.model_info: ModelInfo | None = None
        self.source: str | None = None  # of the loaded model
        self.dtype = "float32"  # the precision of the last load asked for
        self._pending_loads: list[str] = []
        self._fallback_tried = False
        self._replay_target = 0
        self._replay_until = 0  # a speculative run's replay: rounds asked one at a time until this many tokens
        self._deferred_run: tuple[RunRequest, int] | None = None  # asked for while loading
        self.request: RunRequest | None = None  # of the current run, as it was accepted
        self._asked: RunRequest | None = None  # of the run asked for last, until it starts or is refused
        self._queued_steps = 0  # Step pressed while a model loads or a run is prepared: taken once it starts
        self._queued_play: int | None = None  # Play pressed then (its interval): playing once it starts
        self._before: tuple | None = None  # the current run's state while another is asked for (see _on_run_failed)
        self.resume_steps = 0  # the step the run that follows the current load starts at (see `load`)
        w = self.controller.worker
        w.model_loading.connect(self.model_loading)
        w.download_progressed.connect(self.download_progressed)
        w.model_loaded.connect(self._on_model_loaded)
        w.model_load_failed.connect(self._on_model_load_failed)
        w.model_load_cancelled.connect(self._on_model_load_cancelled)

    # ----- state -----
    @property
    def asking(self) -> bool:
        """A run has been asked for and not yet started or refused: the views still show the one before."""
        return self._asked is not None

    @property
    def loading(self) -> bool:
        return bool(self._pending_loads)

    @property
    def can_step(self) -> bool:
        return self.model_info is not None and self.plan is not None and not self.finished and not self.loading

    @property
    def can_reset(self) -> bool:
        return self.model_info is not None and not self.loading

    def record_at(self, new_tokens: int) -> StepRecord | None:
        """The current run's latest record with `new_tokens` tokens generated, if it has come."""
        return next((r for r in reversed(self.records) if r.new_tokens == new_tokens), None)

    @property
    def steps_target(self) -> int:
        """The token the current run is at or on its way to: its replay's target and every step asked for.
        A run that replaces it (a setting changed, another precision) replays to this one, so a change made
        during a replay leaves the new run where the old one was going, not part-way."""
        pending = self._deferred_run[1] if self._deferred_run is not None else 0
        return max(self.steps_done, self._steps_requested, self._replay_target, self._replay_until, pending)

    @property
    def replaying(self) -> bool:
        """A speculative run is on its way to its replay's token, a round at a time."""
        return self.plan is not None and not self.finished and self._replay_until > self.steps_done

    # ----- models -----
    def load(self, source: str, dtype: str | None = None) -> None:
        """Queue a load of `source` (a --model value; "" = the embedded default) in `dtype` (default: the
        precision asked for last, `dtype`). Reloading the loaded model (another precision) keeps the run's
        step for the run that follows (`resume_steps`), as any other change of a run setting does; another
        model starts at step 0."""
        self.pause()
        self.resume_steps = self.steps_target if source == self.source and self.plan is not None else 0
        self.dtype = dtype or self.dtype
        self._pending_loads.append(source)
        self.controller.load(source, self.dtype)
        self.state_changed.emit()

    @property
    def latest_source(self) -> str:
        """The source of the last load asked for: the one loading, else the loaded model's ("" = embedded)."""
        return self._pending_loads[-1] if self._pending_loads else (self.source or EMBEDDED)

    def cancel_download(self) -> None:
        self.controller.cancel_download()

    def _take_pending(self, source: str) -> None:
        if source in self._pending_loads:
            self._pending_loads.remove(source)

    def _on_model_loaded(self, source: str, info: ModelInfo) -> None:
        self._take_pending(source)
        self._deferred_run = None
        replaced = self.model_info is not None
        self.source, self.model_info = source, info
        self.plan, self.records = None, []
        worker_thread_guards.settle(replaced)
        self.model_loaded.emit(info)
        self.state_changed.emit()

    def _on_model_load_failed(self, source: str, message: str) -> None:
        self._take_pending(source)
        if self.model_info is not None and not self.loading:
            self.dtype = self.model_info.dtype  # the next load keeps the model's precision, not the failed one
        self.model_load_failed.emit(source, message)
        if (self.fall_back_to_embedded and self.model_info is None and source != EMBEDDED
                and not self._fallback_tried and not self.loading):
            self._fallback_tried = True
            self.load(EMBEDDED, "float32")  # in the precision every device computes in
        self.state_changed.emit()
        self._start_deferred_run()

    def _on_model_load_cancelled(self, source: str) -> None:
        self._take_pending(source)
        if self.model_info is not None and not self.loading:
            self.dtype = self.model_info.dtype
        self.model_load_cancelled.emit(source)
        self.state_changed.emit()
        self._start_deferred_run()

    def _start_deferred_run(self) -> None:
        if self._deferred_run is not None and not self.loading:
            (request, replay_to), self._deferred_run = self._deferred_run, None
            self.start_run(request, replay_to)

    # ----- runs -----
    def start_run(self, request: RunRequest, replay_to: int = 0) -> None:
        """Start a fresh run of `request` (its run_id is replaced); with `replay_to`, compute that many
        tokens. While a model loads, the run waits for the load's end (see the class)."""
        if self.model_info is None:
            return
        if self.loading:
            self._deferred_run = (request, replay_to)
            return
        self._deferred_run = None
        if self.plan is not None:  # the run going on, kept until the next one is accepted
            self._before = (self._run_id, self.plan, self.records, self._steps_requested, self.finished)
        self._asked = request
        self._replay_target, self._replay_until = replay_to, 0
        self.start(request)

    @property
    def preparing(self) -> bool:
        """A model loads, or a run is asked for and has not started: keys wait for it (see `queued`)."""
        return self.loading or self._asked is not None or self._deferred_run is not None or self.replaying

    def queued(self) -> str:
        """What the keys pressed while preparing will do once the run starts ("2 steps", "play"), or ""."""
        parts = [f"{self._queued_steps} step{'s' if self._queued_steps != 1 else ''}"] if self._queued_steps else []
        if self._queued_play is not None:
            parts.append("play")
        return " and ".join(parts)

    def step(self) -> None:
        """One new token; pauses autoplay first. Pressed while a model loads or a run is prepared, it is queued
        and taken once the run starts (a key is never lost without a sign: the veil says what is queued)."""
        if not self.can_step or self.replaying:
            if self.preparing and self.model_info is not None and self._queued_steps < MAX_QUEUED_STEPS:
                self._queued_steps += 1
                self._queued_play = None
                self.state_changed.emit()
            return
        super().step()

    def toggle_play(self, interval_ms: int) -> None:
        idle = not (self.playing or self._play_asked)
        if idle and (not self.can_step or self.replaying) and self.preparing and self.model_info is not None:
            self._queued_play = None if self._queued_play is not None else interval_ms  # queued, as Step is
            self.state_changed.emit()
            return
        super().toggle_play(interval_ms)

    def stop(self, timeout_ms: int = 1000) -> bool:
        """Stop the worker thread (closing); True when it has ended."""
        return self.controller.stop(timeout_ms)

    def wait(self) -> None:
        self.controller.wait()

    def _on_started(self, lane: str, plan: RunPlan) -> None:
        if not self._ours(lane, plan.run_id):
            return
        self.request, self._asked, self._before = self._asked, None, None
        target, self._replay_target = min(self._replay_target, plan.budget), 0
        super()._on_started(lane, plan)
        if plan.drafter is not None and target:  # rounds of 1 to k + 1 tokens: one at a time, to the token
            self._replay_until = target
            self.controller.step(self.lane)
            self.state_changed.emit()
            return
        for _ in range(target):
            self._steps_requested += 1
            self.controller.step(self.lane)
        self._take_queued()

    def _take_queued(self) -> None:
        """The keys pressed while the run was prepared (or replayed, a round at a time), now that it is there."""
        queued, play, self._queued_steps, self._queued_play = self._queued_steps, self._queued_play, 0, None
        for _ in range(min(queued, self.plan.budget - self._steps_requested)):
            self._steps_requested += 1
            self.controller.step(self.lane)
        if play is not None:
            self.controller.play(self.lane, play)
        self.state_changed.emit()

    def _on_computed(self, lane: str, run_id: int, record: StepRecord) -> None:
        super()._on_computed(lane, run_id, record)
        if not (self._ours(lane, run_id) and self._replay_until):
            return
        if record.new_tokens < self._replay_until and not record.final:
            self.controller.step(self.lane)  # the next round of the replay
        else:
            self._replay_until = 0
            self._take_queued()

    def _on_failed(self, lane: str, run_id: int, message: str) -> None:
        """One rule for every refused setting (a menu's, a key's): the run that was going on goes on, exactly as it
        was (its records, its step, its settings, which `run_refused` gives the window to show again). A run asked
        for with other text or numbers typed in the controls fails instead, keeping what was typed."""
        if not self._ours(lane, run_id):
            return
        (before, self._before), (asked, self._asked) = (self._before, None), (self._asked, None)
        if before is not None and self.request is not None and asked is not None and _menu_change(self.request, asked):
            self._run_id, self.plan, self.records, self._steps_requested, self.finished = before
            self.run_refused.emit(message, self.request)
            self.state_changed.emit()
            return
        self._queued_steps, self._queued_play = 0, None  # for a run that does not come
        super()._on_failed(lane, run_id, message)


MAX_QUEUED_STEPS = 4096  # Step presses kept while a run is prepared (a run's budget caps what is taken)
MENU_SETTINGS = ("use_cache", "compare", "break_cache", "attention", "window", "sinks", "kv_dtype", "draft_tokens",
                 "prompt_lookup", "draft_model", "evict", "budget", "observe",
                 "pool")  # set by menus and keys (C: Run > Toggle KV cache)


def _menu_change(accepted: RunRequest, asked: RunRequest) -> bool:
    """`asked` differs from the `accepted` run's request in menu settings only (nothing typed has changed)."""
    typed = [field.name for field in dataclasses.fields(RunRequest) if field.name not in (*MENU_SETTINGS, "run_id")]
    return all(getattr(accepted, name) == getattr(asked, name) for name in typed)

