"""Gemma 4's text decoder in one readable file: sliding-window and global layers, and its top layers sharing the
keys and values of layers below them (cross-layer KV sharing).

The last `num_kv_shared_layers` layers project queries only. Each reads the keys and values of the last layer below
them of its own kind (sliding or global), as that layer's cache returned them in the same pass, so they keep
nothing: in Gemma 4 E2B, 20 of its 35 layers cost no cache memory at all. The rest is Gemma's: RMSNorm before and
after each block (its weight is the scale itself, not an offset from 1), each head's query, key and value
RMS-normed, attention scores unscaled (the norms set their size), token embeddings scaled by sqrt(hidden_size), a
GELU MLP, soft-capped logits. The global layers have their own head size (with `attention_k_eq_v`, their own KV
heads too, whose values are the key projection) and turn a share of each head's pairs (proportional RoPE). A layer
may add a per-layer embedding of the token (PLE), and the shared layers' MLPs may be twice as wide. Mixture-of-
experts blocks are not modelled (the checkpoint format refuses them). Module names follow transformers'
Gemma4ForCausalLM checkpoint keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
from torch import nn

from kvviz.cache.attention import attend
from kvviz.cache.kv_cache import KVCache, pass_cache
from kvviz.cache.layers import LayerKind
from kvviz.cache.probe import PassProbe
from kvviz.core.memory import Architecture, LayerShape
from kvviz.core.records import EXACT, CachePolicy

SLIDING, GLOBAL = "sliding_attention", "full_attention"  # transformers' layer_types


def gemma_pattern(n_layer: int, every: int = 6) -> tuple[str, ...]:
    """Gemma's layer types: a global layer every `every` layers, the rest sliding, and the top layer global."""
    return tuple(GLOBAL if (i + 1) % every == 0 or i == n_layer - 1 else SLIDING for i in range(n_layer))


