"""The Llama family's one-token cached step, fast: the arithmetic of `llama.Llama.forward` on a (1, 1) input,
written as plain tensor calls on weights gathered once per run, with RoPE's angles computed once per step
instead of once per layer and the query heads reading their group's K/V in place (no repeated copy); unless it
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
from kvviz.models.llama import Llama, rope_angles, rotate
from kvviz.models.products import packed_copy, project, tied_head, verifying_head


class Projection(NamedTuple):
    """One product's tensors: the (in, out) weight, its bias or None, and its packed copy or None."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    packed: torch.Tensor | None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return project(x, self.weight, self.bias, self.packed)


class LayerWeights(NamedTuple):
    """One decoder layer's tensors, read once per run by `decode_one` instead of once per token."""

    input_norm: torch.Tensor
    q: Projection
    k: Projection
    v: Projection
    o: Projection
    post_norm: torch.Tensor
    q_norm: torch.Tensor | None  # Qwen3's per-head norms of queries and keys, or None
    k_norm: torch.Tensor | None
    gate: Projection
    up: Projection
    down: Projection


def _projection(linear: torch.nn.Linear) -> Projection:
    weight = linear.weight.t()  # (in, out), as `products.Linear` multiplies by it
    return Projection(weight, linear.bias, packed_copy(weight))


