"""The lab's counting convention for K/V work, per layer, with and without a cache."""

from __future__ import annotations

from dataclasses import dataclass

from kvviz.errors import KvvizError


def kv_without_cache(prompt_tokens: int, new_tokens: int) -> int:
    """K/V rows per layer when each of N steps re-runs the whole sequence: N*P + N(N-1)/2."""
    return new_tokens * prompt_tokens + new_tokens * (new_tokens - 1) // 2


def kv_with_cache(prompt_tokens: int, new_tokens: int) -> int:
    """K/V rows per layer when each token's key and value are computed once: P + N."""
    return prompt_tokens + new_tokens


@dataclass(frozen=True)
class WorkCount:
    """K/V computations for P prompt tokens and N new tokens, per layer and over all layers."""

    prompt_tokens: int
    new_tokens: int
    layers: int = 1

    def __post_init__(self) -> None:
        for name in ("prompt_tokens", "new_tokens", "layers"):
            if int(getattr(self, name)) <= 0:
                raise KvvizError(f"{name.replace('_', '-')} must be a positive integer, got {getattr(self, name)}")

    @property
    def with_cache(self) -> int:
        return kv_with_cache(self.prompt_tokens, self.new_tokens)

    @property
    def without_cache(self) -> int:
        return kv_without_cache(self.prompt_tokens, self.new_tokens)

    @property
    def avoided(self) -> int:
        return self.without_cache - self.with_cache

    @property
    def ratio(self) -> float:
        return self.without_cache / self.with_cache

    def as_dict(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "new_tokens": self.new_tokens,
            "layers": self.layers,
            "with_cache": self.with_cache,
            "without_cache": self.without_cache,
            "avoided": self.avoided,
            "ratio": round(self.ratio, 4),
            "with_cache_all_layers": self.with_cache * self.layers,
            "without_cache_all_layers": self.without_cache * self.layers,
            "avoided_all_layers": self.avoided * self.layers,
        }
