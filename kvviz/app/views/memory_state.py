"""What the memory view knows of a run and works out with no Qt: the bytes measured at each position filled, the
model's line and the reference architectures', the formula text, linear byte ticks, and where stacked line
names go."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from kvviz.app.theme import Theme
from kvviz.core.memory import DTYPE_BYTES, format_bytes, reference_architectures
from kvviz.core.records import RunPlan, StepRecord

MAX_CONTEXT = 131072  # the x axis ends at 128k tokens
LANDMARKS = (1000, 8192, 32768, MAX_CONTEXT)  # lengths every line passes through exactly (a hover reads them)


class MemoryState:
    """A run's plan (the cached run's, in compare mode) and the cache bytes its records measured, by positions
    filled."""

    def __init__(self, plan: RunPlan | None = None) -> None:
        self.compare = plan is not None and plan.twin is not None
        self.plan = plan.cached_plan if self.compare else plan
        self.points: dict[int, int] = {}  # positions filled -> measured bytes

    def apply(self, record: StepRecord) -> bool:
        """Take one record; True when it measured the cache (a point is added)."""
        measured = False
        passes = record.lockstep_passes()[0] if self.compare else (record,)
        for run_pass in passes:
            if run_pass.use_cache and run_pass.cache_bytes > 0:
                # positions filled: a speculative round's rejected drafts were rolled back before its bytes were read
                spec = run_pass.speculation
                self.points[spec.rolled_back[0] if spec is not None else run_pass.fed_stop] = run_pass.cache_bytes
                measured = True
        return measured

    @property
    def precision(self) -> str:
        """What the run's cache stores its numbers in ("float32", "int8", ...; "" without a cache)."""
        if self.plan is None or self.plan.cache_bytes_per_position == 0:
            return ""
        return self.plan.cache_precision or {4: "float32", 2: "bfloat16"}.get(self.plan.dtype_bytes, "")

    def model_line(self, precision: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The loaded model's line in `precision` (default: the run's own): positions, and the bytes its cache
        holds there as the family states it (kvviz.models.cache_shape, the same figures `kvviz memory` prints):
        each layer's positions held (all of them, or a window's: the line flattens where the window is full)
        times its bytes a position."""
        if self.plan is None or self.plan.cache_bytes_per_position == 0:
            return np.zeros(0), np.zeros(0)
        capacity = self.plan.policy.capacity
        shape = self.plan.cache_shape
        edges = {layer.window for layer in self.plan.layer_shapes if layer.kind == "importance"}  # PyramidKV's
        x = contexts([*sorted(self.points), *([capacity] if capacity else []), *edges])
        if shape is not None:
            precision = precision or self.precision
            return x, np.array([shape.cache_bytes(int(c), precision) for c in x], dtype=np.float64)
        held = np.minimum(x, capacity) if capacity else x  # a plan without a shape: its bytes a position
        first = min(self.plan.policy.first_layer, self.plan.n_layer)  # layers below it hold every position
        held = (first * x + (self.plan.n_layer - first) * held) / self.plan.n_layer
        return x, held * self.plan.cache_bytes_per_position

    def parts(self, precision: str | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """A model whose layers differ, with a part that grows and one that does not: positions, the bytes of its
        full layers (the growing part) and of the rest (the flat part: windows once full, fixed states), which
        sum to `model_line`. None for a model whose layers keep alike, or whose parts are all of one kind."""
        plan = self.plan
        shape = plan.cache_shape if plan is not None and plan.cache_bytes_per_position else None
        if shape is None or not shape.differs:
            return None
        kinds = set(shape.layer_kinds)
        if "full" not in kinds or not kinds & {"window", "state"}:
            return None
        x, total = self.model_line(precision)
        precision = precision or self.precision
        full = [i for i, kind in enumerate(shape.layer_kinds) if kind == "full"]
        growing = np.array([sum(shape.layer_bytes(int(c), precision)[i] for i in full) for c in x], dtype=np.float64)
        return x, growing, total - growing

    def parts_text(self, precision: str) -> str:
        """What the growing part and the flat part hold, e.g. "grows: 2 full layers, 1,024 bytes per token;
        flat: 6 state layers, 73,728 bytes whatever the length" ("" where `parts` is None)."""
        if self.parts(precision) is None:
            return ""
        shape = self.plan.cache_shape
        per_position = shape.layer_bytes_per_position(precision)
        full = [i for i, kind in enumerate(shape.layer_kinds) if kind == "full"]
        windows = [s for s in shape.layer_shapes if s.kind == "window"]
        states = [s for s in shape.layer_shapes if s.kind == "state"]
        flat = []
        if windows:
            held = max(s.window + s.sinks for s in windows)
            flat.append(f"{len(windows)} window layers, flat from {held:,} tokens at "
                        f"{sum(s.elements_per_position() for s in windows) * held * DTYPE_BYTES[precision]:,} bytes")
        if states:
            flat.append(f"{len(states)} state layers, {shape.fixed_bytes(precision):,} bytes whatever the length")
        return (f"grows: {len(full)} full layers, {sum(per_position[i] for i in full):,} bytes per token; "
                f"flat: {' and '.join(flat)}")

    def measured(self) -> tuple[np.ndarray, np.ndarray]:
        """The measured points: positions filled, bytes read from the cache's tensors."""
        positions = sorted(self.points)
        return (np.array(positions, dtype=np.float64),
                np.array([self.points[p] for p in positions], dtype=np.float64))

    def formula_text(self, scale: str, theme: Theme, precision: str | None = None) -> str:
        """The formula of a cache's bytes per token and this run's (rich text) in `precision` (default: the
        run's own), and how `scale`'s axes show it."""
        plan, muted = self.plan, theme.muted
        general = ("bytes per token = 2 \u00d7 layers \u00d7 KV heads \u00d7 head dim \u00d7 bytes per element "
                   "(\u00d7 batch)")
        if plan is not None and plan.cache_parts:  # latent attention caches no K and V per head
            parts = " + ".join(f"{numbers} {name.split()[0]}" for name, numbers in plan.cache_parts)
            general = (f"bytes per token = layers \u00d7 ({parts}) \u00d7 bytes per element (\u00d7 batch): one "
                       "latent and one RoPE key per layer, shared by every head (MLA)")
        if plan is None or plan.cache_bytes_per_position == 0:
            return f"{general}<br><span style='color:{muted}'>no cache in this run: no measured points</span>"
        own = self.precision
        precision = precision or own
        per_token = (plan.cache_shape.bytes_per_token(precision) if plan.cache_shape is not None
                     else plan.cache_bytes_per_position)
        last = max(self.points) if self.points else 0
        if last and precision == own:
            measured = f"; measured {format_bytes(self.points[last])} at {last} positions"
        elif last:
            measured = f"; the run measured its {own} cache: choose {own} to see the points"
        else:
            measured = ""
        axes = ("log axes: every line rises 10\u00d7 per 10\u00d7 tokens (linear growth), the gaps between them are "
                "ratios" if scale == "log" else
                "linear axes: each token adds the same bytes, so every line is straight")
        window = (f", at most {plan.policy.capacity} positions held ({plan.policy.describe()})"
                  if plan.policy.evicts else "")
        if plan.policy.importance:  # a budget, not a window: flat once every layer holds its budget
            window = f" up to the budget, then flat: {plan.policy.describe()}"
        parts = self.parts_text(precision) if plan.cache_shape is not None else ""
        if parts:  # a model whose layers differ: per token while every layer holds it, then its two parts
            window = f" while every layer holds it ({parts})"
        step = f"<br><span style='color:{muted}'>{self.latent_step_text()}</span>" if plan.multi_head_numbers else ""
        return (f"{general}<br><span style='color:{theme.teal}'>{plan.model_name} in {precision}: "
                f"{per_token:,} bytes per token{window}{measured}</span> "
                f"<span style='color:{muted}'>(every line in {precision}; lines for other models: their published "
                f"configs; {axes})</span>{step}")

    def latent_step_text(self) -> str:
        """Latent attention (MLA), in the run's own precision: what a decode step keeps a position and layer, and
        what it holds a layer at the current length (the last measured, else the run's last) to attend: the naive
        step (deepseek.py) each head's key and value, the absorbed one (deepseek_fast.py) a score a head."""
        plan = self.plan
        length = max(self.points) if self.points else plan.width
        key, value = plan.head_key_value
        rebuilt = plan.multi_head_numbers * length * plan.dtype_bytes
        scores = plan.n_head * length * plan.dtype_bytes
        return (f"a decode step keeps the latent, {plan.cache_bytes_per_position // plan.n_layer:,} bytes a position "
                f"and layer; to attend at {length:,} positions the naive step (deepseek.py) rebuilds each head's key "
                f"and value, {plan.n_head} \u00d7 ({key} + {value}) numbers a position: {format_bytes(rebuilt)} a "
                f"layer; the absorbed step (deepseek_fast.py) scores the latents, {plan.n_head} numbers a position: "
                f"{format_bytes(scores)}")


