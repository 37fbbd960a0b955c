"""GPT-2 in one readable file, with explicit positions and an optional KV cache."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from kvviz.core.kv_cache import KVCache
from kvviz.models.products import InferenceCopy, project


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

    def with_name(self, name: str) -> GPTConfig:
        return replace(self, name=name)


PRESETS: dict[str, GPTConfig] = {
    "gpt2": GPTConfig(n_layer=12, n_head=12, n_embd=768, name="gpt2"),
    "gpt2-medium": GPTConfig(n_layer=24, n_head=16, n_embd=1024, name="gpt2-medium"),
    "gpt2-large": GPTConfig(n_layer=36, n_head=20, n_embd=1280, name="gpt2-large"),
    "gpt2-xl": GPTConfig(n_layer=48, n_head=25, n_embd=1600, name="gpt2-xl"),
    # The embedded default: small enough to ship, deep enough for the grid to have rows.
    "kvviz-shakespeare": GPTConfig(n_ctx=256, n_layer=6, n_head=6, n_embd=192, name="kvviz-shakespeare"),
}


def column_major(weight: torch.Tensor) -> torch.Tensor:
    """`weight` (V, C) with the same values, stored column by column: its transpose is then a
    contiguous (C, V) matrix without a copy. GPT keeps `wte` this way, so that the tied output
    head, `x @ wte.T`, multiplies by a contiguous matrix (twice as fast on CPU as by the
    transposed view) while sharing the embedding's memory."""
    return weight.t().contiguous().t()


class Conv1D(nn.Module):
    """Affine map whose weight is (in_features, out_features), as in GPT-2 checkpoints, stored
    column-major: the memory of an (out, in) matrix, whose row blocks `project` multiplies in
    parallel. Loaders that assign a new weight should lay it out the same way (else `project`
    falls back to a single product, with the same values). In bfloat16 on CPU, inference
    multiplies by a packed copy of the weight (see `pack_for_cpu`), kept until it changes."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features).t())
        self.bias = nn.Parameter(torch.zeros(out_features))
        self.inference_copy = InferenceCopy()

    def packed_weight(self) -> torch.Tensor | None:
        """The weight's packed copy for inference, or None (in float32, or where packing does not apply)."""
        return self.inference_copy.of(self.weight.t())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape[:-1] + (self.weight.shape[1],)
        packed = None if torch.is_grad_enabled() else self.packed_weight()
        return project(x.reshape(-1, x.shape[-1]), self.weight, self.bias, packed).view(shape)


