"""Gemma 3's text decoder in one readable file: local and global layers, QK-norm, Gemma's RMSNorm, softcapping.

Gemma 3 interleaves two kinds of attention layer. A *local* layer (`sliding_attention`) lets each query see only the
last `sliding_window` positions, itself included, so its cache stops growing at the window; a *global* layer
(`full_attention`) sees every earlier position and keeps them all. By default five of every six layers are local,
which is why a Gemma 3 cache grows about six times slower than one of the same heads on every layer. The two kinds
turn their queries and keys with RoPE of different bases (10,000 locally, 1,000,000 globally; Gemma 3 4B and up also
turn the global layers 8 times slower: linear scaling). Each head's query and key are RMS-normed before RoPE
(QK-norm), and a score is q·k / sqrt(`query_pre_attn_scalar`) rather than / sqrt(head_dim).

Gemma's own habits: an RMSNorm whose weight is stored as an offset from 1 (x * (1 + w)), four norms a layer (before
and after attention, before and after the MLP), the token embeddings multiplied by sqrt(hidden_size), a gated MLP
on GELU (tanh), an output head tied to the embeddings, and, where the config sets it, tanh *softcapping* of the
final logits (cap * tanh(x / cap): none beyond ±cap). Gemma 2 capped its attention scores too; Gemma 3 normalizes
queries and keys instead, and transformers' Gemma 3 ignores `attn_logit_softcapping` (the format refuses it). Module
names follow transformers' Gemma3ForCausalLM checkpoint keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
from torch import nn

from kvviz.cache.attention import visible
from kvviz.cache.kv_cache import KVCache
from kvviz.cache.layers import Held, LayerKind
from kvviz.cache.probe import PassProbe
from kvviz.core.memory import Architecture, LayerShape
from kvviz.core.records import CachePolicy

LOCAL, GLOBAL = "sliding_attention", "full_attention"  # transformers' names of the two kinds, in `layer_types`


def local_and_global(n_layer: int, pattern: int = 6) -> tuple[str, ...]:
    """Gemma 3's layers when `layer_types` does not list them: every `pattern`-th layer global, the rest local."""
    return tuple(GLOBAL if (i + 1) % pattern == 0 else LOCAL for i in range(n_layer))


@dataclass(frozen=True)
class Gemma3Config:
    """Shape of a Gemma 3 text model; transformers' names in the comments."""

    vocab_size: int = 262144
    n_ctx: int = 32768  # max_position_embeddings
    n_layer: int = 26  # num_hidden_layers
    n_head: int = 4  # num_attention_heads: query heads
    n_kv_head: int = 1  # num_key_value_heads: the heads the cache keeps
    n_embd: int = 1152  # hidden_size
    intermediate_size: int = 6912  # the gated MLP's width
    head_dim: int = 256
    rms_norm_eps: float = 1e-6
    layer_types: tuple[str, ...] = ()  # LOCAL or GLOBAL, a layer; (): five local to one global
    sliding_window: int = 512  # a local layer's query sees the last this many positions, itself included
    rope_theta: float = 1_000_000.0  # the global layers' RoPE base ...
    rope_factor: float = 1.0  # ... and their linear scaling: positions turn this many times slower (4B and up: 8)
    rope_local_theta: float = 10_000.0  # rope_local_base_freq: the local layers' base ...
    rope_local_factor: float = 1.0  # ... and their linear scaling
    query_pre_attn_scalar: int = 256  # a score is q·k / sqrt(this)
    final_logit_softcapping: float = 0.0  # the logits pass through cap * tanh(logit / cap) (0: they do not)
    name: str = field(default="custom", compare=False)

    tie_word_embeddings = True  # the output head is the embedding matrix, in every Gemma 3

    def __post_init__(self) -> None:
        for key in ("vocab_size", "n_ctx", "n_layer", "n_head", "n_kv_head", "n_embd", "intermediate_size",
                    "head_dim", "rope_theta", "rope_factor", "rope_local_theta", "rope_local_factor",
                    "query_pre_attn_scalar"):
            if not getattr(self, key) > 0:
                raise ValueError(f"config {key} must be positive, got {getattr(self, key)}")
        if self.n_head % self.n_kv_head:
            raise ValueError(f"config n_head={self.n_head} is not a multiple of n_kv_head={self.n_kv_head}")
        if self.head_dim % 2:
            raise ValueError(f"a head of {self.head_dim} numbers is odd: RoPE turns a head's numbers in pairs")
        if self.layer_types and (len(self.layer_types) != self.n_layer
                                 or any(kind not in (LOCAL, GLOBAL) for kind in self.layer_types)):
            raise ValueError(f"layer_types must list {self.n_layer} layers, each {LOCAL} or {GLOBAL}")
        if self.final_logit_softcapping < 0:
            raise ValueError(f"config final_logit_softcapping must be 0 (none) or positive, got "
                             f"{self.final_logit_softcapping}")
        if LOCAL in self.kinds and self.sliding_window <= 0:
            raise ValueError(f"local layers need a sliding window, got {self.sliding_window}")

    @property
    def kinds(self) -> tuple[str, ...]:
        """Each layer's kind, from the bottom layer: LOCAL or GLOBAL."""
        return self.layer_types or local_and_global(self.n_layer)

    def with_name(self, name: str) -> Gemma3Config:
        return replace(self, name=name)

    # The family's facts about its cache, which the engine asks for and never works out itself.
    own_window = (0, 0)  # its windows are its local layers', part of the model (cache_layers), not a run's policy
    sinks_stream = False  # it refuses sinks
    cache_parts = ()  # a cached position is a key and a value per KV head
    head_key_value = ()

    def cache_layers(self, policy: CachePolicy) -> tuple[LayerKind, ...]:
        """A window of `sliding_window` positions on each local layer, every position on each global one, with or
        without a cache: transformers' local layers see that window whatever the run."""
        refusal = self.cache_refusal(policy)
        if refusal:
            raise ValueError(refusal)
        local = LayerKind("window", self.n_kv_head, self.head_dim, window=self.sliding_window)
        full = LayerKind("full", self.n_kv_head, self.head_dim)
        return tuple(local if kind == LOCAL else full for kind in self.kinds)

    def cache_refusal(self, policy: CachePolicy) -> str:
        if policy.lossy:
            return (f"{self.name} keeps its own sliding windows (on its local layers): kvviz runs it as it is, "
                    "without another window, sinks, eviction by importance or a quantized cache")
        return ""

    def cache_shape(self, source: str = "the model's config") -> Architecture:
        """What each layer's cache holds, for the memory figures: a window's positions on a local layer, every
        position on a global one."""
        kind = "mha" if self.n_kv_head == self.n_head else "mqa" if self.n_kv_head == 1 else "gqa"
        shapes = tuple(LayerShape("window", self.n_kv_head, self.head_dim, window=self.sliding_window)
                       if layer == LOCAL else LayerShape("full", self.n_kv_head, self.head_dim)
                       for layer in self.kinds)
        return Architecture(name=self.name, attention=kind, layers=self.n_layer, kv_heads=self.n_kv_head,
                            head_dim=self.head_dim, context=self.n_ctx, source=source, layer_shapes=shapes)


