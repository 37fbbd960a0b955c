"""The long sweep's result: the cached step's time against the length for each kind of cache, beside the roofline
a lecturer draws on the board (kvviz.measure.cache_sweep measures it; `kvviz bench --sweep --variants`, the app's
speed view read it).

A decode step reads every weight once and every position the cache holds. At a measured read rate R (bytes a
second, from a plain reduction over a large buffer in the same run) the step cannot take less than
(weight bytes + cache bytes) / R: the bandwidth model. Where the cache's bytes pass the weights', the cache is
what the step mostly reads, and a cache that holds fewer bytes (grouped heads, latents, int8/int4, a window) makes
the step faster, not only smaller.

No torch here: the views read `CacheSweepResult`.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvviz.core.errors import KvvizError

CACHE_SWEEP_WHY = ("A cached decode step reads every weight once and every position its cache holds: past the "
                   "length where the cache holds more bytes than the weights, the cache is what the step reads, "
                   "and a cache of fewer bytes makes the step faster.")


@dataclass(frozen=True)
class VariantCurve:
    """One kind of cache: its step's median milliseconds per length, every turn, the cache's bytes the step read
    at each length, and the time the bandwidth model predicts for those bytes and the weights'."""

    name: str  # "exact", "int8", "int4", "fp8", "kivi-int4", "window:1024", "mla-naive", "mla-absorbed"
    label: str  # for a legend: "int8 cache (codes and a float32 scale a row)"
    ms: tuple[float, ...]  # median per length
    turns_ms: tuple[tuple[float, ...], ...]  # every turn, per length
    cache_bytes: tuple[int, ...]  # bytes the cache held (and the step read) at each length
    predicted_ms: tuple[float, ...]  # (weight bytes + cache bytes) / read rate, per length
    crossover_length: int | None  # the length where its cache holds as many bytes as the weights (None: never)

    @property
    def fraction_of_prediction(self) -> tuple[float, ...]:
        """Predicted over measured, per length: 1.0 is the bandwidth bound reached; 0.5 is twice as slow."""
        return tuple(p / m if m > 0 else 0.0 for p, m in zip(self.predicted_ms, self.ms, strict=True))

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "label": self.label,
            "ms": [round(v, 4) for v in self.ms],
            "turns_ms": [[round(v, 4) for v in turns] for turns in self.turns_ms],
            "cache_bytes": list(self.cache_bytes),
            "predicted_ms": [round(v, 4) for v in self.predicted_ms],
            "fraction_of_prediction": [round(v, 3) for v in self.fraction_of_prediction],
            "crossover_length": self.crossover_length,
        }

    @classmethod
    def from_dict(cls, data: dict) -> VariantCurve:
        return cls(name=str(data["name"]), label=str(data["label"]),
                   ms=tuple(float(v) for v in data["ms"]),
                   turns_ms=tuple(tuple(float(v) for v in t) for t in data["turns_ms"]),
                   cache_bytes=tuple(int(v) for v in data["cache_bytes"]),
                   predicted_ms=tuple(float(v) for v in data["predicted_ms"]),
                   crossover_length=None if data["crossover_length"] is None else int(data["crossover_length"]))


@dataclass(frozen=True)
class CacheSweepResult:
    """Every variant's curve over the same lengths, measured in turns in one run, with the read rate measured in
    that run and the bytes of weights a step reads."""

    model: str
    dtype: str
    lengths: tuple[int, ...]
    repeat: int
    read_bytes_per_second: float
    weight_bytes: int  # bytes of weights one decode step reads (an untied input embedding is looked up, not read)
    variants: tuple[VariantCurve, ...]
    threads: int = 0

    def variant(self, name: str) -> VariantCurve:
        for curve in self.variants:
            if curve.name == name:
                return curve
        raise KeyError(name)

    @property
    def baseline(self) -> VariantCurve:
        """The curve the others are compared with: the exact cache, or MLA's naive step (the first variant)."""
        return self.variants[0]

    def speedups(self, index: int = -1) -> dict[str, float]:
        """Each other variant's step speed over the baseline's at the length `index` (the longest by default):
        the baseline's median over the variant's."""
        base = self.baseline.ms[index]
        return {c.name: base / c.ms[index] for c in self.variants[1:] if c.ms[index] > 0}

    def headline(self) -> str:
        """What the sweep measured, in one sentence: the ratios at the longest length."""
        last = self.lengths[-1]
        if len(self.variants) == 1:
            curve = self.baseline
            return (f"At {last:,} positions a step took {curve.ms[-1]:.1f} ms, "
                    f"{curve.fraction_of_prediction[-1]:.0%} of the bandwidth bound's speed.")
        parts = [f"{name} {ratio:.2f}\u00d7" for name, ratio in self.speedups().items()]
        return f"At {last:,} positions, step speed against {self.baseline.name}: {', '.join(parts)}."

    def as_dict(self) -> dict:
        return {
            "kind": "cache sweep",
            "model": self.model,
            "dtype": self.dtype,
            "threads": self.threads,
            "lengths": list(self.lengths),
            "repeat": self.repeat,
            "read_bytes_per_second": round(self.read_bytes_per_second),
            "weight_bytes": self.weight_bytes,
            "variants": [curve.as_dict() for curve in self.variants],
            "speedup_at_longest": {name: round(v, 3) for name, v in self.speedups().items()},
            "headline": self.headline(),
            "why": CACHE_SWEEP_WHY,
        }

    @classmethod
    def from_dict(cls, data: dict) -> CacheSweepResult:
        """The result `as_dict` wrote (what `kvviz bench --sweep --variants … --json` prints); KvvizError if it is
        not one."""
        try:
            if data.get("kind") != "cache sweep":
                raise ValueError("its kind is not 'cache sweep'")
            result = cls(model=str(data["model"]), dtype=str(data["dtype"]),
                         lengths=tuple(int(v) for v in data["lengths"]), repeat=int(data["repeat"]),
                         read_bytes_per_second=float(data["read_bytes_per_second"]),
                         weight_bytes=int(data["weight_bytes"]),
                         variants=tuple(VariantCurve.from_dict(v) for v in data["variants"]),
                         threads=int(data.get("threads", 0)))
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise KvvizError(f"not a long speed sweep's result ({exc})") from exc
        n = len(result.lengths)
        if not n or not result.variants or any(len(c.ms) != n or len(c.predicted_ms) != n or len(c.cache_bytes) != n
                                               for c in result.variants):
            raise KvvizError("not a long speed sweep's result (its lengths and times do not pair up)")
        return result
