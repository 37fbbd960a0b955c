"""Compare mode: the cached and the uncached run of one request, advanced a token step at a time.

Both runs go through the one engine, one after the other in every step, the order alternating from
step to step so that machine noise hits both alike. Each run has its own sampling generator seeded
alike, so the two draw the same stream. Where the two runs' logits of a step are, their largest
absolute difference is taken and only that number goes into the record.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, replace

import torch

from kvviz.engine import Engine, SamplingSettings
from kvviz.records import RunPlan, StepRecord

MAX_SEED = 2**63 - 1


def lockstep_sampling(sampling: SamplingSettings) -> SamplingSettings:
    """Sampling both runs can share: an unseeded sampler gets one fresh seed for the pair."""
    if sampling.greedy or sampling.seed is not None:
        return sampling
    return replace(sampling, seed=random.SystemRandom().randrange(MAX_SEED))


def plan_lockstep(
    engine: Engine,
    prompt_ids: list[int],
    max_new_tokens: int,
    use_cache: bool = True,
    sampling: SamplingSettings | None = None,
    cache_fault: str = "",
    attention: bool = False,
    **plan_options,
) -> RunPlan:
    """The plan of the run in `use_cache`'s mode, with the other mode's run as its `twin`. Both plans
    describe the same request; `cache_fault` breaks the cached one's cache; with `attention` both runs'
    records carry their newest query's attention weights."""
    plans = {
        cached: engine.plan(prompt_ids, max_new_tokens, cached, sampling, cache_fault=cache_fault,
                            attention=attention, **plan_options)
        for cached in (True, False)
    }
    return replace(plans[use_cache], twin=plans[not use_cache])


class Lockstep:
    """Runs `plan` and its twin in lockstep; `records()` yields `plan`'s records (its own passes, in
    order), each token pass carrying the twin's passes of the same step and the logit difference."""

    def __init__(
        self, engine: Engine, plan: RunPlan, sampling: SamplingSettings | None = None, top_candidates: int = 5
    ) -> None:
        if plan.twin is None:
            raise ValueError("a lockstep run needs a plan with a twin (plan_lockstep)")
        self.engine = engine
        self.plan = plan
        self.sampling = lockstep_sampling(sampling or SamplingSettings())
        self.top_candidates = top_candidates

    def records(self) -> Iterator[StepRecord]:
        plan, twin_plan = self.plan, self.plan.twin
        assert twin_plan is not None
        logits: dict[bool, torch.Tensor] = {}  # the current step's logits, by use_cache; at most two vectors

        def watcher(use_cache: bool):
            def keep(step_logits: torch.Tensor) -> None:
                logits[use_cache] = step_logits.float().clone()  # (V,)
            return keep

        own = self.engine.run(plan, self.sampling, self.top_candidates, watch_logits=watcher(plan.use_cache))
        other = self.engine.run(twin_plan, self.sampling, self.top_candidates,
                                watch_logits=watcher(twin_plan.use_cache))
        for step in range(plan.budget):
            twin_first = step % 2 == 1
            if twin_first:
                twin_passes = _one_step(other, twin_plan)
                own_passes = _one_step(own, plan)
            else:
                own_passes = _one_step(own, plan)
                twin_passes = _one_step(other, twin_plan)
            difference = float((logits.pop(True) - logits.pop(False)).abs().max())
            token_pass, *rest = own_passes
            yield replace(token_pass, twin=twin_passes, max_abs_logit_diff=difference, twin_ran_first=twin_first)
            yield from rest


def _one_step(records: Iterator[StepRecord], plan: RunPlan) -> tuple[StepRecord, ...]:
    """The passes of one token step: the token pass, and the cache-filling pass after the last token."""
    passes = [next(records)]
    if plan.pass_follows_in_step(passes[0]):
        passes.append(next(records))
    return tuple(passes)


@dataclass(frozen=True)
class CompareSummary:
    """What a finished lockstep run shows, measured: equal or not, where they parted, time and work."""

    identical: bool
    first_divergence: int | None  # 1-based token step at which the chosen tokens first differ
    max_abs_logit_diff: float
    cached_seconds_total: float
    uncached_seconds_total: float
    kv_with_cache: int  # per layer, measured: the cached run's projected rows, its filling pass included
    kv_without_cache: int  # per layer, measured: the uncached run's projected rows

    @property
    def time_ratio(self) -> float:
        """Uncached over cached seconds, as measured in the run."""
        return self.uncached_seconds_total / self.cached_seconds_total if self.cached_seconds_total else 0.0


def summarize(records: list[StepRecord]) -> CompareSummary:
    """The summary of a lockstep run's records (those `Lockstep.records` yielded, in order)."""
    cached: list[StepRecord] = []
    uncached: list[StepRecord] = []
    first_divergence = None
    max_diff = 0.0
    for record in records:
        cached_passes, uncached_passes = record.lockstep_passes()
        cached.extend(cached_passes)
        uncached.extend(uncached_passes)
        if record.max_abs_logit_diff is not None:
            max_diff = max(max_diff, record.max_abs_logit_diff)
            if first_divergence is None and record.token_id != record.twin_token_id:
                first_divergence = record.new_tokens
    return CompareSummary(
        identical=first_divergence is None,
        first_divergence=first_divergence,
        max_abs_logit_diff=max_diff,
        cached_seconds_total=sum(r.seconds for r in cached),
        uncached_seconds_total=sum(r.seconds for r in uncached),
        kv_with_cache=cached[-1].kv_computed_total if cached else 0,
        kv_without_cache=uncached[-1].kv_computed_total if uncached else 0,
    )
