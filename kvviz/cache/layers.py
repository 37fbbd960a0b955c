"""One layer's cache: the contract every kind keeps, and the kinds that keep every position.

A layer cache takes each pass's new rows with their positions (`update`) and returns what the layer attends to,
with the positions of what it returns (`Held`). It says what it holds (`positions_held`, `bytes_held`, measured
from its tensors), what its latest update evicted (`evicted`), and rolls back to an earlier position (`crop`),
as speculative decoding needs. A model's cache is a stack of them, one kind a layer (kvviz.cache.kv_cache), which
its family chooses from its config (`cache_layers`, in each family's file).

Nothing is read across calls: the mask a pass needs comes with what `update` returns (kvviz.cache.attention).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

from kvviz.core.records import CachePolicy


class Held(NamedTuple):
    """What one layer attends to in a pass: `keys` and `values` (B, h, S, d) (a latent layer: the latent (B, S, r)
    and the RoPE key (B, S, rope)), and how a query sees them."""

    keys: torch.Tensor
    values: torch.Tensor
    positions: torch.Tensor | None = None  # (S,) each key's position; None: 0 .. S-1 in order
    window: int = 0  # a query sees the keys less than `window` positions before it (0: every earlier key) ...
    sinks: int = 0  # ... and the first `sinks` positions ever fed
    keeper: object = None  # an importance method's layer: it masks and keeps (kvviz.cache.importance), and
    # `positions` is then (heads, S), each KV head's own
    mask: torch.Tensor | None = None  # (T, S): which keys each query sees, where one pass feeds the rows of
    # several requests one after another (a server's flattened pass): a query sees its own request's keys only


@dataclass(frozen=True)
class LayerKind:
    """What a family asks one layer's cache to be: `kind` is "full", "window", "quantized", "kivi" (keys quantized
    per channel, `residual` tokens a group), "latent", "shared" (it keeps nothing and reads layer `source`'s keys
    and values), "state" (a linear-attention layer's fixed-size tensors, of the shapes `state` lists a sequence)
    or "importance" (`budget` positions a head, kept by `evict`)."""

    kind: str
    heads: int = 0  # KV heads a position stores (latent: 0)
    head_dim: int = 0
    window: int = 0  # "window": the last this many positions ...
    sinks: int = 0  # ... and the first this many
    kv_dtype: str = ""  # "quantized" and "kivi": a key of kvviz.core.records.KV_DTYPES
    residual: int = 0  # "kivi": the tokens of a group of keys, quantized per channel, and the most held exact
    rank: int = 0  # "latent": the latent's width ...
    rope_dim: int = 0  # ... and the shared RoPE key's
    source: int = -1  # "shared": the layer whose cache it reads
    state: tuple[tuple[int, ...], ...] = ()  # "state": the shape of each of its tensors, one sequence's
    evict: str = ""  # "importance": the method (kvviz.core.policy.EVICTION_METHODS) ...
    budget: int = 0  # ... the positions a head keeps ...
    observe: int = 0  # ... and SnapKV's observation window and pooling
    pool: int = 0


class LayerCache:
    """The contract of a layer's cache. `length` counts the positions fed so far (the next one is `length`);
    `reused` the rows the latest update returned without writing them; `last_written` the slots [start, stop)
    it wrote to; `evicted` the positions [start, stop) it dropped (empty: start == stop). A layer that evicts says
    its `window`, `sinks` and the most positions it holds at once (`slots`; 0: no bound)."""

    window = 0
    sinks = 0
    slots = 0

    def __init__(self) -> None:
        self.length = 0
        self.reused = 0
        self.last_written = (0, 0)
        self.evicted = (0, 0)

    def update(self, positions: torch.Tensor | int, k: torch.Tensor, v: torch.Tensor) -> Held:
        """Store this pass's `k`, `v` at `positions` ((T,), or the first position of a one-token pass), which
        continue the layer; return what the pass attends to."""
        raise NotImplementedError

    def decode(self, position: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               scale: float | None = None) -> torch.Tensor:
        """One token's step: store its `k`, `v` (1, h, 1, hd) at `position` and return the attention (1, nh, 1, hd)
        of its query `q` (1, nh, 1, hd) over every held position (query head i reads KV head i // (nh // h)).
        Here: `update`, then scaled dot-product attention; a kind that stores its rows otherwise reads them faster."""
        held = self.update(position, k, v)
        return F.scaled_dot_product_attention(q, held.keys, held.values, scale=scale, enable_gqa=True)

    def crop(self, position: int) -> None:
        """Forget every position from `position` on, as if the layer had never been fed past it."""
        if not 0 <= position <= self.length:
            raise ValueError(f"a cache of {self.length} positions cannot crop to {position}")
        self.length = position

    @property
    def positions_held(self) -> int:
        return self.length

    @property
    def bytes_held(self) -> int:
        """Bytes of the rows the layer holds, measured from its tensors."""
        raise NotImplementedError

    @property
    def bytes_allocated(self) -> int:
        raise NotImplementedError

    def _claim(self, positions: torch.Tensor | int, count: int, capacity: int) -> tuple[int, int]:
        """Check that `count` rows at `positions` continue the layer and fit in `capacity`; the new span."""
        start = positions if isinstance(positions, int) else int(positions[0])
        end = start + count
        if start != self.length:
            raise ValueError(f"positions start at {start} but the layer holds {self.length}")
        if end > capacity:
            raise ValueError(f"KV cache is full: {capacity} positions, asked for {end}")
        self.length = end
        self.reused = start
        self.last_written = (start, end)
        self.evicted = (end, end)
        return start, end


class FullLayer(LayerCache):
    """Every position's key and value, in one buffer allocated up front: (2, B, heads, capacity, head_dim), keys at
    index 0 and values at 1, so the memory a run needs is visible before it starts."""

    def __init__(self, heads: int, head_dim: int, capacity: int, batch_size: int = 1,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> None:
        super().__init__()
        self.kv = torch.zeros((2, batch_size, heads, capacity, head_dim), dtype=dtype, device=device)
        self.capacity = capacity

    def update(self, positions: torch.Tensor | int, k: torch.Tensor, v: torch.Tensor) -> Held:
        T = k.shape[2]
        start, end = self._claim(positions, T, self.capacity)
        keys, values = self.kv.unbind(0)  # (B, h, capacity, d) each
        self._write(keys, values, start, k, v)
        return Held(keys.narrow(2, 0, end), values.narrow(2, 0, end))  # (B, h, end, d) each

    def _write(self, keys: torch.Tensor, values: torch.Tensor, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        keys.narrow(2, start, k.shape[2]).copy_(k)
        values.narrow(2, start, v.shape[2]).copy_(v)

    @property
    def bytes_held(self) -> int:
        held = self.kv.narrow(3, 0, self.length)  # (2, B, h, length, d)
        return held.numel() * held.element_size()

    @property
    def bytes_allocated(self) -> int:
        return self.kv.numel() * self.kv.element_size()


class LateWriteLayer(FullLayer):
    """The teaching bug of kvviz.core.records.CACHE_FAULTS["late_write"]: each decoded token's key and value are
    written one slot late, so the query at `position` reads whatever that slot held before; a prefill is written
    where it belongs."""

    def _write(self, keys: torch.Tensor, values: torch.Tensor, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        if k.shape[2] != 1:
            return super()._write(keys, values, start, k, v)
        if start + 1 < self.capacity:
            keys.narrow(2, start + 1, 1).copy_(k)
            values.narrow(2, start + 1, 1).copy_(v)
        self.last_written = (start + 1, min(start + 2, self.capacity))


class PassLayer(LayerCache):
    """A layer that keeps nothing: an uncached pass under a window reads its own rows, masked as the window says,
    and the next pass starts again from position 0."""

    def __init__(self, window: int = 0, sinks: int = 0) -> None:
        super().__init__()
        self.window, self.sinks = window, sinks

    def update(self, positions: torch.Tensor | int, k: torch.Tensor, v: torch.Tensor) -> Held:
        T = k.shape[2]
        start = positions if isinstance(positions, int) else int(positions[0])
        at = torch.arange(start, start + T, device=k.device) if isinstance(positions, int) else positions
        self.reused, self.last_written = 0, (start, start + T)
        return Held(k, v, at, self.window, self.sinks)

    @property
    def bytes_held(self) -> int:
        return 0

    @property
    def bytes_allocated(self) -> int:
        return 0


def head_layers(n_layer: int, heads: int, head_dim: int, policy: CachePolicy) -> tuple[LayerKind, ...]:
    """The layers of a cache that keeps keys and values per head, under `policy`: each quantized (per token, or KIVI's
    keys per channel), or keeping its budget by importance, or windowed from `policy.first_layer` up (full below),
    or full."""
    if policy.importance:
        return tuple(LayerKind("importance", heads, head_dim, evict=policy.evict,
                               budget=policy.layer_budget(layer, n_layer), observe=policy.observe, pool=policy.pool)
                     for layer in range(n_layer))
    if policy.quantized and policy.kv_layout == "kivi":
        return (LayerKind("kivi", heads, head_dim, kv_dtype=policy.kv_dtype, residual=policy.kv_residual),) * n_layer
    if policy.quantized:
        return (LayerKind("quantized", heads, head_dim, kv_dtype=policy.kv_dtype),) * n_layer
    full = LayerKind("full", heads, head_dim)
    window = LayerKind("window", heads, head_dim, window=policy.window, sinks=policy.sinks)
    return tuple(window if policy.windows(layer) else full for layer in range(n_layer))


def head_refusal(name: str, head_dim: int, policy: CachePolicy) -> str:
    """Why a per-head cache of `head_dim` numbers a head cannot take `policy` ("": it can)."""
    if policy.kv_dtype == "int4" and head_dim % 2:
        return f"an int4 cache packs two numbers a byte; {name}'s head size {head_dim} is odd"
    return ""
