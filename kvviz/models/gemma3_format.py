"""The Gemma 3 family's checkpoint format: transformers' `config.json` of model_type gemma3_text (Gemma3ForCausalLM),
as transformers 5 writes it (`rope_parameters` a layer kind) and as the hub's checkpoints have it (`rope_theta`,
`rope_local_base_freq`, `rope_scaling`), and the state dict's keys (the same names as kvviz.models.gemma3's
modules)."""

from __future__ import annotations

from pathlib import Path

import torch

from kvviz.core.errors import ModelLoadError
from kvviz.models import llama_format
from kvviz.models.config_json import positive, read_config, shown, whole
from kvviz.models.gemma3 import GLOBAL, LOCAL, Gemma3Config, local_and_global

MODEL_TYPES = ("gemma3_text", "gemma3")  # gemma3 (with a vision tower) is read only to be refused in one line
IGNORED_SUFFIXES = ("inv_freq",)  # RoPE's buffers, which some checkpoints carry: recomputed from the bases
ROPE_TYPES = ("default", "linear")
DEFAULT_THETA = {GLOBAL: 1_000_000.0, LOCAL: 10_000.0}  # transformers' Gemma3TextConfig defaults


def _rope(raw: dict, path: Path, kind: str) -> tuple[float, float]:
    """One layer kind's RoPE (base, linear factor): from `rope_parameters[kind]` (transformers 5), else from
    `rope_theta` or `rope_local_base_freq` and, for the global layers, `rope_scaling` (the hub's configs)."""
    theta_key = "rope_theta" if kind == GLOBAL else "rope_local_base_freq"
    parameters = raw.get("rope_parameters")
    if parameters is not None:
        if not isinstance(parameters, dict) or not all(key in (LOCAL, GLOBAL) for key in parameters):
            raise ModelLoadError(f"{path}: rope_parameters {shown(parameters)} is not one object a layer kind "
                                 f"({LOCAL}, {GLOBAL})")
        rope = parameters.get(kind) or {}
    else:
        rope = (raw.get("rope_scaling") if kind == GLOBAL else None) or {}
    if not isinstance(rope, dict):
        raise ModelLoadError(f"{path}: the RoPE settings {shown(rope)} of the {kind} layers are not a JSON object")
    rope = {"rope_theta": raw.get(theta_key, DEFAULT_THETA[kind]), **rope}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise ModelLoadError(f"{path}: rope_type {shown(rope_type)} of the {kind} layers is not supported; kvviz "
                             "runs Gemma 3's plain RoPE and its linear scaling")
    if rope.get("partial_rotary_factor", 1.0) != 1.0:
        raise ModelLoadError(f"{path}: partial_rotary_factor {shown(rope['partial_rotary_factor'])} is not "
                             "supported; kvviz turns every number of a head")
    factor = positive(rope, path, "factor", 1.0) if rope_type == "linear" else 1.0
    return positive(rope, path, "rope_theta", DEFAULT_THETA[kind]), factor


def _layer_types(raw: dict, path: Path, layers: int) -> tuple[str, ...]:
    """`layer_types`, or every `sliding_window_pattern`-th layer global (6: five local to one global)."""
    kinds = raw.get("layer_types")
    if kinds is None:
        return local_and_global(layers, whole(raw, path, "sliding_window_pattern", 6, low=1))
    if not isinstance(kinds, list) or len(kinds) != layers or any(kind not in (LOCAL, GLOBAL) for kind in kinds):
        raise ModelLoadError(f"{path}: layer_types must list {layers} layers, each {LOCAL} or {GLOBAL}; got "
                             f"{shown(kinds)}")
    return tuple(kinds)


def _softcap(raw: dict, path: Path, key: str) -> float:
    """A softcapping cap, or 0 where the config sets none (null)."""
    return 0.0 if raw.get(key) is None else positive(raw, path, key, 0.0)


