"""Serving many requests at once: a prefill pass per request into a paged KV cache (sharing the prefixes it
already holds), then one decode pass for the whole batch per token, each request at its own position."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import torch

from kvviz.cache.paged import PagedCache
from kvviz.cache.probe import PassProbe
from kvviz.core.batch_records import BatchPlan, BatchRecord, BatchRequestPlan, BatchSpeed, BlockState
from kvviz.core.counting import plural
from kvviz.core.records import EXACT, RunRequest, describe_sampling
from kvviz.engine.engine import Engine, GenerationError, SamplingSettings
from kvviz.engine.sampling import sampling_generator
from kvviz.models.cache_shape import cache_shape

__all__ = ["measure_speed", "paged_refusal", "plan_batch", "run_batch", "run_one_at_a_time"]


def plan_batch(engine: Engine, prompts: list[list[int]], max_new_tokens: int | list[int], block_size: int,
               share_prefixes: bool = True, sampling: SamplingSettings | None = None,
               texts: list[str] | None = None, model_name: str = "", run_id: int = 0) -> BatchPlan:
    """Check a batch now (GenerationError) and plan it. `max_new_tokens` is one budget for all, or one each."""
    sampling = sampling or SamplingSettings()
    if not prompts:
        raise GenerationError("a batch needs at least one prompt")
    if block_size <= 0:
        raise GenerationError(f"the block size must be a positive number of positions, got {block_size}")
    budgets = max_new_tokens if isinstance(max_new_tokens, list) else [max_new_tokens] * len(prompts)
    if len(budgets) != len(prompts):
        raise GenerationError(f"{len(budgets)} budgets for {len(prompts)} prompts")
    refusal = paged_refusal(engine, "kvviz batch")
    if refusal:
        raise GenerationError(refusal)
    requests = []
    for i, (ids, budget) in enumerate(zip(prompts, budgets, strict=True)):
        plan = engine.plan(_request(budget, sampling), ids)  # the checks of a single run
        if len(ids) + budget > engine.n_ctx:
            raise GenerationError(f"request {i + 1}: {plural(len(ids), 'prompt token')} and {budget} new do not "
                                  f"fit the model's context of {engine.n_ctx}")
        text = texts[i] if texts is not None else plan.prompt
        requests.append(BatchRequestPlan(i, text, plan.prompt_ids, plan.prompt_labels, budget))
    cfg = engine.model.config
    bytes_per_position = cache_shape(cfg).bytes_per_token(engine.cache_precision(EXACT))  # as the family states it
    num_blocks = sum(-(-r.final_length // block_size) for r in requests)
    return BatchPlan(tuple(requests), model_name or cfg.name, cfg.n_layer, engine.n_ctx, block_size, num_blocks,
                     share_prefixes, bytes_per_position,
                     describe_sampling(sampling.temperature, sampling.top_k, sampling.seed), run_id)


def paged_refusal(engine: Engine, command: str) -> str:
    """Why `command` cannot page `engine`'s model ("" when it can): the paged pool holds per-head keys and values
    of every position, for every layer."""
    kinds = {kind.kind for kind in engine.model.config.cache_layers(engine.policy())}
    name = engine.model.config.name
    if "latent" in kinds:
        return f"{name} caches latents (MLA); {command} pages per-head caches only"
    if kinds & {"state", "shared"}:
        what = " and ".join(w for k, w in (("state", "linear-attention layers that keep a fixed state"),
                                           ("shared", "layers that read another layer's keys and values"))
                            if k in kinds)
        return f"{name} has {what}; {command} pages models whose every layer keeps keys and values of its own"
    if kinds != {"full"}:
        return f"{name} has a sliding window; the paged cache keeps every position, so {command} does not run it"
    return ""


def run_batch(engine: Engine, plan: BatchPlan, sampling: SamplingSettings | None = None,
              watch_logits: Callable[[int, torch.Tensor], None] | None = None) -> Iterator[BatchRecord]:
    """Yield a BatchRecord per forward pass of `plan`, on a paged cache that lives as long as the batch.
    `watch_logits(request, logits)` sees the logits (V,) of every choice, before it is made."""
    sampling = sampling or SamplingSettings()
    cfg = engine.model.config
    cache = PagedCache(cfg.n_layer, cfg.n_kv_head, cfg.head_dim, plan.num_blocks, plan.block_size, engine.dtype,
                       engine.device, plan.share_prefixes)
    yield from _passes(engine, plan, cache, sampling, watch_logits)


@torch.inference_mode()
def _passes(engine: Engine, plan: BatchPlan, cache: PagedCache, sampling: SamplingSettings,
            watch_logits: Callable[[int, torch.Tensor], None] | None) -> Iterator[BatchRecord]:
    requests = plan.requests
    tokenizer = engine.tokenizer
    generators = [sampling_generator(sampling, engine.device) for _ in requests]  # each draws as its run alone
    outputs: list[list[int]] = [[] for _ in requests]
    finished = [False] * len(requests)
    released = [False] * len(requests)
    step = 0

    def choose(request: int, logits: torch.Tensor) -> int | None:
        if len(outputs[request]) == requests[request].budget:
            finished[request] = True  # this pass fed its last token: nothing more to choose
            return None
        if watch_logits is not None:
            watch_logits(request, logits)
        token, _ = engine.choose(logits, sampling, generators[request], 1)
        outputs[request].append(token)
        return token

    def record(rows: list[int], prefill: bool, chosen: list[int | None], computed: int, reused: int,
               seconds: float) -> BatchRecord:
        in_use = cache.blocks_in_use()
        owners = {b: tuple(i for i in sorted(cache.tables) if b in cache.tables[i]) for b in in_use}
        return BatchRecord(
            step=step, prefill=prefill, rows=tuple(rows), new_token_ids=tuple(chosen),
            outputs=tuple(tuple(o) for o in outputs),
            output_labels=tuple(tuple(tokenizer.token_label(t) for t in o) for o in outputs),
            lengths=tuple(cache.lengths.get(i, 0) for i in range(len(requests))),
            tables=tuple(tuple(cache.tables.get(i, ())) for i in range(len(requests))),
            blocks=tuple(BlockState(b, owners[b], cache.tables[owners[b][0]].index(b) * cache.block_size,
                                    tuple(cache.block_tokens[b]),
                                    tuple(tokenizer.token_label(t) for t in cache.block_tokens[b])) for b in in_use),
            free_blocks=tuple(sorted(cache.free)), num_blocks=cache.num_blocks, block_size=cache.block_size,
            kv_computed=computed, reused_positions=reused, copies=cache.copies,
            bytes_per_position=cache.bytes_per_position, seconds=seconds, final=all(finished),
            finished=tuple(finished))

    weights = engine.fast.decode_weights(engine.model) if engine.fast is not None else None

    def forward(rows: list[int], fed: list[list[int]]) -> tuple[torch.Tensor, int]:
        positions = cache.prepare(rows, fed)  # (T,) for one row, (B, T) for several
        idx = torch.tensor(fed, dtype=torch.long, device=engine.device)  # (B, T)
        probe = PassProbe(plan.n_layer, False, engine.before_block)
        logits = engine.forward(idx, positions, cache, probe, weights)  # (B, V)
        return logits, probe.kv_rows[0]

    for request in requests:  # prefills, one request at a time: each finds the prefixes cached before it
        started = time.perf_counter()
        reused = cache.admit(request.index, list(request.prompt_ids))
        logits, computed = forward([request.index], [list(request.prompt_ids[reused:])])
        token = choose(request.index, logits[0])
        yield record([request.index], True, [token], computed, reused, time.perf_counter() - started)
        step += 1
    while not all(finished):
        for i in range(len(requests)):
            if finished[i] and not released[i]:
                cache.release(i)  # its blocks go back to the free list (or stay, for the requests sharing them)
                released[i] = True
        rows = [i for i in range(len(requests)) if not finished[i]]
        started = time.perf_counter()
        logits, computed = forward(rows, [[outputs[i][-1]] for i in rows])
        chosen = [choose(i, logits[n]) for n, i in enumerate(rows)]
        yield record(rows, False, chosen, computed, 0, time.perf_counter() - started)
        step += 1


def run_one_at_a_time(engine: Engine, plan: BatchPlan, sampling: SamplingSettings | None = None,
                      watch_logits: Callable[[int, torch.Tensor], None] | None = None
                      ) -> tuple[list[list[int]], float]:
    """The same requests as separate cached runs, one after another (the engine's own decode): their tokens and
    the seconds their passes took."""
    sampling = sampling or SamplingSettings()
    outputs, seconds = [], 0.0
    for request in plan.requests:
        run_plan = engine.plan(_request(request.budget, sampling), request.prompt_ids)
        watch = None if watch_logits is None else (lambda logits, i=request.index: watch_logits(i, logits))
        ids = []
        for step in engine.run(run_plan, sampling, top_candidates=1, watch_logits=watch):
            seconds += step.seconds
            if step.token_id is not None:
                ids.append(step.token_id)
        outputs.append(ids)
    return outputs, seconds


def measure_speed(engine: Engine, plan: BatchPlan, turns: int = 2, sampling: SamplingSettings | None = None,
                  first: tuple[float, float] | None = None) -> BatchSpeed:
    """The batch against the same requests one at a time, taking `turns` turns and keeping the fastest of each (a
    busy machine slows either). `first`, given, is a turn already timed: (batched, one-at-a-time seconds)."""
    timed = [first] if first is not None else []
    for _ in range(turns - (first is not None)):  # in turns: a busy moment slows one turn of each, not one side
        sequential = run_one_at_a_time(engine, plan, sampling)[1]
        timed.append((sum(r.seconds for r in run_batch(engine, plan, sampling)), sequential))
    batched, sequential = min(b for b, _ in timed), min(s for _, s in timed)
    tokens = sum(r.budget for r in plan.requests)
    return BatchSpeed(len(plan.requests), tokens / batched, tokens / sequential, turns,
                      tuple(s / b for b, s in timed if b > 0))


def _request(budget: int, sampling: SamplingSettings) -> RunRequest:
    """A batch's request as a single run of its budget and sampling asks for it."""
    return RunRequest(0, "", True, budget, sampling.temperature, sampling.top_k, sampling.seed)
