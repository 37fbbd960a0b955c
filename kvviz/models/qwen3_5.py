"""A Qwen3.5-style hybrid decoder in one readable file: Gated DeltaNet layers and gated attention layers, three to
one, with dense SwiGLU MLPs.

Most of its layers are *linear attention* (Gated DeltaNet): instead of keeping every position's key and value,
such a layer folds each one into a fixed-size state as it goes, one matrix S of k_dim x v_dim numbers a value head,
and reads the state with its query. Per position t, for one head (q and k L2-normed, q scaled by 1/sqrt(k_dim)):

    S_t = exp(g_t) * S_{t-1}                        the state decays (g_t <= 0: a gate the token chooses)
    S_t = S_t + k_t (beta_t * (v_t - S_t^T k_t))^T  the delta rule: write the part of v_t that S does not yet
                                                    recall for k_t, at the rate beta_t in (0, 1)
    o_t = S_t^T q_t                                 the read

Before that, q, k and v pass a short causal convolution (a window of `linear_conv_kernel_dim` positions, one
filter a channel); after it, a gated RMSNorm (by z, a fourth projection) and the output projection. Its cache
(kvviz.cache.state.StateLayer) is that state and the convolution's last kernel - 1 inputs: a constant size,
whatever the length. Every fourth layer is *gated attention*: GQA whose query projection also emits a sigmoid
gate on its output, with each head's query and key RMS-normed and RoPE on a part of each head only
(`partial_rotary_factor`); those layers keep every position's keys and values, as a Llama layer does.

The recurrence runs one position at a time here, for a prompt too: it is what decoding does, and exact (transformers
runs a prompt through the same rule in chunks, with matrix algebra). Qwen3.5's RoPE has multimodal sections (mrope:
time, height, width); on text every section takes the token's position, which is plain RoPE. Its RMSNorms scale by
(1 + weight), the gated one by its weight. Module names follow transformers' Qwen3_5ForCausalLM checkpoint keys.
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
from kvviz.core.memory import Architecture, LayerShape
from kvviz.core.records import CachePolicy
from kvviz.models.llama import rope_angles, rotate

LINEAR, FULL = "linear_attention", "full_attention"


@dataclass(frozen=True)
class Qwen35Config:
    """Shape of a Qwen3.5-style dense model; transformers' names in the comments."""

    vocab_size: int = 248320
    n_ctx: int = 262144  # max_position_embeddings
    n_layer: int = 24  # num_hidden_layers
    n_head: int = 8  # num_attention_heads: the attention layers' query heads
    n_kv_head: int = 2  # num_key_value_heads: the heads their cache keeps
    head_size: int = 256  # head_dim
    n_embd: int = 1024  # hidden_size
    intermediate_size: int = 3584
    layer_types: tuple[str, ...] = ()  # LINEAR or FULL a layer; (): every `full_attention_interval`-th is FULL
    full_attention_interval: int = 4
    linear_num_key_heads: int = 16  # Gated DeltaNet's query and key heads ...
    linear_num_value_heads: int = 16  # ... and its value heads, each with a state; a key head serves a group
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_conv_kernel_dim: int = 4  # the short convolution's window
    partial_rotary_factor: float = 0.25  # RoPE turns this part of each attention head
    rope_theta: float = 10_000_000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    name: str = field(default="custom", compare=False)

    def __post_init__(self) -> None:
        for key in ("vocab_size", "n_ctx", "n_layer", "n_head", "n_kv_head", "head_size", "n_embd",
                    "intermediate_size", "full_attention_interval", "linear_num_key_heads", "linear_num_value_heads",
                    "linear_key_head_dim", "linear_value_head_dim"):
            if int(getattr(self, key)) <= 0:
                raise ValueError(f"config {key} must be positive, got {getattr(self, key)}")
        if self.layer_types and (len(self.layer_types) != self.n_layer or set(self.layer_types) - {LINEAR, FULL}):
            raise ValueError(f"config layer_types must name {LINEAR!r} or {FULL!r} for each of {self.n_layer} "
                             f"layers, got {list(self.layer_types)}")
        if self.n_head % self.n_kv_head or self.linear_num_value_heads % self.linear_num_key_heads:
            raise ValueError("config num_attention_heads and linear_num_value_heads must be multiples of "
                             "num_key_value_heads and linear_num_key_heads")
        if self.linear_conv_kernel_dim < 2:
            raise ValueError(f"config linear_conv_kernel_dim must be at least 2, got {self.linear_conv_kernel_dim}")
        if not 0 < self.rotary_dim <= self.head_size or self.rotary_dim % 2:
            raise ValueError(f"config partial_rotary_factor={self.partial_rotary_factor} turns {self.rotary_dim} "
                             f"numbers of a head of {self.head_size}; RoPE turns an even number, at least 2")

    @property
    def head_dim(self) -> int:
        return self.head_size

    @property
    def rotary_dim(self) -> int:
        return int(self.head_size * self.partial_rotary_factor)

    @property
    def kinds(self) -> tuple[str, ...]:
        """LINEAR or FULL, each layer from the bottom."""
        interval = self.full_attention_interval
        return self.layer_types or tuple(FULL if (i + 1) % interval == 0 else LINEAR for i in range(self.n_layer))

    @property
    def conv_dim(self) -> int:
        """Channels of the short convolution: q, k and v side by side."""
        return 2 * self.linear_num_key_heads * self.linear_key_head_dim + self.linear_num_value_heads * \
            self.linear_value_head_dim

    @property
    def state_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """A linear layer's state, one sequence's: the convolution's window and the recurrent state."""
        return ((self.conv_dim, self.linear_conv_kernel_dim - 1),
                (self.linear_num_value_heads, self.linear_key_head_dim, self.linear_value_head_dim))

    def with_name(self, name: str) -> Qwen35Config:
        return replace(self, name=name)

    # The family's facts about its cache, which the engine asks for and never works out itself.
    own_window = (0, 0)  # no sliding window
    sinks_stream = False  # it refuses windows, so it has no sinks
    cache_parts = ()  # an attention layer keeps a key and a value per KV head, as Llama's
    head_key_value = ()

    def cache_layers(self, policy: CachePolicy) -> tuple[LayerKind, ...]:
        """A fixed state on each Gated DeltaNet layer, every position's keys and values on each attention layer."""
        state = LayerKind("state", state=self.state_shapes)
        full = LayerKind("full", self.n_kv_head, self.head_dim)
        return tuple(state if kind == LINEAR else full for kind in self.kinds)

    def cache_refusal(self, policy: CachePolicy) -> str:
        if policy.lossy:
            return (f"{self.name} keeps a Gated DeltaNet state in {self.kinds.count(LINEAR)} of its {self.n_layer} "
                    "layers: kvviz runs its cache exact (no window, sinks, eviction by importance or quantized cache)")
        return ""

    def cache_shape(self, source: str = "the model's config") -> Architecture:
        """What each layer keeps: a fixed state (its numbers, whatever the length), or a position's keys and values."""
        state = LayerShape("state", state_elements=sum(math.prod(shape) for shape in self.state_shapes))
        full = LayerShape("full", self.n_kv_head, self.head_dim)
        kind = "mha" if self.n_kv_head == self.n_head else "mqa" if self.n_kv_head == 1 else "gqa"
        return Architecture(name=self.name, attention=kind, layers=self.n_layer, kv_heads=self.n_kv_head,
                            head_dim=self.head_dim, context=self.n_ctx, source=source,
                            layer_shapes=tuple(state if kind == LINEAR else full for kind in self.kinds))


