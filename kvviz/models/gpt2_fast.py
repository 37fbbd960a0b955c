"""GPT-2's one-token cached step, fast: the arithmetic of `gpt2.GPT.forward` on a (1, 1) input, written as
plain tensor calls on weights gathered once per run. At one token, module calls, attribute look-ups and
shape bookkeeping cost about a fifth of the step on CPU, more than everything but the matrix products. Unless it
records attention, each layer's cache attends (`KVCache.decode`), so that a quantized one reads its codes.
`forward` runs every other pass (a prefill, an uncached pass, a batch, a lossy cache) on the same products.
The tests check both against the teaching forward: the same tokens, logits within float rounding."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from kvviz.cache.attention import attend
from kvviz.cache.kv_cache import KVCache
from kvviz.cache.probe import PassProbe, newest_query_weights
from kvviz.models.gpt2 import GPT
from kvviz.models.products import packed_copy, project, tied_head, verifying_head


class BlockWeights(NamedTuple):
    """One block's tensors, read once per run by `decode_one` instead of once per token."""

    ln_1_weight: torch.Tensor
    ln_1_bias: torch.Tensor
    attn_weight: torch.Tensor  # (C, 3C)
    attn_bias: torch.Tensor
    attn_proj_weight: torch.Tensor  # (C, C)
    attn_proj_bias: torch.Tensor
    ln_2_weight: torch.Tensor
    ln_2_bias: torch.Tensor
    fc_weight: torch.Tensor  # (C, 4C)
    fc_bias: torch.Tensor
    mlp_proj_weight: torch.Tensor  # (4C, C)
    mlp_proj_bias: torch.Tensor
    attn_packed: torch.Tensor | None  # the Conv1Ds' packed copies, or None (see `products.packed_copy`)
    attn_proj_packed: torch.Tensor | None
    fc_packed: torch.Tensor | None
    mlp_proj_packed: torch.Tensor | None


def decode_weights(model: GPT) -> list[BlockWeights]:
    """Every block's tensors for `decode_one`; take them again if the parameters are replaced."""
    weights = []
    for block in model.blocks:
        attn, mlp = block.attn, block.mlp
        weights.append(BlockWeights(
            block.ln_1.weight, block.ln_1.bias, attn.c_attn.weight, attn.c_attn.bias, attn.c_proj.weight,
            attn.c_proj.bias, block.ln_2.weight, block.ln_2.bias, mlp.c_fc.weight, mlp.c_fc.bias,
            mlp.c_proj.weight, mlp.c_proj.bias, packed_copy(attn.c_attn.weight), packed_copy(attn.c_proj.weight),
            packed_copy(mlp.c_fc.weight), packed_copy(mlp.c_proj.weight),
        ))
    return weights


def decode_one(model: GPT, token: int, position: int, kv_cache: KVCache, weights: list[BlockWeights] | None = None,
               probe: PassProbe | None = None) -> torch.Tensor:
    """Logits (1, V) for one token of a single sequence at `position`, attending to the cache: equal to
    `model(torch.tensor([[token]]), torch.tensor([position]), kv_cache, probe=probe)[0]`."""
    cfg = model.config
    C, nh, hs, eps = cfg.n_embd, cfg.n_head, cfg.head_dim, cfg.layer_norm_epsilon
    if position >= cfg.n_ctx:
        raise ValueError(f"position {position} is past the context length {cfg.n_ctx}")
    wte, wpe = model.transformer.wte.weight, model.transformer.wpe.weight
    recording = probe is not None and probe.attention is not None
    queries: list[torch.Tensor] = []  # when recording: every layer's query and keys, weighed after the loop
    keys: list[torch.Tensor] = []
    x = (wte[token] + wpe[position]).view(1, C)  # (1, C)
    for i, w in enumerate(weights or decode_weights(model)):
        if probe is not None:
            probe.entering(i)
        h = F.layer_norm(x, (C,), w.ln_1_weight, w.ln_1_bias, eps)
        qkv = project(h, w.attn_weight, w.attn_bias, w.attn_packed)  # (1, 3C)
        if probe is not None:
            probe.projected(i, 1)
        q, k, v = qkv.view(3, 1, nh, 1, hs)  # (B=1, nh, T=1, hs) each
        if recording:
            held = kv_cache.update(i, position, k, v)  # every cached key and value, (1, nh, S, hs) each
            y = F.scaled_dot_product_attention(q, held.keys, held.values)  # (1, nh, 1, hs)
            queries.append(q)  # (1, nh, 1, hs)
            keys.append(held.keys)
        else:  # the layer's own read: a quantized one attends to its codes, no full-precision copy
            y = kv_cache.decode(i, position, q, k, v)  # (1, nh, 1, hs)
        x = project(y.view(1, C), w.attn_proj_weight, w.attn_proj_bias, w.attn_proj_packed).add_(x)
        h = F.layer_norm(x, (C,), w.ln_2_weight, w.ln_2_bias, eps)
        h = F.gelu(project(h, w.fc_weight, w.fc_bias, w.fc_packed), approximate="tanh")  # (1, 4C)
        x = project(h, w.mlp_proj_weight, w.mlp_proj_bias, w.mlp_proj_packed).add_(x)
    if recording:  # all layers in one product: fewer calls than one per layer
        probe.attention.extend(newest_query_weights(torch.cat(queries), torch.cat(keys)).unbind(0))  # L x (nh, S)
    ln_f = model.transformer.ln_f
    x = F.layer_norm(x, (C,), ln_f.weight, ln_f.bias, eps)
    return tied_head(x, wte)  # (1, V)


