"""The KV cache: preallocated per-layer key and value buffers with an explicit length."""

from __future__ import annotations

import torch


class KVCache:
    """Keys and values of every layer for positions `0 .. length-1`.

    Buffers are allocated once, shaped (layers, batch, heads, capacity, head_dim), so the
    memory a run needs is visible up front; `bytes_used` counts only the filled part.
    Positions are explicit: `update` writes rows at the positions it is given, which must
    continue the cache without gaps.
    """

    def __init__(
        self,
        n_layer: int,
        n_head: int,
        head_dim: int,
        capacity: int,
        batch_size: int = 1,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        shape = (n_layer, batch_size, n_head, capacity, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)  # (L, B, nh, S, hs)
        self.values = torch.zeros(shape, dtype=dtype, device=device)  # (L, B, nh, S, hs)
        self._layer_keys = list(self.keys.unbind(0))  # per-layer views, (B, nh, S, hs) each
        self._layer_values = list(self.values.unbind(0))
        self.capacity = capacity
        self.n_layer = n_layer
        self.length = 0
        self._layer_lengths = [0] * n_layer

    def reset(self) -> None:
        """Forget every cached position; the buffers stay allocated."""
        self.length = 0
        self._layer_lengths = [0] * self.n_layer

    def update(
        self, layer: int, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store `k`, `v` (B, nh, T, hs) at `positions` (T,) of `layer`; return all cached K, V."""
        T = k.shape[2]
        start = self._layer_lengths[layer]
        end = start + T
        if end > self.capacity:
            raise ValueError(f"KV cache is full: {self.capacity} positions, asked for {end}")
        first = int(positions[0])
        if first != start:
            raise ValueError(f"layer {layer}: positions start at {first} but the cache holds {start}")
        keys, values = self._layer_keys[layer], self._layer_values[layer]
        keys.narrow(2, start, T).copy_(k)
        values.narrow(2, start, T).copy_(v)
        self._layer_lengths[layer] = end
        if layer == self.n_layer - 1:
            self.length = end
        return keys.narrow(2, 0, end), values.narrow(2, 0, end)  # (B, nh, end, hs)

    @property
    def bytes_used(self) -> int:
        """Bytes of the K and V rows actually filled, over all layers."""
        per_position = 2 * self.keys[:, :, :, 0].numel() * self.keys.element_size()
        return per_position * self.length

    @property
    def bytes_allocated(self) -> int:
        return 2 * self.keys.numel() * self.keys.element_size()
