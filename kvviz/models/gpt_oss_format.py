"""The gpt-oss family's checkpoint format: transformers' `config.json` of model_type gpt_oss with unquantized weights,
and the state dict's keys (the same names as kvviz.models.gpt_oss's modules and parameters)."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from kvviz.core.errors import ModelLoadError
from kvviz.models.config_json import positive as _positive
from kvviz.models.config_json import read_config, shown, whole
from kvviz.models.gpt_oss import FULL, SLIDING, GptOssConfig, Yarn

MODEL_TYPES = ("gpt_oss",)
IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)


def _whole(raw: dict, path: Path, key: str, default: int) -> int:
    """A size of gpt-oss's config: a whole number, at least 1 (config_json.whole)."""
    return whole(raw, path, key, default, low=1)


def _yarn(rope: dict, raw: dict, path: Path) -> Yarn:
    """YaRN's settings as transformers reads them (`_compute_yarn_parameters`): a missing factor is the context's
    stretch, beta_fast and beta_slow default to 32 and 1, truncate to true; the attention factor is given, or
    YaRN's mscale of the factor (a ratio of two where mscale and mscale_all_dim are given)."""
    original = _whole(rope, path, "original_max_position_embeddings", 4096)
    factor = (_positive(rope, path, "factor", 32.0) if rope.get("factor") is not None
              else _whole(raw, path, "max_position_embeddings", 131072) / original)
    if rope.get("partial_rotary_factor", 1.0) != 1.0:
        raise ModelLoadError(f"{path}: partial_rotary_factor {shown(rope['partial_rotary_factor'])} is not "
                             "supported; kvviz turns every number of a head")

    def mscale(scale: float) -> float:
        return 0.1 * scale * math.log(factor) + 1.0 if factor > 1 else 1.0

    attention_factor = 0.0
    if rope.get("attention_factor") is not None:
        attention_factor = _positive(rope, path, "attention_factor", 1.0)
    elif rope.get("mscale") and rope.get("mscale_all_dim"):
        attention_factor = mscale(_positive(rope, path, "mscale", 1.0)) / mscale(
            _positive(rope, path, "mscale_all_dim", 1.0))
    return Yarn(factor=factor, beta_fast=_positive(rope, path, "beta_fast", 32.0) if rope.get("beta_fast") else 32.0,
                beta_slow=_positive(rope, path, "beta_slow", 1.0) if rope.get("beta_slow") else 1.0,
                original_context=original, truncate=bool(rope.get("truncate", True)),
                attention_factor=attention_factor)


