"""What each model family's KV cache holds, per layer: the one place a family states its cache's bytes a position
and the positions each layer keeps, as a kvviz.core.memory.Architecture. The engine plans its runs with it;
`kvviz memory` and the memory view draw it; the cache's measured `bytes_used` must equal it (tests check both
against hand counts).

- GPT-2: every head's key and value, every position (multi-head attention).
- Llama-family: the KV heads' keys and values (grouped- or multi-query attention when fewer than the query
  heads); Mistral's `sliding_window` caps every layer, Qwen2's only from `max_window_layers` up.
- DeepSeek-V2: one latent `c_kv` and one RoPE key `k_pe` a layer and position, shared by every head (MLA).
"""

from __future__ import annotations

from dataclasses import replace

from kvviz.core.memory import Architecture
from kvviz.core.records import CachePolicy
from kvviz.models.deepseek import DeepseekConfig
from kvviz.models.gpt2 import GPTConfig
from kvviz.models.llama import LlamaConfig


def _heads(config: GPTConfig | LlamaConfig, name: str, source: str) -> Architecture:
    n_kv = config.n_kv_head
    attention = "mha" if n_kv == config.n_head else "mqa" if n_kv == 1 else "gqa"
    window = getattr(config, "sliding_window", 0) or None  # GPT-2 has none
    return Architecture(name=name, attention=attention, layers=config.n_layer, kv_heads=n_kv,
                        head_dim=config.head_dim, sliding_window=window,
                        window_first_layer=getattr(config, "window_first_layer", 0) if window else 0,
                        context=config.n_ctx, source=source)


def _latent(config: DeepseekConfig, name: str, source: str) -> Architecture:
    return Architecture(name=name, attention="mla", layers=config.n_layer, latent_dim=config.kv_lora_rank,
                        rope_dim=config.qk_rope_head_dim, context=config.n_ctx, source=source)


SHAPES = {GPTConfig: _heads, LlamaConfig: _heads, DeepseekConfig: _latent}


def cache_shape(config: object, name: str | None = None, source: str = "the model's config") -> Architecture:
    """The KV cache a model of `config` keeps, with its own sliding window (if any)."""
    shape = SHAPES.get(type(config))
    if shape is None:
        raise TypeError(f"{type(config).__name__} is no model config kvviz knows")
    return shape(config, name or getattr(config, "name", "model"), source)


def run_cache_shape(config: object, policy: CachePolicy, name: str | None = None) -> Architecture:
    """The cache a run under `policy` keeps: the model's, with the policy's window, sinks and first windowed
    layer in place of the model's own (a policy without a window keeps every position)."""
    shape = cache_shape(config, name)
    return replace(shape, sliding_window=policy.window or None, sinks=policy.sinks,
                   window_first_layer=policy.first_layer if policy.window else 0)
