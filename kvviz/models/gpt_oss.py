"""A gpt-oss decoder in one readable file: grouped-query attention with learned attention sinks, sliding-window
layers alternating with full ones, YaRN's stretched RoPE, and a mixture-of-experts MLP.

What is new here against the Llama family:
- *Learned sinks*: each query head has one learned logit, `sinks`, that joins every softmax as an extra column with
  no value. A query can so give part of its attention to nothing (kvviz.cache.attention.attend's `sink_logits`);
  the sink keeps no cache entry. (StreamingLLM's sinks are something else: the first positions a window keeps.)
- *Its own windows*: the layers `layer_types` calls "sliding_attention" attend to the last `sliding_window`
  positions only (128 in the published models), and their caches keep no more; the others keep every position.
- *YaRN*: RoPE's slow pairs turn `factor` times slower than trained, its fast pairs as trained, the pairs between
  blended by a ramp over the pairs; cos and sin are scaled by YaRN's attention factor (`yarn_frequencies`).
- *Mixture of experts*: a router picks each token's top-k experts; each is a gated MLP with gpt-oss's clamp and
  sigmoid gate, and the token's output is their outputs weighted by a softmax over the chosen logits (`MoE`).

Module and parameter names follow transformers' gpt_oss checkpoint keys, so weights load by name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from kvviz.cache.attention import attend
from kvviz.cache.kv_cache import KVCache
from kvviz.cache.layers import LayerKind, PassLayer
from kvviz.cache.probe import PassProbe
from kvviz.core.memory import Architecture, LayerShape
from kvviz.core.records import EXACT, CachePolicy

SLIDING, FULL = "sliding_attention", "full_attention"  # transformers' layer_types


class Yarn(NamedTuple):
    """YaRN's RoPE scaling (rope_type "yarn"), transformers' names."""

    factor: float = 32.0  # how much longer a context than trained: the slow pairs turn this many times slower
    beta_fast: float = 32.0  # pairs that turn more than this often over the original context keep their frequency
    beta_slow: float = 1.0  # pairs that turn less than this often are slowed by the whole factor
    original_context: int = 4096  # original_max_position_embeddings
    truncate: bool = False  # round the ramp's ends to whole pairs
    attention_factor: float = 0.0  # cos and sin are scaled by it; 0: YaRN's mscale, 0.1 ln(factor) + 1


@dataclass(frozen=True)
class GptOssConfig:
    """Shape of a gpt-oss model; transformers' names in the comments."""

    vocab_size: int = 201088
    n_ctx: int = 131072  # max_position_embeddings
    n_layer: int = 24  # num_hidden_layers
    n_head: int = 64  # num_attention_heads: query heads
    n_kv_head: int = 8  # num_key_value_heads: the heads the cache keeps
    head_size: int = 64  # head_dim
    n_embd: int = 2880  # hidden_size
    n_expert: int = 32  # num_local_experts
    n_expert_used: int = 4  # num_experts_per_tok: the top-k each token is routed to
    expert_size: int = 2880  # intermediate_size: each expert's width
    swiglu_alpha: float = 1.702  # the gate's sigmoid gain
    swiglu_limit: float = 7.0  # the gate is clamped above, the up projection both ways, at this
    rms_norm_eps: float = 1e-5
    rope_theta: float = 150000.0
    yarn: Yarn | None = Yarn()  # None: plain RoPE
    attention_bias: bool = True  # biases on q, k, v and o
    sliding_window: int = 128
    layer_types: tuple[str, ...] = ()  # SLIDING or FULL, a layer; (): alternating, from a sliding layer 0
    tie_word_embeddings: bool = False
    name: str = field(default="custom", compare=False)

    def __post_init__(self) -> None:
        for key in ("vocab_size", "n_ctx", "n_layer", "n_head", "n_kv_head", "head_size", "n_embd", "n_expert",
                    "n_expert_used", "expert_size", "sliding_window"):
            if int(getattr(self, key)) <= 0:
                raise ValueError(f"config {key} must be positive, got {getattr(self, key)}")
        if self.n_head % self.n_kv_head:
            raise ValueError(f"config n_head={self.n_head} is not a multiple of n_kv_head={self.n_kv_head}")
        if self.head_size % 2:
            raise ValueError(f"a head of {self.head_size} numbers is odd: RoPE turns a head's numbers in pairs")
        if self.n_expert_used > self.n_expert:
            raise ValueError(f"config routes each token to {self.n_expert_used} of {self.n_expert} experts")
        if self.layer_types and (len(self.layer_types) != self.n_layer
                                 or any(kind not in (SLIDING, FULL) for kind in self.layer_types)):
            raise ValueError(f"layer_types must name {self.n_layer} layers, each {SLIDING} or {FULL}")

    @property
    def head_dim(self) -> int:
        return self.head_size

    @property
    def sliding(self) -> tuple[bool, ...]:
        """Per layer: does it attend to a sliding window (its cache keeping no more)?"""
        if self.layer_types:
            return tuple(kind == SLIDING for kind in self.layer_types)
        return tuple(layer % 2 == 0 for layer in range(self.n_layer))

    def with_name(self, name: str) -> GptOssConfig:
        return replace(self, name=name)

    # The family's facts about its cache, which the engine asks for and never works out itself.
    own_window = (0, 0)  # its windows are the model's own, layer by layer, in cache_layers; no user window
    sinks_stream = False  # it refuses StreamingLLM's sinks (its own sinks are learned logits, no positions)
    cache_parts = ()  # a cached position is a key and a value per KV head
    head_key_value = ()

    def cache_layers(self, policy: CachePolicy = EXACT) -> tuple[LayerKind, ...]:
        """The KV heads' keys and values: the last `sliding_window` positions on the sliding layers, every position
        on the full ones, whatever the policy (the windows are the model's; any other policy is refused)."""
        window = LayerKind("window", self.n_kv_head, self.head_dim, window=self.sliding_window)
        full = LayerKind("full", self.n_kv_head, self.head_dim)
        return tuple(window if sliding else full for sliding in self.sliding)

    def cache_refusal(self, policy: CachePolicy) -> str:
        if policy.lossy:
            return (f"{self.name} keeps its own sliding windows ({self.sliding_window} positions on its sliding "
                    "layers): kvviz runs it without --window, --sinks, --evict or --kv-dtype")
        return ""

    def cache_shape(self, source: str = "the model's config") -> Architecture:
        """What the cache holds a position, layer by layer, for the memory figures."""
        kind = "mha" if self.n_kv_head == self.n_head else "mqa" if self.n_kv_head == 1 else "gqa"
        shapes = tuple(LayerShape("window", self.n_kv_head, self.head_dim, window=self.sliding_window) if sliding
                       else LayerShape("full", self.n_kv_head, self.head_dim) for sliding in self.sliding)
        return Architecture(name=self.name, attention=kind, layers=self.n_layer, kv_heads=self.n_kv_head,
                            head_dim=self.head_dim, context=self.n_ctx, source=source, layer_shapes=shapes)


