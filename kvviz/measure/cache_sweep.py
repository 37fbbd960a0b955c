"""The long sweep: a cached decode step's time against the length, for each kind of cache a model runs, in turns,
beside the bandwidth model (`kvviz bench --sweep --variants`, the app's speed view; the result is
kvviz.measure.cache_speed.CacheSweepResult).

A step at length L is the step of the engine (the same fast path a run takes) for one token at position L - 1, whose
query attends to the L positions the cache then holds. The L - 1 positions before it are written straight into the
cache as random keys and values (a prefill of 32k tokens would take minutes on a CPU, and a step's time does not
depend on the numbers it reads); after each timed step the cache is cropped back (a windowed one put back as it
was), so every turn reads the same positions. The lengths double up to the longest; at each, every variant takes
its turn in an order that rotates.
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from kvviz.cache.kv_cache import KVCache, build_cache
from kvviz.core.errors import KvvizError
from kvviz.core.formats import KV_DTYPES
from kvviz.core.policy import EXACT, CachePolicy
from kvviz.engine.engine import Engine
from kvviz.engine.policies import one_token_read
from kvviz.measure.bench import memory_read_rate
from kvviz.measure.cache_speed import CacheSweepResult, VariantCurve
from kvviz.measure.speed import SweepCancelled

MIN_LENGTH = 64  # the shortest length of a long sweep: it halves from the longest down to here
MAX_DEFAULT_LENGTH = 32768  # the longest length by default: the model's context, up to this
LONG_REPEAT = 7  # turns per length and variant; the median counts
FILL_CHUNK = 1024  # positions written into a cache at a time when it is filled
LATENT_VARIANTS = ("mla-naive", "mla-absorbed")
KIVI_VARIANTS = ("kivi-int8", "kivi-int4")


@dataclass(frozen=True)
class Variant:
    """One kind of cache to time: its name, its policy, and whether its step runs the forward's teaching arithmetic
    (MLA's naive step: the fast file's `forward`, on the same products) instead of the fast one-token step."""

    name: str
    label: str
    policy: CachePolicy
    teaching: bool = False


def long_lengths(max_length: int) -> tuple[int, ...]:
    """The longest length, halved down to MIN_LENGTH (or the longest alone if it is shorter)."""
    if max_length < 2:
        raise KvvizError(f"a speed sweep needs a length of at least 2, got {max_length}")
    lengths = [max_length]
    while lengths[-1] // 2 >= MIN_LENGTH:
        lengths.append(lengths[-1] // 2)
    return tuple(reversed(lengths))


def _latent(engine: Engine) -> bool:
    return any(kind.kind == "latent" for kind in engine.model.config.cache_layers(EXACT))


def all_variants(engine: Engine) -> tuple[str, ...]:
    """Every variant the model runs: MLA's two steps on a latent cache; else the exact cache, each quantized format,
    int4 in KIVI's layout and a window of an eighth of the context."""
    if _latent(engine):
        return LATENT_VARIANTS
    return ("exact", *KV_DTYPES, "kivi-int4", f"window:{max(1, engine.n_ctx // 8)}")


def parse_variants(engine: Engine, names: str) -> tuple[Variant, ...]:
    """The variants `names` lists ("all": every one the model runs), each checked against the model: KvvizError,
    one line, for a name kvviz does not know or a cache the model refuses."""
    wanted = all_variants(engine) if names.strip() == "all" else tuple(n.strip() for n in names.split(",") if n.strip())
    if not wanted:
        raise KvvizError("--variants lists no variant")
    if len(set(wanted)) != len(wanted):
        raise KvvizError(f"--variants names a variant twice: {names}")
    return tuple(_variant(engine, name) for name in wanted)


