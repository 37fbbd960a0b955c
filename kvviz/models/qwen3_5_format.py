"""The Qwen3.5 family's checkpoint format: transformers' `config.json` of model_type qwen3_5_text (the text model,
Qwen3_5ForCausalLM), or qwen3_5 (the published checkpoints: Qwen3_5ForConditionalGeneration, its text model's
config under `text_config`), and the state dict's keys (the same names as kvviz.models.qwen3_5's modules).

A published checkpoint holds its text model under `model.language_model.`, beside a vision tower
(`model.visual.`) and a multi-token-prediction head (`mtp.`): kvviz runs the text model on text, so it reads
the first as `model.` and leaves the other two out.
"""

from __future__ import annotations

from pathlib import Path

import torch

from kvviz.core.errors import ModelLoadError
from kvviz.models.config_json import positive as _positive
from kvviz.models.config_json import read_config, shown
from kvviz.models.config_json import whole as _whole
from kvviz.models.qwen3_5 import Qwen35Config

MODEL_TYPES = ("qwen3_5_text", "qwen3_5")
IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)
IGNORED_PREFIXES = ("model.visual.", "mtp.")  # the vision tower and the multi-token-prediction head: not run on text
TEXT_PREFIX = "model.language_model."  # where a multimodal checkpoint keeps its text model


def config_from_json(path: Path) -> Qwen35Config:
    """A Qwen35Config from a transformers `config.json` (ModelLoadError naming what kvviz cannot run)."""
    top = read_config(path)
    raw = top.get("text_config", top) if top.get("model_type") == "qwen3_5" else top
    if not isinstance(raw, dict):
        raise ModelLoadError(f"{path}: text_config {shown(raw)} is not a JSON object")
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    if not isinstance(rope, dict):
        raise ModelLoadError(f"{path}: the RoPE settings {shown(rope)} are not a JSON object")
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind != "default":
        raise ModelLoadError(f"{path}: rope_type {shown(kind)} is not supported; kvviz runs plain RoPE only")
    if raw.get("hidden_act", "silu") != "silu":
        raise ModelLoadError(f"{path}: hidden_act {shown(raw['hidden_act'])} is not SwiGLU's silu")
    if raw.get("attention_bias"):
        raise ModelLoadError(f"{path}: attention_bias is not supported")
    if raw.get("attn_output_gate", True) is not True:
        raise ModelLoadError(f"{path}: attn_output_gate {shown(raw['attn_output_gate'])}: kvviz runs Qwen3.5's "
                             "gated attention only")
    kinds = raw.get("layer_types")
    if kinds is not None and not (isinstance(kinds, list) and all(isinstance(kind, str) for kind in kinds)):
        raise ModelLoadError(f"{path}: layer_types {shown(kinds)} is not a list of layer kinds")
    heads = _whole(raw, path, "num_attention_heads", 16, low=1)
    tied = raw.get("tie_word_embeddings", top.get("tie_word_embeddings", False))
    try:
        return Qwen35Config(
            vocab_size=_whole(raw, path, "vocab_size", 248320, low=1),
            n_ctx=_whole(raw, path, "max_position_embeddings", 32768, low=1),
            n_layer=_whole(raw, path, "num_hidden_layers", 32, low=1),
            n_head=heads,
            n_kv_head=_whole(raw, path, "num_key_value_heads", heads, low=1),
            head_size=_whole(raw, path, "head_dim", 256, low=1),
            n_embd=_whole(raw, path, "hidden_size", 4096, low=1),
            intermediate_size=_whole(raw, path, "intermediate_size", 12288, low=1),
            layer_types=tuple(kinds or ()),
            full_attention_interval=_whole(raw, path, "full_attention_interval", 4, low=1),
            linear_num_key_heads=_whole(raw, path, "linear_num_key_heads", 16, low=1),
            linear_num_value_heads=_whole(raw, path, "linear_num_value_heads", 32, low=1),
            linear_key_head_dim=_whole(raw, path, "linear_key_head_dim", 128, low=1),
            linear_value_head_dim=_whole(raw, path, "linear_value_head_dim", 128, low=1),
            linear_conv_kernel_dim=_whole(raw, path, "linear_conv_kernel_dim", 4, low=1),
            partial_rotary_factor=_positive(rope if "partial_rotary_factor" in rope else raw, path,
                                            "partial_rotary_factor", 0.25),
            rope_theta=_positive(rope if "rope_theta" in rope else raw, path, "rope_theta", 10000.0),
            rms_norm_eps=_positive(raw, path, "rms_norm_eps", 1e-6),
            tie_word_embeddings=bool(tied),
            name=path.parent.name,
        )
    except ModelLoadError:
        raise  # it names the file already
    except (ValueError, TypeError) as exc:
        raise ModelLoadError(f"{path}: {exc}") from exc