PRESETS: dict[str, GptOssConfig] = {  # for untrained weights (random:<name>)
    # gpt-oss-20b's attention (24 layers of 64 query heads on 8 KV heads of 64, a window of 128 on every other
    # layer, YaRN 32 on an original context of 4096, learned sinks) on a narrower residual stream (720, not 2880:
    # at 2880 its attention alone is 636M weights, 2.5 GB in float32), with 4 experts of 256 (top 2, not 32 of
    # 2880, top 4) and GPT-2's vocabulary (not 201,088): its cache is the real model's position for position
    # (4,096 bytes a layer and position in float32: 98,304 while the windows fill, the 12 full layers' 49,152 past
    # them), while its weights (285M) fit a laptop.
    "gpt-oss-20b-attention": GptOssConfig(vocab_size=50257, n_ctx=131072, n_layer=24, n_head=64, n_kv_head=8,
                                          head_size=64, n_embd=720, n_expert=4, n_expert_used=2, expert_size=256,
                                          sliding_window=128, name="gpt-oss-20b-attention"),
}


class RMSNorm(nn.Module):
    """x / sqrt(mean(x²) + eps), scaled per channel; computed in float32 whatever the weights' dtype."""

    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * x32).to(x.dtype)  # gpt-oss scales before it rounds back