PRESETS: dict[str, Gemma3Config] = {  # published shapes, for untrained weights (random:<name>)
    # Gemma 3 1B's layers (26: five local to one global, window 512; 4 query heads on 1 KV head of 256), with
    # GPT-2's vocabulary instead of its 262,144 tokens: the cache is the real model's, position for position, and
    # the weights are 756M parameters (3.0 GB in float32) instead of 1.0 billion (4.0 GB).
    "gemma-3-1b": Gemma3Config(vocab_size=50257, n_ctx=32768, n_layer=26, n_head=4, n_kv_head=1, n_embd=1152,
                               intermediate_size=6912, head_dim=256, layer_types=local_and_global(26),
                               sliding_window=512, name="gemma-3-1b"),
    # Gemma 3 270M whole, its vocabulary too: 268M parameters (1.07 GB in float32), 18 layers, window 512.
    "gemma-3-270m": Gemma3Config(vocab_size=262144, n_ctx=32768, n_layer=18, n_head=4, n_kv_head=1, n_embd=640,
                                 intermediate_size=2048, head_dim=256, layer_types=local_and_global(18),
                                 sliding_window=512, name="gemma-3-270m"),
}
# A shape no one published, for the lesson on layers that keep different caches: Gemma 3 270M with every layer global.
PRESETS["gemma-3-270m-global"] = replace(PRESETS["gemma-3-270m"], layer_types=(GLOBAL,) * 18,
                                         name="gemma-3-270m-global")
# Gemma 3's layers at kvviz-shakespeare's size, for the lesson (a few MB of weights load at once): five local layers
# with a window of 64 to one global, and the same with every layer global.
PRESETS["kvviz-gemma3-mini"] = Gemma3Config(vocab_size=50257, n_ctx=8192, n_layer=6, n_head=4, n_kv_head=1, n_embd=192,
                                            intermediate_size=512, head_dim=48, layer_types=local_and_global(6),
                                            sliding_window=64, query_pre_attn_scalar=48, name="kvviz-gemma3-mini")
PRESETS["kvviz-gemma3-mini-global"] = replace(PRESETS["kvviz-gemma3-mini"], layer_types=(GLOBAL,) * 6,
                                              name="kvviz-gemma3-mini-global")