def _variant(engine: Engine, name: str) -> Variant:
    dtype = str(engine.dtype).removeprefix("torch.")
    latent = _latent(engine)
    if name in LATENT_VARIANTS:
        if not latent:
            raise KvvizError(f"{name} is a step of latent attention (MLA, DeepSeek); this model caches keys and "
                             "values per head")
        naive = name == "mla-naive"
        how = "rebuilds every head's keys and values" if naive else "attends over the latents (absorbed)"
        return Variant(name, f"MLA latent cache, {dtype}: the step {how}", EXACT, teaching=naive)
    if name == "exact":
        return Variant(name, f"exact {dtype} cache", EXACT)
    if name in KV_DTYPES:
        return Variant(name, f"{name} cache (codes and a float32 scale a row and head)",
                       engine.policy(kv_dtype=name))
    if name in KIVI_VARIANTS:
        kv_dtype = name.removeprefix("kivi-")
        return Variant(name, f"{kv_dtype} cache, KIVI: keys per channel over groups of 32 tokens (the newest held "
                             "exact), values per token", engine.policy(kv_dtype=kv_dtype, kv_layout="kivi"))
    if name.startswith("window:"):
        size = name.removeprefix("window:")
        if not size.isdigit() or int(size) < 1:
            raise KvvizError(f"a window variant is window:N with N positions, got {name!r}")
        return Variant(name, f"window of the last {int(size):,} positions, {dtype}", engine.policy(window=int(size)))
    known = ", ".join(("exact", *KV_DTYPES, *KIVI_VARIANTS, "window:N", *LATENT_VARIANTS))
    raise KvvizError(f"no cache variant {name!r}; known: {known}, or all")


def read_weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of weights a decode step reads: every parameter once, less an input embedding the head does not share
    (a step looks up one of its rows)."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    head = model.head_weight  # every family names its output head's matrix
    for module in model.modules():
        if isinstance(module, torch.nn.Embedding) and module.weight.data_ptr() != head.data_ptr():
            total -= module.weight.numel() * module.weight.element_size()
    return total


class _Timed:
    """One variant's cache and its step."""

    def __init__(self, engine: Engine, variant: Variant, capacity: int, generator: torch.Generator) -> None:
        self.engine, self.variant = engine, variant
        self.kinds = engine.model.config.cache_layers(variant.policy)
        # a window cannot roll back past what it evicted without keeping spare positions, which its step would then
        # read masked: a windowed cache is copied before each timed step and put back after it instead
        self.windowed = any(kind.kind == "window" for kind in self.kinds)
        self.cache: KVCache = build_cache(self.kinds, capacity, dtype=engine.dtype, device=engine.device,
                                          spare=0 if self.windowed else 1)
        self.generator = generator
        self.bytes_read = 0
        fast = engine.fast
        policy = variant.policy
        self.weights = fast.decode_weights(engine.model) if fast is not None else None
        self.one_token = fast is not None and not variant.teaching and one_token_read(policy, recording=False)

    @torch.inference_mode()
    def fill(self, length: int) -> None:
        """Write random keys and values into every layer up to `length` positions."""
        while self.cache.length < length:
            start = self.cache.length
            T = min(FILL_CHUNK, length - start)
            positions = torch.arange(start, start + T, device=self.engine.device)
            for i, kind in enumerate(self.kinds):
                if kind.kind == "latent":
                    shapes = ((1, T, kind.rank), (1, T, kind.rope_dim))
                elif kind.kind == "shared":
                    continue
                else:
                    shapes = ((1, kind.heads, T, kind.head_dim),) * 2
                k, v = (torch.randn(s, generator=self.generator).to(self.engine.device, self.engine.dtype)
                        for s in shapes)
                self.cache.update(i, positions, k, v)

    @torch.inference_mode()
    def step(self, token: int) -> float:
        """Seconds of one decode step of `token` at the cache's length, then the cache cropped back."""
        engine, position = self.engine, self.cache.length
        saved = copy.deepcopy(self.cache) if self.windowed else None
        started = time.perf_counter()
        if self.one_token:
            logits = engine.fast.decode_one(engine.model, token, position, self.cache, self.weights, None)
        else:
            idx = torch.tensor([[token]], device=engine.device)
            positions = torch.tensor([position], device=engine.device)
            logits = engine.forward(idx, positions, self.cache, None, self.weights)  # MLA's naive step: the forward
        int(logits.argmax())  # the step is done when its token is chosen
        seconds = time.perf_counter() - started
        self.bytes_read = self.cache.bytes_used  # what the step attended to, its own position included
        if saved is not None:
            self.cache = saved
        else:
            self.cache.crop(position)
        return seconds


