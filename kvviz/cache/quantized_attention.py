"""One query's attention read straight from a quantized cache's codes, block by block: the fast decode of the
quantized layers (kvviz.cache.quantized, kvviz.cache.kivi). No full-precision copy of the cache is ever built.

A scale a token and head factors out of a dot product: q·(c·s) = (q·c)·s. So the scores are the query against
the codes, each times its token's scale, one softmax over them, and the output is Σ_s (p_s·s_s)·c_s: the
probability times the scale weighs the codes. Under grouped-query attention the query heads that read one KV head
are the rows of one product against its codes (nothing is repeated).

On a CPU the int8 and int4 codes are multiplied as integers (torch._int_mm, int8 × int8 → int32, VNNI). The query
and the weights are float32, so each is split into three int8 levels, x ≈ c₁·s + c₂·s/254 + c₃·s/254², each level
rounding what the ones before it left: float32's 23 bits. The integer products are exact, so the output is the
teaching path's (attention over the dequantized rows) within float32 rounding. Chosen by measurement, on small
GPT-2 and Llama models over 12 greedy tokens (the largest logit difference from the teaching path, relative) and
on the SmolLM2-135M shape at 8,192 positions, float32, one thread (a step, against the exact cache's):
one level (the query "quantized per head") drifts by 3-8% and takes int8 to 1.43x; two levels drift by up to 3%
(1.27x); three by 2e-6 (1.16x). A drift of percents is not rounding: an int4 code is a seventh of its vector's
largest number, and a small error upstream moves keys across codes. Converting each block to float32 and
multiplying in floats is exact too, but takes 21 ms a step for the keys and as long for the values, where the
integer products take 8-9 ms each. An int4 product costs what an int8 one does (its nibbles are unpacked to int8
first; for the values two tokens side by side, so that a product runs over S/2 rows), so int4 saves only the
reading. Elsewhere (a GPU, where `_int_mm` wants more rows; fp8, which has no integer form) each block is widened
to float32 and multiplied in floats.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

BLOCK = 8192  # positions a block of the integer products: an int4 head's unpacked nibbles (2 × 256 KiB) stay in a
# 1 MiB L2 cache, and an int32 sum of one block's products cannot overflow (8,192 × 127 × 127 < 2³¹)
FLOAT_BLOCK = 2048  # positions a block widened to float32 (1,024 to 8,192 measured alike; 512 slower)
LEVELS = 3  # int8 levels of the query and of the weights: float32's 23 bits
# Positions from which a one-token step reads the codes; a shorter cache is dequantized whole and attended as the
# teaching path does: its full-precision copy is then small, and the codes' read has a fixed cost of many small calls.
# Measured per layer (SmolLM2-135M's 9 query heads over 3 KV heads and GPT-2-like 4 over 4, head size 64, medians of
# 15, 2-core CPU): the codes' read is faster from 1,024 positions in int8 (436 against 1,387 us; 330 against 146 at
# 256), from 2,048 in int4 and from 256 in fp8.
CODES_FROM = {"int8": 1024, "int4": 2048, "fp8": 256}


def reads_codes(q: torch.Tensor, batch: int) -> bool:
    """Whether a layer's one-token step reads its codes: one sequence, in float32. In bfloat16 or float16 the teaching
    path rounds each dequantized key and value to the model's type before it attends, and the codes read in float32
    land a unit or two in the last place of the logits away from it: more than compare mode allows a quantized
    cache. So a batch or a 16-bit model attends as `update` does (a copy in its own type)."""
    return batch == 1 and q.dtype == torch.float32


def query_rows(q: torch.Tensor, kv_heads: int, scale: float | None) -> torch.Tensor:
    """The query (1, nh, 1, hd) as (kv_heads, group, hd) float32 rows, times the softmax scale (1/√hd by default):
    head h reads KV head h // group."""
    hd = q.shape[-1]
    return q.float().reshape(kv_heads, -1, hd) * (hd ** -0.5 if scale is None else scale)


def integer_codes(codes: torch.Tensor) -> bool:
    """Whether `codes` are read with integer products: int8 or int4 (uint8) codes on a CPU."""
    return codes.device.type == "cpu" and codes.dtype in (torch.int8, torch.uint8) and hasattr(torch, "_int_mm")


