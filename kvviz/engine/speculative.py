"""Speculative decoding: something cheap proposes up to k tokens, the target checks them all in one pass over its
cache, keeps the longest prefix it accepts and a token of its own, and crops its cache (and the draft model's) back
to what it kept.

Two drafters: prompt lookup (`prompt_lookup`: the tokens that followed the last n-gram where it occurred before, as
transformers' `prompt_lookup_num_tokens` proposes them; no model) and a draft model of the same vocabulary
(`DraftModel`: its own tokens, on its own cache). Greedy, the target keeps the drafts equal to its own argmax, so
the tokens are its plain greedy tokens by construction. Sampled, it keeps draft x with probability min(1, p(x)/q(x))
and otherwise draws from max(0, p - q) renormalised (Leviathan et al. 2023, Chen et al. 2023): the tokens follow
the target's own distribution p, whatever the draft's q (a prompt lookup's q is all on its draft). Every draw comes
from the run's seeded generator, so a seed reproduces a run.

A run yields one StepRecord a target pass, whose `speculation` says what was drafted, accepted and rolled back.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

import torch

from kvviz.cache.kv_cache import KVCache, build_cache, rollback_refusal
from kvviz.cache.probe import PassProbe
from kvviz.core.errors import GenerationError
from kvviz.core.records import CachePolicy, Candidate, RunPlan, RunRequest, StepRecord
from kvviz.core.speculation import MAX_DRAFT_TOKENS, MAX_PROMPT_LOOKUP, Drafter, Speculation
from kvviz.engine.sampling import SamplingSettings, distribution, sampling_generator


class Engine(Protocol):
    """What speculative decoding reads of kvviz.engine.engine.Engine (which imports this module): the target's (or
    the draft's) model, fast file, tokenizer and device, its draft's engine, and its passes."""

    model: torch.nn.Module
    fast: object
    tokenizer: object
    device: torch.device
    draft: Engine | None
    before_block: Callable[[int], None] | None
    n_ctx: int

    def forward(self, idx: torch.Tensor, positions: torch.Tensor, kv_cache: KVCache | None, probe: PassProbe,
                weights: object = None) -> torch.Tensor: ...

    def policy(self, window: int = 0, sinks: int = 0, kv_dtype: str = "") -> CachePolicy: ...

TOKENIZER_PROBE = "ROMEO: Time flies, and so do 42 arrows!\n"  # a text two tokenizers must split alike


def prompt_lookup(tokens: Sequence[int], n: int, k: int) -> list[int]:
    """Up to `k` tokens that followed an earlier occurrence of the text's last n-gram, trying n, n - 1, ... 1 tokens
    (transformers' prompt lookup): the first occurrence that has tokens after it; [] where none occurs."""
    length = len(tokens)
    for size in range(min(n, length - 1), 0, -1):
        tail = list(tokens[length - size:])
        for start in range(length - size):
            if list(tokens[start:start + size]) == tail:
                follow = list(tokens[start + size:start + size + k])
                if follow:
                    return follow
    return []


def check_drafter(engine: Engine, request: RunRequest, policy: CachePolicy) -> Drafter | None:
    """The drafter of `request` (None: plain decoding), checked against the target and its cache now
    (GenerationError, one line)."""
    k, lookup, model_name = request.draft_tokens, request.prompt_lookup, request.draft_model
    if not k and not lookup and not model_name:
        return None
    if not 1 <= k <= MAX_DRAFT_TOKENS:
        raise GenerationError(f"draft tokens must be between 1 and {MAX_DRAFT_TOKENS}, got {k}")
    if not 0 <= lookup <= MAX_PROMPT_LOOKUP:
        raise GenerationError(f"prompt lookup takes an n-gram of 1 to {MAX_PROMPT_LOOKUP} tokens, got {lookup}")
    if bool(lookup) == bool(model_name):
        raise GenerationError("speculative decoding takes one drafter: a draft model or prompt lookup")
    if not request.use_cache:
        raise GenerationError("speculative decoding checks drafts against the target's cache: turn the cache on")
    if request.break_cache or request.compare:
        what = "Break the cache" if request.break_cache else "compare mode"
        raise GenerationError(f"speculative decoding runs on its own: turn {what} off first")
    if policy.importance:
        raise GenerationError(f"speculative decoding rolls the cache back, and {policy.method_name} forgets "
                              "positions for good: turn one of them off")
    refusal = rollback_refusal(engine.model.config.cache_layers(policy))
    if refusal:
        raise GenerationError(f"{engine.model.config.name} cannot decode speculatively: {refusal}")
    if model_name:
        draft = engine.draft
        if draft is None:
            raise GenerationError(f"the draft model {model_name} is not loaded")
        if draft.model.config.vocab_size != engine.model.config.vocab_size:
            raise GenerationError(f"the draft model's vocabulary has {draft.model.config.vocab_size} tokens, the "
                                  f"target's {engine.model.config.vocab_size}: a draft proposes the target's tokens")
        if not same_tokenizer(draft.tokenizer, engine.tokenizer):
            raise GenerationError("the draft model's tokenizer splits text unlike the target's: a draft proposes "
                                  "the target's tokens")
        refusal = rollback_refusal(draft.model.config.cache_layers(draft.policy()))
        if refusal:
            raise GenerationError(f"the draft model cannot draft: {refusal}")
    return Drafter(k, lookup, model_name)


def same_tokenizer(a: object, b: object) -> bool:
    """Whether tokenizers `a` and `b` give the same ids: the same vocabulary, end of text and split of a probe."""
    return (a.vocab_size, a.eot_id, a.encode(TOKENIZER_PROBE)) == (b.vocab_size, b.eot_id, b.encode(TOKENIZER_PROBE))


class DraftModel:
    """A smaller model of the target's vocabulary, proposing its own tokens (greedy, or drawn from its
    distribution q) from its own cache, which is cropped back with the target's after each round."""

    def __init__(self, engine: Engine, capacity: int, spare: int) -> None:
        self.engine = engine
        weights = next(engine.model.parameters())
        self.cache = build_cache(engine.model.config.cache_layers(engine.policy()), capacity, dtype=weights.dtype,
                                 device=weights.device, spare=spare)
        self.fast = engine.fast is not None and not engine.policy().lossy
        self.weights = engine.fast.decode_weights(engine.model) if engine.fast is not None else None
        self.passes = 0

    def propose(self, tokens: Sequence[int], k: int, sampling: SamplingSettings,
                generator: torch.Generator | None) -> tuple[list[int], torch.Tensor | None]:
        """Up to `k` tokens after `tokens` and, sampled, the distributions (m, V) they were drawn from: feeds what
        its cache does not hold yet, then one token a pass (no further than its own context)."""
        engine, drafts, rows = self.engine, [], []
        k = min(k, engine.n_ctx - len(tokens))
        fed = list(tokens[self.cache.length:])
        while len(drafts) < k:
            start = self.cache.length
            if self.fast and len(fed) == 1:
                logits = engine.fast.decode_one(engine.model, fed[0], start, self.cache, self.weights)[0]
            else:
                idx = torch.tensor([fed], device=engine.device)
                logits = engine.forward(idx, torch.arange(start, start + len(fed), device=engine.device),
                                        self.cache, PassProbe(self.cache.n_layer), self.weights)[0]
            self.passes += 1
            logits = logits[:engine.tokenizer.vocab_size]
            if sampling.greedy:
                drafts.append(int(logits.argmax()))
            else:
                rows.append(distribution(logits, sampling))
                drafts.append(int(torch.multinomial(rows[-1], 1, generator=generator)))
            fed = drafts[-1:]
        return drafts, (torch.stack(rows) if rows else None)

    def keep(self, length: int) -> None:
        """Roll the draft's cache back to `length` positions, where the target's text and its own part."""
        self.cache.crop(min(self.cache.length, length))


def verifying_pass(engine: Engine, idx: torch.Tensor, positions: torch.Tensor, cache: KVCache, probe: PassProbe,
                   weights: object, first: int) -> Callable[[int], torch.Tensor]:
    """Run the target's pass over `idx` (1, T) and return its logits from row `first` on, `rows(i)` (V,) of row
    first + i: the fast file's blocks and its head on those rows at once (products.verifying_head), or the teaching
    model's logits of every position for a family without a fast file."""
    vocab, name = engine.tokenizer.vocab_size, engine.model.config.name
    if engine.fast is not None and hasattr(engine.fast, "states"):
        x = engine.fast.states(engine.model, idx, positions, cache, weights, probe)[0, first:]  # (T - first, C)
        logits = engine.fast.head(engine.model, x, verifying=True)  # (T - first, V)
    else:
        logits = engine.model(idx, positions, cache, probe=probe)[0, first:]  # (T - first, V)
    logits = logits[:, :vocab]
    if not bool(torch.isfinite(logits).all()):
        raise GenerationError(f"{name}: the model's logits hold NaN or infinite values; its output means nothing")
    return logits.__getitem__


def verify(rows: Callable[[int], torch.Tensor], drafts: Sequence[int], q: torch.Tensor | None,
           sampling: SamplingSettings, generator: torch.Generator | None) -> tuple[int, int, torch.Tensor]:
    """The target's verdict on `drafts` from its logits, `rows(i)` (V,) after the pending token and i drafts: how
    many drafts it accepts, its own next token, and the probabilities (V,) that token was chosen from. Greedy: the
    drafts equal to its argmax, then its argmax. Sampled: each draft with probability min(1, p/q) (`q` (m, V) the
    draft model's, None: all on the draft), then a draw from max(0, p - q) renormalised at the first rejection, or
    from p after the last draft."""
    for i, token in enumerate(drafts):
        if sampling.greedy:
            row = rows(i)
            if token == int(row.argmax()):
                continue
            return i, int(row.argmax()), torch.softmax(row.float(), dim=-1)
        p = distribution(rows(i), sampling)  # (V,)
        q_token = 1.0 if q is None else float(q[i, token])
        if float(torch.rand((), generator=generator, device=p.device)) < min(1.0, float(p[token]) / q_token):
            continue
        residual = p.clone()
        if q is None:
            residual[token] = 0.0
        else:
            residual = (residual - q[i]).clamp_(min=0.0)
        if not float(residual.sum()) > 0:  # p == q there: nothing left to correct; draw from p
            residual = p
        return i, int(torch.multinomial(residual / residual.sum(), 1, generator=generator)), p
    row = rows(len(drafts))
    if sampling.greedy:
        return len(drafts), int(row.argmax()), torch.softmax(row.float(), dim=-1)
    p = distribution(row, sampling)
    return len(drafts), int(torch.multinomial(p, 1, generator=generator)), p


@torch.inference_mode()
def speculative_passes(engine: Engine, plan: RunPlan, sampling: SamplingSettings,
                       top_candidates: int) -> Iterator[StepRecord]:
    """The records of `plan`'s speculative run on `engine`, one a target pass. Round 0 is the prompt's pass, which
    drafts nothing and gives the first token; each round after feeds the pending token and the drafts."""
    drafter, model, device, P = plan.drafter, engine.model, engine.device, plan.prompt_tokens
    k, spare = drafter.k, drafter.k + 1
    capacity = P + plan.budget + spare
    weights = next(model.parameters())
    cache: KVCache = build_cache(model.config.cache_layers(plan.policy), capacity, dtype=weights.dtype,
                                 device=weights.device, spare=spare)
    draft = DraftModel(engine.draft, capacity, spare) if drafter.model_name else None
    generator = sampling_generator(sampling, device)
    fast_weights = engine.fast.decode_weights(model) if engine.fast is not None else None
    label = engine.tokenizer.token_label
    tokens = list(plan.prompt_ids)
    totals = {"computed": 0, "reused": 0, "without": 0, "drafted": 0, "accepted": 0, "draft": 0}
    for number in range(plan.budget):
        started = time.perf_counter()
        start = cache.length  # the pending token's position (round 0: the prompt's first)
        generated = len(tokens) - P
        room = min(k, plan.budget - generated - 1) if number else 0
        drafts, q, draft_passes = [], None, 0
        if room > 0:
            if draft is not None:
                drafts, q = draft.propose(tokens, room, sampling, generator)
                draft_passes = draft.passes - totals["draft"]
                totals["draft"] = draft.passes
            else:
                drafts = prompt_lookup(tokens, drafter.lookup, room)
        fed = [*tokens[start:], *drafts]  # round 0: the prompt; then the pending token and the drafts
        probe = PassProbe(model.config.n_layer, False, engine.before_block)  # a pass of many queries: no weights
        rows = verifying_pass(engine, torch.tensor([fed], device=device),
                              torch.arange(start, start + len(fed), device=device), cache, probe, fast_weights,
                              first=len(fed) - 1 - len(drafts))  # the pending token's row (round 0: the prompt's last)
        accepted, own, probs = verify(rows, drafts, q, sampling, generator)
        written, evicted = cache.last_written, cache.evicted
        cache.crop(start + len(fed) - len(drafts) + accepted)  # the text fed and the drafts it accepted stay
        kept = (*drafts[:accepted], own)
        before = len(tokens)
        tokens.extend(kept)
        if draft is not None:
            draft.keep(len(tokens) - 1)
        values, ids = torch.topk(probs, min(top_candidates, probs.shape[-1]))
        candidates = tuple(Candidate(int(i), label(int(i)), float(v)) for v, i in
                           zip(values.tolist(), ids.tolist(), strict=True))
        seconds = time.perf_counter() - started
        computed, reused = tuple(probe.kv_rows), cache.reused
        totals["computed"] += computed[0]
        totals["reused"] += reused[0]
        totals["without"] += sum(range(before, before + len(kept)))  # an uncached run feeds the whole text a token
        totals["drafted"] += len(drafts)
        totals["accepted"] += accepted
        new_tokens = len(tokens) - P
        final = new_tokens >= plan.budget
        window = plan.policy.window
        if window and evicted[0] < evicted[1]:  # what the crop gave back is no longer evicted
            evicted = (evicted[0], min(evicted[1], max(evicted[0], cache.length - window + 1)))
        speculation = Speculation(number, start + len(fed) - len(drafts) - 1, tuple(drafts),
                                  tuple(label(t) for t in drafts), accepted, kept, tuple(label(t) for t in kept),
                                  draft_passes, number + 1, totals["draft"],
                                  totals["drafted"], totals["accepted"], new_tokens)
        yield StepRecord(
            step=number, use_cache=True, prompt_tokens=P, fed_start=start, fed_stop=start + len(fed),
            fed_token_ids=tuple(fed), kv_computed=computed, kv_reused=reused, token_id=own, token_text=label(own),
            candidates=candidates, new_tokens=new_tokens, sequence_length=len(tokens), seconds=seconds,
            kv_computed_total=totals["computed"], kv_reused_total=totals["reused"],
            with_cache_total=totals["computed"], without_cache_total=totals["without"], cache_bytes=cache.bytes_used,
            n_layer=model.config.n_layer, final=final, stop_reason=plan.stop_reason if final else "",
            kv_written=written, kv_evicted=evicted, positions_held=cache.positions_held,
            layer_positions_held=cache.layer_positions_held, layer_capacity=cache.layer_limits,
            cache_precision=plan.cache_precision, layer_bytes=cache.layer_bytes, windowed=plan.policy.evicts,
            lossy=plan.policy.lossy, speculation=speculation)
        if final:
            return