def run_cache_sweep(
    engine: Engine,
    variants: str = "all",
    max_length: int | None = None,
    repeat: int = LONG_REPEAT,
    model_name: str = "",
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
    partial: Callable[[CacheSweepResult], None] | None = None,
    seed: int = 0,
) -> CacheSweepResult:
    """Time a cached decode step of every variant at lengths doubling up to `max_length` (default: the model's
    context, at most MAX_DEFAULT_LENGTH), `repeat` turns each, the variants in rotating order; and the read rate
    of this machine, measured in the same run. `progress(done, total)`, `cancelled()` (True: SweepCancelled) and
    `partial(result)` (after each length) as kvviz.measure.speed_sweep.run_sweep's."""
    if not 1 <= repeat <= 50:
        raise KvvizError(f"repeat must be a whole number from 1 to 50, got {repeat}")
    chosen = parse_variants(engine, variants)
    longest = engine.n_ctx
    max_length = min(MAX_DEFAULT_LENGTH, longest) if max_length is None else max_length
    if max_length > longest:
        raise KvvizError(f"--max-length {max_length} is more than the model's context allows ({longest})")
    lengths = long_lengths(max_length)
    generator = torch.Generator().manual_seed(seed)
    timed = [_Timed(engine, v, lengths[-1], generator) for v in chosen]
    token = engine.encode_prompt("Time")[0]
    read_rate = memory_read_rate(engine.device)
    weights = read_weight_bytes(engine.model)
    turns: list[list[list[float]]] = [[] for _ in timed]  # per variant, per length: ms of each turn
    held: list[list[int]] = [[] for _ in timed]
    total, done = repeat * len(lengths) * len(timed), 0
    for index, length in enumerate(lengths):
        for t in timed:
            t.fill(length - 1)
            if index == 0:
                t.step(token)  # a warm-up step: the first call of a path allocates
        for n in range(len(timed)):
            turns[n].append([])
        for turn in range(repeat):
            shift = (turn + index) % len(timed)
            for n in [*range(shift, len(timed)), *range(shift)]:
                if cancelled is not None and cancelled():
                    raise SweepCancelled("the speed sweep was cancelled")
                turns[n][index].append(timed[n].step(token) * 1000.0)
                done += 1
                if progress is not None:
                    progress(done, total)
        for n, t in enumerate(timed):
            held[n].append(t.bytes_read)
        if partial is not None:
            partial(_result(engine, model_name, lengths[:index + 1], chosen, turns, held, repeat, read_rate, weights))
    return _result(engine, model_name, lengths, chosen, turns, held, repeat, read_rate, weights)


def _crossover(lengths: tuple[int, ...], cache_bytes: list[int], weights: int) -> int | None:
    """The length where the cache holds as many bytes as the weights, on the line through the last two lengths
    (None where the cache stops growing below the weights' bytes, as a window's does)."""
    if cache_bytes[-1] >= weights:
        for length, held in zip(lengths, cache_bytes, strict=True):
            if held >= weights:
                return length
    if len(lengths) < 2:
        return round(weights / (cache_bytes[-1] / lengths[-1])) if cache_bytes[-1] else None
    slope = (cache_bytes[-1] - cache_bytes[-2]) / (lengths[-1] - lengths[-2])
    if slope <= 0:
        return None
    return round(lengths[-1] + (weights - cache_bytes[-1]) / slope)


def _result(engine: Engine, model_name: str, lengths: tuple[int, ...], variants: tuple[Variant, ...],
            turns: list[list[list[float]]], held: list[list[int]], repeat: int, read_rate: float,
            weights: int) -> CacheSweepResult:
    curves = []
    for variant, variant_turns, variant_bytes in zip(variants, turns, held, strict=True):
        n = len(lengths)
        ms = tuple(statistics.median(t) for t in variant_turns[:n])
        predicted = tuple((weights + b) / read_rate * 1000.0 for b in variant_bytes[:n])
        curves.append(VariantCurve(variant.name, variant.label, ms, tuple(tuple(t) for t in variant_turns[:n]),
                                   tuple(variant_bytes[:n]), predicted,
                                   _crossover(lengths, variant_bytes[:n], weights)))
    return CacheSweepResult(model=model_name or engine.model.config.name,
                            dtype=str(engine.dtype).removeprefix("torch."), lengths=tuple(lengths), repeat=repeat,
                            read_bytes_per_second=read_rate, weight_bytes=weights, variants=tuple(curves),
                            threads=torch.get_num_threads())
