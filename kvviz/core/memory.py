"""KV-cache memory by formula: bytes per token and at a context length, for kvviz's models and for
reference architectures from their published configs (resources/architectures/reference.toml).

Bytes per token (one sequence; times the batch):
- multi-head, grouped-query and multi-query attention: 2 (K and V) x layers x KV heads x head dim x bytes;
- multi-head latent attention (DeepSeek-V2): layers x (latent dim + RoPE key dim) x bytes;
- a quantized cache (int8, int4, fp8): each key and value vector's numbers at their bits, and a 4-byte scale.
A sliding window caps the tokens a windowed layer holds (every layer's, or Qwen2's from `window_first_layer` up).
Where a model's layers differ (`layer_shapes`: Gemma 3's local and global layers, a shared-KV layer that keeps
nothing, a linear-attention layer's fixed state), each layer's bytes are its own, and a state's do not grow.
No torch, no Qt: the engine plans its runs with it, and the CLI and the memory view read the same figures
(kvviz.models.cache_shape states each family's `Architecture`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import lru_cache

from kvviz.core.errors import KvvizError, visible
from kvviz.core.formats import KV_DTYPES
from kvviz.core.resources import resource_path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
PRECISIONS = (*DTYPE_BYTES, *KV_DTYPES)  # what a cache's numbers can be stored in: a float type, or quantized
SCALE_BYTES = 4  # a quantized cache's float32 scale, one per key or value vector
ATTENTION_KINDS = {"mha": "multi-head", "gqa": "grouped-query", "mqa": "multi-query", "mla": "multi-head latent"}
GIB = 1024**3
MEMORY_BUDGETS_GB = (8, 24, 80)  # common accelerator memories, drawn as lines in the memory view


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, element_size: int, batch: int = 1) -> int:
    """Bytes of one token's keys and values over all layers: 2 x layers x KV heads x head dim x element size
    x batch. The engine plans its cache with it; the memory figures use it for every non-latent model."""
    return 2 * layers * kv_heads * head_dim * element_size * batch


LAYER_SHAPE_KINDS = {  # what one layer keeps, for the memory figures and the grid's row labels
    "full": "keeps every position",
    "window": "keeps a sliding window",
    "importance": "keeps a budget of positions, chosen by the attention they get",
    "shared": "keeps nothing: reads an earlier layer's keys and values",
    "state": "keeps a fixed-size state",
}


@dataclass(frozen=True)
class LayerShape:
    """What one layer of a model whose layers differ keeps: "full" every position's keys and values (`kv_heads` x
    `head_dim` each), "window" the last `window` positions' (and `sinks` first ones), "shared" nothing (it reads
    layer `source`'s), "state" `state_elements` numbers whatever the length (a linear-attention layer's recurrent
    state and convolution window), "importance" `window` positions chosen by an importance method (its budget)."""

    kind: str = "full"
    kv_heads: int = 0
    head_dim: int = 0
    window: int = 0
    sinks: int = 0
    source: int = -1
    state_elements: int = 0

    def __post_init__(self) -> None:
        if self.kind not in LAYER_SHAPE_KINDS:
            raise ValueError(f"no layer shape of kind {self.kind!r}; known: {', '.join(LAYER_SHAPE_KINDS)}")

    @property
    def grows(self) -> bool:
        """Its bytes grow with the positions it holds (a full, windowed or budgeted layer)."""
        return self.kind in ("full", "window", "importance")

    def elements_per_position(self) -> int:
        return 2 * self.kv_heads * self.head_dim if self.grows else 0

    def tokens_held(self, context: int) -> int:
        if self.kind == "full":
            return context
        if self.kind in ("window", "importance"):
            return min(context, self.window + self.sinks)
        return 0


class UnknownArchitecture(KvvizError):
    """An --arch name that is not in the reference file."""


@dataclass(frozen=True)
class Architecture:
    """What sizes a model's KV cache. `kv_heads`/`head_dim` for MHA/GQA/MQA, `latent_dim`/`rope_dim` for
    MLA; `sliding_window` caps the tokens held (None: every token stays)."""

    name: str
    attention: str  # a key of ATTENTION_KINDS
    layers: int
    kv_heads: int = 0
    head_dim: int = 0
    latent_dim: int = 0
    rope_dim: int = 0
    sliding_window: int | None = None
    context: int | None = None  # the longest context the published model takes
    source: str = ""

    window_first_layer: int = 0  # layers below it hold every position (Qwen2's max_window_layers)
    sinks: int = 0  # positions a windowed layer keeps from the start, beside its window (attention sinks)
    # Each layer's own, where the layers differ (from the bottom layer); () where every layer is alike and the
    # fields above say it. A float cache only: kvviz quantizes the caches of models whose layers are alike.
    layer_shapes: tuple[LayerShape, ...] = ()

    def __post_init__(self) -> None:
        if self.layer_shapes and len(self.layer_shapes) != self.layers:
            raise ValueError(f"{self.name}: {len(self.layer_shapes)} layer shapes for {self.layers} layers")

    @property
    def differs(self) -> bool:
        """The model's layers keep different things (`layer_shapes`)."""
        return bool(self.layer_shapes)

    @property
    def layer_kinds(self) -> tuple[str, ...]:
        """What each layer keeps, from the bottom layer: a key of LAYER_SHAPE_KINDS."""
        if self.layer_shapes:
            return tuple(shape.kind for shape in self.layer_shapes)
        return ("full",) * (self.layers - self.windowed_layers) + ("window",) * self.windowed_layers

    def elements_per_token(self) -> int:
        """Numbers cached per token over all layers, one sequence."""
        return self.layers * self.elements_per_layer()

    def elements_per_layer(self) -> int:
        """Numbers one layer caches a position: its KV heads' keys and values, or the latent and RoPE key."""
        if self.attention == "mla":
            return self.latent_dim + self.rope_dim
        return 2 * self.kv_heads * self.head_dim

    def bytes_per_layer_position(self, dtype: str = "float32", batch: int = 1) -> int:
        """Bytes one layer caches a position in `dtype` (a key of PRECISIONS). A quantized cache stores each
        vector (a head's key or value; a latent's parts) at its bits, two int4 numbers a byte, with a 4-byte
        scale."""
        if dtype in KV_DTYPES:
            bits = KV_DTYPES[dtype][0]
            vectors = ((self.latent_dim, self.rope_dim) if self.attention == "mla"
                       else (self.head_dim,) * (2 * self.kv_heads))
            return sum(n * bits // 8 + SCALE_BYTES for n in vectors) * batch
        if dtype not in DTYPE_BYTES:
            raise ValueError(f"no cache precision {dtype!r}; known: {', '.join(PRECISIONS)}")
        return self.elements_per_layer() * DTYPE_BYTES[dtype] * batch

    def bytes_per_token(self, dtype: str = "float32", batch: int = 1) -> int:
        """Bytes one position takes over all layers (while every layer still holds it)."""
        if self.layer_shapes:
            return sum(self.layer_bytes_per_position(dtype, batch))
        return self.layers * self.bytes_per_layer_position(dtype, batch)

    def layer_bytes_per_position(self, dtype: str = "float32", batch: int = 1) -> tuple[int, ...]:
        """Bytes each layer caches a position, from the bottom layer (0: a layer that keeps none)."""
        if not self.layer_shapes:
            return (self.bytes_per_layer_position(dtype, batch),) * self.layers
        size = self._float_bytes(dtype)
        return tuple(shape.elements_per_position() * size * batch for shape in self.layer_shapes)

    def fixed_bytes(self, dtype: str = "float32", batch: int = 1) -> int:
        """Bytes the cache holds whatever the length: its linear-attention layers' states."""
        if not self.layer_shapes:
            return 0
        return sum(shape.state_elements for shape in self.layer_shapes) * self._float_bytes(dtype) * batch

    def layer_bytes(self, context: int, dtype: str = "float32", batch: int = 1) -> tuple[int, ...]:
        """Bytes each layer holds after `context` tokens, from the bottom layer: its positions held times its bytes
        a position, or its fixed state."""
        if not self.layer_shapes:
            per = self.bytes_per_layer_position(dtype, batch)
            return tuple(held * per for held in self.layer_tokens_held(context))
        size = self._float_bytes(dtype)
        return tuple((shape.tokens_held(context) * shape.elements_per_position() + shape.state_elements) * size
                     * batch for shape in self.layer_shapes)

    def _float_bytes(self, dtype: str) -> int:
        if dtype not in DTYPE_BYTES:
            raise ValueError(f"{self.name}: its layers differ, and kvviz keeps such a cache in a float type, "
                             f"not {dtype!r}")
        return DTYPE_BYTES[dtype]

    @property
    def windowed_layers(self) -> int:
        """Layers whose cache a window caps (0 without a window)."""
        return self.layers - min(self.window_first_layer, self.layers) if self.sliding_window else 0

    def tokens_held(self, context: int) -> int:
        """Tokens a windowed layer holds after `context` tokens (the top layer's): all of them, or the window's
        and the sinks'. Layers below `window_first_layer` hold all: `layer_tokens_held`."""
        return context if not self.sliding_window else min(
            context, self.sliding_window + self.sinks)

    def layer_tokens_held(self, context: int) -> tuple[int, ...]:
        """Tokens each layer holds after `context` tokens, from the bottom layer."""
        if self.layer_shapes:
            return tuple(shape.tokens_held(context) for shape in self.layer_shapes)
        full = self.layers - self.windowed_layers
        return (context,) * full + (self.tokens_held(context),) * self.windowed_layers

    def cache_bytes(self, context: int, dtype: str = "float32", batch: int = 1) -> int:
        """Bytes the cache holds after `context` tokens: each layer's positions held times its bytes a position,
        and the fixed states."""
        return sum(self.layer_bytes(context, dtype, batch))

    def formula(self, dtype: str = "float32", batch: int = 1) -> str:
        """The bytes-per-token formula with this architecture's numbers in it."""
        tail = f" \u00d7 {batch} (batch)" if batch != 1 else ""
        total = f"{self.bytes_per_token(dtype, batch):,} bytes per token"
        if self.layer_shapes:
            return self._layers_formula(dtype, tail, total, batch)
        if dtype in KV_DTYPES:
            bits = KV_DTYPES[dtype][0]
            if self.attention == "mla":
                return (f"{self.layers} layers \u00d7 ({self.latent_dim} latent + {self.rope_dim} RoPE key numbers "
                        f"\u00d7 {bits} bits + 2 scales \u00d7 {SCALE_BYTES} bytes){tail} = {total}")
            return (f"2 \u00d7 {self.layers} layers \u00d7 {self.kv_heads} KV heads \u00d7 ({self.head_dim} numbers "
                    f"\u00d7 {bits} bits ({dtype}) + a {SCALE_BYTES}-byte scale){tail} = {total}")
        size = DTYPE_BYTES[dtype]
        if self.attention == "mla":
            return (f"{self.layers} layers \u00d7 ({self.latent_dim} latent + {self.rope_dim} RoPE key) "
                    f"\u00d7 {size} bytes ({dtype}){tail} = {total}")
        return (f"2 \u00d7 {self.layers} layers \u00d7 {self.kv_heads} KV heads \u00d7 {self.head_dim} head dim "
                f"\u00d7 {size} bytes ({dtype}){tail} = {total}")

    def _layers_formula(self, dtype: str, tail: str, total: str, batch: int) -> str:
        """The formula of a model whose layers differ: a term for each group of layers that keep alike."""
        size = self._float_bytes(dtype)
        groups: dict[LayerShape, int] = {}
        for shape in self.layer_shapes:
            key = LayerShape(shape.kind, shape.kv_heads, shape.head_dim) if shape.grows else LayerShape(shape.kind)
            groups[key] = groups.get(key, 0) + 1
        terms = [f"2 \u00d7 {n} {shape.kind} layer{'s' * (n != 1)} \u00d7 {shape.kv_heads} KV heads \u00d7 "
                 f"{shape.head_dim} head dim" for shape, n in groups.items() if shape.grows]
        kept = " + ".join(terms) or "0"
        text = f"({kept}) \u00d7 {size} bytes ({dtype}){tail} = {total}"
        none = [f"{n} {shape.kind} layer{'s' * (n != 1)}" for shape, n in groups.items() if not shape.grows]
        if none:
            text += f" ({' and '.join(none)} keep none a token)"
        fixed = self.fixed_bytes(dtype, batch)
        if fixed:
            text += f", plus {fixed:,} bytes of fixed state"
        return text

    def describe(self) -> str:
        if self.layer_shapes:
            counts: dict[str, int] = {}
            for kind in self.layer_kinds:
                counts[kind] = counts.get(kind, 0) + 1
            windows = sorted({shape.window for shape in self.layer_shapes if shape.kind == "window"})
            parts = [f"{n} {kind}" + (f" ({', '.join(f'{w:,}' for w in windows)})" if kind == "window" else "")
                     for kind, n in counts.items()]
            return f"{self.name}: {ATTENTION_KINDS[self.attention]} attention, layers {' + '.join(parts)}"
        kind = ATTENTION_KINDS[self.attention]
        window = ""
        if self.sliding_window:
            sinks = f" + {self.sinks} sinks" if self.sinks else ""
            layers = (f" on layers {self.window_first_layer}-{self.layers - 1} (layers below hold every token)"
                      if self.window_first_layer else "")
            window = f", sliding window {self.sliding_window:,}{sinks}{layers}"
        return f"{self.name}: {kind} attention{window}"

@lru_cache(maxsize=1)
def reference_architectures() -> tuple[Architecture, ...]:
    """The reference architectures, in the file's order."""
    raw = tomllib.loads(resource_path("architectures", "reference.toml").read_text(encoding="utf-8"))
    return tuple(Architecture(**entry) for entry in raw["arch"])


def find_architecture(name: str) -> Architecture:
    """A reference architecture by name, case-insensitive."""
    for arch in reference_architectures():
        if arch.name.lower() == name.lower():
            return arch
    names = ", ".join(a.name for a in reference_architectures())
    raise UnknownArchitecture(f"--arch {visible(name)}: not a reference architecture; choose from {names}")


def architecture_of(name: str, n_layer: int, n_head: int, n_kv_head: int, head_dim: int,
                    n_ctx: int | None = None) -> Architecture:
    """A loaded model's cache as an Architecture: multi-head attention when every query head has its own
    keys and values, multi-query with one KV head, grouped-query between."""
    attention = "mha" if n_kv_head == n_head else "mqa" if n_kv_head == 1 else "gqa"
    return Architecture(name=name, attention=attention, layers=n_layer, kv_heads=n_kv_head, head_dim=head_dim,
                        context=n_ctx, source="the loaded model's config")


def format_bytes(n: float) -> str:
    """Bytes in binary units: '36 KiB', '1.5 GiB'."""
    for unit, size in (("TiB", 1024**4), ("GiB", GIB), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} B"