def contexts(extra: Sequence[int] = ()) -> np.ndarray:
    """Context lengths from 1 to MAX_CONTEXT, log-spaced, with `extra` ones (a sliding window's edge) in."""
    points = {int(round(v)) for v in np.logspace(0, math.log10(MAX_CONTEXT), 64)} | {*LANDMARKS, *extra}
    return np.array(sorted(p for p in points if 1 <= p <= MAX_CONTEXT), dtype=np.float64)


def reference_bytes(name: str, dtype: str, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """The reference architecture `name`'s cache bytes at each context, for `dtype` and `batch`."""
    arch = next(a for a in reference_architectures() if a.name == name)
    x = contexts([arch.sliding_window] if arch.sliding_window else [])
    return x, np.array([arch.cache_bytes(int(c), dtype, batch) for c in x], dtype=np.float64)


def byte_ticks(top: float) -> list[tuple[float, str]]:
    """Linear ticks from 0 to `top` bytes (a `nice_ceiling`), five steps, in decimal units as the GB lines."""
    step = top / 5
    unit, size = next(((u, s) for u, s in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)) if top >= 2 * s),
                      ("B", 1.0))
    return [(k * step, f"{k * step / size:g} {unit}" if k else "0") for k in range(6)]


def spread(targets: Sequence[float], height: float, low: float, high: float) -> list[float]:
    """Label centres as near `targets` (pixels, downwards) as they can be with `height` between any two, between
    `low` and `high`: labels that would overlap are stacked around their targets' mean."""
    order = sorted(range(len(targets)), key=lambda i: targets[i])
    clusters: list[tuple[float, list[int]]] = []  # (first centre, members from the top)
    for i in order:
        members = [i]
        while True:
            n = len(members)
            mean = sum(targets[j] for j in members) / n
            first = min(max(mean - (n - 1) * height / 2, low + height / 2), high - height / 2 - (n - 1) * height)
            if clusters and clusters[-1][0] + len(clusters[-1][1]) * height > first:
                members = clusters.pop()[1] + members  # overlaps the cluster above: one stack
                continue
            clusters.append((first, members))
            break
    centres = [0.0] * len(targets)
    for first, members in clusters:
        for k, i in enumerate(members):
            centres[i] = first + k * height
    return centres