class RMSNorm(nn.Module):
    """x / sqrt(mean(x²) + eps) * (1 + weight): Gemma stores each channel's scale as an offset from 1 (a weight of
    0 leaves x as it is); computed in float32 whatever the weights' dtype, and rounded back once at the end."""

    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * (1.0 + self.weight.float())).to(x.dtype)


def rope_angles(positions: torch.Tensor, head_dim: int, theta: float, factor: float, dtype: torch.dtype):
    """cos and sin (T, head_dim) of RoPE at `positions` (T,): pair i of a head turns by position * theta^(-2i/d),
    `factor` times slower under linear scaling."""
    frequencies = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=positions.device).float() / head_dim)
    angles = positions.float()[:, None] * (frequencies / factor)[None, :]  # (T, d/2)
    angles = torch.cat((angles, angles), dim=-1)  # (T, d): the halves of a head rotate together
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Turn each pair (x[i], x[i + d/2]) of every head of `x` (B, h, T, d) by its position's angle."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, held: Held, positions: torch.Tensor,
              scale: float, probe: PassProbe | None) -> torch.Tensor:
    """softmax(q·Kᵀ·scale, masked)·V for `q` (B, nh, T, d) over the KV heads' `k`, `v` (B, nkv, S, d): query head h
    reads KV head h // (nh / nkv) in place, without a copy for each query head. The mask is `held`'s: causal, and a
    local layer's window (one query of a global layer sees every key held: no mask). The probe, where it asks,
    records the newest query's weights."""
    T = q.shape[2]
    seen = None if T == 1 and not held.window else visible(held, positions)  # (T, S): True where a query sees a key
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=seen, scale=scale, enable_gqa=True)  # (B, nh, T, d)
    if probe is not None and probe.attention is not None:
        probe.attention.append(newest_weights(q, k, held, positions, scale))
    return y