@dataclass(frozen=True)
class Gemma4Config:
    """Shape of a Gemma 4 text model; transformers' names in the comments. RoPE is (rope_theta, the share of a
    head's pairs it turns, factor) per kind of layer: plain RoPE is (theta, 1.0, 1.0)."""

    vocab_size: int = 262144
    n_ctx: int = 131072  # max_position_embeddings
    n_layer: int = 35  # num_hidden_layers
    n_head: int = 8  # num_attention_heads
    n_kv_head: int = 1  # num_key_value_heads: a sliding layer's KV heads (a global one's too, unless below)
    n_embd: int = 1536  # hidden_size
    intermediate_size: int = 6144
    head_size: int = 256  # head_dim: a sliding layer's head
    global_head_dim: int = 512  # a global (full-attention) layer's head
    global_kv_heads: int = 0  # a global layer's KV heads (num_global_key_value_heads); 0: n_kv_head
    attention_k_eq_v: bool = False  # a global layer's values are its key projection (it has no v_proj)
    layer_types: tuple[str, ...] = ()  # SLIDING or GLOBAL, a layer; (): gemma_pattern
    sliding_window: int = 512  # a sliding layer's query sees the last this many positions, its own included
    num_kv_shared_layers: int = 0  # the top this many layers read an earlier layer's keys and values
    sliding_rope: tuple[float, float, float] = (10000.0, 1.0, 1.0)
    global_rope: tuple[float, float, float] = (1000000.0, 0.25, 1.0)  # proportional RoPE: a quarter of pairs turn
    hidden_size_per_layer_input: int = 0  # PLE: numbers a layer and token adds (0: none)
    vocab_size_per_layer_input: int = 0  # the PLE table's rows (0: vocab_size)
    use_double_wide_mlp: bool = False  # the shared layers' MLPs are twice intermediate_size wide
    final_logit_softcapping: float = 0.0  # logits = cap * tanh(logits / cap); 0: none
    attention_bias: bool = False
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    name: str = field(default="custom", compare=False)

    def __post_init__(self) -> None:
        for key in ("vocab_size", "n_ctx", "n_layer", "n_head", "n_kv_head", "n_embd", "intermediate_size",
                    "head_size", "global_head_dim", "sliding_window"):
            if int(getattr(self, key)) <= 0:
                raise ValueError(f"config {key} must be positive, got {getattr(self, key)}")
        object.__setattr__(self, "layer_types", tuple(self.layer_types) or gemma_pattern(self.n_layer))
        if len(self.layer_types) != self.n_layer or set(self.layer_types) - {SLIDING, GLOBAL}:
            raise ValueError(f"layer_types must list {self.n_layer} layers, each {SLIDING} or {GLOBAL}")
        if not 0 <= self.num_kv_shared_layers < self.n_layer:
            raise ValueError(f"num_kv_shared_layers={self.num_kv_shared_layers}: some of the {self.n_layer} layers "
                             "must compute the keys and values the others share")
        for layer in range(self.first_shared, self.n_layer):
            if self.kv_source(layer) < 0:
                raise ValueError(f"layer {layer} ({self.layer_types[layer]}) shares keys and values, but no layer "
                                 f"below {self.first_shared} is of its kind")
        for kind in (SLIDING, GLOBAL):
            heads, head_dim = self.kind_heads(kind)
            if self.n_head % heads:
                raise ValueError(f"n_head={self.n_head} is not a multiple of the {kind} layers' {heads} KV heads")
            if head_dim % 2:
                raise ValueError(f"a head of {head_dim} numbers is odd: RoPE turns a head's numbers in pairs")

    @property
    def head_dim(self) -> int:
        """A sliding layer's head size (the global layers': global_head_dim)."""
        return self.head_size

    @property
    def first_shared(self) -> int:
        """The first layer that reads another's keys and values (n_layer: none does)."""
        return self.n_layer - self.num_kv_shared_layers

    def kv_source(self, layer: int) -> int:
        """The layer whose keys and values `layer` attends to: itself below `first_shared`, else the last layer
        below `first_shared` of its kind (transformers' kv_sharing_modes: that layer "stores", the others "reuse");
        -1 if there is none."""
        if layer < self.first_shared:
            return layer
        kind = self.layer_types[layer]
        return next((i for i in range(self.first_shared - 1, -1, -1) if self.layer_types[i] == kind), -1)

    def kind_heads(self, kind: str) -> tuple[int, int]:
        """(KV heads, head size) of a layer of `kind`."""
        if kind == GLOBAL:
            return (self.global_kv_heads or self.n_kv_head, self.global_head_dim)
        return (self.n_kv_head, self.head_size)

    def with_name(self, name: str) -> Gemma4Config:
        return replace(self, name=name)

    # The family's facts about its cache, which the engine asks for and never works out itself.
    own_window = (0, 0)  # its windows are the sliding layers' own (`cache_layers`), not a policy's
    sinks_stream = False  # it refuses sinks
    cache_parts = ()  # a cached position is a key and a value per KV head
    head_key_value = ()

    def cache_layers(self, policy: CachePolicy) -> tuple[LayerKind, ...]:
        """A sliding layer keeps its window, a global layer every position, and a shared layer nothing: it reads
        its source layer's (`kv_source`)."""
        return tuple(LayerKind("shared", source=self.kv_source(layer)) if layer >= self.first_shared
                     else LayerKind("window", *self.kind_heads(kind), window=self.sliding_window) if kind == SLIDING
                     else LayerKind("full", *self.kind_heads(kind)) for layer, kind in enumerate(self.layer_types))

    def cache_refusal(self, policy: CachePolicy) -> str:
        if policy.lossy:
            return (f"{self.name} keeps its own windows and shares keys and values across layers: kvviz runs it "
                    "on its own cache only (no window, sinks, eviction by importance or quantized cache)")
        return ""

    def cache_shape(self, source: str = "the model's config") -> Architecture:
        """What each layer's cache holds a position, for the memory figures: its window, every position, or none."""
        shapes = tuple(LayerShape(kind.kind, kind.heads, kind.head_dim, window=kind.window, source=kind.source)
                       for kind in self.cache_layers(EXACT))
        attention = "mha" if self.n_kv_head == self.n_head else "mqa" if self.n_kv_head == 1 else "gqa"
        return Architecture(name=self.name, attention=attention, layers=self.n_layer, kv_heads=self.n_kv_head,
                            head_dim=self.head_size, context=self.n_ctx, source=source, layer_shapes=shapes)


