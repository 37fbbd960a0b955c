"""What the worker steps, whatever the mode: a stream of records from a plan, a step at a time.

A single run (with compare mode's twin), a serving batch and a served trace are all streams: `open_stream` checks a
request and plans it (GenerationError, before anything runs), `advance` computes one step's records (StopIteration
once the stream is over), and `after_last` runs once its last record is out (a batch then times itself against its
requests one at a time; a trace gives its figures per request). Imported on the worker thread only: it imports the
engine.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from kvviz.core.batch_records import BatchPlan, BatchRecord, BatchRequest, BatchSpeed
from kvviz.core.records import RunPlan, RunRequest, StepRecord
from kvviz.core.serve_records import ServeMeasure, ServePlan, ServeRecord, ServeRequest

if TYPE_CHECKING:
    from kvviz.engine.engine import Engine
    from kvviz.engine.run import Run


class RunStream:
    """A single run, or compare mode's lockstep: a step is a token step (one pass, or two after a cached run's last
    token: the pass that fills the cache)."""

    def __init__(self, run: Run) -> None:
        self._run = run
        self.plan: RunPlan = run.plan

    def advance(self) -> tuple[StepRecord, ...]:
        return self._run.next_token_step()

    def after_last(self) -> None:
        return None


class BatchStream:
    """A serving batch: a step is one pass (a request's prefill, or a decode step of every running request);
    after the last, `after_last` gives its speed against the same requests one at a time."""

    def __init__(self, engine: Engine, plan: BatchPlan) -> None:
        from kvviz.engine.serving import run_batch

        self._engine = engine
        self.plan = plan
        self._records: Iterator[BatchRecord] = run_batch(engine, plan)

    def advance(self) -> tuple[BatchRecord, ...]:
        return (next(self._records),)

    def after_last(self) -> BatchSpeed:
        """Time the batch against its requests one at a time (not while stepping: a click's wait is no pass's
        time)."""
        from kvviz.engine.serving import measure_speed

        return measure_speed(self._engine, self.plan)


class TraceStream:
    """A served trace: a step is one pass of the scheduler (kvviz.engine.scheduler.serve); after the last,
    `after_last` gives the trace's figures per request, counted from its records (kvviz.core.serve_records.measure)."""

    def __init__(self, engine: Engine, plan: ServePlan) -> None:
        from kvviz.engine.scheduler import serve

        self.plan = plan
        self._served: Iterator[ServeRecord] = serve(engine, plan)
        self._records: list[ServeRecord] = []

    def advance(self) -> tuple[ServeRecord, ...]:
        record = next(self._served)
        self._records.append(record)
        return (record,)

    def after_last(self) -> ServeMeasure:
        from kvviz.core.serve_records import measure

        return measure(self.plan, self._records)


Stream = RunStream | BatchStream | TraceStream


def open_stream(engine: Engine, request: RunRequest | BatchRequest | ServeRequest, model_name: str) -> Stream:
    """Check and plan `request` on `engine` (kvviz.engine.engine.GenerationError if it is refused: a trace that
    cannot be read says so in one line too)."""
    if isinstance(request, ServeRequest):
        return TraceStream(engine, _plan_trace(engine, request, model_name))
    if isinstance(request, BatchRequest):
        from kvviz.engine.serving import plan_batch

        ids = [engine.encode_prompt(p) for p in request.prompts]
        plan = plan_batch(engine, ids, request.new_tokens, request.block_size, request.share_prefixes,
                          texts=list(request.prompts), model_name=model_name, run_id=request.run_id)
        return BatchStream(engine, plan)
    from kvviz.engine.run import start_run

    return RunStream(start_run(engine, request, model_name))


def _plan_trace(engine: Engine, request: ServeRequest, model_name: str) -> ServePlan:
    """The trace `request` names (None: the built-in one), read and planned on `engine`; a trace that cannot be
    read (kvviz.core.trace.TraceError) is refused like a plan (GenerationError, its one line)."""
    from kvviz.core.trace import TraceError, read_trace
    from kvviz.engine.engine import GenerationError
    from kvviz.engine.scheduler import plan_trace

    try:
        trace = read_trace(request.trace_path)
    except TraceError as exc:
        raise GenerationError(str(exc)) from None
    return plan_trace(engine, trace, request.block_size, request.num_blocks, request.prefix_cache, request.chunk,
                      request.max_batched_tokens, model_name=model_name, run_id=request.run_id)
