"""DeepSeek's ABSORBED decode step: multi-head latent attention that attends to the cached latents directly. Read
it after the naive teaching file, `deepseek.py`, whose arithmetic it keeps.

The teaching file rebuilds every head's key and value from every held latent at every pass: `kv_b_proj` over all
S latents, S x heads x (nope + v) numbers a step, most of a decode step's work at a long context. Here its two
halves move out of the loop over positions, as DeepSeek's own decode does. A head's score of position s is
q_nope_h · (W_uk_h c_s) + q_pe_h · k_pe_s = (q_nope_h W_uk_h) · c_s + q_pe_h · k_pe_s: the key half, W_uk_h
(nope, r), is multiplied into the query once, and the head scores the latents c_s (r numbers) themselves. Its
output is sum_s p_s (W_uv_h c_s) = W_uv_h (sum_s p_s c_s): the value half, W_uv_h (v, r), is multiplied once into
the weighted sum of the latents. No head's key or value is rebuilt for any held position, and what a step reads
of the cache is the latents, its bytes. The same sums in another order: the tests check the logits, the tokens
and the attention weights against the teaching forward.

A prefill (or any pass of more than one token) stays naive, as DeepSeek's does: `forward` is the teaching
forward's. Both take every projection's product spread over torch's threads (kvviz.models.spread), so that the
naive and the absorbed step differ in their attention only.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from kvviz.cache.kv_cache import KVCache
from kvviz.cache.probe import PassProbe
from kvviz.models import spread
from kvviz.models.deepseek import Deepseek, LatentAttention, rope_pairs, rotate_pairs
from kvviz.models.spread import Spread


class Absorbed(NamedTuple):
    """One layer's up-projection `kv_b_proj` split into its halves per head, views of its weight."""

    keys: torch.Tensor  # W_uk (nh, nope, r): the latent to a head's key without RoPE
    values: torch.Tensor  # W_uv (nh, v, r): the latent to a head's value


class Weights(NamedTuple):
    """What `decode_one` reads once per run: each layer's halves of the up-projection, and every projection's
    product spread over torch's threads (kvviz.models.spread), as the families without a fast file of their own
    take them."""

    absorbed: list[Absorbed]
    spreads: list[Spread]


def decode_weights(model: Deepseek) -> Weights:
    """Every layer's W_uk and W_uv and every projection's spread product for `decode_one` and `forward`, gathered
    once per run (take them again if the parameters are replaced)."""
    cfg = model.config
    nh, nope, vd, r = cfg.n_head, cfg.qk_nope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank
    absorbed = []
    for layer in model.blocks:
        up = layer.self_attn.kv_b_proj.weight.detach().view(nh, nope + vd, r)  # (nh, nope + v, r): rows per head
        absorbed.append(Absorbed(up[:, :nope], up[:, nope:]))  # (nh, nope, r), (nh, v, r)
    return Weights(absorbed, spread.decode_weights(model))


def forward(model: Deepseek, idx: torch.Tensor, positions: torch.Tensor, kv_cache: KVCache | None,
            weights: Weights | None = None, probe: PassProbe | None = None) -> torch.Tensor:
    """Logits (B, V) of the last position of each row of `idx` (B, T): the teaching forward's (naive), its products
    spread over the threads."""
    spreads = (weights if weights is not None else decode_weights(model)).spreads
    return spread.forward(model, idx, positions, kv_cache, spreads, probe)


def decode_one(model: Deepseek, token: int, position: int, kv_cache: KVCache, weights: Weights | None = None,
               probe: PassProbe | None = None) -> torch.Tensor:
    """Logits (1, V) for one token of a single sequence at `position`, attending to the cached latents (absorbed):
    equal, within float rounding, to `model(torch.tensor([[token]]), torch.tensor([position]), kv_cache,
    probe=probe)[:, -1]`."""
    cfg = model.config
    if position >= cfg.n_ctx:
        raise ValueError(f"position {position} is past the context length {cfg.n_ctx}")
    embeddings = model.model.embed_tokens.weight
    positions = torch.tensor([position], device=embeddings.device)
    rope = rope_pairs(positions, cfg.qk_rope_head_dim, cfg.rope_theta)  # cos, sin (1, rope/2)
    x = embeddings[token].view(1, 1, -1)  # (1, 1, C)
    weights = weights if weights is not None else decode_weights(model)
    with spread.spread_products(weights.spreads):
        for i, (layer, absorbed) in enumerate(zip(model.blocks, weights.absorbed, strict=True)):
            if probe is not None:
                probe.entering(i)
            h = layer.input_layernorm(x)
            x = x + absorbed_attention(layer.self_attn, absorbed, h, positions, rope, kv_cache, probe)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
    return F.linear(model.model.norm(x)[:, -1], model.head_weight)  # (1, V)


def absorbed_attention(attn: LatentAttention, absorbed: Absorbed, x: torch.Tensor, positions: torch.Tensor,
                       rope: tuple[torch.Tensor, torch.Tensor], kv_cache: KVCache,
                       probe: PassProbe | None) -> torch.Tensor:
    """`attn`'s output (1, 1, C) for one position's `x` (1, 1, C): its latent and RoPE key go to the cache as in
    the teaching file, then every head attends to the held latents through W_uk and W_uv (`absorbed`)."""
    cfg = attn.config
    nh, nope, rope_dim, vd, r = (cfg.n_head, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim,
                                 cfg.kv_lora_rank)
    q = attn.q_b_proj(attn.q_a_layernorm(attn.q_a_proj(x))) if cfg.q_lora_rank else attn.q_proj(x)
    q_nope, q_pe = q.view(nh, 1, nope + rope_dim).split((nope, rope_dim), dim=-1)  # (nh, 1, nope), (nh, 1, rope)
    c_kv, k_pe = attn.kv_a_proj_with_mqa(x).split((r, rope_dim), dim=-1)  # (1, 1, r), (1, 1, rope)
    if probe is not None:
        probe.projected(attn.layer_index, 1)
    c_kv = attn.kv_a_layernorm(c_kv)
    q_pe, k_pe = rotate_pairs(q_pe, *rope), rotate_pairs(k_pe, *rope)
    held = kv_cache.update(attn.layer_index, positions, c_kv, k_pe)
    latents, rope_keys = held.keys[0], held.values[0]  # (S, r), (S, rope): every position the layer holds
    q_latent = torch.bmm(q_nope, absorbed.keys).view(nh, r)  # (nh, r): q_nope_h W_uk_h, the key half absorbed
    scores = q_latent @ latents.t() + q_pe.view(nh, rope_dim) @ rope_keys.t()  # (nh, S): the teaching q·k
    weights = torch.softmax(scores.float() / math.sqrt(nope + rope_dim), dim=-1)  # (nh, S), float32
    if probe is not None and probe.attention is not None:  # the newest query's, as the teaching `attend` records
        probe.attention.append(weights)
    mixed = weights.to(latents.dtype) @ latents  # (nh, r): each head's weighted sum of the latents
    y = torch.bmm(mixed.view(nh, 1, r), absorbed.values.transpose(1, 2))  # (nh, 1, v): W_uv_h, the value half
    return attn.o_proj(y.view(1, 1, nh * vd))  # (1, 1, C)
