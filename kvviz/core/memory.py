"""KV-cache memory by formula: bytes per token and at a context length, for kvviz's models and for
reference architectures from their published configs (resources/architectures/reference.toml).

Bytes per token (one sequence; times the batch):
- multi-head, grouped-query and multi-query attention: 2 (K and V) x layers x KV heads x head dim x bytes;
- multi-head latent attention (DeepSeek-V2): layers x (latent dim + RoPE key dim) x bytes.
A sliding window caps the tokens held. No torch, no Qt: the CLI and the memory view both read it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import lru_cache

from kvviz.core.errors import KvvizError
from kvviz.core.resources import resource_path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
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

    def elements_per_token(self) -> int:
        """Numbers cached per token over all layers, one sequence."""
        if self.attention == "mla":
            return self.layers * (self.latent_dim + self.rope_dim)
        return 2 * self.layers * self.kv_heads * self.head_dim

    def bytes_per_token(self, dtype: str = "float32", batch: int = 1) -> int:
        if self.attention == "mla":
            return self.elements_per_token() * DTYPE_BYTES[dtype] * batch
        return kv_bytes_per_token(self.layers, self.kv_heads, self.head_dim, DTYPE_BYTES[dtype], batch)

    def tokens_held(self, context: int) -> int:
        """Tokens the cache holds after `context` tokens: all of them, or the sliding window's."""
        return context if self.sliding_window is None else min(context, self.sliding_window)

    def cache_bytes(self, context: int, dtype: str = "float32", batch: int = 1) -> int:
        return self.tokens_held(context) * self.bytes_per_token(dtype, batch)

    def formula(self, dtype: str = "float32", batch: int = 1) -> str:
        """The bytes-per-token formula with this architecture's numbers in it."""
        size, tail = DTYPE_BYTES[dtype], f" \u00d7 {batch} (batch)" if batch != 1 else ""
        total = f"{self.bytes_per_token(dtype, batch):,} bytes per token"
        if self.attention == "mla":
            return (f"{self.layers} layers \u00d7 ({self.latent_dim} latent + {self.rope_dim} RoPE key) "
                    f"\u00d7 {size} bytes{tail} = {total}")
        return (f"2 \u00d7 {self.layers} layers \u00d7 {self.kv_heads} KV heads \u00d7 {self.head_dim} head dim "
                f"\u00d7 {size} bytes{tail} = {total}")

    def describe(self) -> str:
        kind = ATTENTION_KINDS[self.attention]
        window = f", sliding window {self.sliding_window:,}" if self.sliding_window else ""
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
    raise UnknownArchitecture(f"--arch {name}: not a reference architecture; choose from {names}")


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
