"""What the worker steps, whatever the mode: a stream of records from a plan, a step at a time.

A single run (with compare mode's twin) and a serving batch are both streams: `open_stream` checks a request and
plans it (GenerationError, before anything runs), `advance` computes one step's records (StopIteration once the
stream is over), and `after_last` runs once its last record is out (a batch then times itself against its
requests one at a time). Imported on the worker thread only: it imports the engine.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from kvviz.core.batch_records import BatchPlan, BatchRecord, BatchRequest, BatchSpeed
from kvviz.core.records import RunPlan, RunRequest, StepRecord

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


Stream = RunStream | BatchStream


def open_stream(engine: Engine, request: RunRequest | BatchRequest, model_name: str) -> Stream:
    """Check and plan `request` on `engine` (kvviz.engine.engine.GenerationError if it is refused)."""
    if isinstance(request, BatchRequest):
        from kvviz.engine.serving import plan_batch

        ids = [engine.encode_prompt(p) for p in request.prompts]
        plan = plan_batch(engine, ids, request.new_tokens, request.block_size, request.share_prefixes,
                          texts=list(request.prompts), model_name=model_name, run_id=request.run_id)
        return BatchStream(engine, plan)
    from kvviz.engine.run import start_run

    return RunStream(start_run(engine, request, model_name))
