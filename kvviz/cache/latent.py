"""Multi-head latent attention's layer cache (kvviz.models.deepseek): one latent and one RoPE key a position."""

from __future__ import annotations

import torch

from kvviz.cache.layers import Held, LayerCache


class LatentLayer(LayerCache):
    """Per position one latent `c_kv` of `rank` numbers and one RoPE key `k_pe` of `rope_dim`, shared by every
    head, in a buffer (B, capacity, rank + rope_dim); each head's keys and values are rebuilt from it. `update`
    takes `c_kv` (B, T, r) and `k_pe` (B, T, rope) and returns every held latent and RoPE key as `Held.keys` and
    `Held.values`."""

    def __init__(self, rank: int, rope_dim: int, capacity: int, batch_size: int = 1,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> None:
        super().__init__()
        self.capacity, self.rank = capacity, rank
        self.latents = torch.zeros((batch_size, capacity, rank + rope_dim), dtype=dtype, device=device)

    def update(self, positions: torch.Tensor | int, c_kv: torch.Tensor, k_pe: torch.Tensor) -> Held:
        T = c_kv.shape[1]
        start, end = self._claim(positions, T, self.capacity)
        rows = self.latents.narrow(1, start, T)  # (B, T, r + rope)
        rows[..., : self.rank].copy_(c_kv)
        rows[..., self.rank:].copy_(k_pe)
        held = self.latents.narrow(1, 0, end)  # (B, S, r + rope)
        return Held(held[..., : self.rank], held[..., self.rank:])

    @property
    def bytes_held(self) -> int:
        held = self.latents.narrow(1, 0, self.length)
        return held.numel() * held.element_size()

    @property
    def bytes_allocated(self) -> int:
        return self.latents.numel() * self.latents.element_size()
