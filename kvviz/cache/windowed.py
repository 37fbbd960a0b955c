"""Attention under a cache policy that evicts (kvviz.cache.kv_cache.WindowCache): each query reads only the keys
its window and the attention sinks keep. Shared by every model family; an exact cache never comes here."""

from __future__ import annotations

import math

import torch

from kvviz.cache.kv_cache import WindowCache
from kvviz.cache.probe import PassProbe


def scores_in_window(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, kv_cache: WindowCache,
                     q_for_sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Masked scores q·Kᵀ/√d (B, nh, T, S), float32, -inf where a query does not see a key (see windowed_attention)."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = (q @ k.transpose(-2, -1)).float() * scale  # (B, nh, T, S)
    if q_for_sinks is not None:
        sink_scores = (q_for_sinks @ k.transpose(-2, -1)).float() * scale  # (B, nh, T, S)
        scores = torch.where(kv_cache.sink_keys(q.device)[None, None, None, :], sink_scores, scores)
    return scores.masked_fill(~kv_cache.visible(positions), float("-inf"))


def newest_weights_by_position(scores: torch.Tensor, kv_cache: WindowCache, positions: int) -> torch.Tensor:
    """The newest query's weights (nh, `positions`) from `scores` (1, nh, T, S), each key's at its position, 0 at
    the positions the window evicted: what the attention view draws."""
    weights = torch.softmax(scores[0, :, -1, :], dim=-1)  # (nh, S)
    by_position = weights.new_zeros(weights.shape[0], positions)  # (nh, positions)
    index = torch.tensor(kv_cache.key_positions, device=weights.device)
    return by_position.index_copy_(1, index, weights)


def windowed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                       kv_cache: WindowCache, q_for_sinks: torch.Tensor | None = None,
                       probe: PassProbe | None = None) -> torch.Tensor:
    """softmax(q·Kᵀ/√d + mask)·V for `q` (B, nh, T, hd) over the keys and values the cache returned, `k` and `v`
    (B, nh, S, hd), each query seeing what `kv_cache.visible` says. `q_for_sinks`, where given, is the query
    turned to the position it has within the cache (StreamingLLM on RoPE): the sinks' scores use it, so a sink
    stays as near to every query as the far end of the window, however long the text has grown."""
    scores = scores_in_window(q, k, positions, kv_cache, q_for_sinks)  # (B, nh, T, S)
    if probe is not None and probe.attention is not None:  # the newest query's, beside the output
        probe.attention.append(newest_weights_by_position(scores, kv_cache, int(positions[-1]) + 1))
    return torch.softmax(scores, dim=-1).to(v.dtype) @ v  # (B, nh, T, hd)
