"""What a forward pass reports besides its logits, as an object passed in like the cache."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch


def newest_query_weights(q: torch.Tensor, k: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """softmax(q·Kᵀ/√d) of the last query row of `q` (N, nh, T, hs) over every key of `k` (N, nh, S, hs), in
    float32, for N layers of one sequence (or one layer: N = 1).

    The last query is the newest position, which attends to every key a pass holds, so no mask is needed.
    Returns (N, nh, S). Computed beside the attention output, never in its place, so the logits do not change.
    """
    q_last = q[:, :, -1:, :].float()  # (N, nh, 1, hs)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale  # a family's own (Gemma 4: 1)
    scores = q_last @ k.float().transpose(-2, -1) * scale  # (N, nh, 1, S)
    return torch.softmax(scores, dim=-1).squeeze(2)  # (N, nh, S)


class PassProbe:
    """One pass's instruments: the key/value rows each layer projected (`kv_rows`), the newest query's
    attention weights per layer when asked (`attention`, one (nh, S) float32 tensor a layer), and a check
    called before every block (`before_block(layer)`, which may raise to stop the pass, as the app's
    worker does when its window closes). A model given no probe counts nothing.

    A model with learned attention sinks (gpt-oss: `attend`'s `sink_logits`) also records, beside each layer's
    weights, the share of the newest query's softmax its sink took (`sink_shares`, one (nh,) float32 tensor a
    layer, in the order of `attention`): a layer's weights over the positions plus its sink share are 1 per head.
    Empty for a model without them (a model with sinks on some layers only gives the others -inf: share 0)."""

    def __init__(self, n_layer: int, record_attention: bool = False,
                 before_block: Callable[[int], None] | None = None) -> None:
        self.kv_rows = [0] * n_layer
        self.attention: list[torch.Tensor] | None = [] if record_attention else None
        self.sink_shares: list[torch.Tensor] = []
        self.before_block = before_block

    def entering(self, layer: int) -> None:
        """Called as block `layer` starts."""
        if self.before_block is not None:
            self.before_block(layer)

    def projected(self, layer: int, rows: int) -> None:
        """Layer `layer` computed `rows` new key/value rows."""
        self.kv_rows[layer] += rows

    def attended(self, q: torch.Tensor, k: torch.Tensor, scale: float | None = None) -> None:
        """Record one layer's newest query weights, for `q` (1, nh, T, hs) over `k` (1, nh, S, hs), their scores
        scaled by `scale` (None: 1/√hs)."""
        if self.attention is not None:
            if q.shape[0] != 1:
                raise ValueError(f"attention weights are recorded for one sequence, not a batch of {q.shape[0]}")
            self.attention.append(newest_query_weights(q, k, scale)[0])  # (nh, S)