PRESETS: dict[str, Qwen35Config] = {  # for untrained weights (random:<name>)
    # Qwen3.5-0.8B's text model, its cache layer for layer, with GPT-2's vocabulary (not 248320: 2.2 GB as it is)
    "qwen3.5-0.8b": Qwen35Config(vocab_size=50257, name="qwen3.5-0.8b"),
    # its layers at kvviz-shakespeare's size, for the lesson (8, 3:1): vocabulary, context, layers, heads, KV heads,
    "kvviz-qwen3.5-mini": Qwen35Config(50257, 8192, 8, 4, 1, 48, 192, 512, linear_num_key_heads=2,  # head, width, MLP
                                       linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32,
                                       name="kvviz-qwen3.5-mini"),
}
PRESETS["kvviz-qwen3.5-mini-attention"] = replace(PRESETS["kvviz-qwen3.5-mini"], layer_types=(FULL,) * 8,
                                                  name="kvviz-qwen3.5-mini-attention")


class RMSNorm(nn.Module):
    """x / sqrt(mean(x²) + eps), scaled by (1 + weight), in float32: its weights start at 0."""

    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * (1.0 + self.weight.float())).to(x.dtype)


class GatedRMSNorm(nn.Module):
    """RMSNorm scaled by its weight, then gated: norm(x) * silu(z)."""

    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * x32.to(x.dtype) * F.silu(z.float())).to(x.dtype)


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x))."""

    def __init__(self, config: Qwen35Config) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.n_embd, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.n_embd, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def l2_normed(x: torch.Tensor) -> torch.Tensor:
    """Each vector of `x` (..., d) divided by its length (as transformers and FLA compute it, eps 1e-6)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                     state: torch.Tensor, keep: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """The recurrence, one position at a time, in float32: `q`, `k` (B, h, T, dk), `v` (B, h, T, dv), the log decay
    `g` and the rate `beta` (B, h, T), from `state` (B, h, dk, dv). Returns the reads (B, h, T, dv) and the states
    (n, B, h, dk, dv) after each of the last n = min(keep, T) positions: the last is the state after the pass."""
    reads, states = [], []
    for t in range(q.shape[2]):
        q_t, k_t, v_t = q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1]  # (B, h, 1, dk), (B, h, 1, dv)
        state = state * g[:, :, t, None, None].exp()  # (B, h, dk, dv): every memory decays by exp(g_t)
        recalled = k_t @ state  # (B, h, 1, dv): S^T k_t, what the state holds for this key
        delta = beta[:, :, t, None, None] * (v_t - recalled)  # (B, h, 1, dv): the correction, at the rate beta_t
        state = state + k_t.transpose(-1, -2) @ delta  # (B, h, dk, dv): k_t delta^T written in
        reads.append(q_t @ state)  # (B, h, 1, dv): S^T q_t
        states = [*states, state][-keep:]  # the last `keep` only: a long prompt keeps no more
    return torch.cat(reads, dim=2), torch.stack(states)