def config_to_json(config: Qwen35Config) -> dict:
    """The transformers `config.json` for `config`, loadable by Qwen3_5ForCausalLM."""
    return {
        "architectures": ["Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5_text",
        "vocab_size": config.vocab_size,
        "max_position_embeddings": config.n_ctx,
        "num_hidden_layers": config.n_layer,
        "num_attention_heads": config.n_head,
        "num_key_value_heads": config.n_kv_head,
        "head_dim": config.head_dim,
        "hidden_size": config.n_embd,
        "intermediate_size": config.intermediate_size,
        "layer_types": list(config.kinds),
        "linear_num_key_heads": config.linear_num_key_heads,
        "linear_num_value_heads": config.linear_num_value_heads,
        "linear_key_head_dim": config.linear_key_head_dim,
        "linear_value_head_dim": config.linear_value_head_dim,
        "linear_conv_kernel_dim": config.linear_conv_kernel_dim,
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta,
                            "partial_rotary_factor": config.partial_rotary_factor},
        "rms_norm_eps": config.rms_norm_eps,
        "tie_word_embeddings": config.tie_word_embeddings,
        "hidden_act": "silu",
        "torch_dtype": "float32",
    }


def normalize_keys(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The text model's tensors under the names kvviz.models.qwen3_5 gives them: a multimodal checkpoint's
    `model.language_model.` read as `model.`, its vision tower and multi-token-prediction head left out, and the
    buffers some checkpoints carry besides weights dropped."""
    return {("model." + k.removeprefix(TEXT_PREFIX) if k.startswith(TEXT_PREFIX) else k): v
            for k, v in state.items() if not k.startswith(IGNORED_PREFIXES) and not k.endswith(IGNORED_SUFFIXES)}


def infer_config(state: dict[str, torch.Tensor], name: str, origin: str | None = None) -> Qwen35Config:
    raise ModelLoadError(f"{origin or name}: a Qwen3.5 checkpoint needs its config.json beside it")


def check_config_fits(config: Qwen35Config, state: dict[str, torch.Tensor], origin: str, config_path: Path) -> None:
    """A config.json may not describe a model larger than the tensors beside it (checked before it is built). A
    tied head's copy of the embeddings, which some checkpoints carry, is dropped."""
    layers = {k.split(".")[2] for k in state if k.startswith("model.layers.")}
    try:
        vocab_size, width = (int(n) for n in state["model.embed_tokens.weight"].shape)
    except KeyError as exc:
        raise ModelLoadError(f"{origin}: tensor {exc.args[0]} is missing; not a Qwen3.5 checkpoint") from exc
    except ValueError as exc:
        raise ModelLoadError(f"{origin}: tensor model.embed_tokens.weight is not a matrix") from exc
    for key, needs, found in (("vocab_size", config.vocab_size, vocab_size), ("hidden_size", config.n_embd, width),
                              ("num_hidden_layers", config.n_layer, len(layers))):
        if needs > found:
            raise ModelLoadError(f"{config_path}: {key} is more than the weights in {Path(origin).name} have")
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)


def column_major_keys(state: dict[str, torch.Tensor]) -> list[str]:
    """None: the teaching model multiplies by transformers' (out, in) weights as they are."""
    return []
