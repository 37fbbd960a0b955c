"""How much faster the cache makes a token step, measured beyond the noise: paired step ratios, and the
result of a sweep of the step's cost against the sequence length in both modes (kvviz.measure.speed_sweep runs it).

No torch here: the views read `RatioEstimate` and `SweepResult`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvviz.core.errors import KvvizError
from kvviz.core.ratios import RatioEstimate, paired_ratio

SWEEP_POINTS = 8  # lengths measured, evenly spaced up to the longest
SWEEP_REPEAT = 11  # interleaved turns per length, the median counts; 11 pairs: a 95% interval past an outlier a side
MAX_SWEEP_REPEAT = 50
MIN_SWEEP_LENGTH = 2
DEFAULT_MAX_LENGTH = 256  # positions a sweep reaches by default, or the model's context if shorter
SWEEP_WHY = ("A cached step reads all the weights once plus a cache that grows by one position a step; an "
             "uncached step also recomputes every earlier position, so its cost grows with the sequence.")


class SweepCancelled(KvvizError):
    """The sweep was asked to stop."""


@dataclass(frozen=True)
class SweepResult:
    """Milliseconds per token step against the sequence length, both modes, medians of interleaved turns."""

    model: str
    dtype: str
    lengths: tuple[int, ...]
    cached_ms: tuple[float, ...]  # median per length
    uncached_ms: tuple[float, ...]
    repeat: int
    cached_turns_ms: tuple[tuple[float, ...], ...] = field(default=())  # every turn, per length
    uncached_turns_ms: tuple[tuple[float, ...], ...] = field(default=())
    weight_bytes: int = 0

    @property
    def ratios(self) -> tuple[float, ...]:
        """Uncached over cached median, per length."""
        return tuple(u / c if c > 0 else 0.0 for c, u in zip(self.cached_ms, self.uncached_ms, strict=True))

    def ratio_at(self, index: int = -1) -> RatioEstimate:
        """The paired turns of one length (the longest by default) as a RatioEstimate."""
        estimate = paired_ratio(self.cached_turns_ms[index], self.uncached_turns_ms[index])
        assert estimate is not None
        return estimate

    @classmethod
    def from_dict(cls, data: dict) -> SweepResult:
        """The result `as_dict` wrote (what `kvviz bench --sweep --json` prints); KvvizError if it is not one."""
        try:
            result = cls(
                model=str(data["model"]), dtype=str(data["dtype"]),
                lengths=tuple(int(v) for v in data["lengths"]),
                cached_ms=tuple(float(v) for v in data["cached_ms"]),
                uncached_ms=tuple(float(v) for v in data["uncached_ms"]),
                repeat=int(data["repeat"]),
                cached_turns_ms=tuple(tuple(float(v) for v in t) for t in data["cached_turns_ms"]),
                uncached_turns_ms=tuple(tuple(float(v) for v in t) for t in data["uncached_turns_ms"]),
                weight_bytes=int(data.get("weight_bytes", 0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise KvvizError(f"not a speed sweep's result ({exc})") from exc
        if not result.lengths or not len(result.lengths) == len(result.cached_ms) == len(result.uncached_ms):
            raise KvvizError("not a speed sweep's result (its lengths and times do not pair up)")
        return result

    def headline(self) -> str:
        """What the sweep measured, in one sentence a student reads right: the ratio at the shortest and at
        the longest length, each only where it stands out of the noise."""
        shortest, longest = self.ratio_at(0), self.ratio_at(-1)
        first, last = self.lengths[0], self.lengths[-1]
        if not longest.clear:
            return f"At {last} positions the two modes are too close to tell apart in this measurement."
        if longest.median < 1.0:
            return f"At {last} positions a step with the cache took {1.0 / longest.median:.1f}\u00d7 as long."
        start = (f"{shortest.median:.1f}\u00d7 as long at {first} positions" if shortest.clear
                 else f"about as long at {first} positions")
        return f"Without the cache a token step took {start} and {longest.median:.1f}\u00d7 as long at {last}."

    def as_dict(self) -> dict:
        longest = self.ratio_at()
        return {
            "model": self.model,
            "dtype": self.dtype,
            "lengths": list(self.lengths),
            "cached_ms": [round(v, 4) for v in self.cached_ms],
            "uncached_ms": [round(v, 4) for v in self.uncached_ms],
            "ratio": [round(v, 3) for v in self.ratios],
            "repeat": self.repeat,
            "cached_growth": round(self.cached_ms[-1] / self.cached_ms[0], 3),
            "uncached_growth": round(self.uncached_ms[-1] / self.uncached_ms[0], 3),
            "ratio_at_longest": round(longest.median, 3),
            "ratio_at_longest_interval": [round(v, 3) for v in (longest.low, longest.high) if v is not None],
            "clear_at_longest": longest.clear,
            "headline": self.headline(),
            "cached_turns_ms": [[round(v, 4) for v in turns] for turns in self.cached_turns_ms],
            "uncached_turns_ms": [[round(v, 4) for v in turns] for turns in self.uncached_turns_ms],
            "weight_bytes": self.weight_bytes,
            "why": SWEEP_WHY,
        }
