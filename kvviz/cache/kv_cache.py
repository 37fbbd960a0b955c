"""A model's KV cache: a stack of layer caches, one kind a layer (kvviz.cache.layers), built from the kinds a
model family asks for (each family's `cache_layers`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvviz.cache.importance import ImportanceLayer, Keeper, ReplayLayer, eviction_state
from kvviz.cache.kivi import KiviLayer
from kvviz.cache.latent import LatentLayer
from kvviz.cache.layers import FullLayer, Held, LateWriteLayer, LayerCache, LayerKind, PassLayer
from kvviz.cache.quantized import QuantizedLayer
from kvviz.cache.shared import SharedLayer
from kvviz.cache.state import StateLayer
from kvviz.cache.window import WindowLayer
from kvviz.core.eviction import EvictionState


class KVCache:
    """The layers' caches, from the bottom layer. `update(layer, ...)` goes to that layer's; the rest reads them
    all: what they hold, measured, and `crop`, which rolls every layer back to a position."""

    def __init__(self, layers: Sequence[LayerCache]) -> None:
        self.layers = list(layers)
        self.n_layer = len(self.layers)

    def update(self, layer: int, positions: torch.Tensor | int, k: torch.Tensor, v: torch.Tensor) -> Held:
        """Store `layer`'s new rows at `positions`; what that layer attends to (kvviz.cache.layers.Held)."""
        return self.layers[layer].update(positions, k, v)

    def decode(self, layer: int, position: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               scale: float | None = None) -> torch.Tensor:
        """One token's step in `layer`: store its `k`, `v` at `position` and return its query `q`'s attention
        (1, nh, 1, hd) over what the layer holds (LayerCache.decode: a quantized layer reads its codes)."""
        return self.layers[layer].decode(position, q, k, v, scale)

    def crop(self, position: int) -> None:
        """Roll every layer back to `position`: as if no pass had fed it or anything after."""
        for layer in self.layers:
            layer.crop(position)

    @property
    def length(self) -> int:
        """Positions fed so far: the next pass starts here."""
        return self.layers[-1].length

    @property
    def streams(self) -> bool:
        """Some layer keeps attention sinks: a model on RoPE counts its positions within the cache, past its
        context (StreamingLLM)."""
        return any(layer.sinks for layer in self.layers)

    @property
    def reused(self) -> tuple[int, ...]:
        """Per layer: rows the latest update returned without writing them."""
        return tuple(layer.reused for layer in self.layers)

    @property
    def last_written(self) -> tuple[int, int]:
        """Where the top layer's latest update wrote: slots [start, stop) (a window layer's: positions)."""
        return self._top.last_written

    @property
    def _top(self) -> LayerCache:
        """The top layer that keeps positions of its own: a shared layer keeps none (it reads another's), nor does a
        linear-attention layer (it keeps a state)."""
        return next((layer for layer in reversed(self.layers) if not isinstance(layer, (SharedLayer, StateLayer))),
                    self.layers[-1])

    @property
    def evicted(self) -> tuple[int, int]:
        """The positions [start, stop) the latest pass evicted from any layer ((0, 0): none)."""
        spans = [layer.evicted for layer in self.layers if layer.evicted[0] < layer.evicted[1]]
        return (min(s for s, _ in spans), max(e for _, e in spans)) if spans else (0, 0)

    @property
    def positions_held(self) -> int:
        return self._top.positions_held

    @property
    def eviction(self) -> EvictionState | None:
        """What each layer keeps after the latest pass, with its scores, where the layers keep by importance."""
        layers = [layer for layer in self.layers if isinstance(layer, (ImportanceLayer, ReplayLayer))]
        if len(layers) != self.n_layer or not layers:
            return None
        return eviction_state(layers[0].keeper.method, layers[0].keeper.heads, self.layers)

    @property
    def layer_positions_held(self) -> tuple[int, ...]:
        """Positions each layer holds, from the bottom layer."""
        return tuple(layer.positions_held for layer in self.layers)

    @property
    def layer_limits(self) -> tuple[int, ...]:
        """The most positions each layer holds at once (0: no bound)."""
        return tuple(layer.slots for layer in self.layers)

    @property
    def bytes_used(self) -> int:
        """Bytes of the rows every layer holds, measured from their tensors."""
        return sum(layer.bytes_held for layer in self.layers)

    @property
    def layer_bytes(self) -> tuple[int, ...]:
        """Bytes each layer holds, from the bottom layer, measured from its tensors."""
        return tuple(layer.bytes_held for layer in self.layers)

    @property
    def bytes_allocated(self) -> int:
        return sum(layer.bytes_allocated for layer in self.layers)


