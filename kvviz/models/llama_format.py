"""The Llama family's checkpoint format: transformers' `config.json` of model_type llama, qwen2, mistral or qwen3,
the state dict's keys (the same names as kvviz.models.llama's modules)."""

from __future__ import annotations

from pathlib import Path

import torch

from kvviz.core.errors import ModelLoadError
from kvviz.models.config_json import positive as _positive
from kvviz.models.config_json import read_config, shown
from kvviz.models.config_json import whole as _whole
from kvviz.models.llama import LlamaConfig

MODEL_TYPES = ("llama", "qwen2", "mistral", "qwen3")
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM",
                 "qwen3": "Qwen3ForCausalLM"}
IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)  # a buffer older checkpoints carry, recomputed from rope_theta


LAYER_KINDS = ("full_attention", "sliding_attention")


def _first_windowed_layer(kinds: object, layers: int, path: Path) -> int:
    """Qwen2's `layer_types`: the first windowed layer, where the windowed layers are the top ones (the shape
    kvviz's cache keeps: max_window_layers); any other order is refused in one line rather than run otherwise."""
    if not isinstance(kinds, list) or len(kinds) != layers or any(kind not in LAYER_KINDS for kind in kinds):
        raise ModelLoadError(f"{path}: layer_types must list {layers} layers, each {' or '.join(LAYER_KINDS)}; "
                             f"got {shown(kinds)}")
    first = next((i for i, kind in enumerate(kinds) if kind == "sliding_attention"), layers)
    if any(kind != "sliding_attention" for kind in kinds[first:]):
        windowed = [i for i, kind in enumerate(kinds) if kind == "sliding_attention"]
        raise ModelLoadError(f"{path}: layer_types windows layers {shown(windowed)} under full ones; kvviz windows "
                             "the top layers only (a window from one layer up)")
    return first