def yarn_frequencies(head_dim: int, theta: float, yarn: Yarn | None) -> tuple[torch.Tensor, float]:
    """The turn per position of each pair i of a head (head_dim / 2,), and the factor cos and sin are scaled by.

    Plain RoPE turns pair i by theta^(-2i/d) a position. YaRN stretches the context `factor` times without
    retraining: a pair that turns many times over the original context (beta_fast or more) keeps its frequency
    (it has seen every angle: extrapolate), a pair that turns less than beta_slow times is slowed by the whole
    factor (interpolate: its angles stay in the range it was trained on), and the pairs between are blended by a
    ramp over the pair index. cos and sin are scaled by the attention factor (0.1 ln(factor) + 1 by default), which
    sharpens the softmax that the longer context would flatten."""
    base = theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)  # (hd/2,): theta^(2i/d)
    if yarn is None:
        return 1.0 / base, 1.0
    factor = yarn.factor
    extrapolated = 1.0 / base  # as trained
    interpolated = 1.0 / (factor * base)  # factor times slower

    def pair_turning(turns: float) -> float:
        """The (fractional) pair index whose wavelength fits `turns` times into the original context."""
        return head_dim * math.log(yarn.original_context / (turns * 2 * math.pi)) / (2 * math.log(theta))

    low, high = pair_turning(yarn.beta_fast), pair_turning(yarn.beta_slow)
    if yarn.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # a ramp of no width would divide by zero
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)  # 0: fast pairs
    keep = 1 - ramp  # how much of each pair's own frequency it keeps
    frequencies = interpolated * (1 - keep) + extrapolated * keep
    scale = yarn.attention_factor or (0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0)
    return frequencies, scale


def rope_angles(positions: torch.Tensor, head_dim: int, theta: float, yarn: Yarn | None, dtype: torch.dtype):
    """cos and sin (T, head_dim) of RoPE at `positions` (T,), scaled by YaRN's attention factor."""
    frequencies, scale = yarn_frequencies(head_dim, theta, yarn)
    angles = positions.float()[:, None] * frequencies.to(positions.device)[None, :]  # (T, hd/2)
    angles = torch.cat((angles, angles), dim=-1)  # (T, hd): the halves of a head rotate together
    return (angles.cos() * scale).to(dtype), (angles.sin() * scale).to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Turn each pair (x[i], x[i + d/2]) of every head of `x` (B, h, T, d) by its position's angle."""
    half = x.shape[-1] // 2
    turned = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + turned * sin


