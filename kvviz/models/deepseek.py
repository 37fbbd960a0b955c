"""A DeepSeek-V2-style decoder in one readable file: multi-head latent attention (MLA) with dense SwiGLU layers.

MLA caches one compressed *latent* per position and layer instead of a key and a value per head: `c_kv`, the
hidden state projected down to `kv_lora_rank` numbers (and RMS-normed), plus `k_pe`, a small key of
`qk_rope_head_dim` numbers that carries the position (RoPE) and is shared by every head. Each head's key and value
are rebuilt from the latent by one up-projection, `kv_b_proj`, every time attention runs: that is where this file
spends the memory it saves. This is the naive path, the lesson; `deepseek_fast.py` is DeepSeek's absorbed decode
step, which multiplies the up-projection into the query and the output instead and attends to the latents directly
(the same arithmetic, summed in another order). For DeepSeek-V3 the cache holds 512 + 64 numbers a layer and
position, where multi-head attention would hold 2 x 128 heads x 128.

The RoPE here turns pairs of neighbouring numbers (x[2i], x[2i+1]), as DeepSeek's checkpoints expect, not the two
halves of a head as Llama's does. Module names follow transformers' DeepseekV2 checkpoint keys. Mixture-of-experts
layers are not modelled: every layer's MLP is dense.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
from torch import nn

from kvviz.cache.attention import attend
from kvviz.cache.kv_cache import KVCache
from kvviz.cache.layers import LayerKind
from kvviz.cache.probe import PassProbe
from kvviz.core.memory import Architecture
from kvviz.core.records import CachePolicy


@dataclass(frozen=True)
class DeepseekConfig:
    """Shape of a DeepSeek-V2-style model with dense layers; transformers' names in the comments."""

    vocab_size: int = 102400
    n_ctx: int = 4096  # max_position_embeddings
    n_layer: int = 2  # num_hidden_layers
    n_head: int = 16  # num_attention_heads
    n_embd: int = 2048  # hidden_size
    intermediate_size: int = 10944
    kv_lora_rank: int = 512  # the latent c_kv: what the cache keeps of the keys and values, per position
    q_lora_rank: int = 0  # queries through a low-rank bottleneck too (0: one projection, as in V2-Lite)
    qk_nope_head_dim: int = 128  # each head's key and query numbers without RoPE, rebuilt from the latent
    qk_rope_head_dim: int = 64  # the RoPE part of every head's query, and the one RoPE key all heads share
    v_head_dim: int = 128
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False
    name: str = field(default="custom", compare=False)

    def __post_init__(self) -> None:
        for key in ("vocab_size", "n_ctx", "n_layer", "n_head", "n_embd", "intermediate_size", "kv_lora_rank",
                    "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            if int(getattr(self, key)) <= 0:
                raise ValueError(f"config {key} must be positive, got {getattr(self, key)}")
        if self.qk_rope_head_dim % 2:
            raise ValueError(f"config qk_rope_head_dim={self.qk_rope_head_dim} must be even: RoPE turns pairs")

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def latent_dim(self) -> int:
        """Numbers the cache keeps per position and layer: the latent and the shared RoPE key."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def n_kv_head(self) -> int:
        """The cache keeps one latent per position, whatever the heads: views count it as one cached head."""
        return 1

    @property
    def head_dim(self) -> int:
        """The numbers of that one cached 'head': the latent and the RoPE key."""
        return self.latent_dim

    def with_name(self, name: str) -> DeepseekConfig:
        return replace(self, name=name)

    # The family's facts about its cache, which the engine asks for and never works out itself.
    own_window = (0, 0)  # no sliding window of its own
    sinks_stream = False  # it refuses windows, so it has no sinks

    @property
    def cache_parts(self) -> tuple[tuple[str, int], ...]:
        """A cached position's parts, shared by every head: the latent and the RoPE key."""
        return (("latent c_kv", self.kv_lora_rank), ("RoPE key k_pe", self.qk_rope_head_dim))

    @property
    def head_key_value(self) -> tuple[int, int]:
        """The numbers of each head's key and value, rebuilt from the latent at every pass."""
        return (self.qk_head_dim, self.v_head_dim)

    def cache_layers(self, policy: CachePolicy) -> tuple[LayerKind, ...]:
        """One latent and one RoPE key a position in every layer (multi-head latent attention)."""
        return (LayerKind("latent", rank=self.kv_lora_rank, rope_dim=self.qk_rope_head_dim),) * self.n_layer

    def cache_refusal(self, policy: CachePolicy) -> str:
        if policy.lossy:
            return (f"{self.name} caches latents (MLA): kvviz windows, evicts by importance and quantizes per-head "
                    "caches only")
        return ""

    def cache_shape(self, source: str = "the model's config") -> Architecture:
        """What the cache holds a position, for the memory figures (kvviz.core.memory)."""
        return Architecture(name=self.name, attention="mla", layers=self.n_layer, latent_dim=self.kv_lora_rank,
                            rope_dim=self.qk_rope_head_dim, context=self.n_ctx, source=source)


PRESETS: dict[str, DeepseekConfig] = {  # for untrained weights (random:<name>)
    # DeepSeek-V2-Lite's attention (27 layers of 16 heads, latent 512, RoPE key 64, no query bottleneck) with a
    # narrower residual stream and MLP, dense, and GPT-2's vocabulary: its cache is the real model's, position for
    # position (27 x 576 numbers), while its weights (183M) fit a laptop.
    "deepseek-v2-lite-attention": DeepseekConfig(vocab_size=50257, n_ctx=4096, n_layer=27, n_head=16, n_embd=512,
                                                 intermediate_size=512, kv_lora_rank=512, qk_nope_head_dim=128,
                                                 qk_rope_head_dim=64, v_head_dim=128, tie_word_embeddings=True,
                                                 name="deepseek-v2-lite-attention"),
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
        return self.weight * x32.to(x.dtype)


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x))."""

    def __init__(self, config: DeepseekConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.n_embd, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.n_embd, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def rope_pairs(positions: torch.Tensor, dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (T, dim/2) at `positions` (T,): pair i turns by position * theta^(-2i/dim)."""
    inverse_frequencies = 1.0 / theta ** (torch.arange(0, dim, 2, device=positions.device).float() / dim)
    angles = positions.float()[:, None] * inverse_frequencies[None, :]  # (T, dim/2)
    return angles.cos(), angles.sin()


def rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Turn each pair (x[2i], x[2i+1]) of `x` (..., T, dim) by its position's angle, in float32."""
    pairs = x.float().unflatten(-1, (-1, 2))  # (..., T, dim/2, 2)
    even, odd = pairs[..., 0], pairs[..., 1]
    turned = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
    return turned.flatten(-2).to(x.dtype)  # (..., T, dim)


class LatentAttention(nn.Module):
    """Multi-head latent attention: the keys and values of every head come from one cached latent per position,
    rebuilt for every held position at every pass (the naive path; deepseek_fast.py's decode step absorbs them)."""

    def __init__(self, config: DeepseekConfig, layer_index: int) -> None:
        super().__init__()
        self.layer_index = layer_index
        self.config = config
        C, nh = config.n_embd, config.n_head
        if config.q_lora_rank:
            self.q_a_proj = nn.Linear(C, config.q_lora_rank, bias=False)
            self.q_a_layernorm = RMSNorm(config.q_lora_rank, 1e-6)
            self.q_b_proj = nn.Linear(config.q_lora_rank, nh * config.qk_head_dim, bias=False)
        else:
            self.q_proj = nn.Linear(C, nh * config.qk_head_dim, bias=False)
        # down: the hidden state to the latent and the shared RoPE key, which the cache keeps
        self.kv_a_proj_with_mqa = nn.Linear(C, config.kv_lora_rank + config.qk_rope_head_dim, bias=False)
        self.kv_a_layernorm = RMSNorm(config.kv_lora_rank, 1e-6)
        # up: the latent to every head's key (without RoPE) and value, rebuilt at every pass
        self.kv_b_proj = nn.Linear(config.kv_lora_rank, nh * (config.qk_nope_head_dim + config.v_head_dim), bias=False)
        self.o_proj = nn.Linear(nh * config.v_head_dim, C, bias=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                kv_cache: KVCache | None, probe: PassProbe | None = None) -> torch.Tensor:
        cfg = self.config
        B, T, C = x.shape  # (B, T, C)
        nh, nope, rope_dim, vd, r = cfg.n_head, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim, \
            cfg.kv_lora_rank
        if cfg.q_lora_rank:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        else:
            q = self.q_proj(x)
        q = q.view(B, T, nh, nope + rope_dim).transpose(1, 2)  # (B, nh, T, nope + rope)
        q_nope, q_pe = q.split((nope, rope_dim), dim=-1)
        c_kv, k_pe = self.kv_a_proj_with_mqa(x).split((r, rope_dim), dim=-1)  # (B, T, r), (B, T, rope)
        if probe is not None:
            probe.projected(self.layer_index, B * T)
        c_kv = self.kv_a_layernorm(c_kv)
        q_pe, k_pe = rotate_pairs(q_pe, *rope), rotate_pairs(k_pe, *rope)  # the latent itself carries no position
        held = None if kv_cache is None else kv_cache.update(self.layer_index, positions, c_kv, k_pe)
        if held is not None:
            c_kv, k_pe = held.keys, held.values  # (B, S, r), (B, S, rope): every latent the layer holds
        S = c_kv.shape[1]
        kv = self.kv_b_proj(c_kv).view(B, S, nh, nope + vd).transpose(1, 2)  # (B, nh, S, nope + vd): the up-projection
        k_nope, v = kv.split((nope, vd), dim=-1)
        k = torch.cat((k_nope, k_pe[:, None].expand(B, nh, S, rope_dim)), dim=-1)  # (B, nh, S, nope + rope)
        q = torch.cat((q_nope, q_pe), dim=-1)  # (B, nh, T, nope + rope)
        scale = 1.0 / math.sqrt(nope + rope_dim)
        y = attend(q, k, v, held, positions, probe, scale=scale)  # (B, nh, T, vd)
        y = y.transpose(1, 2).reshape(B, T, nh * vd)  # (B, T, nh * vd)
        return self.o_proj(y)


