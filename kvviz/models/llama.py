"""A Llama-style decoder in one readable file: RMSNorm, rotary positions (RoPE), SwiGLU, and grouped-query
attention, with explicit positions and an optional KV cache.

The family of Llama 2 and 3, SmolLM2, Qwen2 (biases on q, k and v) and Mistral. Its cache keeps one key and
one value per *KV head*: with `n_kv_head` < `n_head`, each group of `n_head // n_kv_head` query heads reads the
same cached K/V (GQA; MQA when there is one KV head), so a position costs `n_head // n_kv_head` times fewer
bytes than in multi-head attention. Module names follow transformers' checkpoint keys.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
from torch import nn

from kvviz.cache.attention import attend
from kvviz.cache.kv_cache import KVCache
from kvviz.cache.layers import Held, LayerKind, head_layers, head_refusal
from kvviz.cache.probe import PassProbe
from kvviz.core.memory import Architecture
from kvviz.core.records import CachePolicy


@dataclass(frozen=True)
class LlamaConfig:
    """Shape of a Llama-style model; transformers' names in the comments."""

    vocab_size: int = 49152
    n_ctx: int = 2048  # max_position_embeddings
    n_layer: int = 30  # num_hidden_layers
    n_head: int = 9  # num_attention_heads: query heads
    n_kv_head: int = 3  # num_key_value_heads: the heads the cache keeps
    n_embd: int = 576  # hidden_size
    intermediate_size: int = 1536  # the SwiGLU's width
    head_size: int = 0  # head_dim; 0: n_embd // n_head
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    # Llama 3.1's RoPE scaling (rope_type "llama3"): (factor, low_freq_factor, high_freq_factor, the original
    # context); () for plain RoPE
    rope_scaling: tuple[float, float, float, float] = ()
    qkv_bias: bool = False  # biases on the q, k and v projections (Qwen2; Llama's attention_bias)
    qk_norm: bool = False  # Qwen3's: each head's query and key RMS-normed (weights of head_dim) before RoPE
    o_bias: bool = False  # a bias on the output projection too (Llama's attention_bias)
    tie_word_embeddings: bool = True  # the output head is the embedding matrix
    sliding_window: int = 0  # Mistral's: each query attends to the last this many positions (0: to all)
    window_first_layer: int = 0  # Qwen2's max_window_layers: the window is on this layer and those above
    name: str = field(default="custom", compare=False)

    def __post_init__(self) -> None:
        for key in ("vocab_size", "n_ctx", "n_layer", "n_head", "n_kv_head", "n_embd", "intermediate_size"):
            if int(getattr(self, key)) <= 0:
                raise ValueError(f"config {key} must be positive, got {getattr(self, key)}")
        if self.n_head % self.n_kv_head:
            raise ValueError(f"config n_head={self.n_head} is not a multiple of n_kv_head={self.n_kv_head}")
        if not self.head_size and self.n_embd % self.n_head:
            raise ValueError(f"config n_embd={self.n_embd} is not divisible by n_head={self.n_head}")
        if self.head_dim % 2:
            raise ValueError(f"a head of {self.head_dim} numbers is odd: RoPE turns a head's numbers in pairs")

    @property
    def head_dim(self) -> int:
        return self.head_size or self.n_embd // self.n_head

    @property
    def group_size(self) -> int:
        """Query heads per KV head: 1 is multi-head attention, n_head is multi-query attention."""
        return self.n_head // self.n_kv_head

    def with_name(self, name: str) -> LlamaConfig:
        return replace(self, name=name)

    # The family's facts about its cache, which the engine asks for and never works out itself.
    sinks_stream = True  # RoPE: with sinks, positions count within the cache, so a run goes on past n_ctx
    cache_parts = ()  # the parts of a cached position beyond a key and a value per KV head: none
    head_key_value = ()

    @property
    def own_window(self) -> tuple[int, int]:
        """Mistral's sliding window on every layer, Qwen2's from `max_window_layers` up: (window, first layer)."""
        return (self.sliding_window, self.window_first_layer if self.sliding_window else 0)

    def cache_layers(self, policy: CachePolicy) -> tuple[LayerKind, ...]:
        """The KV heads' keys and values in every layer (grouped- or multi-query attention when fewer than the
        query heads), under `policy`: windowed from its first windowed layer up."""
        return head_layers(self.n_layer, self.n_kv_head, self.head_dim, policy)

    def cache_refusal(self, policy: CachePolicy) -> str:
        if policy.importance and self.own_window[0]:
            return (f"{self.name} keeps its own sliding window of {self.own_window[0]} positions: kvviz evicts by "
                    "importance on models that attend to every position")
        return head_refusal(self.name, self.head_dim, policy)

    def cache_shape(self, source: str = "the model's config") -> Architecture:
        """What the cache holds a position, with the model's own window, for the memory figures."""
        kind = "mha" if self.n_kv_head == self.n_head else "mqa" if self.n_kv_head == 1 else "gqa"
        window, first_layer = self.own_window
        return Architecture(name=self.name, attention=kind, layers=self.n_layer, kv_heads=self.n_kv_head,
                            head_dim=self.head_dim, sliding_window=window or None, window_first_layer=first_layer,
                            context=self.n_ctx, source=source)