class GatedDeltaNet(nn.Module):
    """Linear attention with the gated delta rule: a fixed state a value head, read and written by each position."""

    def __init__(self, config: Qwen35Config, layer_index: int) -> None:
        super().__init__()
        self.layer_index, self.n_head = layer_index, config.n_head
        self.nk, self.nv = config.linear_num_key_heads, config.linear_num_value_heads
        self.dk, self.dv = config.linear_key_head_dim, config.linear_value_head_dim
        C, conv_dim, self.kernel = config.n_embd, config.conv_dim, config.linear_conv_kernel_dim
        self.in_proj_qkv = nn.Linear(C, conv_dim, bias=False)  # q, k and v of every head, side by side
        self.in_proj_z = nn.Linear(C, self.nv * self.dv, bias=False)  # the output norm's gate
        self.in_proj_b = nn.Linear(C, self.nv, bias=False)  # beta, the write's rate, a head
        self.in_proj_a = nn.Linear(C, self.nv, bias=False)  # the decay's input, a head
        self.conv1d = nn.Conv1d(conv_dim, conv_dim, self.kernel, groups=conv_dim, bias=False)  # a filter a channel
        self.dt_bias = nn.Parameter(torch.ones(self.nv))
        self.A_log = nn.Parameter(torch.zeros(self.nv))
        self.norm = GatedRMSNorm(self.dv, config.rms_norm_eps)
        self.out_proj = nn.Linear(self.nv * self.dv, C, bias=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, kv_cache: KVCache | None,
                probe: PassProbe | None = None) -> torch.Tensor:
        B, T, C = x.shape  # (B, T, C)
        qkv = self.in_proj_qkv(x).transpose(1, 2)  # (B, conv_dim, T)
        z = self.in_proj_z(x).view(B, T, self.nv, self.dv)
        beta = torch.sigmoid(self.in_proj_b(x).float()).transpose(1, 2)  # (B, nv, T)
        g = (-self.A_log.float().exp() * F.softplus(self.in_proj_a(x).float() + self.dt_bias)).transpose(1, 2)
        if probe is not None:
            probe.projected(self.layer_index, B * T)  # a key and a value a position, folded in, kept nowhere
            if probe.attention is not None:  # no attention weights over positions: a row of NaN keeps the layers
                probe.attention.append(torch.full((self.n_head, int(positions[-1]) + 1), float("nan"), device=x.device))
        cache = None if kv_cache is None else kv_cache.layers[self.layer_index]  # a StateLayer
        if cache is None:  # a pass without a cache starts from the zero state and keeps nothing
            window = qkv.new_zeros(B, qkv.shape[1], self.kernel - 1)
            state = torch.zeros(B, self.nv, self.dk, self.dv, device=x.device)
        else:
            window, state = cache.read()  # (B, conv_dim, kernel - 1), (B, nv, dk, dv)
        inputs = torch.cat((window.to(qkv.dtype), qkv), dim=2)  # (B, conv_dim, kernel - 1 + T)
        mixed = F.silu(F.conv1d(inputs, self.conv1d.weight, groups=inputs.shape[1]))  # (B, conv_dim, T)
        q, k, v = mixed.float().split((self.nk * self.dk, self.nk * self.dk, self.nv * self.dv), dim=1)
        group = self.nv // self.nk  # value heads a key head serves
        q = l2_normed(q.view(B, self.nk, self.dk, T).transpose(2, 3)).repeat_interleave(group, 1)  # (B, nv, T, dk)
        k = l2_normed(k.view(B, self.nk, self.dk, T).transpose(2, 3)).repeat_interleave(group, 1)  # (B, nv, T, dk)
        v = v.view(B, self.nv, self.dv, T).transpose(2, 3)  # (B, nv, T, dv)
        keep = 1 if cache is None else cache.spare + 1  # the state after the pass, and `spare` to roll back into
        reads, states = gated_delta_rule(q / math.sqrt(self.dk), k, v, g, beta, state.float(), keep)
        if cache is not None:  # the window after position t: the last kernel - 1 inputs up to and including t
            windows = inputs.unfold(2, self.kernel - 1, 1)[:, :, -len(states):].movedim(2, 0)  # (n, B, conv_dim, K - 1)
            cache.write(positions, windows[-1], states[-1], (windows[:-1], states[:-1]))  # the next pass's, the rest
        y = self.norm(reads.transpose(1, 2).to(x.dtype), z)  # (B, T, nv, dv)
        return self.out_proj(y.reshape(B, T, self.nv * self.dv))


