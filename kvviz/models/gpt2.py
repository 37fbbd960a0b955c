"""GPT-2 in one readable file, with explicit positions and an optional KV cache.

This is the lesson: plain torch, a module per checkpoint key. The engine runs every pass (prefill, uncached,
one token) through the same arithmetic in `gpt2_fast.py`, on the products that run fast on a CPU (column blocks,
packed bfloat16: `products.py`); the tests check it against this file, token for token and logit for logit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
from torch import nn

from kvviz.cache.attention import attend
from kvviz.cache.kv_cache import KVCache
from kvviz.cache.layers import LayerKind, head_layers, head_refusal
from kvviz.cache.probe import PassProbe
from kvviz.core.memory import Architecture
from kvviz.core.records import CachePolicy


@dataclass(frozen=True)
class GPTConfig:
    """Shape of a GPT-2 model; field names follow transformers' GPT2Config where they overlap."""

    vocab_size: int = 50257  # GPT-2 BPE tokens, <|endoftext|> included
    n_ctx: int = 1024  # context length: number of learned positions
    n_layer: int = 12  # transformer blocks
    n_head: int = 12  # attention heads per block
    n_embd: int = 768  # width of the residual stream
    layer_norm_epsilon: float = 1e-5
    name: str = field(default="custom", compare=False)  # preset or checkpoint name, for display

    def __post_init__(self) -> None:
        for key in ("vocab_size", "n_ctx", "n_layer", "n_head", "n_embd"):
            if int(getattr(self, key)) <= 0:
                raise ValueError(f"config {key} must be positive, got {getattr(self, key)}")
        if self.n_embd % self.n_head:
            raise ValueError(f"config n_embd={self.n_embd} is not divisible by n_head={self.n_head}")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def n_kv_head(self) -> int:
        """Heads whose keys and values the cache keeps: every head (multi-head attention)."""
        return self.n_head

    def with_name(self, name: str) -> GPTConfig:
        return replace(self, name=name)

    # The family's facts about its cache, which the engine asks for and never works out itself.
    own_window = (0, 0)  # no sliding window of its own: (window, first windowed layer)
    sinks_stream = False  # learned positions end at n_ctx, so sinks cannot carry a run past it
    cache_parts = ()  # the parts of a cached position beyond a key and a value per head: none
    head_key_value = ()

    def cache_layers(self, policy: CachePolicy) -> tuple[LayerKind, ...]:
        """Every head's key and value in every layer (multi-head attention), under `policy`."""
        return head_layers(self.n_layer, self.n_head, self.head_dim, policy)

    def cache_refusal(self, policy: CachePolicy) -> str:
        return head_refusal(self.name, self.head_dim, policy)

    def cache_shape(self, source: str = "the model's config") -> Architecture:
        """What the cache holds a position, for the memory figures (kvviz.core.memory)."""
        return Architecture(name=self.name, attention="mha", layers=self.n_layer, kv_heads=self.n_head,
                            head_dim=self.head_dim, context=self.n_ctx, source=source)


PRESETS: dict[str, GPTConfig] = {
    "gpt2": GPTConfig(n_layer=12, n_head=12, n_embd=768, name="gpt2"),
    "gpt2-medium": GPTConfig(n_layer=24, n_head=16, n_embd=1024, name="gpt2-medium"),
    "gpt2-large": GPTConfig(n_layer=36, n_head=20, n_embd=1280, name="gpt2-large"),
    "gpt2-xl": GPTConfig(n_layer=48, n_head=25, n_embd=1600, name="gpt2-xl"),
    # The embedded default: small enough to ship, deep enough for the grid to have rows.
    "kvviz-shakespeare": GPTConfig(n_ctx=256, n_layer=6, n_head=6, n_embd=192, name="kvviz-shakespeare"),
    # The embedded draft for speculative decoding: the default's tokenizer and corpus, a third of its layers' width.
    "kvviz-shakespeare-draft": GPTConfig(n_ctx=256, n_layer=2, n_head=2, n_embd=128, name="kvviz-shakespeare-draft"),
}