PRESETS: dict[str, LlamaConfig] = {  # published shapes, for untrained weights (random:<name>)
    "smollm2-135m": LlamaConfig(vocab_size=49152, n_ctx=8192, n_layer=30, n_head=9, n_kv_head=3, n_embd=576,
                                intermediate_size=1536, rope_theta=100000.0, name="smollm2-135m"),
    "smollm2-360m": LlamaConfig(vocab_size=49152, n_ctx=8192, n_layer=32, n_head=15, n_kv_head=5, n_embd=960,
                                intermediate_size=2560, rope_theta=100000.0, name="smollm2-360m"),
    "qwen2.5-0.5b": LlamaConfig(vocab_size=151936, n_ctx=32768, n_layer=24, n_head=14, n_kv_head=2, n_embd=896,
                                intermediate_size=4864, rms_norm_eps=1e-6, rope_theta=1000000.0, qkv_bias=True,
                                name="qwen2.5-0.5b"),
    # The second embedded model: kvviz-shakespeare's depth, width and query heads, three query heads per KV head.
    "kvviz-shakespeare-gqa": LlamaConfig(vocab_size=50257, n_ctx=256, n_layer=6, n_head=6, n_kv_head=2, n_embd=192,
                                         intermediate_size=512, name="kvviz-shakespeare-gqa"),
}
# Shapes no one published, for the lesson on sharing keys and values: the same models with one KV head (MQA),
# and with a KV head per query head (MHA).
PRESETS["kvviz-shakespeare-mqa"] = replace(PRESETS["kvviz-shakespeare-gqa"], n_kv_head=1, name="kvviz-shakespeare-mqa")
PRESETS["smollm2-135m-mha"] = replace(PRESETS["smollm2-135m"], n_kv_head=9, name="smollm2-135m-mha")


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


def rope_frequencies(head_dim: int, theta: float, scaling: tuple = (), device=None) -> torch.Tensor:
    """The turn per position of each pair i of a head (head_dim / 2,): theta^(-2i/d).

    With Llama 3's `scaling` (factor, low, high, original context L): a pair whose wavelength 2π/frequency is
    longer than L / low turns `factor` times slower (it would see positions it never saw in training); one
    shorter than L / high keeps its frequency; one between the two is blended, linearly in L / wavelength, from
    the slow turn to its own."""
    frequencies = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim)
    if not scaling:
        return frequencies
    factor, low, high, context = scaling
    wavelengths = 2 * math.pi / frequencies
    slow = frequencies / factor
    blend = ((context / wavelengths - low) / (high - low)).clamp(0.0, 1.0)  # 0: slow, 1: as it was
    blended = (1 - blend) * slow + blend * frequencies
    return torch.where(wavelengths > context / low, slow, torch.where(wavelengths < context / high, frequencies,
                                                                       blended))


def rope_angles(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype, scaling: tuple = ()):
    """cos and sin (T, head_dim) of RoPE at `positions` (T,): pair i of a head turns by position * its frequency
    (`rope_frequencies`)."""
    angles = positions.float()[:, None] * rope_frequencies(head_dim, theta, scaling, positions.device)[None, :]
    angles = torch.cat((angles, angles), dim=-1)  # (T, d): the halves of a head rotate together
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Turn each pair (x[i], x[i + d/2]) of every head of `x` (B, h, T, d) by its position's angle."""
    half = x.shape[-1] // 2
    turned = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + turned * sin


