"""The lab's counting convention for K/V work, per layer, with and without a cache."""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral

from kvviz.core.errors import KvvizError

MAX_COUNT = 10**12  # tokens or layers: far beyond any model, small enough for exact floats and ratios


def plural(count: int, noun: str) -> str:
    """'1 new token', '2 new tokens', '1,000 layers': a count with its noun, in the singular for one."""
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


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
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, Integral) or not 0 < value <= MAX_COUNT:
                raise KvvizError(f"{name.replace('_', '-')} must be a whole number from 1 to {MAX_COUNT:,}, "
                                 f"got {value}")

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
        """Work without the cache over work with it: below 1 for a single new token (see `pays_off_from`)."""
        return self.without_cache / self.with_cache

    @property
    def pays_off_from(self) -> int:
        """The first number of new tokens for which the cache does less K/V work than no cache.

        With one new token the cache does one computation more (its final pass stores the new
        token's K/V); with two it saves P - 1, nothing for a one-token prompt; with three, 2P.
        """
        return 2 if self.prompt_tokens >= 2 else 3

    def report(self) -> str:
        """The counts as `kvviz count` prints them: a table, then what the cache buys, in words."""
        P, N, L = self.prompt_tokens, self.new_tokens, self.layers
        rows = [
            ("without cache", f"N*P + N(N-1)/2 = {N}*{P} + {N}*{N - 1}/2", self.without_cache),
            ("with cache", f"P + N = {P} + {N}", self.with_cache),
            ("avoided", "", self.avoided) if self.avoided >= 0 else ("extra", "", -self.avoided),
        ]
        lines = [f"K/V computations per layer for P={plural(P, 'prompt token')} and N={plural(N, 'new token')}"
                 + (f" ({plural(L, 'layer')})" if L > 1 else "")]
        for label, formula, value in rows:
            total = f"   all {L:,} layers: {value * L:,}" if L > 1 else ""
            lines.append(f"  {label:<14}{value:>10,}" + (f"   {formula}" if formula else "") + total)
        pays_off = f"the cache pays off from the {({2: 'second', 3: 'third'})[self.pays_off_from]} new token on"
        if self.avoided > 0:
            lines.append(f"  without the cache: {self.ratio:.1f}x the K/V work")
        elif self.avoided == 0:
            lines.append(f"  the same K/V work with and without the cache; {pays_off}")
        else:
            lines += ["  for a single new token the cache does one more K/V computation than no cache:",
                      f"  its final pass stores the new token's K/V. {pays_off.capitalize()}."]
        return "\n".join(lines)

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
