"""What a cache policy costs in quality: perplexity on a held-out text, teacher-forced through the cache one token a
pass (as eviction papers measure it), against the full cache.

A text longer than the model's context runs in chunks of the context, each from position 0 in a fresh cache; the
chunks overlap by one token, so that every token but the text's first is predicted once. Torch-free at import (the
command line's parser reads the names and defaults here).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kvviz.core.errors import KvvizError
from kvviz.core.files import read_text_file
from kvviz.core.policy import EVICTION_METHODS, CachePolicy
from kvviz.core.resources import resource_path

if TYPE_CHECKING:
    from kvviz.engine.engine import Engine

HELD_OUT_TEXT = ("text", "held-out.txt")  # under resources/: a passage of a play the embedded models never saw
STREAMING_SINKS = 4  # StreamingLLM's attention sinks: the first four positions, beside a window
BASELINES = {  # the position-based policies at the same budget B, by the names the command line takes
    "window": "a sliding window of the last B positions, no sinks",
    "streamingllm": f"StreamingLLM: the first {STREAMING_SINKS} positions (sinks) and a window of the last "
                    f"B - {STREAMING_SINKS}",
}
METHODS = (*EVICTION_METHODS, *BASELINES)  # every policy the table can measure, in its order
METHOD_NAMES = {"h2o": "H2O", "tova": "TOVA", "snapkv": "SnapKV", "pyramidkv": "PyramidKV", "window": "window",
                "streamingllm": "StreamingLLM"}
DEFAULT_BUDGETS = (16, 32, 64)
MAX_TEXT_BYTES = 16 * 1024 * 1024  # a --text file larger than this is refused unread


class QualityError(KvvizError):
    """A text, a budget or a method the measurement cannot take: one line."""


@dataclass(frozen=True)
class Perplexity:
    """exp of the mean negative log-likelihood `nll` (nats) of the `tokens` predicted, measured in `seconds`."""

    value: float
    tokens: int
    nll: float
    seconds: float


@dataclass(frozen=True)
class QualityRow:
    """One policy at one budget against the full cache: `delta` = its perplexity - the full cache's, `ratio` = its
    perplexity / the full cache's."""

    method: str  # a key of METHODS
    budget: int
    policy: CachePolicy
    perplexity: Perplexity
    delta: float
    ratio: float

    @property
    def name(self) -> str:
        return METHOD_NAMES[self.method]

    def as_dict(self) -> dict:
        return {"method": self.method, "name": self.name, "budget": self.budget, "policy": self.policy.describe(),
                "perplexity": self.perplexity.value, "nll": self.perplexity.nll, "delta": self.delta,
                "ratio": self.ratio, "seconds": round(self.perplexity.seconds, 3)}


@dataclass(frozen=True)
class QualityTable:
    """The full cache's perplexity on a text, then each policy's at each budget (`rows`, budgets in order, the
    methods in their order within a budget)."""

    model: str
    tokens: int  # tokens of text measured (one more than those predicted)
    chunk: int  # positions a chunk holds at most
    full: Perplexity
    rows: tuple[QualityRow, ...]

    def as_dict(self) -> dict:
        return {"model": self.model, "tokens": self.tokens, "predicted": self.full.tokens, "chunk": self.chunk,
                "chunks": len(chunk_spans(self.tokens, self.chunk)), "full_perplexity": self.full.value,
                "full_nll": self.full.nll, "full_seconds": round(self.full.seconds, 3),
                "rows": [row.as_dict() for row in self.rows]}


def heldout_text() -> str:
    """The shipped held-out passage (see resources/text/README.md)."""
    return resource_path(*HELD_OUT_TEXT).read_text(encoding="utf-8")


def heldout_ids(tokenizer, tokens: int | None = None) -> list[int]:
    """The shipped held-out passage's ids under `tokenizer`: the first `tokens` (None: all of them)."""
    return text_ids(tokenizer, heldout_text(), tokens, "the held-out passage")


def text_ids(tokenizer, text: str, tokens: int | None = None, name: str = "the text") -> list[int]:
    """`text`'s ids, the first `tokens` of them (None: all); QualityError where it has fewer than 2 (nothing to
    predict) or fewer than `tokens`."""
    ids = tokenizer.encode(text) if text.strip() else []
    if len(ids) < 2:
        raise QualityError(f"{name} holds {len(ids)} token{'' if len(ids) == 1 else 's'}: perplexity needs at least "
                           "2 (one to predict)")
    if tokens is not None and tokens > len(ids):
        raise QualityError(f"{name} holds {len(ids):,} tokens, fewer than the {tokens:,} asked for")
    return ids if tokens is None else ids[:tokens]


def read_text(path: Path) -> str:
    """A user's text file, UTF-8; QualityError (one line, naming the file) where it is missing, a folder, a FIFO,
    larger than 16 MB, unreadable or not UTF-8."""
    return read_text_file(path, MAX_TEXT_BYTES, "16 MB", "text file", QualityError, encoding="utf-8-sig")


