"""Attention under a cache policy that evicts (kvviz.core.kv_cache.WindowCache): each query reads only the keys
its window and the attention sinks keep. Shared by every model family; an exact cache never comes here."""

from __future__ import annotations

import math

import torch

from kvviz.core.kv_cache import WindowCache


def windowed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                       kv_cache: WindowCache, q_for_sinks: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q·Kᵀ/√d + mask)·V for `q` (B, nh, T, hd) over the keys and values the cache returned, `k` and `v`
    (B, nh, S, hd), each query seeing what `kv_cache.visible` says. `q_for_sinks`, where given, is the query
    turned to the position it has within the cache (StreamingLLM on RoPE): the sinks' scores use it, so a sink
    stays as near to every query as the far end of the window, however long the text has grown."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = (q @ k.transpose(-2, -1)).float() * scale  # (B, nh, T, S)
    if q_for_sinks is not None:
        sink_scores = (q_for_sinks @ k.transpose(-2, -1)).float() * scale  # (B, nh, T, S)
        scores = torch.where(kv_cache.sink_keys(q.device)[None, None, None, :], sink_scores, scores)
    scores = scores.masked_fill(~kv_cache.visible(positions), float("-inf"))
    return torch.softmax(scores, dim=-1).to(v.dtype) @ v  # (B, nh, T, hd)