class GatedAttention(nn.Module):
    """GQA with a sigmoid gate on its output: q_proj emits each head's query and its gate; each head's query and
    key are RMS-normed, then turned (RoPE) on their first `rotary_dim` numbers."""

    def __init__(self, config: Qwen35Config, layer_index: int) -> None:
        super().__init__()
        self.layer_index = layer_index
        self.n_head, self.n_kv_head, self.head_dim, self.rotary_dim = (config.n_head, config.n_kv_head,
                                                                        config.head_dim, config.rotary_dim)
        C, hd = config.n_embd, config.head_dim
        self.q_proj = nn.Linear(C, config.n_head * hd * 2, bias=False)  # a query and a gate a head
        self.k_proj = nn.Linear(C, config.n_kv_head * hd, bias=False)
        self.v_proj = nn.Linear(C, config.n_kv_head * hd, bias=False)
        self.o_proj = nn.Linear(config.n_head * hd, C, bias=False)
        self.q_norm = RMSNorm(hd, config.rms_norm_eps)
        self.k_norm = RMSNorm(hd, config.rms_norm_eps)

    def turned(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """`x` (B, h, T, hd) with its first `rotary_dim` numbers a head turned by RoPE, the rest as they are."""
        r = self.rotary_dim
        return torch.cat((rotate(x[..., :r], cos, sin), x[..., r:]), dim=-1)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                kv_cache: KVCache | None, probe: PassProbe | None = None) -> torch.Tensor:
        B, T, C = x.shape  # (B, T, C)
        nh, nkv, hd = self.n_head, self.n_kv_head, self.head_dim
        q, gate = self.q_proj(x).view(B, T, nh, 2 * hd).chunk(2, dim=-1)  # (B, T, nh, hd) each
        q = self.turned(self.q_norm(q).transpose(1, 2), *rope)  # (B, nh, T, hd)
        k = self.turned(self.k_norm(self.k_proj(x).view(B, T, nkv, hd)).transpose(1, 2), *rope)  # (B, nkv, T, hd)
        v = self.v_proj(x).view(B, T, nkv, hd).transpose(1, 2)  # (B, nkv, T, hd)
        if probe is not None:
            probe.projected(self.layer_index, B * T)
        held = None if kv_cache is None else kv_cache.update(self.layer_index, positions, k, v)
        if held is not None:
            k, v = held.keys, held.values  # (B, nkv, S, hd): every position the layer holds
        k, v = k.repeat_interleave(nh // nkv, dim=1), v.repeat_interleave(nh // nkv, dim=1)  # (B, nh, S, hd)
        y = attend(q, k, v, held, positions, probe).transpose(1, 2).reshape(B, T, nh * hd)  # (B, T, nh * hd)
        return self.o_proj(y * torch.sigmoid(gate.reshape(B, T, nh * hd)))


class DecoderLayer(nn.Module):
    """Pre-RMSNorm: a token mixer (Gated DeltaNet, `linear_attn`, or gated attention, `self_attn`), then SwiGLU."""

    def __init__(self, config: Qwen35Config, layer_index: int) -> None:
        super().__init__()
        self.linear = config.kinds[layer_index] == LINEAR
        self.input_layernorm = RMSNorm(config.n_embd, config.rms_norm_eps)
        if self.linear:
            self.linear_attn = GatedDeltaNet(config, layer_index)
        else:
            self.self_attn = GatedAttention(config, layer_index)
        self.post_attention_layernorm = RMSNorm(config.n_embd, config.rms_norm_eps)
        self.mlp = SwiGLU(config)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                kv_cache: KVCache | None, probe: PassProbe | None = None) -> torch.Tensor:
        h = self.input_layernorm(x)
        x = x + (self.linear_attn(h, positions, kv_cache, probe) if self.linear
                 else self.self_attn(h, positions, rope, kv_cache, probe))
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen35(nn.Module):
    """A Qwen3.5-style decoder: token embeddings, pre-RMSNorm layers of Gated DeltaNet or gated attention and
    SwiGLU, a final RMSNorm and an output head (the embeddings when tied, else `lm_head`)."""

    def __init__(self, config: Qwen35Config) -> None:
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
        """transformers' initialisation: Normal(0, 0.02) matrices, (1 + w) norms at 0, the gated norms and dt_bias
        at 1, A = exp(A_log) uniform in [0.01, 16]."""
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("linear_attn.norm.weight") or name.endswith("dt_bias"):
                    p.fill_(1.0)
                elif name.endswith("norm.weight"):
                    p.zero_()
                elif name.endswith("A_log"):
                    p.copy_(torch.empty(p.shape).uniform_(0.01, 16.0, generator=generator).log())
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
            raise ValueError("the Qwen3.5 family runs one sequence at a time (positions (T,))")
        if int(positions.max()) >= self.config.n_ctx:
            raise ValueError(f"position {int(positions.max())} is past the context length {self.config.n_ctx}")
        x = self.model.embed_tokens(idx)  # (B, T, C)
        rope = rope_angles(positions, self.config.rotary_dim, self.config.rope_theta, x.dtype)  # (T, rotary_dim)
        for i, layer in enumerate(self.blocks):
            if probe is not None:
                probe.entering(i)
            x = layer(x, positions, rope, kv_cache, probe)
        return self.model.norm(x[:, -1:, :] if last_only else x)  # (B, 1, C) or (B, T, C)

    def forward(self, idx: torch.Tensor, positions: torch.Tensor | None = None, kv_cache: KVCache | None = None,
                last_only: bool = False, probe: PassProbe | None = None) -> torch.Tensor:
        """Logits (B, T, V) for `idx` (B, T) at `positions` (T,); with `kv_cache`, from its states and keys."""
        return F.linear(self.hidden_states(idx, positions, kv_cache, last_only, probe), self.head_weight)  # (B, T, V)

    @property
    def head_weight(self) -> torch.Tensor:
        """The output head's (V, C) matrix: the token embeddings when tied, else `lm_head`'s."""
        return self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