ROLLS_BACK = ("full", "window", "quantized", "latent", "shared", "state")  # every kind build_cache makes
# but two: "importance" forgets positions by the attention they got, and "kivi" quantizes a group of keys per channel
# once it fills, keeping no exact copy: neither can be what it was before a pass

def rollback_refusal(kinds: Sequence[LayerKind]) -> str:
    """Why a cache of `kinds` cannot roll back by `crop` to a position inside its latest pass ("": it can). Full,
    quantized and latent layers forget the rows past the position, a shared layer its count, a window layer brings
    back the `spare` rows it keeps past its window, a state layer the state it kept after that position (one of its
    last `spare`); importance and KIVI layers do not roll back (ROLLS_BACK). A pass
    of at most `spare` positions (build_cache's) rolls back to any position inside it."""
    unknown = sorted({kind.kind for kind in kinds} - set(ROLLS_BACK))
    if unknown:
        return f"no layer cache of kind {unknown[0]!r} rolls back: the kinds that do are {', '.join(ROLLS_BACK)}"
    return ""


def build_cache(kinds: Sequence[LayerKind], capacity: int, *, batch_size: int = 1,
                dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu", fault: str = "",
                spare: int = 0) -> KVCache:
    """A cache of one layer each of `kinds`, for `capacity` positions. `fault` "late_write" plants the teaching bug
    in its full layers; `spare` is how far back a crop may go: window layers keep that many positions past their
    window, KIVI layers that many keys exact past their groups, state layers the states after that many last
    positions."""
    if fault not in ("", "late_write"):
        raise ValueError(f"unknown cache fault {fault!r}")
    full = LateWriteLayer if fault else FullLayer
    layers: list[LayerCache] = []
    for kind in kinds:
        if kind.kind == "full":
            layers.append(full(kind.heads, kind.head_dim, capacity, batch_size, dtype, device))
        elif kind.kind == "window":
            layers.append(WindowLayer(kind.heads, kind.head_dim, kind.window, kind.sinks, batch_size, dtype, device,
                                      spare))
        elif kind.kind == "quantized":
            layers.append(QuantizedLayer(kind.heads, kind.head_dim, capacity, kind.kv_dtype, batch_size, dtype, device))
        elif kind.kind == "kivi":  # keys per channel in groups of `residual` tokens; `spare` more kept exact
            layers.append(KiviLayer(kind.heads, kind.head_dim, capacity, kind.kv_dtype, kind.residual, batch_size,
                                    dtype, device, spare))
        elif kind.kind == "latent":
            layers.append(LatentLayer(kind.rank, kind.rope_dim, capacity, batch_size, dtype, device))
        elif kind.kind == "state":  # a linear-attention layer's fixed state; `spare`: positions it can roll back
            layers.append(StateLayer(*kind.state, batch_size=batch_size, dtype=dtype, device=device, spare=spare))
        elif kind.kind == "importance":  # `budget` positions a head, chosen by the attention they get
            keeper = Keeper(kind.evict, kind.budget, kind.heads, capacity, kind.observe, kind.pool, device)
            layers.append(ImportanceLayer(kind.heads, kind.head_dim, keeper, batch_size, dtype, device))
        elif kind.kind == "shared":  # keeps nothing: reads layer `source`'s keys and values of the same pass
            layers.append(SharedLayer(kind.source))
        else:
            raise ValueError(f"no layer cache of kind {kind.kind!r}")
    return KVCache(layers)


def pass_cache(kinds: Sequence[LayerKind], prefill: int = 0) -> KVCache | None:
    """What an uncached pass reads through: layers that keep nothing but say their window, or replay an importance
    method's choices (its first `prefill` positions fed in one pass, as a cached run's prompt), so that the pass's
    queries see what a cached run's would; None where no layer evicts (a plain causal pass)."""
    if any(kind.kind == "importance" for kind in kinds):
        return KVCache([ReplayLayer(kind, prefill) for kind in kinds])
    if not any(kind.kind == "window" for kind in kinds):
        return None
    return KVCache([SharedLayer(kind.source) if kind.kind == "shared" else PassLayer(kind.window, kind.sinks)
                    for kind in kinds])


def full_cache(n_layer: int, heads: int, head_dim: int, capacity: int, batch_size: int = 1,
               dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> KVCache:
    """Every layer a full one: the cache of GPT-2, or of any model kept exact."""
    return build_cache([LayerKind("full", heads, head_dim)] * n_layer, capacity, batch_size=batch_size, dtype=dtype,
                       device=device)