class Attention(nn.Module):
    """Grouped-query causal self-attention with a learned sink per query head, on a window or on every position."""

    def __init__(self, config: GptOssConfig, layer_index: int) -> None:
        super().__init__()
        self.layer_index = layer_index
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.n_kv_head, config.head_dim
        C, hd, bias = config.n_embd, config.head_dim, config.attention_bias
        self.q_proj = nn.Linear(C, config.n_head * hd, bias=bias)
        self.k_proj = nn.Linear(C, config.n_kv_head * hd, bias=bias)
        self.v_proj = nn.Linear(C, config.n_kv_head * hd, bias=bias)
        self.o_proj = nn.Linear(config.n_head * hd, C, bias=bias)
        self.sinks = nn.Parameter(torch.zeros(config.n_head))  # (nh,): each head's learned sink logit

    def forward(self, x: torch.Tensor, positions: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                kv_cache: KVCache, probe: PassProbe | None = None) -> torch.Tensor:
        B, T, C = x.shape  # (B, T, C)
        hd = self.head_dim
        q = self.q_proj(x).view(B, T, self.n_head, hd).transpose(1, 2)  # (B, nh, T, hd)
        k = self.k_proj(x).view(B, T, self.n_kv_head, hd).transpose(1, 2)  # (B, nkv, T, hd)
        v = self.v_proj(x).view(B, T, self.n_kv_head, hd).transpose(1, 2)  # (B, nkv, T, hd)
        if probe is not None:
            probe.projected(self.layer_index, B * T)
        q, k = rotate(q, *rope), rotate(k, *rope)  # keys are cached already turned to their positions
        held = kv_cache.update(self.layer_index, positions, k, v)  # the window's or every position's, with its mask
        # (B, nkv, S, hd) each, read in place: query head h reads KV head h // (nh // nkv), its sink beside them
        y = attend(q, held.keys, held.values, held, positions, probe, sink_logits=self.sinks)  # (B, nh, T, hd)
        y = y.transpose(1, 2).reshape(B, T, self.n_head * hd)  # (B, T, nh * hd)
        return self.o_proj(y)


class Experts(nn.Module):
    """`n_expert` gated MLPs of width I (`expert_size`), stored as transformers stores them: `gate_up_proj`
    (E, C, 2I) multiplies from the right (x @ W), its columns interleaved gate, up, gate, up, ...; `down_proj`
    (E, I, C); a bias each."""

    def __init__(self, config: GptOssConfig) -> None:
        super().__init__()
        E, C, width = config.n_expert, config.n_embd, config.expert_size
        self.gate_up_proj = nn.Parameter(torch.zeros(E, C, 2 * width))
        self.gate_up_proj_bias = nn.Parameter(torch.zeros(E, 2 * width))
        self.down_proj = nn.Parameter(torch.zeros(E, width, C))
        self.down_proj_bias = nn.Parameter(torch.zeros(E, C))
        self.alpha, self.limit = config.swiglu_alpha, config.swiglu_limit

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Expert `e` on the rows `x` (N, C): down((up + 1) * gate * sigmoid(alpha * gate)), gate and up clamped."""
        gate_up = x @ self.gate_up_proj[e] + self.gate_up_proj_bias[e]  # (N, 2I)
        gate, up = gate_up[:, 0::2], gate_up[:, 1::2]  # (N, I) each: the columns alternate
        gate = gate.clamp(max=self.limit)
        up = up.clamp(min=-self.limit, max=self.limit)
        glu = gate * torch.sigmoid(gate * self.alpha)
        return ((up + 1) * glu) @ self.down_proj[e] + self.down_proj_bias[e]  # (N, C)


class MoE(nn.Module):
    """Mixture of experts: the router scores every expert for each token, the top `n_expert_used` are run, and the
    token's output is their outputs weighted by a softmax over their scores (the experts not chosen get none)."""

    def __init__(self, config: GptOssConfig) -> None:
        super().__init__()
        self.top_k = config.n_expert_used
        self.router = nn.Linear(config.n_embd, config.n_expert)  # its weight (E, C) and bias (E,)
        self.experts = Experts(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        x = x.reshape(B * T, C)  # (N, C): every token on its own
        scores = self.router(x)  # (N, E)
        chosen_scores, chosen = scores.topk(self.top_k, dim=-1)  # (N, k) each: the best k experts of each token
        weights = torch.softmax(chosen_scores, dim=-1)  # (N, k): over the chosen experts only
        out = torch.zeros_like(x)  # (N, C)
        for e in chosen.unique().tolist():  # only the experts some token chose run, each on its tokens
            rows, slot = torch.where(chosen == e)  # the tokens that chose e (each once), and e's place in their top k
            out[rows] += self.experts.expert(e, x[rows]) * weights[rows, slot, None]  # (n, C): e's share of them
        return out.view(B, T, C)


class DecoderLayer(nn.Module):
    def __init__(self, config: GptOssConfig, layer_index: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.n_embd, config.rms_norm_eps)
        self.self_attn = Attention(config, layer_index)
        self.post_attention_layernorm = RMSNorm(config.n_embd, config.rms_norm_eps)
        self.mlp = MoE(config)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                kv_cache: KVCache, probe: PassProbe | None = None) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), positions, rope, kv_cache, probe)
        return x + self.mlp(self.post_attention_layernorm(x))