def config_from_json(path: Path) -> LlamaConfig:
    """A LlamaConfig from a transformers `config.json` (ModelLoadError naming what kvviz cannot run)."""
    raw = read_config(path)
    model_type = raw.get("model_type")
    # transformers 5 writes RoPE's settings as rope_parameters, older configs as rope_scaling and rope_theta
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    if not isinstance(rope, dict):
        raise ModelLoadError(f"{path}: the RoPE settings {shown(rope)} are not a JSON object")
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind not in ("default", "llama3"):
        raise ModelLoadError(f"{path}: rope_type {shown(kind)} is not supported; kvviz runs plain RoPE "
                             "(rope_theta) and Llama 3's scaling (llama3)")
    scaling = ()
    if kind == "llama3":
        scaling = (_positive(rope, path, "factor", 8.0), _positive(rope, path, "low_freq_factor", 1.0),
                   _positive(rope, path, "high_freq_factor", 4.0),
                   float(_whole(rope, path, "original_max_position_embeddings", 8192)))
        if scaling[2] <= scaling[1]:
            raise ModelLoadError(f"{path}: high_freq_factor {scaling[2]:g} is not above low_freq_factor "
                                 f"{scaling[1]:g}")
    theta_from = rope if "rope_theta" in rope else raw
    if raw.get("hidden_act", "silu") != "silu":
        raise ModelLoadError(f"{path}: hidden_act {shown(raw['hidden_act'])} is not SwiGLU's silu")
    if raw.get("mlp_bias"):
        raise ModelLoadError(f"{path}: mlp_bias is not supported")
    window = 0  # Mistral's sliding window, where it is shorter than the context
    if model_type == "mistral" and raw.get("sliding_window") is not None:
        window = _whole(raw, path, "sliding_window", 0)
        window = window if 0 < window < _whole(raw, path, "max_position_embeddings", 2048) else 0
    first_layer = 0  # Qwen2 windows the layers from max_window_layers on; the ones below keep every position
    if model_type in ("qwen2", "qwen3") and raw.get("use_sliding_window"):
        layers, first = _whole(raw, path, "num_hidden_layers", 32), _whole(raw, path, "max_window_layers", 28)
        if raw.get("layer_types") is not None:  # transformers windows the layers it names, max_window_layers aside
            first = _first_windowed_layer(raw["layer_types"], layers, path)
        if first < layers:
            window = _whole(raw, path, "sliding_window", 4096)
            window = window if 0 < window < _whole(raw, path, "max_position_embeddings", 32768) else 0
            first_layer = first if window else 0
    heads = _whole(raw, path, "num_attention_heads", 32)
    try:
        return LlamaConfig(
            vocab_size=_whole(raw, path, "vocab_size", 32000),
            n_ctx=_whole(raw, path, "max_position_embeddings", 2048),
            n_layer=_whole(raw, path, "num_hidden_layers", 32),
            n_head=heads,
            n_kv_head=_whole(raw, path, "num_key_value_heads", heads),
            n_embd=_whole(raw, path, "hidden_size", 4096),
            intermediate_size=_whole(raw, path, "intermediate_size", 11008),
            head_size=_whole(raw, path, "head_dim", 0) if raw.get("head_dim") is not None else 0,
            rms_norm_eps=_positive(raw, path, "rms_norm_eps", 1e-6),
            rope_theta=_positive(theta_from, path, "rope_theta", 10000.0),
            rope_scaling=scaling,
            qkv_bias=True if model_type == "qwen2" else bool(raw.get("attention_bias", False)),
            qk_norm=model_type == "qwen3",
            o_bias=model_type != "qwen2" and bool(raw.get("attention_bias", False)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            sliding_window=window,
            window_first_layer=first_layer,
            name=path.parent.name,
        )
    except ModelLoadError:
        raise  # it names the file already
    except ValueError as exc:
        raise ModelLoadError(f"{path}: {exc}") from exc


def config_to_json(config: LlamaConfig, model_type: str = "llama") -> dict:
    """The transformers `config.json` for `config`, loadable by LlamaForCausalLM (Qwen3ForCausalLM with QK-norm)."""
    model_type = "qwen3" if config.qk_norm else model_type
    return {
        "architectures": [ARCHITECTURES[model_type]],
        "model_type": model_type,
        "vocab_size": config.vocab_size,
        "max_position_embeddings": config.n_ctx,
        "num_hidden_layers": config.n_layer,
        "num_attention_heads": config.n_head,
        "num_key_value_heads": config.n_kv_head,
        "hidden_size": config.n_embd,
        "intermediate_size": config.intermediate_size,
        "head_dim": config.head_dim,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        **({"rope_scaling": {"rope_type": "llama3", "factor": config.rope_scaling[0],
                             "low_freq_factor": config.rope_scaling[1], "high_freq_factor": config.rope_scaling[2],
                             "original_max_position_embeddings": int(config.rope_scaling[3])}}
           if config.rope_scaling else {}),
        "attention_bias": config.qkv_bias and config.o_bias,
        "tie_word_embeddings": config.tie_word_embeddings,
        **({"sliding_window": config.sliding_window} if config.sliding_window else {}),
        **({"use_sliding_window": True, "max_window_layers": config.window_first_layer}
           if config.window_first_layer else {}),
        "hidden_act": "silu",
        "torch_dtype": "float32",
    }


def normalize_keys(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The state dict without the buffers checkpoints may carry besides weights."""
    return {k: v for k, v in state.items() if not k.endswith(IGNORED_SUFFIXES)}


def infer_config(state: dict[str, torch.Tensor], name: str, origin: str | None = None) -> LlamaConfig:
    raise ModelLoadError(f"{origin or name}: a Llama-family checkpoint needs its config.json beside it")


def check_config_fits(config: LlamaConfig, state: dict[str, torch.Tensor], origin: str, config_path: Path,
                      family: str = "Llama-family") -> None:
    """A config.json may not describe a model larger than the tensors beside it: checked before anything of its
    size is built (a smaller one fails `build_model`'s tensor checks, which name the tensor). A tied head's copy
    of the embeddings, which some checkpoints carry, is dropped. `family` names the checkpoints of a family with
    the same tensor names (Gemma 3's)."""
    layers = {k.split(".")[2] for k in state if k.startswith("model.layers.")}
    try:
        vocab_size, width = (int(n) for n in state["model.embed_tokens.weight"].shape)
        queries = int(state["model.layers.0.self_attn.q_proj.weight"].shape[0])
        keys = int(state["model.layers.0.self_attn.k_proj.weight"].shape[0])
        hidden = int(state["model.layers.0.mlp.gate_proj.weight"].shape[0])
    except KeyError as exc:
        raise ModelLoadError(f"{origin}: tensor {exc.args[0]} is missing; not a {family} checkpoint") from exc
    except (ValueError, IndexError) as exc:
        raise ModelLoadError(f"{origin}: tensor model.embed_tokens.weight is not a matrix") from exc
    if not all(layer.isdigit() for layer in layers):
        raise ModelLoadError(f"{origin}: unexpected tensor names under model.layers; not a {family} checkpoint")
    hd = config.head_dim
    for key, value, needs, found in (
        ("vocab_size", config.vocab_size, config.vocab_size, vocab_size),
        ("hidden_size", config.n_embd, config.n_embd, width),
        ("num_hidden_layers", config.n_layer, config.n_layer, len(layers)),
        ("num_attention_heads", config.n_head, config.n_head * hd, queries),
        ("num_key_value_heads", config.n_kv_head, config.n_kv_head * hd, keys),
        ("intermediate_size", config.intermediate_size, config.intermediate_size, hidden),
    ):
        if needs > found:
            raise ModelLoadError(f"{config_path}: {key}={shown(value)} is more than the weights in "
                                 f"{Path(origin).name} have")
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)


def column_major_keys(state: dict[str, torch.Tensor]) -> list[str]:
    """None: the teaching model multiplies by transformers' (out, in) weights as they are."""
    return []
