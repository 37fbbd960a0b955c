"""Speculative decoding, greedy: something cheap proposes up to k tokens, the target checks them all in one pass over
its cache, keeps the longest prefix it would have chosen itself and its own next token, and crops its cache (and the
draft model's) back to what it kept. The tokens are the target's plain greedy tokens by construction; what changes is
how many target passes they take.

Two drafters: prompt lookup (`prompt_lookup`: the tokens that followed the last n-gram where it occurred before, as
transformers' `prompt_lookup_num_tokens` proposes them; no model) and a draft model of the same vocabulary
(`DraftModel`: its own greedy tokens, on its own cache). A round is a `SpeculativeRound`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from kvviz.cache.kv_cache import KVCache, build_cache
from kvviz.core.errors import GenerationError
from kvviz.core.records import EXACT, CachePolicy
from kvviz.engine.engine import Engine


@dataclass(frozen=True)
class SpeculativeRound:
    """One round: the target fed its pending token and the drafts at positions [start, start + 1 + len(drafted)),
    agreed with the first `accepted` drafts, and kept `token_ids` (those drafts and its own next token); the positions
    [start + 1 + accepted, start + 1 + len(drafted)) were written to its cache and rolled back."""

    round: int
    start: int
    drafted: tuple[int, ...]
    accepted: int
    token_ids: tuple[int, ...]
    draft_passes: int  # the draft model's passes this round (0 for prompt lookup)
    cache_positions: int  # positions the target's cache holds after the crop

    @property
    def rolled_back(self) -> tuple[int, int]:
        """Positions [start, stop) the target wrote this round and cropped away."""
        kept = self.start + 1 + self.accepted
        return kept, self.start + 1 + len(self.drafted)


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


class DraftModel:
    """A smaller model of the target's vocabulary, proposing its own greedy tokens from its own cache, which is
    cropped back with the target's after each round."""

    def __init__(self, model: torch.nn.Module, policy: CachePolicy, vocab_size: int, capacity: int,
                 spare: int) -> None:
        if model.config.vocab_size != vocab_size:
            raise GenerationError(f"the draft model's vocabulary has {model.config.vocab_size} tokens, the target's "
                                  f"{vocab_size}: a draft proposes the target's tokens")
        self.model = model.eval()
        weights = next(model.parameters())
        self.cache = build_cache(model.config.cache_layers(policy), capacity, dtype=weights.dtype,
                                 device=weights.device, spare=spare)
        self.passes = 0

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        """`k` greedy tokens after `tokens`: feeds what its cache does not hold yet, then one token a pass."""
        drafts: list[int] = []
        device = next(self.model.parameters()).device
        fed = list(tokens[self.cache.length:])
        while len(drafts) < k:
            start = self.cache.length
            idx = torch.tensor([fed], device=device)
            logits = self.model(idx, torch.arange(start, start + len(fed), device=device), self.cache,
                                last_only=True)[0, -1]  # (V,)
            self.passes += 1
            drafts.append(int(logits.argmax()))
            fed = drafts[-1:]
        return drafts

    def keep(self, length: int) -> None:
        """Roll the draft's cache back to `length` positions, where the target's text and its own part."""
        self.cache.crop(min(self.cache.length, length))


@torch.inference_mode()
def speculate(model: torch.nn.Module, prompt_ids: Sequence[int], max_new_tokens: int, k: int,
              lookup: int = 0, draft: torch.nn.Module | None = None) -> Iterator[SpeculativeRound]:
    """Greedy speculative decoding of `model` after `prompt_ids`: rounds until `max_new_tokens` tokens (or the
    context) are generated, drafting up to `k` tokens a round by prompt lookup of `lookup`-grams or with `draft`.
    Round 0 is the prompt's pass, which drafts nothing and gives the first token."""
    if not 1 <= k <= 64:
        raise GenerationError(f"draft tokens must be between 1 and 64, got {k}")
    if (lookup > 0) == (draft is not None):
        raise GenerationError("speculative decoding takes one drafter: a draft model or prompt lookup")
    config = model.config
    for which, each in (("the target", model), ("the draft model", draft)):
        if each is not None and any(kind.kind == "state" for kind in each.config.cache_layers(EXACT)):
            raise GenerationError(f"{which} has linear-attention layers: a rejected draft is folded into their "
                                  "state, and kvviz keeps no state a position to roll it back")
    capacity = min(config.n_ctx, len(prompt_ids) + max_new_tokens + k + 1)
    weights = next(model.parameters())
    policy = Engine(model).policy()  # the model's own window (Mistral's), as a plain run keeps it
    cache: KVCache = build_cache(config.cache_layers(policy), capacity, dtype=weights.dtype, device=weights.device,
                                 spare=k + 1)
    drafter = None if draft is None else DraftModel(draft, Engine(draft).policy(), config.vocab_size, capacity, k + 1)
    tokens = list(prompt_ids)
    first = model(torch.tensor([tokens], device=weights.device), torch.arange(len(tokens), device=weights.device),
                  cache, last_only=True)[0, -1]
    tokens.append(int(first.argmax()))  # the target's own first token, pending: its key and value are not cached
    yield SpeculativeRound(0, len(prompt_ids) - 1, (), 0, (tokens[-1],), 0, cache.length)  # the prefill's round
    budget = min(max_new_tokens, config.n_ctx - len(prompt_ids))
    number = 1
    while len(tokens) - len(prompt_ids) < budget:
        start = cache.length  # the pending token's position
        room = min(k, budget - (len(tokens) - len(prompt_ids)) - 1, capacity - start - 1)
        passes_before = drafter.passes if drafter is not None else 0
        drafts = [] if room <= 0 else (drafter.propose(tokens, room) if drafter is not None
                                       else prompt_lookup(tokens, lookup, room))
        fed = [tokens[-1], *drafts]
        logits = model(torch.tensor([fed], device=weights.device),
                       torch.arange(start, start + len(fed), device=weights.device), cache)[0]  # (1 + m, V)
        chosen = logits.argmax(dim=-1).tolist()
        accepted = 0
        while accepted < len(drafts) and drafts[accepted] == chosen[accepted]:
            accepted += 1
        cache.crop(start + 1 + accepted)  # the pending token and the drafts it agreed with stay
        kept = (*drafts[:accepted], chosen[accepted])
        tokens.extend(kept)
        if drafter is not None:
            drafter.keep(len(tokens) - 1)
        yield SpeculativeRound(number, start, tuple(drafts), accepted, kept,
                               drafter.passes - passes_before if drafter is not None else 0, cache.length)
        number += 1
