"""The DeepSeek family's checkpoint format: transformers' `config.json` of model_type deepseek_v2 with dense
layers only, and the state dict's keys (the same names as kvviz.models.deepseek's modules)."""

from __future__ import annotations

from pathlib import Path

import torch

from kvviz.core.errors import ModelLoadError
from kvviz.models.config_json import positive as _positive
from kvviz.models.config_json import read_config, shown, whole
from kvviz.models.deepseek import DeepseekConfig

MODEL_TYPES = ("deepseek_v2",)
IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)


def config_from_json(path: Path) -> DeepseekConfig:
    """A DeepseekConfig from a transformers `config.json` (ModelLoadError naming what kvviz cannot run)."""
    raw = read_config(path)
    layers = _whole(raw, path, "num_hidden_layers", 27)
    dense = raw.get("first_k_dense_replace", 0)
    if raw.get("n_routed_experts") and (not isinstance(dense, int) or dense < layers):
        raise ModelLoadError(f"{path}: layers {shown(dense)} to {layers - 1} are mixture-of-experts "
                             f"({shown(raw['n_routed_experts'])} experts); kvviz runs DeepSeek's dense layers only")
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    if not isinstance(rope, dict):
        raise ModelLoadError(f"{path}: the RoPE settings {shown(rope)} are not a JSON object")
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind != "default":
        raise ModelLoadError(f"{path}: rope_type {shown(kind)} is not supported; kvviz runs plain RoPE only")
    if raw.get("hidden_act", "silu") != "silu":
        raise ModelLoadError(f"{path}: hidden_act {shown(raw['hidden_act'])} is not SwiGLU's silu")
    for key in ("attention_bias", "mlp_bias"):
        if raw.get(key):
            raise ModelLoadError(f"{path}: {key} is not supported")
    heads = _whole(raw, path, "num_attention_heads", 16)
    kv_heads = raw.get("num_key_value_heads")
    if kv_heads is not None and kv_heads != heads:
        raise ModelLoadError(f"{path}: num_key_value_heads {shown(kv_heads)} differs from num_attention_heads; "
                             "latent attention rebuilds a key and a value for every head")
    q_rank = raw.get("q_lora_rank")
    try:
        return DeepseekConfig(
            vocab_size=_whole(raw, path, "vocab_size", 102400),
            n_ctx=_whole(raw, path, "max_position_embeddings", 2048),
            n_layer=layers,
            n_head=heads,
            n_embd=_whole(raw, path, "hidden_size", 2048),
            intermediate_size=_whole(raw, path, "intermediate_size", 10944),
            kv_lora_rank=_whole(raw, path, "kv_lora_rank", 512),
            q_lora_rank=0 if q_rank is None else _whole(raw, path, "q_lora_rank", 0),
            qk_nope_head_dim=_whole(raw, path, "qk_nope_head_dim", 128),
            qk_rope_head_dim=_whole(raw, path, "qk_rope_head_dim", 64),
            v_head_dim=_whole(raw, path, "v_head_dim", 128),
            rms_norm_eps=_positive(raw, path, "rms_norm_eps", 1e-6),
            rope_theta=_positive(rope if "rope_theta" in rope else raw, path, "rope_theta", 10000.0),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        )
    except ModelLoadError:
        raise  # it names the file already
    except (ValueError, TypeError) as exc:
        raise ModelLoadError(f"{path}: {exc}") from exc


def _whole(raw: dict, path: Path, key: str, default: int) -> int:
    """A size of DeepSeek's config: a whole number, at least 1 (config_json.whole)."""
    return whole(raw, path, key, default, low=1)


def config_to_json(config: DeepseekConfig) -> dict:
    """The transformers `config.json` for `config`, loadable by DeepseekV2ForCausalLM (every layer dense)."""
    return {
        "architectures": ["DeepseekV2ForCausalLM"],
        "model_type": "deepseek_v2",
        "vocab_size": config.vocab_size,
        "max_position_embeddings": config.n_ctx,
        "num_hidden_layers": config.n_layer,
        "num_attention_heads": config.n_head,
        "num_key_value_heads": config.n_head,
        "hidden_size": config.n_embd,
        "intermediate_size": config.intermediate_size,
        "kv_lora_rank": config.kv_lora_rank,
        "q_lora_rank": config.q_lora_rank or None,
        "qk_nope_head_dim": config.qk_nope_head_dim,
        "qk_rope_head_dim": config.qk_rope_head_dim,
        "v_head_dim": config.v_head_dim,
        "first_k_dense_replace": config.n_layer,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
        "tie_word_embeddings": config.tie_word_embeddings,
        "hidden_act": "silu",
        "torch_dtype": "float32",
    }


def normalize_keys(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The state dict without the buffers checkpoints may carry besides weights."""
    return {k: v for k, v in state.items() if not k.endswith(IGNORED_SUFFIXES)}


def infer_config(state: dict[str, torch.Tensor], name: str, origin: str | None = None) -> DeepseekConfig:
    raise ModelLoadError(f"{origin or name}: a DeepSeek checkpoint needs its config.json beside it")


def check_config_fits(config: DeepseekConfig, state: dict[str, torch.Tensor], origin: str,
                      config_path: Path) -> None:
    """A config.json may not describe a model larger than the tensors beside it (checked before it is built)."""
    layers = {k.split(".")[2] for k in state if k.startswith("model.layers.")}
    try:
        vocab_size, width = (int(n) for n in state["model.embed_tokens.weight"].shape)
        latent = int(state["model.layers.0.self_attn.kv_a_proj_with_mqa.weight"].shape[0])
    except KeyError as exc:
        raise ModelLoadError(f"{origin}: tensor {exc.args[0]} is missing; not a DeepSeek checkpoint") from exc
    except (ValueError, IndexError) as exc:
        raise ModelLoadError(f"{origin}: tensor model.embed_tokens.weight is not a matrix") from exc
    for key, needs, found in (("vocab_size", config.vocab_size, vocab_size), ("hidden_size", config.n_embd, width),
                              ("num_hidden_layers", config.n_layer, len(layers)),
                              ("kv_lora_rank", config.latent_dim, latent)):
        if needs > found:
            raise ModelLoadError(f"{config_path}: {key} is more than the weights in {Path(origin).name} have")
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)


def column_major_keys(state: dict[str, torch.Tensor]) -> list[str]:
    """None: the teaching model multiplies by transformers' (out, in) weights as they are."""
    return []