PRESETS: dict[str, Gemma4Config] = {  # for untrained weights (random:<name>)
    # Gemma 4 E2B's attention as its config.json (google/gemma-4-E2B) states it: 35 layers of 8 query heads on 1 KV
    # head, sliding heads of 256 (window 512), every 5th layer global (heads of 512, proportional RoPE on a quarter
    # of their pairs), the top 20 reading layer 13's (sliding) or 14's (global) keys and values, logits capped at 30.
    # Narrower where the cache does not care: a stream of 512, an MLP of 1024 (doubled on the shared layers, as
    # E2B's), GPT-2's vocabulary, no per-layer embeddings (E2B's table is 262,144 x 35 x 256): 0.8 GB in float32.
    "gemma-4-e2b-attention": Gemma4Config(
        vocab_size=50257, n_ctx=131072, n_layer=35, n_head=8, n_kv_head=1, n_embd=512, intermediate_size=1024,
        head_size=256, global_head_dim=512, layer_types=gemma_pattern(35, every=5), sliding_window=512,
        num_kv_shared_layers=20, use_double_wide_mlp=True, final_logit_softcapping=30.0,
        name="gemma-4-e2b-attention"),
}
# Its layers at kvviz-shakespeare's size, for the lesson: local, local, global, twice; the top two read layers 3 and 2
PRESETS["kvviz-gemma4-mini"] = Gemma4Config(vocab_size=50257, n_ctx=8192, n_layer=6, n_head=4, n_kv_head=1, n_embd=192,
                                            intermediate_size=512, head_size=48, global_head_dim=96,
                                            layer_types=gemma_pattern(6, every=3), sliding_window=64,
                                            num_kv_shared_layers=2, name="kvviz-gemma4-mini")


class RMSNorm(nn.Module):
    """x / sqrt(mean(x²) + eps), times `weight` (Gemma 4 stores the scale itself, starting at 1; no weight: a plain
    norm, as on the values); in float32 whatever the weights' dtype."""

    def __init__(self, width: int, eps: float, with_scale: bool = True) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width)) if with_scale else None
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.pow(x32.pow(2).mean(-1, keepdim=True) + self.eps, -0.5)
        return (x32 if self.weight is None else x32 * self.weight.float()).to(x.dtype)