def config_from_json(path: Path) -> GptOssConfig:
    """A GptOssConfig from a transformers `config.json` (ModelLoadError naming what kvviz cannot run)."""
    raw = read_config(path)
    if raw.get("quantization_config") is not None:
        method = raw["quantization_config"].get("quant_method") if isinstance(raw["quantization_config"], dict) \
            else raw["quantization_config"]
        raise ModelLoadError(f"{path}: quantization_config {shown(method)}: kvviz runs unquantized gpt-oss weights "
                             "only (float32, float16 or bfloat16; dequantize the MXFP4 experts first)")
    # transformers 5 writes RoPE's settings as rope_parameters, older configs (the published ones) as rope_scaling
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    if not isinstance(rope, dict):
        raise ModelLoadError(f"{path}: the RoPE settings {shown(rope)} are not a JSON object")
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind not in ("default", "yarn"):
        raise ModelLoadError(f"{path}: rope_type {shown(kind)} is not supported; kvviz runs gpt-oss with YaRN "
                             "(yarn) or plain RoPE")
    layers = _whole(raw, path, "num_hidden_layers", 24)
    kinds = raw.get("layer_types")
    if kinds is None:
        kinds = [SLIDING if i % 2 == 0 else FULL for i in range(layers)]  # transformers' default: alternating
    if not isinstance(kinds, list) or len(kinds) != layers or any(k not in (SLIDING, FULL) for k in kinds):
        raise ModelLoadError(f"{path}: layer_types must list {layers} layers, each {SLIDING} or {FULL}; "
                             f"got {shown(kinds)}")
    heads = _whole(raw, path, "num_attention_heads", 64)
    width = _whole(raw, path, "hidden_size", 2880)
    try:
        return GptOssConfig(
            vocab_size=_whole(raw, path, "vocab_size", 201088),
            n_ctx=_whole(raw, path, "max_position_embeddings", 131072),
            n_layer=layers,
            n_head=heads,
            n_kv_head=_whole(raw, path, "num_key_value_heads", heads),
            head_size=_whole(raw, path, "head_dim", width // heads) if raw.get("head_dim") is not None
            else width // heads,
            n_embd=width,
            n_expert=_whole(raw, path, "num_local_experts", 128),
            n_expert_used=_whole(raw, path, "num_experts_per_tok", 4),
            expert_size=_whole(raw, path, "intermediate_size", 2880),
            swiglu_alpha=_positive(raw, path, "swiglu_alpha", 1.702),
            swiglu_limit=_positive(raw, path, "swiglu_limit", 7.0),
            rms_norm_eps=_positive(raw, path, "rms_norm_eps", 1e-5),
            rope_theta=_positive(rope if "rope_theta" in rope else raw, path, "rope_theta", 150000.0),
            yarn=_yarn(rope, raw, path) if kind == "yarn" else None,
            attention_bias=bool(raw.get("attention_bias", True)),
            sliding_window=_whole(raw, path, "sliding_window", 128),
            layer_types=tuple(kinds),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            name=path.parent.name,
        )
    except ModelLoadError:
        raise  # it names the file already
    except (ValueError, TypeError) as exc:
        raise ModelLoadError(f"{path}: {exc}") from exc


def config_to_json(config: GptOssConfig) -> dict:
    """The transformers `config.json` for `config`, loadable by GptOssForCausalLM."""
    rope: dict = {"rope_type": "default", "rope_theta": config.rope_theta}
    if config.yarn is not None:
        yarn = config.yarn
        rope = {"rope_type": "yarn", "rope_theta": config.rope_theta, "factor": yarn.factor,
                "beta_fast": yarn.beta_fast, "beta_slow": yarn.beta_slow,
                "original_max_position_embeddings": yarn.original_context, "truncate": yarn.truncate,
                **({"attention_factor": yarn.attention_factor} if yarn.attention_factor else {})}
    return {
        "architectures": ["GptOssForCausalLM"],
        "model_type": "gpt_oss",
        "vocab_size": config.vocab_size,
        "max_position_embeddings": config.n_ctx,
        "num_hidden_layers": config.n_layer,
        "num_attention_heads": config.n_head,
        "num_key_value_heads": config.n_kv_head,
        "head_dim": config.head_dim,
        "hidden_size": config.n_embd,
        "num_local_experts": config.n_expert,
        "num_experts_per_tok": config.n_expert_used,
        "intermediate_size": config.expert_size,
        "swiglu_alpha": config.swiglu_alpha,
        "swiglu_limit": config.swiglu_limit,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_parameters": rope,
        "attention_bias": config.attention_bias,
        "sliding_window": config.sliding_window,
        "layer_types": [SLIDING if sliding else FULL for sliding in config.sliding],
        "tie_word_embeddings": config.tie_word_embeddings,
        "torch_dtype": "float32",
    }


def normalize_keys(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The state dict without the buffers checkpoints may carry besides weights."""
    return {k: v for k, v in state.items() if not k.endswith(IGNORED_SUFFIXES)}


def infer_config(state: dict[str, torch.Tensor], name: str, origin: str | None = None) -> GptOssConfig:
    raise ModelLoadError(f"{origin or name}: a gpt-oss checkpoint needs its config.json beside it")


def check_config_fits(config: GptOssConfig, state: dict[str, torch.Tensor], origin: str,
                      config_path: Path) -> None:
    """A config.json may not describe a model larger than the tensors beside it (checked before it is built)."""
    layers = {k.split(".")[2] for k in state if k.startswith("model.layers.")}
    try:
        vocab_size, width = (int(n) for n in state["model.embed_tokens.weight"].shape)
        queries = int(state["model.layers.0.self_attn.q_proj.weight"].shape[0])
        keys = int(state["model.layers.0.self_attn.k_proj.weight"].shape[0])
        experts, _, gate_up = (int(n) for n in state["model.layers.0.mlp.experts.gate_up_proj"].shape)
    except KeyError as exc:
        raise ModelLoadError(f"{origin}: tensor {exc.args[0]} is missing; not an unquantized gpt-oss "
                             "checkpoint") from exc
    except (ValueError, IndexError) as exc:
        raise ModelLoadError(f"{origin}: a tensor of the embeddings or the first layer has an unexpected "
                             "shape; not a gpt-oss checkpoint") from exc
    if not all(layer.isdigit() for layer in layers):
        raise ModelLoadError(f"{origin}: unexpected tensor names under model.layers; not a gpt-oss checkpoint")
    hd = config.head_dim
    for key, value, needs, found in (
        ("vocab_size", config.vocab_size, config.vocab_size, vocab_size),
        ("hidden_size", config.n_embd, config.n_embd, width),
        ("num_hidden_layers", config.n_layer, config.n_layer, len(layers)),
        ("num_attention_heads", config.n_head, config.n_head * hd, queries),
        ("num_key_value_heads", config.n_kv_head, config.n_kv_head * hd, keys),
        ("num_local_experts", config.n_expert, config.n_expert, experts),
        ("intermediate_size", config.expert_size, 2 * config.expert_size, gate_up),
    ):
        if needs > found:
            raise ModelLoadError(f"{config_path}: {key}={shown(value)} is more than the weights in "
                                 f"{Path(origin).name} have")
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)


def column_major_keys(state: dict[str, torch.Tensor]) -> list[str]:
    """None: the teaching model multiplies by transformers' weights as they are stored."""
    return []