class GptOss(nn.Module):
    """A gpt-oss decoder: token embeddings (RoPE turns queries and keys), pre-RMSNorm layers of windowed or full
    attention with learned sinks and a mixture of experts, a final RMSNorm and an output head (`lm_head`, or the
    embeddings when tied)."""

    def __init__(self, config: GptOssConfig) -> None:
        super().__init__()
        self.config = config
        self.model = nn.ModuleDict(dict(
            embed_tokens=nn.Embedding(config.vocab_size, config.n_embd,
                                      _weight=torch.empty(config.vocab_size, config.n_embd)),
            layers=nn.ModuleList(DecoderLayer(config, i) for i in range(config.n_layer)),
            norm=RMSNorm(config.n_embd, config.rms_norm_eps),
        ))
        self.lm_head = None if config.tie_word_embeddings else nn.Linear(config.n_embd, config.vocab_size, bias=False)

    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """Normal(0, 0.02) weights, sinks and router bias, zero biases, unit norms (transformers' initialisation)."""
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                    p.fill_(1.0)
                elif name.endswith("bias") and not name.endswith("router.bias"):
                    p.zero_()
                else:
                    p.normal_(0.0, 0.02, generator=generator)

    @property
    def blocks(self) -> nn.ModuleList:
        return self.model.layers

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def hidden_states(self, idx: torch.Tensor, positions: torch.Tensor | None = None,
                      kv_cache: KVCache | None = None, last_only: bool = False,
                      probe: PassProbe | None = None) -> torch.Tensor:
        """The final RMSNorm's output (B, T, C) for `idx` (B, T). Without a cache the pass still attends as the
        model's windows say: through layers that keep nothing but mask as they would (PassLayer)."""
        B, T = idx.shape
        if positions is None:
            start = 0 if kv_cache is None else kv_cache.length
            positions = torch.arange(start, start + T, device=idx.device)
        if positions.dim() != 1:
            raise ValueError("the gpt-oss family runs one sequence at a time (positions (T,))")
        if int(positions.max()) >= self.config.n_ctx:
            raise ValueError(f"position {int(positions.max())} is past the context length {self.config.n_ctx}")
        kinds = self.config.cache_layers()
        through = kv_cache if kv_cache is not None else KVCache([PassLayer(kind.window) for kind in kinds])
        x = self.model.embed_tokens(idx)  # (B, T, C)
        rope = rope_angles(positions, self.config.head_dim, self.config.rope_theta, self.config.yarn, x.dtype)
        for i, layer in enumerate(self.blocks):
            if probe is not None:
                probe.entering(i)
            x = layer(x, positions, rope, through, probe)
        if last_only:
            x = x[:, -1:, :]  # (B, 1, C)
        return self.model.norm(x)

    def forward(self, idx: torch.Tensor, positions: torch.Tensor | None = None, kv_cache: KVCache | None = None,
                last_only: bool = False, probe: PassProbe | None = None) -> torch.Tensor:
        """Logits (B, T, V) for `idx` (B, T) at `positions` (T,); with `kv_cache`, attend to cached keys too."""
        x = self.hidden_states(idx, positions, kv_cache, last_only, probe)  # (B, T, C)
        return F.linear(x, self.head_weight)  # (B, T, V)

    @property
    def head_weight(self) -> torch.Tensor:
        """The output head's (V, C) matrix: `lm_head`'s, or the token embeddings when tied."""
        return self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
