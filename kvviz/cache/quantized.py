"""A layer that stores every key and value quantized: int8, int4 or fp8, with a float32 scale a token and head."""

from __future__ import annotations

import torch

from kvviz.cache import quantized_attention
from kvviz.cache.layers import Held, LayerCache
from kvviz.cache.quantized_attention import key_scores, query_rows, reads_codes, unpack, value_sum
from kvviz.core.formats import KV_DTYPES


class QuantizedLayer(LayerCache):
    """Stores every key and value quantized (`kv_dtype`: int8, int4 or fp8), per token and head: each (head_dim,)
    vector gets a float32 scale, its largest magnitude over the format's largest value, and is stored as
    round(x / scale) (int8 and int4, two int4 numbers to a byte) or x / scale in float8 e4m3 (fp8). A new token never
    rescales the old ones, so it streams (KIVI's per-channel keys wait for a group of tokens: kvviz.cache.kivi).
    `update`, the teaching path, returns the dequantized rows, c * scale, in the model's number type; `decode`, one
    query's step, reads the codes themselves. The output drifts from an exact cache's by the rounding, and
    `bytes_held` counts the stored numbers and their scales."""

    def __init__(self, heads: int, head_dim: int, capacity: int, kv_dtype: str, batch_size: int = 1,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> None:
        if kv_dtype not in KV_DTYPES:
            raise ValueError(f"no quantized cache in {kv_dtype!r}; known: {', '.join(KV_DTYPES)}")
        bits, self.largest = KV_DTYPES[kv_dtype]
        if bits == 4 and head_dim % 2:
            raise ValueError(f"an int4 cache packs two numbers to a byte: head_dim {head_dim} is odd")
        super().__init__()
        self.capacity, self.kv_dtype, self.model_dtype = capacity, kv_dtype, dtype
        self.packed = bits == 4
        stored = torch.float8_e4m3fn if kv_dtype == "fp8" else torch.uint8 if self.packed else torch.int8
        width = head_dim // 2 if self.packed else head_dim
        shape = (2, batch_size, heads, capacity)
        self.codes = torch.zeros((*shape, width), dtype=stored, device=device)  # (2, B, h, S, hd or hd/2)
        self.scales = torch.zeros((*shape, 1), dtype=torch.float32, device=device)  # (2, B, h, S, 1)

    def quantize(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Codes and scales of `x` (..., hd): scales (..., 1) float32, codes in the stored type."""
        return quantize(x, self.kv_dtype)

    def dequantize(self, codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        """The rows `codes` with `scales` stand for, (..., hd) in the model's number type."""
        return (unpack(codes) * scales).to(self.model_dtype)

    def update(self, positions: torch.Tensor | int, k: torch.Tensor, v: torch.Tensor) -> Held:
        end = self._store(positions, k, v)
        held = self.dequantize(self.codes.narrow(3, 0, end), self.scales.narrow(3, 0, end))  # (2, B, h, end, hd)
        return Held(held[0], held[1])

    def decode(self, position: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               scale: float | None = None) -> torch.Tensor:
        """One query's attention read from the codes, block by block (kvviz.cache.quantized_attention): the
        scores (q·c)·s, one softmax, then Σ (p·s)·c; never a full-precision copy of the cache. A batch, a model
        in a 16-bit type (see kvviz.cache.quantized_attention.reads_codes) or a cache shorter than CODES_FROM
        attends as `update` does."""
        if not reads_codes(q, self.codes.shape[1]) or self.length + 1 < quantized_attention.CODES_FROM[self.kv_dtype]:
            return super().decode(position, q, k, v, scale)  # a batch, a 16-bit model or a short cache
        end = self._store(position, k, v)
        codes, scales = self.codes[:, 0, :, :end], self.scales[:, 0, :, :end, 0]  # (2, h, S, hd or hd/2), (2, h, S)
        rows = query_rows(q, codes.shape[1], scale)  # (h, g, hd)
        p = torch.softmax(key_scores(rows, codes[0], scales[0]), dim=-1)  # (h, g, S)
        y = value_sum(p * scales[1][:, None, :], codes[1])  # (h, g, hd)
        return y.view(q.shape).to(q.dtype)  # (1, nh, 1, hd)

    def _store(self, positions: torch.Tensor | int, k: torch.Tensor, v: torch.Tensor) -> int:
        """Quantize and write this pass's rows; the positions held after it."""
        T = k.shape[2]
        start, end = self._claim(positions, T, self.capacity)
        codes, scales = self.quantize(torch.stack((k, v)))  # (2, B, h, T, hd or hd/2), (2, B, h, T, 1)
        self.codes.narrow(3, start, T).copy_(codes)
        self.scales.narrow(3, start, T).copy_(scales)
        return end

    @property
    def bytes_held(self) -> int:
        codes, scales = self.codes.narrow(3, 0, self.length), self.scales.narrow(3, 0, self.length)
        return codes.numel() * codes.element_size() + scales.numel() * scales.element_size()

    @property
    def bytes_allocated(self) -> int:
        return self.codes.numel() * self.codes.element_size() + self.scales.numel() * self.scales.element_size()


def quantize(x: torch.Tensor, kv_dtype: str, dim: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes and scales of `x` (..., hd) in `kv_dtype`, a scale for each slice along `dim` (-1: a vector's, per token;
    the token axis: per channel) in float32, its largest magnitude over the format's largest value; codes in the
    stored type, int4 two a byte (q + 8 in 0..15, even channels in the low half)."""
    largest = KV_DTYPES[kv_dtype][1]
    x = x.float()
    scale = (x.abs().amax(dim=dim, keepdim=True) / largest).clamp_min(1e-12)
    if kv_dtype == "fp8":
        return (x / scale).to(torch.float8_e4m3fn), scale
    q = torch.round(x / scale).clamp(-largest, largest).to(torch.int8)
    if kv_dtype == "int4":
        q = (q + 8).to(torch.uint8)
        q = q[..., 0::2] | (q[..., 1::2] << 4)
    return q, scale
