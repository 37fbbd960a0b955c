"""KV-cache memory by formula: bytes per token and at a context length, for kvviz's models and for
reference architectures from their published configs (resources/architectures/reference.toml).

Bytes per token (one sequence; times the batch):
- multi-head, grouped-query and multi-query attention: 2 (K and V) x layers x KV heads x head dim x bytes;
- multi-head latent attention (DeepSeek-V2): layers x (latent dim + RoPE key dim) x bytes;
- a quantized cache (int8, int4, fp8): each key and value vector's numbers at their bits, and a 4-byte scale.
A sliding window caps the tokens a windowed layer holds (every layer's, or Qwen2's from `window_first_layer` up).
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
        return self.layers * self.bytes_per_layer_position(dtype, batch)

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
        full = self.layers - self.windowed_layers
        return (context,) * full + (self.tokens_held(context),) * self.windowed_layers

    def cache_bytes(self, context: int, dtype: str = "float32", batch: int = 1) -> int:
        """Bytes the cache holds after `context` tokens: each layer's positions held times its bytes a position."""
        return sum(self.layer_tokens_held(context)) * self.bytes_per_layer_position(dtype, batch)

    def formula(self, dtype: str = "float32", batch: int = 1) -> str:
        """The bytes-per-token formula with this architecture's numbers in it."""
        tail = f" \u00d7 {batch} (batch)" if batch != 1 else ""
        total = f"{self.bytes_per_token(dtype, batch):,} bytes per token"
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

    def describe(self) -> str:
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
