"""What a model's KV cache holds, per layer, as a kvviz.core.memory.Architecture: each family states it in its
config's `cache_shape` (the one place its bytes a position are stated); here a run's policy puts its window, sinks
and first windowed layer in place of the model's own. The engine plans its runs with it; `kvviz memory` and the
memory view draw it; the cache's measured `bytes_used` must equal it (tests check both against hand counts)."""

from __future__ import annotations

from dataclasses import replace

from kvviz.core.memory import Architecture, LayerShape
from kvviz.core.records import CachePolicy


def cache_shape(config: object, name: str | None = None, source: str = "the model's config") -> Architecture:
    """The KV cache a model of `config` keeps, with its own sliding window (if any)."""
    shape = config.cache_shape(source)
    return replace(shape, name=name) if name else shape


def run_cache_shape(config: object, policy: CachePolicy, name: str | None = None) -> Architecture:
    """The cache a run under `policy` keeps: the model's, with the policy's window, sinks and first windowed
    layer in place of the model's own (a policy without a window keeps every position)."""
    shape = cache_shape(config, name)
    if policy.importance:  # each layer its budget (PyramidKV's shrinks with depth), of the model's heads
        return replace(shape, sliding_window=None, layer_shapes=tuple(
            LayerShape("importance", shape.kv_heads, shape.head_dim, window=policy.layer_budget(layer, shape.layers))
            for layer in range(shape.layers)))
    return replace(shape, sliding_window=policy.window or None, sinks=policy.sinks,
                   window_first_layer=policy.first_layer if policy.window else 0)
