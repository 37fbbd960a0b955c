"""The one path from a request to a run: `start_run` checks a RunRequest, plans it (with its twin in compare
mode) and hands out the plan, its passes and its token steps. Every front end starts its runs here."""

from __future__ import annotations

from collections.abc import Generator, Iterator, Sequence

from kvviz.core.records import RunPlan, RunRequest, StepRecord
from kvviz.engine.compare import Lockstep, plan_lockstep
from kvviz.engine.engine import Engine, SamplingSettings


class Run:
    """A planned run: its `plan`, the `sampling` both runs of a lockstep share, and one stream of records,
    read as passes (`passes`) or as token steps (`token_steps`, `next_token_step`), not both."""

    def __init__(self, plan: RunPlan, sampling: SamplingSettings, records: Generator[StepRecord, None, None]) -> None:
        self.plan = plan
        self.sampling = sampling
        self._records = records

    def passes(self) -> Iterator[StepRecord]:
        """The records, one per forward pass of the plan (a lockstep's token passes carry their twin's)."""
        return self._records

    def next_token_step(self) -> tuple[StepRecord, ...]:
        """The passes of the next token step: one, or two after a cached run's last token (the pass that
        fills the cache). StopIteration when the run is over."""
        return self.plan.next_token_step(self._records)

    def token_steps(self) -> Iterator[tuple[StepRecord, ...]]:
        """Every token step's passes, in order."""
        while True:
            try:
                yield self.next_token_step()
            except StopIteration:
                return

    def close(self) -> None:
        """Stop the run where it is; its cache goes."""
        self._records.close()


def start_run(
    engine: Engine,
    request: RunRequest,
    model_name: str = "",
    prompt_ids: Sequence[int] | None = None,
    top_candidates: int = 5,
) -> Run:
    """Check `request` now (GenerationError, before anything runs) and start it on `engine`: a single run,
    or with `request.compare` the cached and the uncached run in lockstep. `prompt_ids` stand for the
    encoded prompt where the caller has ids of its own; each pass keeps its `top_candidates` likeliest tokens."""
    sampling = SamplingSettings(request.temperature, request.top_k, request.seed)
    if request.compare:
        plan = plan_lockstep(engine, request, prompt_ids, model_name)
        lockstep = Lockstep(engine, plan, sampling, top_candidates)
        return Run(plan, lockstep.sampling, lockstep.records())
    plan = engine.plan(request, prompt_ids, model_name)
    return Run(plan, sampling, engine.run(plan, sampling, top_candidates))
