"""A layer that keeps no keys or values of its own: cross-layer KV sharing (Gemma 4's and Gemma 3n's top layers).

A shared layer projects queries only. Its keys and values are those of an earlier layer, its `source`, as that
layer's cache returned them in the same pass: the positions the source holds and this pass's rows, seen through the
source's window. So the shared layer costs no memory at all, however long the text, and computes no key or value
row; its own work is its queries, its attention and its MLP.

In a model, the source layer's `Held` of the current pass is kept for the layers that read it (transformers keeps
them in `shared_kv_states`; kvviz.models.gemma4 in a dict passed down the layers), and each shared layer hands it to
`SharedLayer.read`, which counts the pass's positions, so that the layer crops and reports like any other.
"""

from __future__ import annotations

import torch

from kvviz.cache.layers import Held, LayerCache


class SharedLayer(LayerCache):
    """Keeps nothing (0 bytes, 0 positions held) and reads layer `source`'s keys and values: `read(positions,
    held)` takes what the source's cache returned in this pass and returns it as this layer's. It tracks `length`
    (the positions fed so far), so `crop` rolls it back with the rest of the cache; `reused` counts the rows it
    read that earlier passes computed (the source's), `last_written` is empty: it writes nowhere."""

    def __init__(self, source: int) -> None:
        if source < 0:
            raise ValueError(f"a shared layer reads an earlier layer's keys and values, not layer {source}'s")
        super().__init__()
        self.source = source

    def update(self, positions: torch.Tensor | int, k: torch.Tensor, v: torch.Tensor) -> Held:
        raise TypeError(f"a shared layer keeps no keys or values: it reads layer {self.source}'s (SharedLayer.read)")

    def read(self, positions: torch.Tensor | int, held: Held) -> Held:
        """Count this pass's `positions` ((T,), or the first position of a one-token pass) and return `held`, what
        layer `source`'s cache returned in this same pass: this layer's queries attend to those keys and values, at
        their positions and under the source's window. The source has checked that the positions continue the
        cache; an uncached pass (kvviz.cache.kv_cache.pass_cache) starts again from 0 each time, and so does this."""
        start = positions if isinstance(positions, int) else int(positions[0])
        count = 1 if isinstance(positions, int) else int(positions.shape[0])
        end = self.length = start + count
        self.reused = held.keys.shape[-2] - count  # what the source read from its cache; this pass's rows are new
        self.last_written = (start, start)  # nothing: its keys and values are the source's
        self.evicted = (end, end)
        return held

    @property
    def positions_held(self) -> int:
        return 0

    @property
    def bytes_held(self) -> int:
        return 0

    @property
    def bytes_allocated(self) -> int:
        return 0
