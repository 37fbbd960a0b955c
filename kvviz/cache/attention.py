"""Attention over what a layer's cache holds, masked once for every family: causal, a sliding window and its
sinks, or a batch's rows each up to its own position. The teaching files call `attend`; nothing here is family's."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from kvviz.cache.layers import Held
from kvviz.cache.probe import PassProbe


def visible(held: Held, positions: torch.Tensor) -> torch.Tensor:
    """(T, S), or (B, T, S) for `positions` (B, T): True where the query at each position sees each held key."""
    S = held.keys.shape[-2] if held.keys.dim() == 4 else held.keys.shape[1]
    keys = torch.arange(S, device=positions.device) if held.positions is None else held.positions  # (S,)
    queries = positions[..., None]  # (T, 1) or (B, T, 1)
    seen = keys <= queries
    if held.window:
        seen = seen & ((keys < held.sinks) | (keys > queries - held.window))
    return seen


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, held: Held | None, positions: torch.Tensor,
           probe: PassProbe | None = None, q_for_sinks: torch.Tensor | None = None,
           scale: float | None = None) -> torch.Tensor:
    """softmax(q·Kᵀ·scale + mask)·V for `q` (B, nh, T, d) over `k`, `v` (B, nh, S, d): a pass without a cache when
    `held` is None (causal over its own rows), else what the layer's cache returned, seen as `held` says.
    `q_for_sinks`, where given, is the query turned to its position within the cache (StreamingLLM on RoPE): the
    sinks' scores use it. The probe records the newest query's weights, each key's at its position."""
    T = q.shape[2]
    if held is None:
        y = F.scaled_dot_product_attention(q, k, v, is_causal=T > 1, scale=scale)
    elif held.window:
        return _windowed(q, k, v, held, positions, probe, q_for_sinks, scale)
    elif T == 1 and positions.dim() == 1:  # one query sees every key
        y = F.scaled_dot_product_attention(q, k, v, scale=scale)
    else:  # keys in position order; a batch's rows each up to its own, padded after
        mask = visible(held, positions)  # (T, S) or (B, T, S)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask if mask.dim() == 2 else mask[:, None], scale=scale)
    if probe is not None:
        probe.attended(q, k)
    return y


def _windowed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, held: Held, positions: torch.Tensor,
              probe: PassProbe | None, q_for_sinks: torch.Tensor | None, scale: float | None) -> torch.Tensor:
    """Attention under a window: scores written out, so that the sinks can take their own query's."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-2, -1)).float() * scale  # (B, nh, T, S)
    if q_for_sinks is not None and held.sinks:
        keys = held.positions if held.positions is not None else torch.arange(k.shape[2], device=q.device)
        sink_scores = (q_for_sinks @ k.transpose(-2, -1)).float() * scale  # (B, nh, T, S)
        scores = torch.where((keys < held.sinks)[None, None, None, :], sink_scores, scores)
    scores = scores.masked_fill(~visible(held, positions), float("-inf"))
    if probe is not None and probe.attention is not None:  # the newest query's, each key's at its position
        weights = torch.softmax(scores[0, :, -1, :], dim=-1)  # (nh, S)
        by_position = weights.new_zeros(weights.shape[0], int(positions[-1]) + 1)  # (nh, positions)
        keys = held.positions if held.positions is not None else torch.arange(k.shape[2], device=q.device)
        probe.attention.append(by_position.index_copy_(1, keys, weights))
    return torch.softmax(scores, dim=-1).to(v.dtype) @ v  # (B, nh, T, d)