class Conv1D(nn.Module):
    """Affine map whose weight is (in_features, out_features), as in GPT-2 checkpoints."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features).t())
        self.bias = nn.Parameter(torch.zeros(out_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight + self.bias  # (..., out)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention: each new token's key and value are computed once, written to the
    cache at their positions, and every later query reads them back from there."""

    def __init__(self, config: GPTConfig, layer_index: int) -> None:
        super().__init__()
        self.layer_index = layer_index
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.c_attn = Conv1D(config.n_embd, 3 * config.n_embd)
        self.c_proj = Conv1D(config.n_embd, config.n_embd)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, kv_cache: KVCache | None,
                probe: PassProbe | None = None) -> torch.Tensor:
        B, T, C = x.shape  # (B, T, C)
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)  # 3 x (B, T, C)
        if probe is not None:
            probe.projected(self.layer_index, B * T)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        held = None if kv_cache is None else kv_cache.update(self.layer_index, positions, k, v)
        if held is not None:
            k, v = held.keys, held.values  # (B, nh, S, hs): what the layer's cache holds, this pass's rows too
        y = attend(q, k, v, held, positions, probe)  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = Conv1D(config.n_embd, 4 * config.n_embd)
        self.c_proj = Conv1D(4 * config.n_embd, config.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, config: GPTConfig, layer_index: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.attn = CausalSelfAttention(config, layer_index)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, kv_cache: KVCache | None,
                probe: PassProbe | None = None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), positions, kv_cache, probe)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT-2: learned positions, pre-LayerNorm blocks, GELU (tanh), output head tied to `wte`.

    Module names follow the checkpoint keys (`wte`, `wpe`, `h`, `ln_f`, `c_attn`, `c_proj`).
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        V, C = config.vocab_size, config.n_embd
        self.transformer = nn.ModuleDict(
            dict(
                # Uninitialised, like Conv1D: loaders overwrite them and `init_weights` draws them.
                # (Embedding's own init on the meta device would import torch._dynamo: seconds.)
                wte=nn.Embedding(config.vocab_size, config.n_embd, _weight=torch.empty(C, V).t()),
                wpe=nn.Embedding(config.n_ctx, config.n_embd, _weight=torch.empty(config.n_ctx, C)),
                h=nn.ModuleList(Block(config, i) for i in range(config.n_layer)),
                ln_f=nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon),
            )
        )

    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """GPT-2's initialisation: N(0, 0.02), residual projections scaled by 1/sqrt(2 * n_layer)."""
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("bias"):
                    p.zero_()
                elif ".ln_" in name or name.startswith("transformer.ln_f"):
                    p.fill_(1.0)
                else:
                    # Drawn in logical order whatever the layout, so a seed gives the same weights as ever.
                    drawn = p if p.is_contiguous() else torch.empty_like(p, memory_format=torch.contiguous_format)
                    drawn.normal_(0.0, residual_std if name.endswith("c_proj.weight") else 0.02, generator=generator)
                    if drawn is not p:
                        p.copy_(drawn)

    @property
    def blocks(self) -> nn.ModuleList:
        return self.transformer.h

    @property
    def head_weight(self) -> torch.Tensor:
        """The output head's (V, C) matrix: the token embeddings (GPT-2 ties them)."""
        return self.transformer.wte.weight

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def hidden_states(self, idx: torch.Tensor, positions: torch.Tensor | None = None,
                      kv_cache: KVCache | None = None, last_only: bool = False,
                      probe: PassProbe | None = None) -> torch.Tensor:
        """The final LayerNorm's output (B, T, C) for `idx` (B, T): what the tied head turns into logits."""
        B, T = idx.shape
        if positions is None:
            start = 0 if kv_cache is None else kv_cache.length
            positions = torch.arange(start, start + T, device=idx.device)
        if int(positions.max()) >= self.config.n_ctx:
            raise ValueError(f"position {int(positions.max())} is past the context length {self.config.n_ctx}")
        x = self.transformer.wte(idx) + self.transformer.wpe(positions)  # (B, T, C); positions (T,) or (B, T)
        for i, block in enumerate(self.blocks):
            if probe is not None:
                probe.entering(i)
            x = block(x, positions, kv_cache, probe)
        if last_only:
            x = x[:, -1:, :]  # (B, 1, C)
        return self.transformer.ln_f(x)

    def forward(self, idx: torch.Tensor, positions: torch.Tensor | None = None, kv_cache: KVCache | None = None,
                last_only: bool = False, probe: PassProbe | None = None) -> torch.Tensor:
        """Logits for `idx` (B, T) at `positions` (T,), or (B, T) for rows at different positions; with
        `kv_cache`, attend to cached keys too.

        `last_only` computes logits for the last position alone, which is all decoding needs; `probe`
        counts the K/V rows each layer projects and records what it is asked to.
        """
        x = self.hidden_states(idx, positions, kv_cache, last_only, probe)  # (B, T, C)
        return F.linear(x, self.transformer.wte.weight)  # (B, T, V): the head is the token embedding