class Attention(nn.Module):
    """Grouped-query causal self-attention: keys and values are projected for `n_kv_head` heads only, rotated
    to their positions, written to the cache once, and read back by every query head of their group."""

    def __init__(self, config: LlamaConfig, layer_index: int) -> None:
        super().__init__()
        self.layer_index = layer_index
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.n_kv_head, config.head_dim
        self.rope_theta, self.rope_scaling = config.rope_theta, config.rope_scaling
        C, hd, bias = config.n_embd, config.head_dim, config.qkv_bias
        self.q_proj = nn.Linear(C, config.n_head * hd, bias=bias)
        self.k_proj = nn.Linear(C, config.n_kv_head * hd, bias=bias)
        self.v_proj = nn.Linear(C, config.n_kv_head * hd, bias=bias)
        self.o_proj = nn.Linear(config.n_head * hd, C, bias=config.o_bias)
        self.qk_norm = config.qk_norm
        if config.qk_norm:  # Qwen3: a query's and a key's size no longer grows with the projections' weights
            self.q_norm = RMSNorm(hd, config.rms_norm_eps)
            self.k_norm = RMSNorm(hd, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                kv_cache: KVCache | None, probe: PassProbe | None = None) -> torch.Tensor:
        B, T, C = x.shape  # (B, T, C)
        hd = self.head_dim
        q = self.q_proj(x).view(B, T, self.n_head, hd).transpose(1, 2)  # (B, nh, T, hd)
        k = self.k_proj(x).view(B, T, self.n_kv_head, hd).transpose(1, 2)  # (B, nkv, T, hd)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)  # over each head's numbers
        v = self.v_proj(x).view(B, T, self.n_kv_head, hd).transpose(1, 2)  # (B, nkv, T, hd)
        if probe is not None:
            probe.projected(self.layer_index, B * T)
        q_here = q
        q, k = rotate(q, *rope), rotate(k, *rope)  # keys are cached already turned to their positions
        held = None if kv_cache is None else kv_cache.update(self.layer_index, positions, k, v)
        if held is not None:
            k, v = held.keys, held.values  # (B, nkv, S, hd): what the layer's cache holds, this pass's rows too
        group = self.n_head // self.n_kv_head
        k = k.repeat_interleave(group, dim=1)  # (B, nh, S, hd): query head h reads KV head h // group
        v = v.repeat_interleave(group, dim=1)  # (B, nh, S, hd)
        y = attend(q, k, v, held, positions, probe, self.turned_for_sinks(q_here, positions, held))  # (B, nh, T, hd)
        y = y.transpose(1, 2).reshape(B, T, self.n_head * hd)  # (B, T, nh * hd)
        return self.o_proj(y)


    def turned_for_sinks(self, q: torch.Tensor, positions: torch.Tensor, held: Held | None) -> torch.Tensor | None:
        """`q` (B, nh, T, hd) turned to each query's position within the cache, where attention sinks keep the
        text's first positions (StreamingLLM): sinks, then the window, the query last. None on a layer without
        sinks, whose keys all keep their positions."""
        if held is None or not held.sinks:
            return None
        within = positions.clamp(max=held.sinks + held.window - 1)  # (T,): the window's keys keep their distances
        return rotate(q, *rope_angles(within, self.head_dim, self.rope_theta, q.dtype, self.rope_scaling))


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x))."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.n_embd, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.n_embd, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig, layer_index: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.n_embd, config.rms_norm_eps)
        self.self_attn = Attention(config, layer_index)
        self.post_attention_layernorm = RMSNorm(config.n_embd, config.rms_norm_eps)
        self.mlp = SwiGLU(config)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                kv_cache: KVCache | None, probe: PassProbe | None = None) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), positions, rope, kv_cache, probe)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    """A Llama-style decoder: token embeddings (no learned positions: RoPE turns queries and keys), pre-RMSNorm
    layers of grouped-query attention and SwiGLU, a final RMSNorm, and an output head tied to the embeddings
    or its own (`lm_head`)."""

    def __init__(self, config: LlamaConfig) -> None:
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
        """Normal(0, 0.02) weights, zero biases, unit norms (transformers' initializer_range)."""
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("bias"):
                    p.zero_()
                elif name.endswith("norm.weight") or name.endswith("layernorm.weight"):
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
        streaming = kv_cache is not None and kv_cache.streams  # positions count within the cache
        if int(positions.max()) >= self.config.n_ctx and not streaming:
            raise ValueError(f"position {int(positions.max())} is past the context length {self.config.n_ctx}")
        x = self.model.embed_tokens(idx)  # (B, T, C)
        rope = rope_angles(positions.flatten(), self.config.head_dim, self.config.rope_theta, x.dtype,
                           self.config.rope_scaling)  # (T, hd)
        if positions.dim() == 2:  # a position per row of a batch: (B, 1, T, hd), every head alike
            rope = tuple(r.view(B, 1, T, -1) for r in rope)
        for i, layer in enumerate(self.blocks):
            if probe is not None:
                probe.entering(i)
            x = layer(x, positions, rope, kv_cache, probe)
        if last_only:
            x = x[:, -1:, :]  # (B, 1, C)
        return self.model.norm(x)

    def forward(self, idx: torch.Tensor, positions: torch.Tensor | None = None, kv_cache: KVCache | None = None,
                last_only: bool = False, probe: PassProbe | None = None) -> torch.Tensor:
        """Logits (B, T, V) for `idx` (B, T) at `positions` (T,), or (B, T) for rows at different positions; with
        `kv_cache`, attend to cached keys too."""
        x = self.hidden_states(idx, positions, kv_cache, last_only, probe)  # (B, T, C)
        return F.linear(x, self.head_weight)  # (B, T, V)

    @property
    def head_weight(self) -> torch.Tensor:
        """The output head's (V, C) matrix: the token embeddings when tied, else `lm_head`'s."""
        return self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