def rope_angles(positions: torch.Tensor, head_dim: int, rope: tuple[float, float, float],
                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (T, head_dim) at `positions` (T,). Pair i of a head turns by position * theta^(-2i/head_dim) /
    factor for the first `turned` share of the pairs; the other pairs do not turn (proportional RoPE: they carry
    no position)."""
    theta, turned, factor = rope
    pairs = int(turned * head_dim // 2)
    frequencies = torch.zeros(head_dim // 2, device=positions.device)
    exponents = torch.arange(0, 2 * pairs, 2, device=positions.device).float() / head_dim
    frequencies[:pairs] = 1.0 / theta ** exponents
    angles = positions.float()[:, None] * (frequencies / factor)[None, :]  # (T, hd/2)
    angles = torch.cat((angles, angles), dim=-1)  # (T, hd): the halves of a head rotate together
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Turn each pair (x[i], x[i + d/2]) of every head of `x` (B, h, T, d) by its position's angle."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class Attention(nn.Module):
    """Grouped-query attention with QK- and V-norm. A layer at or above `first_shared` has no k_proj or v_proj:
    its queries attend to its source layer's keys and values, which that layer left in `shared` this pass."""

    def __init__(self, config: Gemma4Config, layer_index: int) -> None:
        super().__init__()
        self.layer_index = layer_index
        self.kind = config.layer_types[layer_index]
        self.n_head = config.n_head
        self.n_kv_head, self.head_dim = config.kind_heads(self.kind)
        self.source = config.kv_source(layer_index)  # itself, or the layer it reads
        self.read_later = any(config.kv_source(i) == layer_index for i in range(config.first_shared, config.n_layer))
        C, nh, nkv, hd, bias = config.n_embd, config.n_head, self.n_kv_head, self.head_dim, config.attention_bias
        self.q_proj = nn.Linear(C, nh * hd, bias=bias)
        self.q_norm = RMSNorm(hd, config.rms_norm_eps)
        if self.source == layer_index:
            self.k_proj = nn.Linear(C, nkv * hd, bias=bias)
            values_from_keys = config.attention_k_eq_v and self.kind == GLOBAL  # k_proj serves as v_proj too
            self.v_proj = None if values_from_keys else nn.Linear(C, nkv * hd, bias=bias)
            self.k_norm = RMSNorm(hd, config.rms_norm_eps)
            self.v_norm = RMSNorm(hd, config.rms_norm_eps, with_scale=False)
        self.o_proj = nn.Linear(nh * hd, C, bias=bias)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                kv_cache: KVCache | None, shared: dict[int, tuple], probe: PassProbe | None = None) -> torch.Tensor:
        B, T, C = x.shape  # (B, T, C)
        nh, nkv, hd = self.n_head, self.n_kv_head, self.head_dim
        q = self.q_proj(x).view(B, T, nh, hd).transpose(1, 2)  # (B, nh, T, hd)
        q = rotate(self.q_norm(q), *rope)
        if self.source != self.layer_index:  # queries only: the source's keys and values, of this same pass
            k, v, held, fed = shared[self.source]
            if kv_cache is not None:
                held = kv_cache.layers[self.layer_index].read(fed, held)  # keeps nothing; counts the pass's positions
        else:
            k = self.k_proj(x).view(B, T, nkv, hd).transpose(1, 2)  # (B, nkv, T, hd)
            v = k if self.v_proj is None else self.v_proj(x).view(B, T, nkv, hd).transpose(1, 2)  # (B, nkv, T, hd)
            if probe is not None:
                probe.projected(self.layer_index, B * T)
            k, v = rotate(self.k_norm(k), *rope), self.v_norm(v)  # keys cached turned to their positions
            held = None if kv_cache is None else kv_cache.update(self.layer_index, positions, k, v)
            if held is not None:
                k, v = held.keys, held.values  # (B, nkv, S, hd): what the layer's cache holds, this pass's rows too
            if self.read_later:
                shared[self.layer_index] = (k, v, held, positions)
        group = nh // k.shape[1]
        k = k.repeat_interleave(group, dim=1)  # (B, nh, S, hd): query head h reads KV head h // group
        v = v.repeat_interleave(group, dim=1)  # (B, nh, S, hd)
        recording = probe is not None and probe.attention is not None
        if held is not None and held.window and T == 1 and k.shape[2] <= held.window and not recording:
            held = None  # a step's query sees every key its window holds: no mask to build (the step stays cheap)
        y = attend(q, k, v, held, positions, probe, scale=1.0)  # (B, nh, T, hd): scores unscaled
        y = y.transpose(1, 2).reshape(B, T, nh * hd)  # (B, T, nh * hd)
        return self.o_proj(y)


