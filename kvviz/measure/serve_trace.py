"""A served trace measured (kvviz serve-trace): the trace on the server as configured, each request against its solo
run (tokens and logits), and the same trace without the prefix cache, without chunking and as the all-at-once
batch of kvviz batch, timed in turns."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace

from kvviz.core.serve_records import ServeMeasure, ServePlan, ServeRecord, measure
from kvviz.core.trace import TraceRequest
from kvviz.engine.engine import Engine, SamplingSettings
from kvviz.engine.scheduler import serve
from kvviz.engine.serving import plan_batch, run_batch, run_one_at_a_time

VARIANTS = ("as configured", "no prefix cache", "no chunking", "all at once")


@dataclass(frozen=True)
class VariantRun:
    """One way of serving the trace: counts from its records, times as the median of its turns."""

    name: str
    passes: int
    prefill_tokens: int
    cached_tokens: int
    preemptions: int
    seconds: float  # median of the turns
    tokens: int
    long_prefill_gap_ms: float | None  # median of the turns (None: the all-at-once batch, which has no arrivals)
    turns_seconds: tuple[float, ...]
    note: str = ""

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class TraceReport:
    plan: ServePlan
    records: tuple[ServeRecord, ...]  # the configured server's, first turn
    measure: ServeMeasure
    solo_outputs: tuple[tuple[int, ...], ...]
    largest_logit_diff: tuple[float, ...]  # per request, against its solo run
    variants: tuple[VariantRun, ...]
    repeat: int

    def variant(self, name: str) -> VariantRun:
        return next(v for v in self.variants if v.name == name)

    @property
    def identical(self) -> tuple[bool, ...]:
        return tuple(tuple(o) == s for o, s in zip(self.records[-1].outputs, self.solo_outputs, strict=True))

    @property
    def prefill_cut(self) -> float:
        """The share of prefill tokens the prefix cache saved against none."""
        off = self.variant("no prefix cache").prefill_tokens
        return 1 - self.variant("as configured").prefill_tokens / off if off else 0.0

    @property
    def gap_cut(self) -> float | None:
        """Unchunked over chunked: the longest gap between a running request's tokens while the longest prompt
        prefills (None when either run had no such gap)."""
        chunked = self.variant("as configured").long_prefill_gap_ms
        whole = self.variant("no chunking").long_prefill_gap_ms
        return whole / chunked if chunked and whole else None


def measure_trace(engine: Engine, trace: tuple[TraceRequest, ...], plan: ServePlan, sampling: SamplingSettings,
                  repeat: int = 3, progress: Callable[[str], None] | None = None) -> TraceReport:
    """Serve `plan`, check every request against its solo run, and time the four variants in `repeat` turns."""
    say = progress or (lambda _line: None)
    solo_logits: dict[tuple[int, int], object] = {}
    seen = [0] * len(plan.requests)

    def keep(request: int, logits) -> None:
        solo_logits[request, seen[request]] = logits.detach().float().clone()
        seen[request] += 1

    say("solo runs")
    solo, _ = run_one_at_a_time(engine, plan, sampling, keep)  # ServePlan's requests have what a batch's have
    largest, step_of = [0.0] * len(plan.requests), [0] * len(plan.requests)

    def against_solo(request: int, logits) -> None:
        other = solo_logits.get((request, step_of[request]))
        if other is not None:
            largest[request] = max(largest[request], float((logits.float() - other).abs().max()))
        step_of[request] += 1

    say("the trace as configured")
    records = tuple(serve(engine, plan, sampling, against_solo))
    solo_logits.clear()
    longest = max(len(r.prompt_ids) + r.budget for r in plan.requests)
    plans = {"as configured": plan, "no prefix cache": replace(plan, prefix_cache="off"),
             "no chunking": replace(plan, chunk=0, max_batched_tokens=max(plan.max_batched_tokens, longest))}
    batch = plan_batch(engine, [list(r.prompt_ids) for r in plan.requests], [r.budget for r in plan.requests],
                       plan.block_size, True, sampling, texts=[r.prompt for r in plan.requests])
    runs: dict[str, list[tuple[float, float | None, object]]] = {name: [] for name in VARIANTS}
    runs["as configured"].append((sum(r.seconds for r in records), measure(plan, list(records)).long_prefill_gap_ms,
                                  records))
    for turn in range(repeat):
        for name in VARIANTS:  # in turns: a busy moment slows one turn of each, not one variant
            if name == "as configured" and turn == 0:
                continue
            say(f"turn {turn + 1} of {repeat}: {name}")
            if name == "all at once":
                done = tuple(run_batch(engine, batch, sampling))
                runs[name].append((sum(r.seconds for r in done), None, done))
            else:
                done = tuple(serve(engine, plans[name], sampling))
                runs[name].append((sum(r.seconds for r in done), measure(plans[name], list(done)).long_prefill_gap_ms,
                                   done))
    variants = []
    for name in VARIANTS:
        turns = runs[name]
        seconds = statistics.median(t for t, _, _ in turns)
        last = turns[-1][2]
        if name == "all at once":
            prefill = sum(r.kv_computed for r in last if r.prefill)
            cached = sum(r.reused_positions for r in last)
            variants.append(VariantRun(name, len(last), prefill, cached, 0, seconds,
                                       sum(r.budget for r in plan.requests), None, tuple(t for t, _, _ in turns),
                                       "every request at pass 0, prefilled one at a time, prefixes shared while "
                                       "they run"))
            continue
        counted = measure(plans[name], list(last))
        gaps = [g for _, g, _ in turns if g]
        widened = name == "no chunking" and plans[name].max_batched_tokens != plan.max_batched_tokens
        variants.append(VariantRun(name, counted.passes, counted.prefill_tokens, counted.cached_tokens,
                                   counted.preemptions, seconds, counted.tokens,
                                   statistics.median(gaps) if gaps else None, tuple(t for t, _, _ in turns),
                                   f"a pass feeds {plans[name].max_batched_tokens} tokens at most" if widened else ""))
    return TraceReport(plan, records, measure(plan, list(records)), tuple(tuple(s) for s in solo), tuple(largest),
                       tuple(variants), repeat)