def chunk_spans(tokens: int, chunk: int) -> list[tuple[int, int]]:
    """(start, stop) of each chunk of at most `chunk` positions over `tokens` tokens, each overlapping the last by
    one token: token `start` of a chunk is its context only, and every later token of the text is predicted once."""
    if chunk < 2:
        raise QualityError(f"a chunk holds at least 2 positions (one to predict), got {chunk}")
    return [(start, min(start + chunk, tokens)) for start in range(0, max(tokens - 1, 1), chunk - 1)]


def policy_for(engine: Engine, method: str, budget: int) -> CachePolicy:
    """The cache policy of `method` (a key of METHODS) keeping `budget` positions a layer; QualityError or
    GenerationError (one line) where the model or the budget cannot take it."""
    if method not in METHODS:
        raise QualityError(f"no policy {method!r}: kvviz quality measures {', '.join(METHODS)}")
    if not 1 <= budget <= engine.n_ctx:
        raise QualityError(f"a budget is the positions a layer keeps: 1 to the context's {engine.n_ctx}, got "
                           f"{budget}")
    if method == "window":
        return engine.policy(window=budget)
    if method == "streamingllm":
        if budget <= STREAMING_SINKS:
            raise QualityError(f"StreamingLLM keeps {STREAMING_SINKS} sinks and a window: a budget of "
                               f"{STREAMING_SINKS + 1} or more, got {budget}")
        return engine.policy(window=budget - STREAMING_SINKS, sinks=STREAMING_SINKS)
    return engine.policy(evict=method, budget=budget)


def perplexity(engine: Engine, token_ids: Sequence[int], policy: CachePolicy, chunk: int | None = None) -> Perplexity:
    """Perplexity of `token_ids` teacher-forced through a cache under `policy`, one token a pass, in chunks of at
    most `chunk` positions (None: the model's context), each in a fresh cache from position 0 (chunk_spans). An
    exact cache takes the family's fast one-token step; the same logits as the plain pass, within rounding."""
    import torch

    from kvviz.cache.kv_cache import build_cache
    from kvviz.cache.probe import PassProbe

    chunk = chunk or engine.n_ctx
    if not 2 <= chunk <= engine.n_ctx:
        raise QualityError(f"a chunk holds 2 to the context's {engine.n_ctx} positions, got {chunk}")
    ids = list(token_ids)
    if len(ids) < 2:
        raise QualityError(f"perplexity needs at least 2 tokens (one to predict), got {len(ids)}")
    model, fast, device = engine.model, engine.fast, engine.device
    kinds = model.config.cache_layers(policy)
    n_layer = model.config.n_layer
    one_token_fast = fast is not None and not policy.lossy
    nlls: list[float] = []
    started = time.perf_counter()
    with torch.inference_mode():
        weights = fast.decode_weights(model) if fast is not None else None
        for start, stop in chunk_spans(len(ids), chunk):
            cache = build_cache(kinds, stop - start, dtype=engine.dtype, device=device)
            for t in range(start, stop - 1):
                probe = PassProbe(n_layer, False, engine.before_block)
                if one_token_fast:
                    logits = fast.decode_one(model, ids[t], t - start, cache, weights, probe)[0]  # (V,)
                else:
                    idx = torch.tensor([[ids[t]]], dtype=torch.long, device=device)  # (1, 1)
                    positions = torch.tensor([t - start], device=device)  # (1,)
                    logits = engine.forward(idx, positions, cache, probe, weights)[0]  # (V,)
                logits = logits.float()
                nlls.append((torch.logsumexp(logits, 0) - logits[ids[t + 1]]).item())
    nll = math.fsum(nlls) / len(nlls)
    return Perplexity(math.exp(nll), len(nlls), nll, time.perf_counter() - started)


def quality_table(engine: Engine, ids: Sequence[int], methods: Sequence[str] = METHODS,
                  budgets: Sequence[int] = DEFAULT_BUDGETS, chunk: int | None = None, model_name: str = "",
                  progress: Callable[[int, int, QualityRow | None, Perplexity], None] | None = None) -> QualityTable:
    """The full cache's perplexity on `ids`, then each of `methods` at each of `budgets` against it. Every policy
    is checked before the first pass (one line for the first the model refuses). `progress(done, total, row,
    perplexity)` is called after each measurement (row None for the full cache's)."""
    policies = [(budget, method, policy_for(engine, method, budget)) for budget in budgets for method in methods]
    total = len(policies) + 1
    full = perplexity(engine, ids, CachePolicy(), chunk)
    if progress is not None:
        progress(1, total, None, full)
    rows = []
    for budget, method, policy in policies:
        measured = perplexity(engine, ids, policy, chunk)
        row = QualityRow(method, budget, policy, measured, measured.value - full.value, measured.value / full.value)
        rows.append(row)
        if progress is not None:
            progress(len(rows) + 1, total, row, measured)
    return QualityTable(model_name or engine.model.config.name, len(ids), chunk or engine.n_ctx, full, tuple(rows))