def newest_weights(q: torch.Tensor, k: torch.Tensor, held: Held, positions: torch.Tensor,
                   scale: float) -> torch.Tensor:
    """The newest query's attention weights (nh, positions) in float32, each key's at its position (0 where a
    local layer's window no longer reaches): what the attention view draws."""
    B, nh, T, d = q.shape
    if B != 1:
        raise ValueError(f"attention weights are recorded for one sequence, not a batch of {B}")
    keys = k[0].repeat_interleave(nh // k.shape[1], dim=0)  # (nh, S, d)
    scores = (q[0, :, -1:, :] @ keys.transpose(-2, -1))[:, 0].float() * scale  # (nh, S)
    scores = scores.masked_fill(~visible(held, positions[-1:])[0], float("-inf"))
    weights = torch.softmax(scores, dim=-1)  # (nh, S)
    at = held.positions if held.positions is not None else torch.arange(keys.shape[1], device=q.device)
    return weights.new_zeros(nh, int(positions[-1]) + 1).index_copy_(1, at, weights)


class Attention(nn.Module):
    """Grouped-query attention with QK-norm, on a local layer's window or every position (a global layer)."""

    def __init__(self, config: Gemma3Config, layer_index: int) -> None:
        super().__init__()
        self.layer_index = layer_index
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.n_kv_head, config.head_dim
        self.scale = config.query_pre_attn_scalar ** -0.5
        self.window = config.sliding_window if config.kinds[layer_index] == LOCAL else 0
        C, hd = config.n_embd, config.head_dim
        self.q_proj = nn.Linear(C, config.n_head * hd, bias=False)
        self.k_proj = nn.Linear(C, config.n_kv_head * hd, bias=False)
        self.v_proj = nn.Linear(C, config.n_kv_head * hd, bias=False)
        self.o_proj = nn.Linear(config.n_head * hd, C, bias=False)
        self.q_norm = RMSNorm(hd, config.rms_norm_eps)
        self.k_norm = RMSNorm(hd, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                kv_cache: KVCache | None, probe: PassProbe | None = None) -> torch.Tensor:
        B, T, C = x.shape  # (B, T, C)
        hd = self.head_dim
        q = self.q_proj(x).view(B, T, self.n_head, hd).transpose(1, 2)  # (B, nh, T, hd)
        k = self.k_proj(x).view(B, T, self.n_kv_head, hd).transpose(1, 2)  # (B, nkv, T, hd)
        v = self.v_proj(x).view(B, T, self.n_kv_head, hd).transpose(1, 2)  # (B, nkv, T, hd)
        if probe is not None:
            probe.projected(self.layer_index, B * T)
        q, k = self.q_norm(q), self.k_norm(k)  # QK-norm: over each head's numbers, before RoPE
        q, k = rotate(q, *rope), rotate(k, *rope)  # keys are cached already turned to their positions
        if kv_cache is None:  # this pass's own rows, seen as the layer sees them: causal, within a local window
            held = Held(k, v, positions, self.window)
        else:
            held = kv_cache.update(self.layer_index, positions, k, v)  # (B, nkv, S, hd): what the layer holds
        y = attention(q, held.keys, held.values, held, positions, self.scale, probe)  # (B, nh, T, hd)
        y = y.transpose(1, 2).reshape(B, T, self.n_head * hd)  # (B, T, nh * hd)
        return self.o_proj(y)


class GatedMLP(nn.Module):
    """down(gelu_tanh(gate(x)) * up(x))."""

    def __init__(self, config: Gemma3Config) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.n_embd, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.n_embd, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.gelu(self.gate_proj(x), approximate="tanh") * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Attention and the MLP, each between two norms: one on its input and one on its output, before the
    residual add."""

    def __init__(self, config: Gemma3Config, layer_index: int) -> None:
        super().__init__()
        self.kind = config.kinds[layer_index]  # LOCAL or GLOBAL: which window and which RoPE
        self.input_layernorm = RMSNorm(config.n_embd, config.rms_norm_eps)
        self.self_attn = Attention(config, layer_index)
        self.post_attention_layernorm = RMSNorm(config.n_embd, config.rms_norm_eps)
        self.pre_feedforward_layernorm = RMSNorm(config.n_embd, config.rms_norm_eps)
        self.mlp = GatedMLP(config)
        self.post_feedforward_layernorm = RMSNorm(config.n_embd, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                kv_cache: KVCache | None, probe: PassProbe | None = None) -> torch.Tensor:
        attended = self.self_attn(self.input_layernorm(x), positions, rope, kv_cache, probe)
        x = x + self.post_attention_layernorm(attended)
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class Gemma3(nn.Module):
    """A Gemma 3 text decoder: token embeddings scaled by sqrt(hidden_size) (no learned positions: RoPE turns
    queries and keys), local and global layers, a final norm, and the embeddings as the output head, its logits
    softcapped where the config says."""

    def __init__(self, config: Gemma3Config) -> None:
        super().__init__()
        self.config = config
        self.model = nn.ModuleDict(dict(
            embed_tokens=nn.Embedding(config.vocab_size, config.n_embd,
                                      _weight=torch.empty(config.vocab_size, config.n_embd)),
            layers=nn.ModuleList(DecoderLayer(config, i) for i in range(config.n_layer)),
            norm=RMSNorm(config.n_embd, config.rms_norm_eps),
        ))

    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """Normal(0, 0.02) weights and norms of offset 0, a scale of 1 (transformers' initialisation)."""
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("norm.weight"):
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
        """The final norm's output (B, T, C) for `idx` (B, T)."""
        B, T = idx.shape
        cfg = self.config
        if positions is None:
            start = 0 if kv_cache is None else kv_cache.length
            positions = torch.arange(start, start + T, device=idx.device)
        if positions.dim() != 1:
            raise ValueError("the Gemma 3 family runs one sequence at a time (positions (T,))")
        if int(positions.max()) >= cfg.n_ctx:
            raise ValueError(f"position {int(positions.max())} is past the context length {cfg.n_ctx}")
        x = self.model.embed_tokens(idx)  # (B, T, C)
        x = x * torch.tensor(cfg.n_embd ** 0.5).to(x.dtype)  # scaled up in the model's dtype, as Gemma was trained
        ropes = {LOCAL: rope_angles(positions, cfg.head_dim, cfg.rope_local_theta, cfg.rope_local_factor, x.dtype),
                 GLOBAL: rope_angles(positions, cfg.head_dim, cfg.rope_theta, cfg.rope_factor, x.dtype)}  # (T, hd)
        for i, layer in enumerate(self.blocks):
            if probe is not None:
                probe.entering(i)
            x = layer(x, positions, ropes[layer.kind], kv_cache, probe)
        if last_only:
            x = x[:, -1:, :]  # (B, 1, C)
        return self.model.norm(x)

    def forward(self, idx: torch.Tensor, positions: torch.Tensor | None = None, kv_cache: KVCache | None = None,
                last_only: bool = False, probe: PassProbe | None = None) -> torch.Tensor:
        """Logits (B, T, V) for `idx` (B, T) at `positions` (T,); with `kv_cache`, attend to cached keys too."""
        x = self.hidden_states(idx, positions, kv_cache, last_only, probe)  # (B, T, C)
        logits = F.linear(x, self.head_weight)  # (B, T, V)
        cap = self.config.final_logit_softcapping
        return cap * torch.tanh(logits / cap) if cap else logits

    @property
    def head_weight(self) -> torch.Tensor:
        """The output head's (V, C) matrix: the token embeddings."""
        return self.model.embed_tokens.weight
