"""A server's scheduler, pass by pass, as vLLM's and SGLang's do it: requests arrive over time (a trace), wait,
are admitted while blocks are free, prefill in chunks mixed with the running requests' decode steps under one
token budget a pass, and the youngest is preempted, to be computed again, when the pool runs out. The paged cache
(kvviz.cache.paged) keeps finished requests' blocks as a prefix cache, by block hash or radix tree.

A pass is one forward, flattened as serving engines do it: the decode steps' tokens and the prefill chunks one
after another in one row, each query masked to its own request's keys (kvviz.cache.paged's flat pass), and the
logits taken at each request's last token. Every request draws from a generator of its own, so that its tokens
are its solo run's, whatever the arrivals, chunks, preemptions and cache hits.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence

import torch

from kvviz.cache.paged import PagedCache
from kvviz.cache.probe import PassProbe
from kvviz.core.counting import plural
from kvviz.core.records import EXACT
from kvviz.core.serve_records import (
    DECODING,
    FINISHED,
    NOT_ARRIVED,
    PREEMPTED,
    PREFILLING,
    PREFIX_CACHES,
    WAITING,
    PassRow,
    ServePlan,
    ServeRecord,
    ServeRequestPlan,
)
from kvviz.core.trace import TraceRequest
from kvviz.engine.engine import Engine, GenerationError, SamplingSettings
from kvviz.engine.sampling import sampling_generator
from kvviz.engine.server_state import pool_record
from kvviz.engine.serving import paged_refusal
from kvviz.models.cache_shape import cache_shape

__all__ = ["plan_trace", "serve"]


def plan_trace(engine: Engine, trace: Sequence[TraceRequest], block_size: int = 16, num_blocks: int = 64,
               prefix_cache: str = "radix", chunk: int = 16, max_batched_tokens: int = 256,
               sampling: SamplingSettings | None = None, model_name: str = "", run_id: int = 0) -> ServePlan:
    """Check a trace against the model and the server now (GenerationError, one line, naming the request) and
    plan it: every request must fit the context and, alone, the pool; unchunked, its prompt must fit a pass."""
    sampling = sampling or SamplingSettings()
    refusal = paged_refusal(engine, "kvviz serve-trace")
    if refusal:
        raise GenerationError(refusal)
    if prefix_cache not in PREFIX_CACHES:
        raise GenerationError(f"unknown prefix cache {prefix_cache!r}; one of {', '.join(PREFIX_CACHES)}")
    if block_size <= 0 or num_blocks <= 0 or max_batched_tokens <= 0 or chunk < 0:
        raise GenerationError("the block size, the pool's blocks and the token budget must be positive numbers")
    requests = []
    for i, request in enumerate(trace):
        where = f"request {i + 1} ({request.name})"
        try:
            ids = engine.encode_prompt(request.prompt)
        except GenerationError as exc:
            raise GenerationError(f"{where}: {exc}") from None
        final = len(ids) + request.max_new_tokens
        if final > engine.n_ctx:
            raise GenerationError(f"{where}: {plural(len(ids), 'prompt token')} and {request.max_new_tokens} new "
                                  f"do not fit the model's context of {engine.n_ctx}")
        blocks = -(-final // block_size)
        if blocks > num_blocks:
            raise GenerationError(f"{where} can never fit the pool: {final} positions take {blocks} blocks of "
                                  f"{block_size}, and the pool has {num_blocks}")
        if not chunk and len(ids) + request.max_new_tokens > max_batched_tokens:
            raise GenerationError(f"{where}: its {len(ids)} prompt tokens (and a restart's {request.max_new_tokens}"
                                  f" more) exceed the {max_batched_tokens} tokens a pass feeds, and prompts are not"
                                  " chunked (give --chunk N)")
        labels = tuple(engine.tokenizer.token_label(t) for t in ids)
        requests.append(ServeRequestPlan(i, request.name, request.arrive_at_pass, request.prompt, tuple(ids),
                                         labels, request.max_new_tokens))
    cfg = engine.model.config
    return ServePlan(tuple(requests), model_name or cfg.name, cfg.n_layer, engine.n_ctx, block_size, num_blocks,
                     prefix_cache, chunk, max_batched_tokens,
                     cache_shape(cfg).bytes_per_token(engine.cache_precision(EXACT)),
                     _describe(sampling), run_id)


def _describe(sampling: SamplingSettings) -> str:
    from kvviz.core.records import describe_sampling

    return describe_sampling(sampling.temperature, sampling.top_k, sampling.seed)


class _Server:
    """The scheduler's state between passes: the queues, each request's tokens, the pool."""

    def __init__(self, engine: Engine, plan: ServePlan, sampling: SamplingSettings) -> None:
        cfg = engine.model.config
        self.engine, self.plan, self.sampling = engine, plan, sampling
        self.cache = PagedCache(cfg.n_layer, cfg.n_kv_head, cfg.head_dim, plan.num_blocks, plan.block_size,
                                engine.dtype, engine.device, share_prefixes=plan.prefix_cache != "off",
                                prefix_cache="" if plan.prefix_cache == "off" else plan.prefix_cache)
        n = len(plan.requests)
        self.states = [NOT_ARRIVED] * n
        self.outputs: list[list[int]] = [[] for _ in range(n)]
        self.generators = [sampling_generator(sampling, engine.device) for _ in range(n)]
        self.fed = [0] * n  # positions of its current admission's tokens (prompt, and outputs on a restart) fed
        self.restarts = [0] * n
        self.waiting: list[int] = []
        self.running: list[int] = []  # admitted and not finished, oldest admission first
        self.weights = engine.fast.decode_weights(engine.model) if engine.fast is not None else None

    def tokens(self, request: int) -> list[int]:
        """What its admission feeds: the prompt, and on a restart every token it chose before (the last one is
        fed too: the restart's last logits choose the next token)."""
        return list(self.plan.requests[request].prompt_ids) + self.outputs[request]

    def forward(self, rows: list[int], fed: list[list[int]]) -> torch.Tensor:
        """Logits (R, V) at the last token of each row, one flattened forward for them all."""
        positions = self.cache.prepare(rows, fed, flat=True)  # (ΣT,)
        idx = torch.tensor([[t for tokens in fed for t in tokens]], dtype=torch.long, device=self.engine.device)
        probe = PassProbe(self.plan.n_layer, False, self.engine.before_block)
        last = torch.tensor([len(t) for t in fed]).cumsum(0) - 1
        engine, fast = self.engine, self.engine.fast
        if fast is not None and hasattr(fast, "states"):
            x = fast.states(engine.model, idx, positions, self.cache, self.weights, probe)[0, last]  # (R, C)
            return fast.head(engine.model, x, verifying=len(rows) > 1)  # several rows: as a verifying pass's
        return engine.model(idx, positions, self.cache, probe=probe)[0, last]

    def choose(self, request: int, logits: torch.Tensor, watch: Callable | None) -> int:
        if watch is not None:
            watch(request, logits)
        token, _ = self.engine.choose(logits, self.sampling, self.generators[request], 1)
        self.outputs[request].append(token)
        return token

    def preempt_youngest(self, preempted: list[int], freed: list[int]) -> int:
        """Preempt the youngest running request by recompute: its blocks go back (cached, under a prefix cache),
        and it waits at the head of the queue to compute its prompt and tokens again."""
        victim = self.running.pop()
        freed.append(sum(1 for b in self.cache.tables[victim] if self.cache.refs[b] == 1))
        self.cache.release(victim)
        self.states[victim], self.fed[victim] = PREEMPTED, 0
        self.restarts[victim] += 1
        self.waiting.insert(0, victim)
        preempted.append(victim)
        return victim


@torch.inference_mode()
def serve(engine: Engine, plan: ServePlan, sampling: SamplingSettings | None = None,
          watch_logits: Callable[[int, torch.Tensor], None] | None = None) -> Iterator[ServeRecord]:
    """Yield a ServeRecord per pass of the scheduler over `plan`'s trace, until every request has its tokens.
    `watch_logits(request, logits)` sees the logits (V,) of every choice, before it is made."""
    server = _Server(engine, plan, sampling or SamplingSettings())
    cache, requests = server.cache, plan.requests
    step = 0
    while not all(s == FINISHED for s in server.states):
        started = time.perf_counter()
        arrived = [r.index for r in requests if r.arrive_at_pass <= step and server.states[r.index] == NOT_ARRIVED]
        for i in arrived:
            server.states[i] = WAITING
            server.waiting.append(i)
        budget, spare = plan.max_batched_tokens, cache.available()
        decode: list[int] = []
        chunks: list[tuple[int, int]] = []
        preempted: list[int] = []
        freed: list[int] = []  # per preemption: the blocks only the victim held
        evicted_before = cache.evicted
        for request in list(server.running):  # the running requests first, oldest first
            if request not in server.running:
                continue  # preempted for an older one this pass
            prefilling = server.states[request] != DECODING
            want = 1 if not prefilling else _chunk(plan, len(server.tokens(request)) - server.fed[request], budget)
            if want == 0 or want > budget:
                continue
            while cache.blocks_needed(request, want) > spare and request in server.running:
                victim = server.preempt_youngest(preempted, freed)
                spare = cache.available() - _reserved(cache, decode, chunks)
                if victim == request:
                    break
            if request not in server.running:
                continue
            spare -= cache.blocks_needed(request, want)
            budget -= want
            (chunks.append((request, want)) if prefilling else decode.append(request))
        admitted, hits = [], []
        while server.waiting and budget > 0 and not preempted:  # then the queue, in order, while blocks last
            request = server.waiting[0]
            tokens = server.tokens(request)
            matched = cache.admit(request, tokens)
            want = _chunk(plan, len(tokens) - matched, budget)
            spare = cache.available() - _reserved(cache, decode, chunks)
            if want == 0 or cache.blocks_needed(request, want) > spare:
                cache.withdraw(request)  # it waits: its matched blocks stay cached
                break
            server.waiting.pop(0)
            server.running.append(request)
            server.fed[request] = matched
            server.states[request] = PREFILLING
            admitted.append(request)
            hits.append(matched)
            chunks.append((request, want))
            budget -= want
        rows: list[PassRow] = []
        order = decode + [r for r, _ in chunks]
        fed = [[server.outputs[r][-1]] for r in decode]
        for request, want in chunks:
            start = server.fed[request]
            fed.append(server.tokens(request)[start:start + want])
        logits = server.forward(order, fed) if order else None
        for n, request in enumerate(decode):
            rows.append(PassRow(request, False, cache.lengths[request] - 1, 1,
                                server.choose(request, logits[n], watch_logits)))
        for n, (request, want) in enumerate(chunks, len(decode)):
            start = server.fed[request]
            server.fed[request] = start + want
            chosen = None
            if server.fed[request] == len(server.tokens(request)):
                chosen = server.choose(request, logits[n], watch_logits)
                server.states[request] = DECODING
            rows.append(PassRow(request, True, start, want, chosen, server.restarts[request] > 0))
        for row in rows:
            if row.chosen is not None and len(server.outputs[row.request]) == requests[row.request].budget:
                server.states[row.request] = FINISHED
                server.running.remove(row.request)
                cache.release(row.request)
        if not rows and not server.running and not server.waiting and \
                all(s != NOT_ARRIVED for s in server.states) and not all(s == FINISHED for s in server.states):
            raise GenerationError("the scheduler found nothing to run; a request is stuck")  # a bug, not input
        yield pool_record(server, step, rows, admitted, hits, preempted, freed, cache.evicted - evicted_before,
                          time.perf_counter() - started)
        step += 1
        if not server.running and not server.waiting:  # idle until the next arrival: one record says so, the
            later = [r.arrive_at_pass for r in requests if r.arrive_at_pass >= step]  # passes between are skipped
            step = min(later) if later else step


def _chunk(plan: ServePlan, remaining: int, budget: int) -> int:
    """Prompt tokens a request prefills this pass: a chunk at most (all of them unchunked, or none if they do not
    fit what is left of the budget)."""
    if not plan.chunk:
        return remaining if remaining <= budget else 0
    return min(remaining, plan.chunk, budget)


def _reserved(cache: PagedCache, decode: list[int], chunks: list[tuple[int, int]]) -> int:
    """Blocks the rows planned so far in a pass will claim."""
    return sum(cache.blocks_needed(r, 1) for r in decode) + sum(cache.blocks_needed(r, n) for r, n in chunks)