def forward(model: GPT, idx: torch.Tensor, positions: torch.Tensor, kv_cache: KVCache | None,
            weights: list[BlockWeights] | None = None, probe: PassProbe | None = None) -> torch.Tensor:
    """Logits (B, V) of the last position of each row of `idx` (B, T) at `positions` ((T,), or (B, T) for rows at
    positions of their own), attending through `kv_cache` (None: causally, over the pass's own rows): any pass the
    engine runs, prefill, uncached or one token, on the products `decode_one` takes. Equal, within the rounding of
    another order of sums, to `model(idx, positions, kv_cache, last_only=True, probe=probe)[:, -1]`."""
    B, T = idx.shape
    return head(model, _blocks(model, idx, positions, kv_cache, weights, probe).view(B, T, -1)[:, -1])  # (B, V)


def states(model: GPT, idx: torch.Tensor, positions: torch.Tensor, kv_cache: KVCache | None,
           weights: list[BlockWeights] | None = None, probe: PassProbe | None = None) -> torch.Tensor:
    """What the head reads at every position (B, T, C), before the final LayerNorm: speculative decoding's
    verifying pass, whose rows `head` turns into logits."""
    B, T = idx.shape
    return _blocks(model, idx, positions, kv_cache, weights, probe).view(B, T, -1)


def head(model: GPT, x: torch.Tensor, verifying: bool = False) -> torch.Tensor:
    """Logits (M, V) of the blocks' output `x` (M, C): the final LayerNorm and the tied head (`verifying`: every row
    of a verifying pass, products.verifying_head)."""
    ln_f = model.transformer.ln_f
    x = F.layer_norm(x, (model.config.n_embd,), ln_f.weight, ln_f.bias, model.config.layer_norm_epsilon)
    return (verifying_head if verifying else tied_head)(x, model.transformer.wte.weight)  # (M, V)


def _blocks(model: GPT, idx: torch.Tensor, positions: torch.Tensor, kv_cache: KVCache | None,
            weights: list[BlockWeights] | None, probe: PassProbe | None) -> torch.Tensor:
    """The blocks' output (B*T, C) for `idx` (B, T) at `positions`, through `kv_cache`."""
    cfg = model.config
    C, nh, hs, eps = cfg.n_embd, cfg.n_head, cfg.head_dim, cfg.layer_norm_epsilon
    B, T = idx.shape
    if int(positions.max()) >= cfg.n_ctx:
        raise ValueError(f"position {int(positions.max())} is past the context length {cfg.n_ctx}")
    wte, wpe = model.transformer.wte.weight, model.transformer.wpe.weight
    x = (wte[idx] + wpe[positions]).reshape(B * T, C)  # (B*T, C)
    for i, w in enumerate(weights or decode_weights(model)):
        if probe is not None:
            probe.entering(i)
        h = F.layer_norm(x, (C,), w.ln_1_weight, w.ln_1_bias, eps)
        qkv = project(h, w.attn_weight, w.attn_bias, w.attn_packed)  # (B*T, 3C)
        if probe is not None:
            probe.projected(i, B * T)
        q, k, v = qkv.view(B, T, 3, nh, hs).permute(2, 0, 3, 1, 4).unbind(0)  # (B, nh, T, hs) each
        held = None if kv_cache is None else kv_cache.update(i, positions, k, v)
        if held is not None:
            k, v = held.keys, held.values  # (B, nh, S, hs)
        y = attend(q, k, v, held, positions, probe).transpose(1, 2).reshape(B * T, C)  # (B*T, C)
        x = project(y, w.attn_proj_weight, w.attn_proj_bias, w.attn_proj_packed).add_(x)
        h = F.layer_norm(x, (C,), w.ln_2_weight, w.ln_2_bias, eps)
        h = F.gelu(project(h, w.fc_weight, w.fc_bias, w.fc_packed), approximate="tanh")  # (B*T, 4C)
        x = project(h, w.mlp_proj_weight, w.mlp_proj_bias, w.mlp_proj_packed).add_(x)
    return x  # (B*T, C)
