"""KIVI's layout of a quantized cache (Liu et al., 2024): keys quantized per channel over groups of tokens, the
latest keys short of a group held exact, values quantized per token."""

from __future__ import annotations

import torch

from kvviz.cache.layers import Held, LayerCache
from kvviz.cache.quantized import quantize
from kvviz.cache.quantized_attention import FLOAT_BLOCK, nibbles, query_rows, reads_codes, unpack, value_sum

KIVI_DTYPES = ("int8", "int4")  # the formats a KIVI layer stores in (fp8's scale per channel is not KIVI's)


class KiviLayer(LayerCache):
    """Keys quantized per channel: each group of `residual` tokens (R) gets a float32 scale a channel and head, the
    channel's largest magnitude over those tokens over the format's largest value, and is stored as
    round(x / scale) (int4: two a byte). Until R keys have come they are held exact, in the model's number type;
    then the group is quantized. Values are quantized per token, as QuantizedLayer does (a scale a vector).

    Why: a key's channels differ in size, a few of them large in every token (outliers that RoPE and the
    projections put in fixed channels), so a scale per token is set by the outliers and rounds the small channels
    to nothing; a scale per channel follows each. Values have no such channels, and attention mixes them per token,
    so a value's error stays in its own token. A group needs its tokens before it can be scaled: the residual is
    what streaming costs.

    `spare` (build_cache's) keeps that many of the latest keys exact past the groups; `crop` goes back only where no
    group has been quantized since (a group's exact keys are gone, and a layer fed only that far would hold them
    exact), so speculative decoding, which rolls back after any pass, does not run on it.
    `update`, the teaching path, returns the keys and values dequantized (the exact keys
    as they are); `decode` reads the codes block by block."""

    def __init__(self, heads: int, head_dim: int, capacity: int, kv_dtype: str, residual: int, batch_size: int = 1,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu", spare: int = 0) -> None:
        if kv_dtype not in KIVI_DTYPES:
            raise ValueError(f"a KIVI cache stores {' or '.join(KIVI_DTYPES)}, not {kv_dtype!r}")
        if residual < 1 or spare < 0:
            raise ValueError(f"a KIVI cache quantizes keys in groups of at least 1 token, got {residual}")
        packed = kv_dtype == "int4"
        if packed and head_dim % 2:
            raise ValueError(f"an int4 cache packs two numbers to a byte: head_dim {head_dim} is odd")
        super().__init__()
        self.capacity, self.kv_dtype, self.model_dtype = capacity, kv_dtype, dtype
        self.group, self.spare = residual, spare
        stored, width = (torch.uint8, head_dim // 2) if packed else (torch.int8, head_dim)
        shape, groups = (batch_size, heads), capacity // residual
        self.key_codes = torch.zeros((*shape, groups * residual, width), dtype=stored, device=device)
        self.key_scales = torch.zeros((*shape, groups, head_dim), dtype=torch.float32, device=device)  # a channel's
        self.exact = torch.zeros((*shape, residual + spare, head_dim), dtype=dtype, device=device)  # the latest keys
        self.value_codes = torch.zeros((*shape, capacity, width), dtype=stored, device=device)
        self.value_scales = torch.zeros((*shape, capacity, 1), dtype=torch.float32, device=device)  # a token's
        self.grouped = 0  # positions whose keys are in groups (a multiple of `group`); the rest are `exact`

    def update(self, positions: torch.Tensor | int, k: torch.Tensor, v: torch.Tensor) -> Held:
        end = self._store(positions, k, v)
        B, h, _, hd = self.exact.shape
        G = self.grouped // self.group
        grouped = unpack(self.key_codes.narrow(2, 0, self.grouped)).view(B, h, G, self.group, hd)
        keys = (grouped * self.key_scales.narrow(2, 0, G)[..., None, :]).view(B, h, self.grouped, hd)
        keys = torch.cat((keys.to(self.model_dtype), self.exact.narrow(2, 0, end - self.grouped)), dim=2)
        values = unpack(self.value_codes.narrow(2, 0, end)) * self.value_scales.narrow(2, 0, end)
        return Held(keys, values.to(self.model_dtype))  # (B, h, end, hd) each

    def decode(self, position: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               scale: float | None = None) -> torch.Tensor:
        """One query's attention read from the codes: the grouped keys block by block, their channel scales on the
        dequantized block (kvviz.cache.quantized_attention for the rest), the exact keys as they are, one softmax,
        and the values' codes weighed by probability × scale (a batch, or a 16-bit model: as `update` does)."""
        if not reads_codes(q, self.exact.shape[0]):
            return super().decode(position, q, k, v, scale)
        end = self._store(position, k, v)
        rows = query_rows(q, self.exact.shape[1], scale)  # (h, g, hd)
        grouped = grouped_key_scores(rows, self.key_codes[0, :, : self.grouped],
                                     self.key_scales[0, :, : self.grouped // self.group], self.group)  # (h, g, G·R)
        exact = torch.bmm(rows, self.exact[0, :, : end - self.grouped].float().transpose(1, 2))  # (h, g, end - G·R)
        p = torch.softmax(torch.cat((grouped, exact), dim=-1), dim=-1)  # (h, g, end)
        y = value_sum(p * self.value_scales[0, :, :end, 0][:, None, :], self.value_codes[0, :, :end])  # (h, g, hd)
        return y.view(q.shape).to(q.dtype)

    def crop(self, position: int) -> None:
        """Roll back to `position` where the layer is then what a layer fed only that far would be: its groups of
        keys formed at the same positions (a layer fed `position` tokens has quantized max(0, position - spare)
        // R whole groups). A crop behind a group quantized since then is refused: that group's exact keys are gone."""
        fresh = max(0, position - self.spare) // self.group * self.group
        if 0 <= position <= self.length and fresh != self.grouped:
            raise ValueError(f"a KIVI cache has quantized the keys of its first {self.grouped} positions per channel, "
                             f"{self.group} at a time, and kept no exact copy; fed only {position} positions it would "
                             f"have quantized {fresh}: it cannot roll back to {position}")
        super().crop(position)

    def _store(self, positions: torch.Tensor | int, k: torch.Tensor, v: torch.Tensor) -> int:
        """Write this pass's values quantized and its keys exact, then quantize every whole group of exact keys that
        leaves at least `spare` of them exact; the positions held after it."""
        T = k.shape[2]
        start, end = self._claim(positions, T, self.capacity)
        codes, scales = quantize(v, self.kv_dtype)  # per token
        self.value_codes.narrow(2, start, T).copy_(codes)
        self.value_scales.narrow(2, start, T).copy_(scales)
        keys = torch.cat((self.exact.narrow(2, 0, start - self.grouped), k.to(self.model_dtype)), dim=2)  # exact
        B, h, held, hd = keys.shape
        whole = max(0, held - self.spare) // self.group  # groups to quantize now
        if whole:
            rows = keys.narrow(2, 0, whole * self.group).reshape(B, h, whole, self.group, hd)
            codes, scales = quantize(rows, self.kv_dtype, dim=-2)  # a scale a channel: (B, h, whole, 1, hd)
            self.key_codes.narrow(2, self.grouped, whole * self.group).copy_(codes.flatten(2, 3))
            self.key_scales.narrow(2, self.grouped // self.group, whole).copy_(scales.squeeze(-2))
            self.grouped += whole * self.group
        left = keys.narrow(2, whole * self.group, held - whole * self.group)
        self.exact.narrow(2, 0, left.shape[2]).copy_(left)
        return end

    @property
    def bytes_held(self) -> int:
        """The grouped keys' codes and their scales (a channel's, a group), the exact keys, the values' codes and
        their scales (a token's)."""
        exact = self.length - self.grouped
        held = (self.key_codes.narrow(2, 0, self.grouped), self.key_scales.narrow(2, 0, self.grouped // self.group),
                self.exact.narrow(2, 0, exact), self.value_codes.narrow(2, 0, self.length),
                self.value_scales.narrow(2, 0, self.length))
        return sum(t.numel() * t.element_size() for t in held)

    @property
    def bytes_allocated(self) -> int:
        return sum(t.numel() * t.element_size()
                   for t in (self.key_codes, self.key_scales, self.exact, self.value_codes, self.value_scales))


def grouped_key_scores(q: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, group: int) -> torch.Tensor:
    """Scores (h, g, S) of query rows `q` (h, g, hd) against keys stored per channel as `codes` (h, S, hd or hd/2)
    with `scales` (h, S / group, hd), a channel's a group: q·(c ⊙ s), block by block, each block's keys dequantized
    in float32 where they stay in the CPU's cache. (The scales could go on the query instead, (q ⊙ s)·c, but that
    is a query a group: a product a group instead of one a block; and integer products would need the query's
    levels a group.) int4: the even channels and the odd ones apart, (c - 8)·s in one pass each."""
    h, S = codes.shape[:2]
    step = max(1, FLOAT_BLOCK // group) * group  # whole groups a block
    packed = codes.dtype == torch.uint8
    if packed:  # the even channels' queries and scales, the odd ones'
        halves = [(q[..., i::2].contiguous(), scales[..., i::2].contiguous()) for i in (0, 1)]
    blocks = []
    for a in range(0, S, step):
        block = codes[:, a:a + step]  # (h, B, hd or hd/2)
        n = block.shape[1] // group
        groups = slice(a // group, a // group + n)
        if not packed:
            keys = block.float().view(h, n, group, -1).mul_(scales[:, groups, None, :])  # (h, n, R, hd) float32
            blocks.append(torch.bmm(q, keys.view(h, n * group, -1).transpose(1, 2)))  # (h, g, B)
            continue
        scores = None
        for (rows, channel), codes_8 in zip(halves, nibbles(block), strict=True):  # codes + 8, (h, B, hd/2)
            channel = channel[:, groups, None, :]  # (h, n, 1, hd/2)
            keys = torch.addcmul(-8 * channel, codes_8.float().view(h, n, group, -1), channel)  # (c - 8)·s
            part = torch.bmm(rows, keys.view(h, n * group, -1).transpose(1, 2))
            scores = part if scores is None else scores.add_(part)
        blocks.append(scores)
    return torch.cat(blocks, -1) if blocks else q.new_zeros(h, q.shape[1], 0)