def newest_query_weights(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """softmax(q·Kᵀ/√d) of the last query row of `q` (N, nh, T, hs) over every key of `k` (N, nh, S, hs), in
    float32, for N layers of one sequence (or one layer: N = 1).

    The last query is the newest position, which attends to every key a pass holds, so no mask is needed.
    Returns (N, nh, S). Computed beside the attention output, never in its place, so the logits do not change.
    """
    q_last = q[:, :, -1:, :].float()  # (N, nh, 1, hs)
    scores = q_last @ k.float().transpose(-2, -1) / math.sqrt(q.shape[-1])  # (N, nh, 1, S)
    return torch.softmax(scores, dim=-1).squeeze(2)  # (N, nh, S)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention that counts the key/value rows it projects.

    The count goes to `kv_rows[layer_index]`, a list the whole model shares. When `attention_rows` is a
    list (see `GPT.attention_rows`), each pass appends its newest query's weights (nh, S) to it.
    """

    def __init__(self, config: GPTConfig, layer_index: int, kv_rows: list[int]) -> None:
        super().__init__()
        self.layer_index = layer_index
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.c_attn = Conv1D(config.n_embd, 3 * config.n_embd)
        self.c_proj = Conv1D(config.n_embd, config.n_embd)
        self.kv_rows = kv_rows  # K/V rows each layer has computed since the last reset
        self.attention_rows: list[torch.Tensor] | None = None  # set by GPT.attention_rows, shared by all layers

    def forward(self, x: torch.Tensor, positions: torch.Tensor, kv_cache: KVCache | None) -> torch.Tensor:
        B, T, C = x.shape  # (B, T, C)
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)  # 3 x (B, T, C)
        self.kv_rows[self.layer_index] += B * T
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        if kv_cache is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=T > 1)
        else:
            k, v = kv_cache.update(self.layer_index, positions, k, v)  # (B, nh, S, hs), S = cached + T
            if T == 1:
                y = F.scaled_dot_product_attention(q, k, v)
            else:
                S = k.shape[2]
                key_positions = torch.arange(S, device=x.device)
                mask = key_positions[None, :] <= positions[:, None]  # (T, S)
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        if self.attention_rows is not None:
            if B != 1:
                raise ValueError(f"attention weights are recorded for one sequence, not a batch of {B}")
            self.attention_rows.append(newest_query_weights(q, k)[0])  # (nh, S)
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
    def __init__(self, config: GPTConfig, layer_index: int, kv_rows: list[int]) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.attn = CausalSelfAttention(config, layer_index, kv_rows)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, kv_cache: KVCache | None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), positions, kv_cache)
        return x + self.mlp(self.ln_2(x))

    def decode_weights(self) -> BlockWeights:
        attn, mlp = self.attn, self.mlp
        return BlockWeights(
            self.ln_1.weight, self.ln_1.bias, attn.c_attn.weight, attn.c_attn.bias, attn.c_proj.weight,
            attn.c_proj.bias, self.ln_2.weight, self.ln_2.bias, mlp.c_fc.weight, mlp.c_fc.bias,
            mlp.c_proj.weight, mlp.c_proj.bias, attn.c_attn.packed_weight(), attn.c_proj.packed_weight(),
            mlp.c_fc.packed_weight(), mlp.c_proj.packed_weight(),
        )


class BlockWeights(NamedTuple):
    """One block's tensors, read once per run by `GPT.decode_one` instead of once per token."""

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
    attn_packed: torch.Tensor | None  # the Conv1Ds' packed copies, or None (see `pack_for_cpu`)
    attn_proj_packed: torch.Tensor | None
    fc_packed: torch.Tensor | None
    mlp_proj_packed: torch.Tensor | None


class GPT(nn.Module):
    """GPT-2: learned positions, pre-LayerNorm blocks, GELU (tanh), output head tied to `wte`.

    Module names follow the checkpoint keys (`wte`, `wpe`, `h`, `ln_f`, `c_attn`, `c_proj`).
    `wte` is stored column-major (see `column_major`); loaders that assign a new `wte` should
    lay it out the same way, or inference keeps a transposed copy of it for the head.
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        V, C = config.vocab_size, config.n_embd
        self._kv_rows = [0] * config.n_layer  # shared with every attention layer, which counts into it
        self.transformer = nn.ModuleDict(
            dict(
                # Uninitialised, like Conv1D: loaders overwrite them and `init_weights` draws them.
                # (Embedding's own init on the meta device would import torch._dynamo: seconds.)
                wte=nn.Embedding(config.vocab_size, config.n_embd, _weight=torch.empty(C, V).t()),
                wpe=nn.Embedding(config.n_ctx, config.n_embd, _weight=torch.empty(config.n_ctx, C)),
                h=nn.ModuleList(Block(config, i, self._kv_rows) for i in range(config.n_layer)),
                ln_f=nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon),
            )
        )
        self._head_t: torch.Tensor | None = None
        self._head_key: tuple[int, int] | None = None
        self._head_packed = InferenceCopy()
        self._attention_rows: list[torch.Tensor] | None = None
        # Called before every block in every pass, with the block's index: a way to stop a long
        # pass from another thread (it raises), as the app's worker does when the window closes.
        self.before_block: Callable[[int], None] | None = None

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
        self.release_inference_buffers()

    @property
    def blocks(self) -> nn.ModuleList:
        return self.transformer.h

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    @property
    def attention_rows(self) -> list[torch.Tensor] | None:
        """None (the default: nothing recorded), or a list that every pass's attention layers append their
        newest query's weights to, one (nh, S) float32 tensor per layer in order: set a fresh list before a
        pass, read it after, and set None again."""
        return self._attention_rows

    @attention_rows.setter
    def attention_rows(self, rows: list[torch.Tensor] | None) -> None:
        self._attention_rows = rows
        for block in self.blocks:
            block.attn.attention_rows = rows

    def kv_rows_projected(self) -> list[int]:
        """K/V rows each layer has projected since `reset_kv_counters`."""
        return list(self._kv_rows)

    def reset_kv_counters(self) -> None:
        self._kv_rows[:] = [0] * len(self._kv_rows)

    def decode_weights(self) -> list[BlockWeights]:
        """Every block's tensors for `decode_one`; take them again if the parameters are replaced."""
        return [block.decode_weights() for block in self.blocks]

    def release_inference_buffers(self) -> None:
        """Drop what inference keeps besides the parameters (a transposed copy of the head, made only
        when `wte` is not column-major; packed bfloat16 copies); call it when the model is being replaced."""
        self._head_t = None
        self._head_key = None
        self._head_packed.release()
        for module in self.modules():
            if isinstance(module, Conv1D):
                module.inference_copy.release()

    def _head_logits(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (M, V) for final hidden states `x` (M, C), through the tied head."""
        packed = self._head_packed.of(self.transformer.wte.weight)  # wte is (V, C): (out, in)
        if packed is not None:
            return project(x, self.transformer.wte.weight, None, packed)
        return x @ self._output_head()

    def _output_head(self) -> torch.Tensor:
        """The tied head as a contiguous (C, V) tensor for inference: `wte`'s own memory when it is
        column-major, else a copy kept until `wte` changes or `release_inference_buffers`."""
        w = self.transformer.wte.weight
        head = w.detach().t()  # (C, V)
        if head.is_contiguous():
            return head
        key = (w.data_ptr(), w._version)
        if self._head_t is None or self._head_key != key or self._head_t.dtype != w.dtype:
            self._head_t = w.detach().t().contiguous()  # (C, V)
            self._head_key = key
        return self._head_t

    def hidden_states(
        self,
        idx: torch.Tensor,
        positions: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
        last_only: bool = False,
    ) -> torch.Tensor:
        """The final LayerNorm's output (B, T, C) for `idx` (B, T): what the tied head turns into logits."""
        B, T = idx.shape
        if positions is None:
            start = 0 if kv_cache is None else kv_cache.length
            positions = torch.arange(start, start + T, device=idx.device)
        if int(positions[-1]) >= self.config.n_ctx:
            raise ValueError(f"position {int(positions[-1])} is past the context length {self.config.n_ctx}")
        x = self.transformer.wte(idx) + self.transformer.wpe(positions)  # (B, T, C)
        for i, block in enumerate(self.blocks):
            if self.before_block is not None:
                self.before_block(i)
            x = block(x, positions, kv_cache)
        if last_only:
            x = x[:, -1:, :]  # (B, 1, C)
        return self.transformer.ln_f(x)

    def decode_one(
        self, token: int, position: int, kv_cache: KVCache, weights: list[BlockWeights] | None = None
    ) -> torch.Tensor:
        """Logits (1, V) for one token of a single sequence at `position`, attending to the cache.

        The same arithmetic as `forward` on a (1, 1) input (a test checks the logits are equal),
        written as plain tensor calls on `weights` (from `decode_weights`, taken once per run):
        at one token, module calls, attribute look-ups and shape bookkeeping cost about a fifth
        of the step on CPU, more than everything but the matrix products.
        """
        cfg = self.config
        C, nh, hs, eps = cfg.n_embd, cfg.n_head, cfg.head_dim, cfg.layer_norm_epsilon
        if position >= cfg.n_ctx:
            raise ValueError(f"position {position} is past the context length {cfg.n_ctx}")
        wte, wpe = self.transformer.wte.weight, self.transformer.wpe.weight
        kv_rows, before_block, attention_rows = self._kv_rows, self.before_block, self._attention_rows
        queries: list[torch.Tensor] = []  # with attention_rows: every layer's query, weighed after the loop
        x = (wte[token] + wpe[position]).view(1, C)  # (1, C)
        for i, w in enumerate(weights or self.decode_weights()):
            if before_block is not None:
                before_block(i)
            h = F.layer_norm(x, (C,), w.ln_1_weight, w.ln_1_bias, eps)
            qkv = project(h, w.attn_weight, w.attn_bias, w.attn_packed)  # (1, 3C)
            kv_rows[i] += 1
            qkv = qkv.view(3, 1, nh, 1, hs)  # q, k, v as (B=1, nh, T=1, hs) each
            cached = kv_cache.append(i, position, qkv[1:])  # (2, 1, nh, S, hs)
            y = F.scaled_dot_product_attention(qkv[0], cached[0], cached[1])  # (1, nh, 1, hs)
            if attention_rows is not None:
                queries.append(qkv[0])  # (1, nh, 1, hs)
            x = project(y.view(1, C), w.attn_proj_weight, w.attn_proj_bias, w.attn_proj_packed).add_(x)
            h = F.layer_norm(x, (C,), w.ln_2_weight, w.ln_2_bias, eps)
            h = F.gelu(project(h, w.fc_weight, w.fc_bias, w.fc_packed), approximate="tanh")  # (1, 4C)
            x = project(h, w.mlp_proj_weight, w.mlp_proj_bias, w.mlp_proj_packed).add_(x)
        if attention_rows is not None:  # all layers in one product: fewer calls than one per layer
            keys = kv_cache.keys[:, 0, :, : position + 1]  # (L, nh, S, hs): every layer's keys this step read
            attention_rows.extend(newest_query_weights(torch.cat(queries), keys).unbind(0))  # L x (nh, S)
        ln_f = self.transformer.ln_f
        x = F.layer_norm(x, (C,), ln_f.weight, ln_f.bias, eps)
        if torch.is_grad_enabled():
            return F.linear(x, wte)  # (1, V)
        return self._head_logits(x)  # (1, V)

    def forward(
        self,
        idx: torch.Tensor,
        positions: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
        last_only: bool = False,
    ) -> torch.Tensor:
        """Logits for `idx` (B, T) at `positions` (T,); with `kv_cache`, attend to cached keys too.

        `last_only` computes logits for the last position alone, which is all decoding needs.
        """
        x = self.hidden_states(idx, positions, kv_cache, last_only)  # (B, T, C)
        if torch.is_grad_enabled():
            return F.linear(x, self.transformer.wte.weight)  # (B, T, V)
        return self._head_logits(x.reshape(-1, x.shape[-1])).view(*x.shape[:-1], -1)  # (B, T, V)
