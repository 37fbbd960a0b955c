"""Frozen records of a served trace (kvviz.engine.scheduler): requests that arrive over time, a scheduler that
admits, chunks and preempts them pass by pass, and a prefix cache whose blocks outlive their requests.

Torch-free and Qt-free, like kvviz.core.batch_records: the serving view, the CLI and the lesson read them as they
are, and the measures below are computed from them, never from the scheduler's own counters.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from kvviz.core.batch_records import BlockState

WAITING, PREFILLING, DECODING, PREEMPTED, FINISHED = "waiting", "prefilling", "decoding", "preempted", "finished"
NOT_ARRIVED = "not arrived"
STATES = (NOT_ARRIVED, WAITING, PREFILLING, DECODING, PREEMPTED, FINISHED)
PREFIX_CACHES = ("off", "hash", "radix")  # no cache across requests; vLLM's block hashes; SGLang's radix tree


@dataclass(frozen=True)
class ServeRequestPlan:
    """One request of a trace, tokenized: when it arrives, its prompt and how many tokens it generates."""

    index: int
    name: str
    arrive_at_pass: int
    prompt: str
    prompt_ids: tuple[int, ...]
    prompt_labels: tuple[str, ...]
    budget: int

    @property
    def final_length(self) -> int:
        return len(self.prompt_ids) + self.budget


@dataclass(frozen=True)
class ServePlan:
    """A checked trace and the server it runs on: the pool, the scheduler's budget and chunk, the prefix cache."""

    requests: tuple[ServeRequestPlan, ...]
    model_name: str
    n_layer: int
    n_ctx: int
    block_size: int
    num_blocks: int
    prefix_cache: str  # one of PREFIX_CACHES
    chunk: int  # prompt tokens a request prefills in one pass at most (0: its whole prompt at once)
    max_batched_tokens: int  # tokens one pass feeds, decode steps and prefill chunks together
    bytes_per_position: int
    sampling: str
    run_id: int = 0

    @property
    def steps(self) -> int:
        """Passes are not known before the trace runs (arrivals, preemptions); the session protocol's upper bound:
        every request prefilled token by token and decoded alone, after the last arrival."""
        return self.requests[-1].arrive_at_pass + sum(r.final_length for r in self.requests)

    def steps_done(self, record: ServeRecord) -> int:
        return record.step + 1


@dataclass(frozen=True)
class PassRow:
    """What one pass fed one request: a prefill chunk (`tokens` prompt positions from `first_position`; the last
    chunk chooses the first token) or a decode step (one token)."""

    request: int
    prefill: bool
    first_position: int
    tokens: int
    chosen: int | None  # the token chosen from this row's logits (None: a chunk that is not the prompt's last)
    recompute: bool = False  # a preempted request computing again what it had


@dataclass(frozen=True)
class RadixNode:
    """A node of the prefix tree: a run of tokens whose keys and values the cache holds, `parent` an index into
    the record's `tree` (-1: a child of the root), `hits` the admissions that matched into it, `live` whether a
    running request holds it (else it is cached and evictable)."""

    parent: int
    token_ids: tuple[int, ...]
    token_labels: tuple[str, ...]
    hits: int
    live: bool
    blocks: tuple[int, ...]  # the physical blocks its tokens live in


@dataclass(frozen=True)
class ServeRecord:
    """One pass of the scheduler: the rows it fed, every request's state after it, the pool, and its decision in
    one sentence."""

    step: int  # the pass, from 0 (passes where nothing runs after an idle one are skipped: the next arrival's is next)
    rows: tuple[PassRow, ...]
    states: tuple[str, ...]  # per request, after the pass: one of STATES
    outputs: tuple[tuple[int, ...], ...]
    output_labels: tuple[tuple[str, ...], ...]
    lengths: tuple[int, ...]  # positions each request's cache holds
    tables: tuple[tuple[int, ...], ...]
    blocks: tuple[BlockState, ...]  # blocks running requests hold
    cached_blocks: tuple[BlockState, ...]  # blocks no request holds, kept for a later prefix (evictable)
    free_blocks: tuple[int, ...]
    num_blocks: int
    block_size: int
    admitted: tuple[int, ...]  # requests that started (or restarted) this pass
    cached_tokens: tuple[int, ...]  # per admitted request: prompt positions found cached
    preempted: tuple[int, ...]
    freed_blocks: tuple[int, ...]  # per preempted request: the blocks only it held, now free (or cached)
    evicted: int  # cached blocks evicted this pass
    decision: str
    tree: tuple[RadixNode, ...]  # the prefix tree after the pass (radix mode; else empty)
    seconds: float
    final: bool

    @property
    def prefill_tokens(self) -> int:
        return sum(r.tokens for r in self.rows if r.prefill)

    @property
    def decode_tokens(self) -> int:
        return sum(r.tokens for r in self.rows if not r.prefill)