def config_from_json(path: Path) -> Gemma3Config:
    """A Gemma3Config from a transformers `config.json` (ModelLoadError naming what kvviz cannot run)."""
    raw = read_config(path)
    if raw.get("model_type") == "gemma3":
        raise ModelLoadError(f"{path}: model_type gemma3 is Gemma 3 with its vision tower; kvviz runs Gemma 3's text "
                             "models only (gemma3_text, Gemma3ForCausalLM)")
    activation = raw.get("hidden_activation", raw.get("hidden_act", "gelu_pytorch_tanh"))
    if activation != "gelu_pytorch_tanh":
        raise ModelLoadError(f"{path}: hidden_activation {shown(activation)} is not Gemma 3's gelu_pytorch_tanh")
    for key, why in (("attention_bias", "Gemma 3 has no biases"), ("use_bidirectional_attention",
                     "kvviz runs causal decoders")):
        if raw.get(key):
            raise ModelLoadError(f"{path}: {key} is not supported ({why})")
    if raw.get("attn_logit_softcapping") is not None:
        raise ModelLoadError(f"{path}: attn_logit_softcapping {shown(raw['attn_logit_softcapping'])} is not "
                             "supported; Gemma 3 caps no attention scores (transformers' Gemma3ForCausalLM ignores "
                             "the field), and kvviz runs what transformers runs")
    if raw.get("tie_word_embeddings") is False:
        raise ModelLoadError(f"{path}: tie_word_embeddings false is not supported; kvviz runs Gemma 3 with its "
                             "output head tied to the embeddings, as every published one")
    layers = whole(raw, path, "num_hidden_layers", 26, low=1)
    kinds = _layer_types(raw, path, layers)
    window = 0
    if LOCAL in kinds:
        if raw.get("sliding_window", 4096) is None:
            raise ModelLoadError(f"{path}: sliding_window is null, but layer_types has {LOCAL} layers")
        window = whole(raw, path, "sliding_window", 4096, low=1)
    (global_theta, global_factor), (local_theta, local_factor) = _rope(raw, path, GLOBAL), _rope(raw, path, LOCAL)
    heads = whole(raw, path, "num_attention_heads", 8, low=1)
    try:
        return Gemma3Config(
            vocab_size=whole(raw, path, "vocab_size", 262208, low=1),
            n_ctx=whole(raw, path, "max_position_embeddings", 131072, low=1),
            n_layer=layers,
            n_head=heads,
            n_kv_head=whole(raw, path, "num_key_value_heads", 4, low=1),
            n_embd=whole(raw, path, "hidden_size", 2304, low=1),
            intermediate_size=whole(raw, path, "intermediate_size", 9216, low=1),
            head_dim=whole(raw, path, "head_dim", 256, low=1),
            rms_norm_eps=positive(raw, path, "rms_norm_eps", 1e-6),
            layer_types=kinds,
            sliding_window=window,
            rope_theta=global_theta,
            rope_factor=global_factor,
            rope_local_theta=local_theta,
            rope_local_factor=local_factor,
            query_pre_attn_scalar=whole(raw, path, "query_pre_attn_scalar", 256, low=1),
            final_logit_softcapping=_softcap(raw, path, "final_logit_softcapping"),
            name=path.parent.name,
        )
    except ValueError as exc:
        raise ModelLoadError(f"{path}: {exc}") from exc


def config_to_json(config: Gemma3Config) -> dict:
    """The transformers `config.json` for `config`, loadable by Gemma3ForCausalLM (transformers 5's RoPE fields)."""
    def rope(theta: float, factor: float) -> dict:
        return {"rope_type": "linear", "rope_theta": theta, "factor": factor} if factor != 1.0 else \
            {"rope_type": "default", "rope_theta": theta}

    return {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "vocab_size": config.vocab_size,
        "max_position_embeddings": config.n_ctx,
        "num_hidden_layers": config.n_layer,
        "num_attention_heads": config.n_head,
        "num_key_value_heads": config.n_kv_head,
        "hidden_size": config.n_embd,
        "intermediate_size": config.intermediate_size,
        "head_dim": config.head_dim,
        "rms_norm_eps": config.rms_norm_eps,
        "layer_types": list(config.kinds),
        "sliding_window": config.sliding_window or None,
        "rope_parameters": {GLOBAL: rope(config.rope_theta, config.rope_factor),
                            LOCAL: rope(config.rope_local_theta, config.rope_local_factor)},
        "query_pre_attn_scalar": config.query_pre_attn_scalar,
        "attn_logit_softcapping": None,
        "final_logit_softcapping": config.final_logit_softcapping or None,
        "hidden_activation": "gelu_pytorch_tanh",
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
    }


def normalize_keys(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The state dict without the buffers checkpoints may carry besides weights."""
    return {k: v for k, v in state.items() if not k.endswith(IGNORED_SUFFIXES)}


def infer_config(state: dict[str, torch.Tensor], name: str, origin: str | None = None) -> Gemma3Config:
    raise ModelLoadError(f"{origin or name}: a Gemma 3 checkpoint needs its config.json beside it")


def check_config_fits(config: Gemma3Config, state: dict[str, torch.Tensor], origin: str, config_path: Path) -> None:
    """A config.json may not describe a model larger than the tensors beside it: the Llama family's check, whose
    tensor names Gemma 3 shares; its head is always tied, so a copy of the embeddings is dropped."""
    llama_format.check_config_fits(config, state, origin, config_path, "Gemma 3")
    state.pop("lm_head.weight", None)


def column_major_keys(state: dict[str, torch.Tensor]) -> list[str]:
    """None: the teaching model multiplies by transformers' (out, in) weights as they are."""
    return []