def int8_levels(x: torch.Tensor, positive: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """`x` (h, m, n) float32 as LEVELS matrices of whole numbers -127..127 stacked as rows, (h, LEVELS·m, n) float32
    (`.to(torch.int8)` for the products), and their scales (h, LEVELS, m, 1): x ≈ Σ_l codes_l · scale_l, each level
    rounding what the ones before it left (at most half a step, so 127 steps of a level 254 times finer hold it).
    `positive`: x has no negative numbers."""
    h, m, n = x.shape
    scale = (x if positive else x.abs()).amax(-1, keepdim=True).clamp_min_(1e-30).div_(127)  # (h, m, 1)
    codes = x.new_empty(h, LEVELS, m, n)
    scales, rest = [], x
    for level in range(LEVELS):
        c = torch.mul(rest, scale.reciprocal(), out=codes[:, level]).round_()
        scales.append(scale)
        if level + 1 < LEVELS:
            rest, scale = torch.addcmul(rest, c, scale, value=-1), scale / 254
    return codes.view(h, LEVELS * m, n), torch.stack(scales, 1)


def nibbles(packed: torch.Tensor, low: torch.Tensor | None = None,
            high: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """int4 codes (..., hd/2), two a byte, as the even channels' and the odd channels' codes + 8 (0..15), int8
    (written into `low` and `high` where given)."""
    low = packed & 0x0F if low is None else torch.bitwise_and(packed, 0x0F, out=low)
    high = packed >> 4 if high is None else torch.bitwise_right_shift(packed, 4, out=high)
    return low.view(torch.int8), high.view(torch.int8)


def unpack(codes: torch.Tensor) -> torch.Tensor:
    """The numbers codes (..., hd) (int4: (..., hd/2), two a byte, even channels in the low half) stand for, before
    their scale, as float32 (..., hd)."""
    if codes.dtype == torch.uint8:
        low, high = nibbles(codes)
        codes = torch.stack((low - 8, high - 8), dim=-1).flatten(-2)  # (..., hd): even, odd, even, ...
    return codes.float()


def widen(codes: torch.Tensor) -> torch.Tensor:
    """`unpack`, faster for fp8 on a CPU (where torch widens float8 one number at a time): e4m3's sign, exponent and
    mantissa bits moved to float32's places, times 2^120 for the exponents' biases (7 against 127); e4m3's
    subnormals land on float32's, which the same factor scales right."""
    if codes.dtype != torch.float8_e4m3fn or codes.device.type != "cpu":
        return unpack(codes)
    bits = codes.view(torch.uint8).to(torch.int32)
    bits = ((bits & 0x80) << 24) | ((bits & 0x7F) << 20)
    return bits.view(torch.float32).mul_(2.0 ** 120)


def key_scores(q: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Scores (h, g, S) of query rows `q` (h, g, hd) against keys stored per token as `codes` (h, S, hd or hd/2)
    with `scales` (h, S): (q·c)·s, block by block."""
    if not integer_codes(codes):
        blocks = [torch.bmm(q, widen(codes[:, a:a + FLOAT_BLOCK]).transpose(1, 2))  # (h, g, B)
                  for a in range(0, codes.shape[1], FLOAT_BLOCK)]
        return torch.cat(blocks, -1).mul_(scales[:, None, :])
    h, g, _ = q.shape
    S = codes.shape[1]
    levels, row_scales = int8_levels(q)  # (h, L·g, hd), (h, L, g, 1)
    rows = levels.to(torch.int8)
    packed = codes.dtype == torch.uint8
    if packed:  # q·(c - 8) = q_even·low + q_odd·high - 8·Σq: no interleaving, the offset once a row
        even, odd = rows[..., 0::2].contiguous().unbind(0), rows[..., 1::2].contiguous().unbind(0)
        offset = 8 * (levels.sum(-1).view(h, LEVELS, g, 1) * row_scales).sum(1)  # (h, g, 1)
        low, high = codes.new_empty(min(S, BLOCK), codes.shape[-1]), codes.new_empty(min(S, BLOCK), codes.shape[-1])
    dots = torch.empty(h, LEVELS * g, S, dtype=torch.int32)
    for a in range(0, S, BLOCK):
        B = min(BLOCK, S - a)
        for head, (block, out) in enumerate(zip(codes[:, a:a + B], dots[:, :, a:a + B], strict=True)):
            into = out if out.is_contiguous() else torch.empty_like(out)  # (L·g, B) int32
            if packed:
                lows, highs = nibbles(block, low[:B], high[:B])
                torch._int_mm(even[head], lows.t(), out=into).add_(torch._int_mm(odd[head], highs.t()))
            else:
                torch._int_mm(rows[head], block.t(), out=into)
            if into is not out:
                out.copy_(into)
    dots = dots.view(h, LEVELS, g, S)
    scores = torch.addcmul(-offset, dots[:, 0], row_scales[:, 0]) if packed else dots[:, 0] * row_scales[:, 0]
    for level in range(1, LEVELS):
        scores.addcmul_(dots[:, level], row_scales[:, level])
    return scores.mul_(scales[:, None, :])  # (h, g, S)


def value_sum(weights: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """Σ_s weights_s · c_s (h, g, hd) for `weights` (h, g, S), each a probability times its value's scale (none
    negative), and values stored as `codes` (h, S, hd or hd/2), block by block."""
    h, g, S = weights.shape
    packed = codes.dtype == torch.uint8
    hd = codes.shape[-1] * (2 if packed else 1)
    if not integer_codes(codes):
        y = weights.new_zeros(h, g, hd)
        for a in range(0, S, FLOAT_BLOCK):
            y.baddbmm_(weights[..., a:a + FLOAT_BLOCK], widen(codes[:, a:a + FLOAT_BLOCK]))
        return y
    if not packed:
        levels, row_scales = int8_levels(weights, positive=True)  # (h, L·g, S), (h, L, g, 1)
        rows, sums = levels.to(torch.int8), weights.new_zeros(h, LEVELS * g, hd)
        for a in range(0, S, BLOCK):
            for head, (block, weighed) in enumerate(zip(codes[:, a:a + BLOCK], rows[..., a:a + BLOCK], strict=True)):
                sums[head] += torch._int_mm(weighed, block)  # (L·g, B) by (B, hd): int32, added in float32
        return (sums.view(h, LEVELS, g, hd) * row_scales).sum(1)  # (h, g, hd)
    # int4: the nibbles of two tokens side by side make one row of hd numbers, and (S/2, hd) a matrix: a product
    # over S/2 rows costs half one over S. So the weights are parted by the token's parity (an odd S padded with a
    # weight 0): the even tokens' rows weigh the first half of each row of nibbles, the odd tokens' the second.
    even = weights if S % 2 == 0 else F.pad(weights, (0, 1))
    parted = even.view(h, g, -1, 2).transpose(-1, -2).reshape(h, g * 2, -1)  # (h, g·2, S'/2)
    levels, row_scales = int8_levels(parted, positive=True)  # (h, L·g·2, S'/2), (h, L, g·2, 1)
    rows = levels.to(torch.int8)
    sums = weights.new_zeros(h, 2, LEVELS * g * 2, hd)  # the low nibbles' products, then the high ones'
    low, high = codes.new_empty(min(S, BLOCK) + 1, hd // 2), codes.new_empty(min(S, BLOCK) + 1, hd // 2)
    for a in range(0, S, BLOCK):
        B = min(BLOCK, S - a)
        n = (B + 1) // 2  # a lone last token's partner row is weighed by the padding's 0
        for head, block in enumerate(codes[:, a:a + B]):
            nibbles(block, low[:B], high[:B])
            weighed = rows[head, :, a // 2:a // 2 + n]  # (L·g·2, n)
            sums[head, 0] += torch._int_mm(weighed, low[:2 * n].view(torch.int8).view(n, hd))
            sums[head, 1] += torch._int_mm(weighed, high[:2 * n].view(torch.int8).view(n, hd))
    sums = sums.view(h, 2, LEVELS * g, 2, 2, hd // 2)  # (..., the row's parity, which token of the pair, channel)
    sums = torch.stack((sums[:, :, :, 0, 0], sums[:, :, :, 1, 1]), 3)  # (h, 2, L·g, 2, hd/2): each token its rows
    sums -= 8 * levels.sum(-1).view(h, 1, LEVELS * g, 2, 1)  # Σ w·(c - 8): whole numbers, exact in float32
    sums = (sums.view(h, 2, LEVELS, g, 2, hd // 2) * row_scales.view(h, 1, LEVELS, g, 2, 1)).sum((2, 4))
    return sums.permute(0, 2, 3, 1).reshape(h, g, hd)  # (h, g, hd): the channels back in order: even, odd, ...