def decode_weights(model: Llama) -> list[LayerWeights]:
    """Every layer's tensors for `decode_one`; take them again if the parameters are replaced."""
    return [LayerWeights(
        layer.input_layernorm.weight, *(_projection(getattr(layer.self_attn, f"{n}_proj")) for n in "qkvo"),
        layer.post_attention_layernorm.weight,
        *((layer.self_attn.q_norm.weight, layer.self_attn.k_norm.weight) if model.config.qk_norm else (None, None)),
        _projection(layer.mlp.gate_proj), _projection(layer.mlp.up_proj),
        _projection(layer.mlp.down_proj),
    ) for layer in model.blocks]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`llama.RMSNorm` as one function: the same operations in the same order."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def decode_one(model: Llama, token: int, position: int, kv_cache: KVCache, weights: list[LayerWeights] | None = None,
               probe: PassProbe | None = None) -> torch.Tensor:
    """Logits (1, V) for one token of a single sequence at `position`, attending to the cache: equal to
    `model(torch.tensor([[token]]), torch.tensor([position]), kv_cache, probe=probe)[0]`."""
    cfg = model.config
    nh, nkv, hd, eps = cfg.n_head, cfg.n_kv_head, cfg.head_dim, cfg.rms_norm_eps
    if position >= cfg.n_ctx:
        raise ValueError(f"position {position} is past the context length {cfg.n_ctx}")
    embeddings = model.model.embed_tokens.weight
    positions = torch.tensor([position], device=embeddings.device)
    cos, sin = rope_angles(positions, hd, cfg.rope_theta, embeddings.dtype, cfg.rope_scaling)  # (1, hd) each
    recording = probe is not None and probe.attention is not None
    x = embeddings[token].view(1, -1)  # (1, C)
    for i, w in enumerate(weights or decode_weights(model)):
        if probe is not None:
            probe.entering(i)
        h = rms_norm(x, w.input_norm, eps)
        q, k = w.q(h).view(1, nh, 1, hd), w.k(h).view(1, nkv, 1, hd)
        if w.q_norm is not None:
            q, k = rms_norm(q, w.q_norm, eps), rms_norm(k, w.k_norm, eps)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)  # (1, nh, 1, hd), (1, nkv, 1, hd)
        if probe is not None:
            probe.projected(i, 1)
        v = w.v(h).view(1, nkv, 1, hd)
        if recording:
            keys, values, *_ = kv_cache.update(i, position, k, v)  # (1, nkv, S, hd) each
            y = F.scaled_dot_product_attention(q, keys, values, enable_gqa=True)  # (1, nh, 1, hd): h reads h // group
            probe.attention.append(newest_query_weights(q, keys.repeat_interleave(nh // nkv, dim=1))[0])  # (nh, S)
        else:  # the layer's own read: a quantized one attends to its codes, no full-precision copy
            y = kv_cache.decode(i, position, q, k, v)  # (1, nh, 1, hd)
        x = x + w.o(y.view(1, nh * hd))
        h = rms_norm(x, w.post_norm, eps)
        x = x + w.down(F.silu(w.gate(h)) * w.up(h))
    x = rms_norm(x, model.model.norm.weight, eps)
    return tied_head(x, model.head_weight)  # (1, V)


def forward(model: Llama, idx: torch.Tensor, positions: torch.Tensor, kv_cache: KVCache | None,
            weights: list[LayerWeights] | None = None, probe: PassProbe | None = None) -> torch.Tensor:
    """Logits (B, V) of the last position of each row of `idx` (B, T) at `positions` ((T,), or (B, T) for rows at
    positions of their own), attending through `kv_cache` (None: causally, over the pass's own rows): any pass the
    engine runs, prefill, uncached or one token, on the products `decode_one` takes. Equal, within the rounding of
    another order of sums, to `model(idx, positions, kv_cache, last_only=True, probe=probe)[:, -1]`."""
    B, T = idx.shape
    return head(model, _layers(model, idx, positions, kv_cache, weights, probe).view(B, T, -1)[:, -1])  # (B, V)


def states(model: Llama, idx: torch.Tensor, positions: torch.Tensor, kv_cache: KVCache | None,
           weights: list[LayerWeights] | None = None, probe: PassProbe | None = None) -> torch.Tensor:
    """What the head reads at every position (B, T, C), before the final RMSNorm: speculative decoding's verifying
    pass, whose rows `head` turns into logits."""
    B, T = idx.shape
    return _layers(model, idx, positions, kv_cache, weights, probe).view(B, T, -1)


def head(model: Llama, x: torch.Tensor, verifying: bool = False) -> torch.Tensor:
    """Logits (M, V) of the layers' output `x` (M, C): the final RMSNorm and the head (`verifying`: every row of a
    verifying pass, products.verifying_head)."""
    x = rms_norm(x, model.model.norm.weight, model.config.rms_norm_eps)
    return (verifying_head if verifying else tied_head)(x, model.head_weight)  # (M, V)


def _layers(model: Llama, idx: torch.Tensor, positions: torch.Tensor, kv_cache: KVCache | None,
            weights: list[LayerWeights] | None, probe: PassProbe | None) -> torch.Tensor:
    """The layers' output (B*T, C) for `idx` (B, T) at `positions`, through `kv_cache`."""
    cfg = model.config
    nh, nkv, hd, eps = cfg.n_head, cfg.n_kv_head, cfg.head_dim, cfg.rms_norm_eps
    B, T = idx.shape
    streaming = kv_cache is not None and kv_cache.streams  # positions count within the cache
    if int(positions.max()) >= cfg.n_ctx and not streaming:
        raise ValueError(f"position {int(positions.max())} is past the context length {cfg.n_ctx}")
    embeddings = model.model.embed_tokens.weight
    cos, sin = rope_angles(positions.flatten(), hd, cfg.rope_theta, embeddings.dtype,
                           cfg.rope_scaling)  # (B*T or T, hd)
    if positions.dim() == 2:  # a position per row of a batch: (B, 1, T, hd), every head alike
        cos, sin = cos.view(B, 1, T, hd), sin.view(B, 1, T, hd)
    x = embeddings[idx].reshape(B * T, -1)  # (B*T, C)
    group = nh // nkv
    for i, w in enumerate(weights or decode_weights(model)):
        if probe is not None:
            probe.entering(i)
        h = rms_norm(x, w.input_norm, eps)
        q_here = w.q(h).view(B, T, nh, hd).transpose(1, 2)  # (B, nh, T, hd)
        k = w.k(h).view(B, T, nkv, hd).transpose(1, 2)  # (B, nkv, T, hd)
        if w.q_norm is not None:
            q_here, k = rms_norm(q_here, w.q_norm, eps), rms_norm(k, w.k_norm, eps)
        q = rotate(q_here, cos, sin)
        k = rotate(k, cos, sin)
        v = w.v(h).view(B, T, nkv, hd).transpose(1, 2)  # (B, nkv, T, hd)
        if probe is not None:
            probe.projected(i, B * T)
        held = None if kv_cache is None else kv_cache.update(i, positions, k, v)
        if held is not None:
            k, v = held.keys, held.values  # (B, nkv, S, hd)
        turned = model.blocks[i].self_attn.turned_for_sinks(q_here, positions, held)  # StreamingLLM, or None
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # (B, nh, S, hd)
        y = attend(q, k, v, held, positions, probe, turned).transpose(1, 2).reshape(B * T, nh * hd)
        x = x + w.o(y)
        h = rms_norm(x, w.post_norm, eps)
        x = x + w.down(F.silu(w.gate(h)) * w.up(h))
    return x  # (B*T, C)
