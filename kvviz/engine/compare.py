"""Compare mode: the cached and the uncached run of one request, advanced a token step at a time.

Both runs go through the one engine, one after the other in every step, the order alternating from
step to step so that machine noise hits both alike. Each run has its own sampling generator seeded
alike, so the two draw the same stream. Where the two runs' logits of a step are, their largest
absolute difference is taken and only that number goes into the record.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import torch

from kvviz.core.ratios import RatioEstimate, paired_ratio
from kvviz.core.records import EXACT, RunPlan, RunRequest, StepRecord
from kvviz.engine.engine import Engine, SamplingSettings

MAX_SEED = 2**63 - 1
NOISE_ULPS = 4  # units in the last place of the dtype that rounding alone may move a logit by
ACCUMULATION_ULPS = 64  # float32 units for sums accumulated in float32 whatever the dtype (768-wide dot products)


def logit_tolerance(dtype: torch.dtype, logit_scale: float) -> float:
    """How far two exact computations of the same logits may differ: rounding noise only.

    A cached and an uncached pass do the same arithmetic in another order (other matrix shapes, so
    other summation orders), and every rounding moves a result by a fraction of a unit in the last
    place. So their logits differ by a few units in the last place of `dtype` at the size of the largest
    logit, `logit_scale`, plus the float32 rounding of the sums accumulated in float32:
    max(1, scale) * (NOISE_ULPS * eps(dtype) + ACCUMULATION_ULPS * eps(float32)). Measured over 20 steps of
    random GPT-2 124M and the embedded model in float32, bfloat16 and float16: exact caches differ by at
    most 0.35 of it, a cache written one slot late by 2.4 to 170,000 times it from the step after the prefill.
    """
    epsilon = torch.finfo(dtype).eps
    return max(1.0, logit_scale) * (NOISE_ULPS * epsilon + ACCUMULATION_ULPS * torch.finfo(torch.float32).eps)


def lockstep_sampling(sampling: SamplingSettings) -> SamplingSettings:
    """Sampling both runs can share: an unseeded sampler gets one fresh seed for the pair."""
    if sampling.greedy or sampling.seed is not None:
        return sampling
    return replace(sampling, seed=random.SystemRandom().randrange(MAX_SEED))


def plan_lockstep(engine: Engine, request: RunRequest, prompt_ids: Sequence[int] | None = None,
                  model_name: str = "") -> RunPlan:
    """The plan of `request`'s run, with the other run of compare mode as its `twin`: the other mode's (cached
    or not) for an exact cache, the exact cache's for a lossy one (a window, or quantized), which stops where the
    exact one must. Both describe the same request (see Engine.plan for `prompt_ids` and `model_name`)."""
    if request.window or request.kv_dtype or request.evict:  # a lossy cache: the exact one against it
        full = engine.plan(replace(request, use_cache=True), prompt_ids, model_name, policy=EXACT)
        lossy = engine.plan(replace(request, use_cache=True, max_new_tokens=full.budget), prompt_ids, model_name)
        return replace(lossy, twin=full)
    plans = {cached: engine.plan(replace(request, use_cache=cached), prompt_ids, model_name)
             for cached in (True, False)}
    return replace(plans[request.use_cache], twin=plans[not request.use_cache])


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
        self.engine.warm_up()  # no one-time cost in the first step's time of either run
        logits: dict[str, torch.Tensor] = {}  # the current step's logits, by run; at most two vectors

        def watcher(run: str):
            def keep(step_logits: torch.Tensor) -> None:
                logits[run] = step_logits.float().clone()  # (V,)
            return keep

        dtype = self.engine.dtype
        own = self.engine.run(plan, self.sampling, self.top_candidates, watch_logits=watcher("own"))
        other = self.engine.run(twin_plan, self.sampling, self.top_candidates, watch_logits=watcher("twin"))
        for step in range(plan.budget):
            twin_first = step % 2 == 1
            if twin_first:
                twin_passes = twin_plan.next_token_step(other)
                own_passes = plan.next_token_step(own)
            else:
                own_passes = plan.next_token_step(own)
                twin_passes = twin_plan.next_token_step(other)
            cached_logits, uncached_logits = logits.pop("own"), logits.pop("twin")  # |difference|: either order
            difference = float((cached_logits - uncached_logits).abs().max())
            scale = float(torch.maximum(cached_logits.abs().max(), uncached_logits.abs().max()))
            tolerance = logit_tolerance(dtype, scale if math.isfinite(scale) else 1.0)
            token_pass, *rest = own_passes
            yield replace(token_pass, twin=twin_passes, max_abs_logit_diff=difference, logit_tolerance=tolerance,
                          twin_ran_first=twin_first)
            yield from rest


@dataclass(frozen=True)
class CompareSummary:
    """What a finished lockstep run shows, measured: equal or not, where they parted, time and work."""

    identical: bool  # the same tokens, and the logits within float noise at every step
    first_divergence: int | None  # 1-based token step at which the chosen tokens first differ
    first_logit_divergence: int | None  # 1-based token step whose logits first differ beyond float noise
    max_abs_logit_diff: float  # NaN when a step's logits could not be compared (not finite)
    logit_tolerance: float  # the largest step's tolerance (logit_tolerance) of the run
    cached_seconds_total: float
    uncached_seconds_total: float
    kv_with_cache: int  # per layer, measured: the cached run's projected rows, its filling pass included
    kv_without_cache: int  # per layer, measured: the uncached run's projected rows
    time_estimate: RatioEstimate | None = None  # uncached over cached time, paired by token step

    @property
    def time_ratio(self) -> float:
        """The median of the token steps' uncached over cached times, as measured in the run."""
        return self.time_estimate.median if self.time_estimate is not None else 0.0


def summarize(records: list[StepRecord]) -> CompareSummary:
    """The summary of a lockstep run's records (those `Lockstep.records` yielded, in order)."""
    cached: list[StepRecord] = []
    uncached: list[StepRecord] = []
    step_seconds: dict[int, list[float]] = {}  # token step -> [cached, uncached] seconds, filling pass included
    first_divergence = first_logit_divergence = None
    max_diff = tolerance = 0.0
    for record in records:
        cached_passes, uncached_passes = record.lockstep_passes()
        cached.extend(cached_passes)
        uncached.extend(uncached_passes)
        for run, passes in enumerate((cached_passes, uncached_passes)):
            for run_pass in passes:
                step_seconds.setdefault(run_pass.new_tokens, [0.0, 0.0])[run] += run_pass.seconds
        if record.max_abs_logit_diff is not None:
            difference = record.max_abs_logit_diff
            if math.isnan(difference) or difference > max_diff:  # a NaN stays: nothing after it undoes it
                max_diff = difference
            tolerance = max(tolerance, record.logit_tolerance or 0.0)
            if first_divergence is None and record.token_id != record.twin_token_id:
                first_divergence = record.new_tokens
            if first_logit_divergence is None and record.logits_agree is False:
                first_logit_divergence = record.new_tokens
    return CompareSummary(
        identical=first_divergence is None and first_logit_divergence is None,
        first_divergence=first_divergence,
        first_logit_divergence=first_logit_divergence,
        max_abs_logit_diff=max_diff,
        logit_tolerance=tolerance,
        cached_seconds_total=sum(r.seconds for r in cached),
        uncached_seconds_total=sum(r.seconds for r in uncached),
        kv_with_cache=cached[-1].kv_computed_total if cached else 0,
        kv_without_cache=uncached[-1].kv_computed_total if uncached else 0,
        time_estimate=paired_ratio([c for c, _ in step_seconds.values()], [u for _, u in step_seconds.values()]),
    )
