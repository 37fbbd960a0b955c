"""Uncached over cached time of paired token steps, with a distribution-free interval around the median ratio.

Plain statistics, no torch: the engine's compare mode, the speed sweep and the views all read `RatioEstimate`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

CONFIDENCE = 0.95  # of the interval around the median ratio
SAME_WITHIN = 0.10  # a median ratio within 10% of 1 reads as "about the same", however sure


def _median_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """A distribution-free interval around the median of `values`: the order statistics (k, n+1-k) of the
    sign test, with coverage at least `confidence`; None when there are too few values for one."""
    ordered = sorted(values)
    n = len(ordered)
    tail = (1.0 - confidence) / 2.0
    best = None
    cumulative = 0.0
    for k in range(n // 2 + 1):  # P(Binomial(n, 1/2) <= k - 1) <= tail  ->  [x_(k), x_(n+1-k)] covers
        if cumulative > tail:
            break
        if k >= 1:
            best = k
        cumulative += math.comb(n, k) / 2.0**n
    if best is None:
        return None
    return ordered[best - 1], ordered[n - best]


@dataclass(frozen=True)
class RatioEstimate:
    """Uncached over cached time of paired token steps: the median of the per-step ratios and an interval
    around it (None when too few steps were paired for one)."""

    median: float
    low: float | None
    high: float | None
    steps: int

    @property
    def clear(self) -> bool:
        """The two modes differ beyond the noise: the interval leaves out 1, and the median is more than
        SAME_WITHIN away from it."""
        if self.low is None or self.high is None:
            return False
        apart = self.low > 1.0 or self.high < 1.0
        return apart and abs(math.log(self.median)) > math.log1p(SAME_WITHIN)

    def sentence(self, length_note: str = "at this length") -> str:
        """The ratio as a student reads it right, or why there is none."""
        if self.low is None:
            return f"too few steps to tell the two apart ({self.steps} so far)"
        if not self.clear:
            return f"too close to tell apart {length_note}"
        if self.median >= 1.0:
            return f"without the cache this run took {self.median:.1f}\u00d7 as long"
        return f"with the cache this run took {1.0 / self.median:.1f}\u00d7 as long"


def paired_ratio(cached_seconds: Sequence[float], uncached_seconds: Sequence[float]) -> RatioEstimate | None:
    """The estimate from each token step's two times (the same steps, in the same order); None before a step
    has both. Steps with a time of zero or less are left out."""
    ratios = [u / c for c, u in zip(cached_seconds, uncached_seconds, strict=False) if c > 0 and u > 0]
    if not ratios:
        return None
    interval = _median_interval(ratios)
    low, high = interval if interval is not None else (None, None)
    return RatioEstimate(statistics.median(ratios), low, high, len(ratios))