@dataclass(frozen=True)
class RequestMeasure:
    """One request's service, counted from the records: passes and milliseconds from its arrival to its first
    token, and between its tokens."""

    index: int
    name: str
    prompt_tokens: int
    cached_tokens: int  # prompt positions its admissions found cached (a restart counts again)
    prefill_tokens: int  # prompt positions it computed (a restart's recompute included)
    first_token_passes: int  # passes from its arrival to the pass that chose its first token, that pass counted
    first_token_ms: float
    mean_gap_passes: float  # between consecutive tokens
    max_gap_passes: int
    mean_gap_ms: float
    max_gap_ms: float
    preemptions: int


@dataclass(frozen=True)
class ServeMeasure:
    """A served trace's figures, from its records."""

    requests: tuple[RequestMeasure, ...]
    passes: int  # the last pass's number + 1 (idle passes skipped count)
    seconds: float
    tokens: int  # generated
    prefill_tokens: int
    prompt_tokens: int
    cached_tokens: int
    preemptions: int
    evicted_blocks: int
    long_prefill_gap_ms: float  # the longest gap between another request's tokens that spans a pass prefilling
    long_prefill_gap_passes: int  # ... the trace's longest prompt (0: no request was running then)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def hit_rate(self) -> float:
        """Prompt positions found cached over every prompt position the admissions asked for."""
        asked = self.cached_tokens + self.prefill_tokens
        return self.cached_tokens / asked if asked else 0.0


def measure(plan: ServePlan, records: list[ServeRecord]) -> ServeMeasure:
    """The figures of a served trace, counted from its records."""
    n = len(plan.requests)
    token_passes: list[list[int]] = [[] for _ in range(n)]
    ends_ms: dict[int, float] = {}  # by pass: the clock at its end
    clock = 0.0
    prefill = [0] * n
    cached = [0] * n
    preemptions = [0] * n
    for record in records:
        clock += record.seconds * 1e3
        ends_ms[record.step] = clock
        for row in record.rows:
            if row.prefill:
                prefill[row.request] += row.tokens
            if row.chosen is not None:
                token_passes[row.request].append(record.step)
        for request, hit in zip(record.admitted, record.cached_tokens, strict=True):
            cached[request] += hit
        for request in record.preempted:
            preemptions[request] += 1
    steps = sorted(ends_ms)

    def start_ms(step: int) -> float:
        """The clock when pass `step` starts: the end of the last pass before it."""
        return ends_ms[steps[bisect.bisect_left(steps, step) - 1]] if steps and step > steps[0] else 0.0
    longest = max(range(n), key=lambda i: len(plan.requests[i].prompt_ids))
    long_passes = {r.step for r in records for row in r.rows if row.request == longest and row.prefill}
    measures, gap_ms, gap_passes = [], 0.0, 0
    for i, request in enumerate(plan.requests):
        passes = token_passes[i]
        arrive = request.arrive_at_pass
        gaps = list(zip(passes, passes[1:], strict=False))
        ms = [ends_ms[b] - ends_ms[a] for a, b in gaps]
        if i != longest:
            for (a, b), m in zip(gaps, ms, strict=True):
                if any(a < p <= b for p in long_passes) and m > gap_ms:
                    gap_ms, gap_passes = m, b - a
        first = passes[0] if passes else (steps[-1] if steps else 0)
        measures.append(RequestMeasure(
            i, request.name, len(request.prompt_ids), cached[i], prefill[i], first - arrive + 1,
            ends_ms.get(first, 0.0) - start_ms(arrive),
            sum(b - a for a, b in gaps) / len(gaps) if gaps else 0.0, max((b - a for a, b in gaps), default=0),
            sum(ms) / len(ms) if ms else 0.0, max(ms, default=0.0), preemptions[i]))
    passes = records[-1].step + 1 if records else 0
    return ServeMeasure(tuple(measures), passes, clock / 1e3, sum(len(p) for p in token_passes),
                        sum(prefill), sum(len(r.prompt_ids) for r in plan.requests), sum(cached),
                        sum(preemptions), sum(r.evicted for r in records), gap_ms, gap_passes)


@dataclass(frozen=True)
class ServeRequest:
    """What the app's serving view asks the worker to run: a trace (None: the built-in one) on a server of these
    settings; `run_id` tags the plan and every record."""

    run_id: int
    trace_path: str | None = None
    prefix_cache: str = "radix"
    chunk: int = 16
    block_size: int = 16
    num_blocks: int = 64
    max_batched_tokens: int = 256
