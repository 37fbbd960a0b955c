"""Choosing the next token from a pass's logits: greedy, or sampled with a temperature and a top-k, from a
generator of the run's own."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvviz.core.errors import GenerationError
from kvviz.core.records import Candidate
from kvviz.core.tokenizer import Tokenizer


@dataclass(frozen=True)
class SamplingSettings:
    """Greedy when `temperature` is 0; otherwise softmax sampling, optionally from the top `top_k`."""

    temperature: float = 0.0
    top_k: int | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise GenerationError(f"temperature must be 0 (greedy) or positive, got {self.temperature}")
        if self.top_k is not None and self.top_k <= 0:
            raise GenerationError(f"top-k must be a positive integer, got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def sampling_generator(sampling: SamplingSettings, device: torch.device | str) -> torch.Generator | None:
    """A run's own random generator (None when greedy): seeded with `sampling.seed`, else fresh entropy; torch's
    global generator is left alone, so two runs with one seed draw alike."""
    if sampling.greedy:
        return None
    generator = torch.Generator(device=device)
    if sampling.seed is None:
        generator.seed()
    else:
        generator.manual_seed(sampling.seed)
    return generator


def distribution(logits: torch.Tensor, sampling: SamplingSettings) -> torch.Tensor:
    """What a sampled run draws from (..., V): the softmax of `logits` (..., V) over the temperature, zero outside
    the top-k."""
    scaled = logits.float() / sampling.temperature
    if sampling.top_k is not None and sampling.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, sampling.top_k).values[..., -1:]
        scaled = torch.where(scaled < kth, torch.full_like(scaled, float("-inf")), scaled)
    return torch.softmax(scaled, dim=-1)


def choose(logits: torch.Tensor, sampling: SamplingSettings, generator: torch.Generator | None, top: int,
           tokenizer: Tokenizer, not_finite: str) -> tuple[int, tuple[Candidate, ...]]:
    """The next token from `logits` (V,) and the `top` likeliest candidates with their probabilities;
    GenerationError(`not_finite`) for logits with NaN or infinite values."""
    logits = logits.float()  # (V,)
    if not bool(torch.isfinite(logits).all()):
        raise GenerationError(not_finite)
    if logits.shape[-1] > tokenizer.vocab_size:
        # Vocabularies padded past the tokenizer's (50304 in nanoGPT) hold ids with no text: never pick them.
        logits = logits[: tokenizer.vocab_size]
    if sampling.greedy:
        # The first maximum, as argmax picks it; probabilities only for the candidates shown.
        best, index = torch.max(logits, dim=-1)
        token = int(index)
        log_total = torch.logsumexp(logits, dim=-1)
        if top == 1:
            values, ids = torch.exp(best - log_total).reshape(1), index.reshape(1)
        else:
            values, ids = torch.topk(logits, min(top, logits.shape[-1]))
            values = torch.exp(values - log_total)
    else:
        probs = distribution(logits, sampling)
        token = int(torch.multinomial(probs, 1, generator=generator))
        if top == 1:
            value, index = torch.max(probs, dim=-1)  # one candidate: a max is cheaper than a top-k
            values, ids = value.reshape(1), index.reshape(1)
        else:
            values, ids = torch.topk(probs, min(top, probs.shape[-1]))
    candidates = tuple(Candidate(int(i), tokenizer.token_label(int(i)), float(p))
                       for p, i in zip(values.tolist(), ids.tolist(), strict=True))
    return token, candidates
