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
           scale: float | None = None, sink_logits: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q·Kᵀ·scale + mask)·V for `q` (B, nh, T, d) over `k`, `v` (B, nh, S, d): a pass without a cache when
    `held` is None (causal over its own rows), else what the layer's cache returned, seen as `held` says.
    `q_for_sinks`, where given, is the query turned to its position within the cache (StreamingLLM on RoPE): the
    sinks' scores use it. `sink_logits` (nh,), where given, are learned attention sinks (gpt-oss), which are no
    positions: `_with_sink_logits`. The probe records the newest query's weights, each key's at its position."""
    if held is not None and held.keeper is not None:
        return _by_importance(q, k, held, positions, probe, scale, v)
    if sink_logits is not None:
        return _with_sink_logits(q, k, v, held, positions, probe, scale, sink_logits)
    T = q.shape[2]
    if held is None:
        y = F.scaled_dot_product_attention(q, k, v, is_causal=T > 1, scale=scale)
    elif held.window:
        return _windowed(q, k, v, held, positions, probe, q_for_sinks, scale)
    elif T == 1 and positions.dim() == 1 and held.mask is None:  # one query sees every key
        y = F.scaled_dot_product_attention(q, k, v, scale=scale)
    else:  # keys in position order; a batch's rows each up to its own, padded after
        mask = visible(held, positions) if held.mask is None else held.mask  # (T, S) or (B, T, S)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask if mask.dim() == 2 else mask[:, None], scale=scale)
    if probe is not None:
        probe.attended(q, k, scale)
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


def _with_sink_logits(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, held: Held | None, positions: torch.Tensor,
                      probe: PassProbe | None, scale: float | None, sink_logits: torch.Tensor) -> torch.Tensor:
    """Attention with a learned sink per head (gpt-oss): the head's sink logit joins every query's softmax as one
    more column, which has no value, so a query can give part of its attention to nothing. The sink keeps no
    cache entry and no position (StreamingLLM's sinks are positions a window keeps: `Held.sinks`). Scores are
    written out: causal without a cache, as `held` says with one (windows included). `k` and `v` may hold fewer
    heads than `q` (B, nkv, S, d): each group of nh // nkv query heads reads its KV head in place, its queries
    stacked as rows against the same keys, so no key or value is copied for every query head."""
    B, nh, T, d = q.shape
    nkv, S = k.shape[1], k.shape[2]
    group = nh // nkv  # query heads a KV head serves (query head h reads KV head h // group)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    rows = q.reshape(B, nkv, group * T, d)  # a group's queries, one after another, against its KV head's keys
    scores = (rows @ k.transpose(-2, -1)).float().view(B, nh, T, S) * scale  # (B, nh, T, S)
    seen = torch.ones(T, S, dtype=torch.bool, device=q.device).tril() if held is None else visible(held, positions)
    scores = scores.masked_fill(~(seen if seen.dim() == 2 else seen[:, None]), float("-inf"))
    sinks = sink_logits.float().view(1, nh, 1, 1).expand(B, nh, T, 1)  # (B, nh, T, 1): the same for every query
    shares = torch.softmax(torch.cat((scores, sinks), dim=-1), dim=-1)  # (B, nh, T, S + 1)
    weights = shares[..., :-1]  # (B, nh, T, S): the sink's column is dropped; these rows sum to less than 1
    if probe is not None and probe.attention is not None:  # the newest query's, each key's at its position
        if B != 1:
            raise ValueError(f"attention weights are recorded for one sequence, not a batch of {B}")
        keys = held.positions if held is not None and held.positions is not None else torch.arange(S, device=q.device)
        by_position = weights.new_zeros(nh, int(positions[-1]) + 1)  # (nh, positions)
        probe.attention.append(by_position.index_copy_(1, keys, weights[0, :, -1, :]))
        probe.sink_shares.append(shares[0, :, -1, -1])  # (nh,): what the positions' weights leave to 1
    y = weights.reshape(B, nkv, group * T, S).to(v.dtype) @ v  # (B, nkv, group * T, d)
    return y.view(B, nh, T, d)


def _by_importance(q: torch.Tensor, k: torch.Tensor, held: Held, positions: torch.Tensor, probe: PassProbe | None,
                   scale: float | None, v: torch.Tensor) -> torch.Tensor:
    """Attention through a layer that keeps by importance (kvviz.cache.importance): scores written out, each KV
    head's group of query heads stacked against its keys (as `_with_sink_logits`); the layer masks them to what it
    holds, takes the softmax, and decides what to keep from those weights."""
    B, nh, T, d = q.shape
    nkv, S = k.shape[1], k.shape[2]
    if B != 1:
        raise ValueError(f"an importance method keeps positions for one sequence, not a batch of {B}")
    group = nh // nkv
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    scores = (q.reshape(B, nkv, group * T, d) @ k.transpose(-2, -1)).float().view(nh, T, S) * scale
    weights = held.keeper.attend(scores, held.positions, positions)  # (nh, T, S)
    if probe is not None and probe.attention is not None:  # the newest query's, each key's at its position
        keys = held.positions.repeat_interleave(nh // held.positions.shape[0], 0)  # (nh, S): its KV head's
        by_position = weights.new_zeros(nh, int(positions[-1]) + 1)
        probe.attention.append(by_position.scatter_(1, keys, weights[:, -1, :]))
    y = weights.reshape(B, nkv, group * T, S).to(v.dtype) @ v  # (B, nkv, group * T, d)
    return y.view(B, nh, T, d)