class DecoderLayer(nn.Module):
    def __init__(self, config: DeepseekConfig, layer_index: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.n_embd, config.rms_norm_eps)
        self.self_attn = LatentAttention(config, layer_index)
        self.post_attention_layernorm = RMSNorm(config.n_embd, config.rms_norm_eps)
        self.mlp = SwiGLU(config)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                kv_cache: KVCache | None, probe: PassProbe | None = None) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), positions, rope, kv_cache, probe)
        return x + self.mlp(self.post_attention_layernorm(x))


class Deepseek(nn.Module):
    """A DeepSeek-V2-style decoder: token embeddings, pre-RMSNorm layers of latent attention and SwiGLU, a final
    RMSNorm and an output head (`lm_head`, or the embeddings when tied)."""

    def __init__(self, config: DeepseekConfig) -> None:
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
        """Normal(0, 0.02) weights, unit norms (transformers' initializer_range)."""
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                    p.fill_(1.0)
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
        """The final RMSNorm's output (B, T, C) for `idx` (B, T)."""
        B, T = idx.shape
        if positions is None:
            start = 0 if kv_cache is None else kv_cache.length
            positions = torch.arange(start, start + T, device=idx.device)
        if positions.dim() != 1:
            raise ValueError("the DeepSeek family runs one sequence at a time (positions (T,))")
        if int(positions.max()) >= self.config.n_ctx:
            raise ValueError(f"position {int(positions.max())} is past the context length {self.config.n_ctx}")
        x = self.model.embed_tokens(idx)  # (B, T, C)
        rope = rope_pairs(positions, self.config.qk_rope_head_dim, self.config.rope_theta)  # cos, sin (T, rope/2)
        for i, layer in enumerate(self.blocks):
            if probe is not None:
                probe.entering(i)
            x = layer(x, positions, rope, kv_cache, probe)
        if last_only:
            x = x[:, -1:, :]  # (B, 1, C)
        return self.model.norm(x)

    def forward(self, idx: torch.Tensor, positions: torch.Tensor | None = None, kv_cache: KVCache | None = None,
                last_only: bool = False, probe: PassProbe | None = None) -> torch.Tensor:
        """Logits (B, T, V) for `idx` (B, T) at `positions` (T,); with `kv_cache`, attend to cached latents too."""
        x = self.hidden_states(idx, positions, kv_cache, last_only, probe)  # (B, T, C)
        return F.linear(x, self.head_weight)  # (B, T, V)

    @property
    def head_weight(self) -> torch.Tensor:
        """The output head's (V, C) matrix: `lm_head`'s, or the token embeddings when tied."""
        return self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