class MLP(nn.Module):
    """down(gelu(gate(x)) * up(x)), GELU's tanh form."""

    def __init__(self, config: Gemma4Config, width: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.n_embd, width, bias=False)
        self.up_proj = nn.Linear(config.n_embd, width, bias=False)
        self.down_proj = nn.Linear(width, config.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.gelu(self.gate_proj(x), approximate="tanh") * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Attention and MLP, each between two RMSNorms, added to the residual stream; then the layer's per-layer
    embedding (PLE), gated by the stream; the whole scaled by `layer_scalar`."""

    def __init__(self, config: Gemma4Config, layer_index: int) -> None:
        super().__init__()
        C, eps = config.n_embd, config.rms_norm_eps
        self.kind = config.layer_types[layer_index]
        self.input_layernorm = RMSNorm(C, eps)
        self.self_attn = Attention(config, layer_index)
        self.post_attention_layernorm = RMSNorm(C, eps)
        self.pre_feedforward_layernorm = RMSNorm(C, eps)
        wide = config.use_double_wide_mlp and layer_index >= config.first_shared
        self.mlp = MLP(config, config.intermediate_size * (2 if wide else 1))
        self.post_feedforward_layernorm = RMSNorm(C, eps)
        if config.hidden_size_per_layer_input:
            P = config.hidden_size_per_layer_input
            self.per_layer_input_gate = nn.Linear(C, P, bias=False)
            self.per_layer_projection = nn.Linear(P, C, bias=False)
            self.post_per_layer_input_norm = RMSNorm(C, eps)
        self.register_buffer("layer_scalar", torch.ones(1))

    def forward(self, x: torch.Tensor, positions: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                per_layer_input: torch.Tensor | None, kv_cache: KVCache | None, shared: dict,
                probe: PassProbe | None = None) -> torch.Tensor:
        attended = self.self_attn(self.input_layernorm(x), positions, rope, kv_cache, shared, probe)
        x = x + self.post_attention_layernorm(attended)
        x = x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))
        if per_layer_input is not None:  # (B, T, P): this layer's embedding of each token
            gated = F.gelu(self.per_layer_input_gate(x), approximate="tanh") * per_layer_input  # (B, T, P)
            x = x + self.post_per_layer_input_norm(self.per_layer_projection(gated))
        return x * self.layer_scalar


class Gemma4(nn.Module):
    """A Gemma 4 text decoder: token embeddings scaled by sqrt(hidden_size) (no learned positions), its layers, a
    final RMSNorm, an output head tied to the embeddings (or `lm_head`), and the logits soft-capped."""

    def __init__(self, config: Gemma4Config) -> None:
        super().__init__()
        self.config = config
        V, C, L, P = config.vocab_size, config.n_embd, config.n_layer, config.hidden_size_per_layer_input
        modules = dict(
            embed_tokens=nn.Embedding(V, C, _weight=torch.empty(V, C)),
            layers=nn.ModuleList(DecoderLayer(config, i) for i in range(L)),
            norm=RMSNorm(C, config.rms_norm_eps),
        )
        if P:  # per-layer embeddings: a table of L x P numbers a token, and a projection of the embedding to them
            rows = config.vocab_size_per_layer_input or V
            modules.update(embed_tokens_per_layer=nn.Embedding(rows, L * P, _weight=torch.empty(rows, L * P)),
                           per_layer_model_projection=nn.Linear(C, L * P, bias=False),
                           per_layer_projection_norm=RMSNorm(P, config.rms_norm_eps))
        self.model = nn.ModuleDict(modules)
        self.lm_head = None if config.tie_word_embeddings else nn.Linear(C, V, bias=False)

    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """Normal(0, 0.02) weights, zero biases, unit norms (transformers' initializer_range)."""
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("bias"):
                    p.zero_()
                elif name.endswith("norm.weight"):
                    p.fill_(1.0)
                else:
                    p.normal_(0.0, 0.02, generator=generator)

    @property
    def blocks(self) -> nn.ModuleList:
        return self.model.layers

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def per_layer_inputs(self, idx: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """PLE (B, T, L, P): each token's row of the per-layer table (scaled by sqrt(P)) and the projection of its
        scaled embedding `x` (B, T, C) (scaled by 1/sqrt(C), then normed), averaged in the sense of 1/sqrt(2)."""
        cfg = self.config
        B, T = idx.shape
        L, P = cfg.n_layer, cfg.hidden_size_per_layer_input
        table = self.model.embed_tokens_per_layer(idx) * torch.tensor(P ** 0.5).to(x.dtype)  # (B, T, L * P)
        projected = self.model.per_layer_model_projection(x) * cfg.n_embd ** -0.5  # (B, T, L * P)
        projected = self.model.per_layer_projection_norm(projected.view(B, T, L, P))  # (B, T, L, P)
        return (projected + table.view(B, T, L, P)) * 2 ** -0.5

    def hidden_states(self, idx: torch.Tensor, positions: torch.Tensor | None = None,
                      kv_cache: KVCache | None = None, last_only: bool = False,
                      probe: PassProbe | None = None) -> torch.Tensor:
        """The final RMSNorm's output (B, T, C) for `idx` (B, T). Without `kv_cache`, the pass still attends as
        the model's windows say: through layers that keep nothing (kvviz.cache.kv_cache.pass_cache)."""
        cfg = self.config
        T = idx.shape[1]
        if positions is None:
            start = 0 if kv_cache is None else kv_cache.length
            positions = torch.arange(start, start + T, device=idx.device)
        if kv_cache is None:
            kv_cache = pass_cache(cfg.cache_layers(EXACT))  # the sliding layers' windows are the model's own
        if positions.dim() != 1:
            raise ValueError("the Gemma 4 family runs one sequence at a time (positions (T,))")
        if int(positions.max()) >= cfg.n_ctx:
            raise ValueError(f"position {int(positions.max())} is past the context length {cfg.n_ctx}")
        x = self.model.embed_tokens(idx)  # (B, T, C)
        x = x * torch.tensor(cfg.n_embd ** 0.5).to(x.dtype)  # scaled up in the weights' dtype, as Gemma was trained
        per_layer = self.per_layer_inputs(idx, x) if cfg.hidden_size_per_layer_input else None  # (B, T, L, P)
        ropes = {kind: rope_angles(positions, cfg.kind_heads(kind)[1], rope, x.dtype)  # cos, sin (T, hd) each
                 for kind, rope in ((SLIDING, cfg.sliding_rope), (GLOBAL, cfg.global_rope))}
        shared: dict[int, tuple] = {}  # a source layer: the k, v and Held it attended to, at the positions fed
        for i, layer in enumerate(self.blocks):
            if i == cfg.first_shared and last_only and T > 1:  # no layer from here up computes a key or a value, so
                x, positions = x[:, -1:], positions[-1:]  # a position feeds its own output only: the last one alone
                per_layer = None if per_layer is None else per_layer[:, -1:]  # goes on (as transformers' generate)
                ropes = {kind: (cos[-1:], sin[-1:]) for kind, (cos, sin) in ropes.items()}
            if probe is not None:
                probe.entering(i)
            x = layer(x, positions, ropes[layer.kind], None if per_layer is None else per_layer[:, :, i], kv_cache,
                      shared, probe)
        if last_only:
            x = x[:, -1:, :]  # (B, 1, C)
        return self.model.norm(x)

    def forward(self, idx: torch.Tensor, positions: torch.Tensor | None = None, kv_cache: KVCache | None = None,
                last_only: bool = False, probe: PassProbe | None = None) -> torch.Tensor:
        """Logits (B, T, V) for `idx` (B, T) at `positions` (T,); with `kv_cache`, attend to cached keys too."""
        logits = F.linear(self.hidden_states(idx, positions, kv_cache, last_only, probe), self.head_weight)
        cap = self.config.final_logit_softcapping
        return torch.tanh(logits / cap) * cap if cap else logits  # (B, T, V)

    @property
    def head_weight(self) -> torch.Tensor:
        """The output head's (V, C) matrix: the token embeddings when tied (unscaled), else `lm_head`'s."""
        return self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
