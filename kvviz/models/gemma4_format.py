"""The Gemma 4 family's checkpoint format: transformers' `config.json` of model_type gemma4_text (Gemma4ForCausalLM,
the text model alone), and the state dict's keys (the same names as kvviz.models.gemma4's modules).

What kvviz does not run is refused in one line naming the file: mixture-of-experts blocks (`enable_moe_block`,
Gemma 4 26B A4B), bidirectional attention, other activations or RoPE types, and the multimodal checkpoint
(model_type gemma4, Gemma4ForConditionalGeneration), whose text model sits under other names beside its vision and
audio towers.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from kvviz.core.errors import ModelLoadError
from kvviz.models.config_json import positive, read_config, shown, whole
from kvviz.models.gemma4 import GLOBAL, SLIDING, Gemma4Config, gemma_pattern

MODEL_TYPES = ("gemma4_text", "gemma4")
IGNORED_SUFFIXES = ("inv_freq",)  # RoPE's frequencies, recomputed from rope_parameters
DEFAULT_ROPE = {SLIDING: {"rope_type": "default", "rope_theta": 10000.0},  # transformers' when config.json has none
                GLOBAL: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0}}
SHARED_KEYS = re.compile(r"model\.layers\.(\d+)\.self_attn\.(k_proj|v_proj|k_norm|v_norm)\.")


def _whole(raw: dict, path: Path, key: str, default: int) -> int:
    """A size of Gemma 4's config: a whole number, at least 1 (config_json.whole)."""
    return whole(raw, path, key, default, low=1)


def _refuse_unsupported(raw: dict, path: Path) -> None:
    """One line for each thing kvviz does not run."""
    if raw.get("model_type") == "gemma4":
        raise ModelLoadError(f"{path}: a multimodal Gemma 4 checkpoint (Gemma4ForConditionalGeneration); kvviz runs "
                             "the text model saved alone (Gemma4ForCausalLM, model_type gemma4_text)")
    if raw.get("enable_moe_block"):
        raise ModelLoadError(f"{path}: enable_moe_block: mixture-of-experts blocks are not modelled; kvviz runs "
                             "Gemma 4's dense layers only")
    if raw.get("use_bidirectional_attention") == "all":
        raise ModelLoadError(f"{path}: use_bidirectional_attention \"all\": kvviz runs causal attention only")
    if raw.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        raise ModelLoadError(f"{path}: hidden_activation {shown(raw['hidden_activation'])} is not Gemma's "
                             "gelu_pytorch_tanh")


def _layer_types(raw: dict, path: Path, layers: int) -> tuple[str, ...]:
    """Each layer's kind: config.json's layer_types, or Gemma's pattern; the top layer global, as transformers
    makes it whatever the file says."""
    kinds = raw.get("layer_types")
    if kinds is None:
        return gemma_pattern(layers)
    if not isinstance(kinds, list) or len(kinds) != layers or any(kind not in (SLIDING, GLOBAL) for kind in kinds):
        raise ModelLoadError(f"{path}: layer_types must list {layers} layers, each {SLIDING} or {GLOBAL}; got "
                             f"{shown(kinds)}")
    return (*kinds[:-1], GLOBAL)


def _rope(raw: dict, path: Path, kind: str) -> tuple[float, float, float]:
    """(rope_theta, the share of pairs turned, factor) of the layers of `kind`: plain RoPE or proportional."""
    settings = raw.get("rope_parameters") or DEFAULT_ROPE
    rope = settings.get(kind) if isinstance(settings, dict) else None
    if not isinstance(rope, dict):
        raise ModelLoadError(f"{path}: rope_parameters has no settings for the {kind} layers")
    rope_type = rope.get("rope_type", "default")
    if rope_type not in ("default", "proportional"):
        raise ModelLoadError(f"{path}: rope_type {shown(rope_type)} of the {kind} layers is not supported; kvviz "
                             "runs plain RoPE (default) and proportional RoPE")
    theta = positive(rope, path, "rope_theta", 10000.0)
    if rope_type == "default":
        return (theta, 1.0, 1.0)
    turned = positive(rope, path, "partial_rotary_factor", 1.0)
    if turned > 1:
        raise ModelLoadError(f"{path}: partial_rotary_factor {turned:g} of the {kind} layers is more than 1")
    return (theta, turned, positive(rope, path, "factor", 1.0))


def _global_heads(raw: dict, path: Path, kinds: tuple[str, ...], heads: int, head_dim: int) -> tuple[int, int]:
    """(KV heads, head size) of the global layers: per_layer_config's overrides (transformers 5 writes them), else
    global_head_dim and, with attention_k_eq_v, num_global_key_value_heads (the published configs)."""
    overrides = raw.get("per_layer_config")
    if overrides is None:
        size = _whole(raw, path, "global_head_dim", 512)
        if raw.get("attention_k_eq_v") and raw.get("num_global_key_value_heads") is not None:
            return _whole(raw, path, "num_global_key_value_heads", heads), size
        return heads, size
    if not isinstance(overrides, dict):
        raise ModelLoadError(f"{path}: per_layer_config {shown(overrides)} is not a JSON object")
    found = set()
    for key, override in overrides.items():
        layer = int(key) if key.isdigit() else -1
        if not 0 <= layer < len(kinds) or not isinstance(override, dict):
            raise ModelLoadError(f"{path}: per_layer_config {shown(key)}: not a layer's overrides")
        if kinds[layer] != GLOBAL or set(override) - {"head_dim", "num_key_value_heads"}:
            raise ModelLoadError(f"{path}: per_layer_config changes {', '.join(override)} of layer {layer} "
                                 f"({kinds[layer]}); kvviz runs the global layers' own head_dim and "
                                 "num_key_value_heads only")
        found.add((_whole(override, path, "num_key_value_heads", heads), _whole(override, path, "head_dim", head_dim)))
    if len(overrides) < kinds.count(GLOBAL):
        found.add((heads, head_dim))  # a global layer it leaves as the sliding ones
    if len(found) > 1:
        raise ModelLoadError(f"{path}: per_layer_config gives the global layers different heads; kvviz runs "
                             "global layers that are alike")
    return found.pop() if found else (heads, head_dim)


def config_from_json(path: Path) -> Gemma4Config:
    """A Gemma4Config from a transformers `config.json` (ModelLoadError naming what kvviz cannot run)."""
    raw = read_config(path)
    _refuse_unsupported(raw, path)
    layers, vocab_size = _whole(raw, path, "num_hidden_layers", 30), _whole(raw, path, "vocab_size", 262144)
    heads, head_dim = _whole(raw, path, "num_key_value_heads", 4), _whole(raw, path, "head_dim", 256)
    kinds = _layer_types(raw, path, layers)
    global_heads, global_head_dim = _global_heads(raw, path, kinds, heads, head_dim)
    ple = whole(raw, path, "hidden_size_per_layer_input", 256)
    ple_rows = _whole(raw, path, "vocab_size_per_layer_input", 262144) if ple else 0
    if ple and ple_rows < vocab_size:
        raise ModelLoadError(f"{path}: vocab_size_per_layer_input {ple_rows} is less than vocab_size {vocab_size}: "
                             "the per-layer embeddings would have no row for some tokens")
    cap = raw.get("final_logit_softcapping")
    try:
        return Gemma4Config(
            vocab_size=vocab_size,
            n_ctx=_whole(raw, path, "max_position_embeddings", 131072),
            n_layer=layers,
            n_head=_whole(raw, path, "num_attention_heads", 8),
            n_kv_head=heads,
            n_embd=_whole(raw, path, "hidden_size", 2304),
            intermediate_size=_whole(raw, path, "intermediate_size", 9216),
            head_size=head_dim,
            global_head_dim=global_head_dim,
            global_kv_heads=global_heads,
            attention_k_eq_v=bool(raw.get("attention_k_eq_v", False)),
            layer_types=kinds,
            sliding_window=_whole(raw, path, "sliding_window", 512),
            num_kv_shared_layers=whole(raw, path, "num_kv_shared_layers", 0),
            sliding_rope=_rope(raw, path, SLIDING) if SLIDING in kinds else (10000.0, 1.0, 1.0),
            global_rope=_rope(raw, path, GLOBAL),
            hidden_size_per_layer_input=ple,
            vocab_size_per_layer_input=ple_rows,
            use_double_wide_mlp=bool(raw.get("use_double_wide_mlp", False)),
            final_logit_softcapping=0.0 if cap is None else positive(raw, path, "final_logit_softcapping", 30.0),
            attention_bias=bool(raw.get("attention_bias", False)),
            rms_norm_eps=positive(raw, path, "rms_norm_eps", 1e-6),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", True)),
            name=path.parent.name,
        )
    except ModelLoadError:
        raise  # it names the file already
    except (ValueError, TypeError) as exc:
        raise ModelLoadError(f"{path}: {exc}") from exc


def _rope_json(rope: tuple[float, float, float]) -> dict:
    theta, turned, factor = rope
    if turned == 1.0 and factor == 1.0:
        return {"rope_type": "default", "rope_theta": theta}
    return {"rope_type": "proportional", "rope_theta": theta, "partial_rotary_factor": turned,
            **({"factor": factor} if factor != 1.0 else {})}


def config_to_json(config: Gemma4Config) -> dict:
    """The transformers `config.json` for `config`, loadable by Gemma4ForCausalLM."""
    global_heads, global_head_dim = config.kind_heads(GLOBAL)
    heads: dict = {"global_head_dim": global_head_dim}  # the published configs' way to say it
    if config.attention_k_eq_v:
        heads["num_global_key_value_heads"] = global_heads
    elif global_heads != config.n_kv_head:  # other KV heads, values of their own: transformers 5's overrides
        heads = {"per_layer_config": {str(layer): {"head_dim": global_head_dim, "num_key_value_heads": global_heads}
                                      for layer, kind in enumerate(config.layer_types) if kind == GLOBAL}}
    return {
        "architectures": ["Gemma4ForCausalLM"],
        "model_type": "gemma4_text",
        "vocab_size": config.vocab_size,
        "max_position_embeddings": config.n_ctx,
        "num_hidden_layers": config.n_layer,
        "num_attention_heads": config.n_head,
        "num_key_value_heads": config.n_kv_head,
        "hidden_size": config.n_embd,
        "intermediate_size": config.intermediate_size,
        "head_dim": config.head_size,
        **heads,
        "attention_k_eq_v": config.attention_k_eq_v,
        "layer_types": list(config.layer_types),
        "sliding_window": config.sliding_window,
        "num_kv_shared_layers": config.num_kv_shared_layers,
        "rope_parameters": {SLIDING: _rope_json(config.sliding_rope), GLOBAL: _rope_json(config.global_rope)},
        "hidden_size_per_layer_input": config.hidden_size_per_layer_input,
        "vocab_size_per_layer_input": config.vocab_size_per_layer_input or config.vocab_size,
        "use_double_wide_mlp": config.use_double_wide_mlp,
        "enable_moe_block": False,
        "final_logit_softcapping": config.final_logit_softcapping or None,
        "attention_bias": config.attention_bias,
        "rms_norm_eps": config.rms_norm_eps,
        "tie_word_embeddings": config.tie_word_embeddings,
        "hidden_activation": "gelu_pytorch_tanh",
        "torch_dtype": "float32",
    }


def normalize_keys(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The state dict without the buffers checkpoints may carry besides weights."""
    return {k: v for k, v in state.items() if not k.endswith(IGNORED_SUFFIXES)}


def infer_config(state: dict[str, torch.Tensor], name: str, origin: str | None = None) -> Gemma4Config:
    raise ModelLoadError(f"{origin or name}: a Gemma 4 checkpoint needs its config.json beside it")


def check_config_fits(config: Gemma4Config, state: dict[str, torch.Tensor], origin: str, config_path: Path) -> None:
    """A config.json may not describe a model larger than the tensors beside it (checked before it is built). A
    shared layer's key and value projections, which a checkpoint may carry, are dropped, as transformers drops
    them: a shared layer never uses them. So is a tied head's copy of the embeddings."""
    layers = {k.split(".")[2] for k in state if k.startswith("model.layers.")}
    try:
        vocab_size, width = (int(n) for n in state["model.embed_tokens.weight"].shape)
        queries = int(state["model.layers.0.self_attn.q_proj.weight"].shape[0])
        hidden = int(state["model.layers.0.mlp.gate_proj.weight"].shape[0])
    except KeyError as exc:
        raise ModelLoadError(f"{origin}: tensor {exc.args[0]} is missing; not a Gemma 4 checkpoint") from exc
    except (ValueError, IndexError) as exc:
        raise ModelLoadError(f"{origin}: tensor model.embed_tokens.weight is not a matrix") from exc
    heads, head_dim = config.kind_heads(config.layer_types[0])
    for key, needs, found in (("vocab_size", config.vocab_size, vocab_size), ("hidden_size", config.n_embd, width),
                              ("num_hidden_layers", config.n_layer, len(layers)),
                              ("num_attention_heads", config.n_head * head_dim, queries),
                              ("intermediate_size", config.intermediate_size, hidden)):
        if needs > found:
            raise ModelLoadError(f"{config_path}: {key} is more than the weights in {Path(origin).name} have")
    for key in [k for k in state if (match := SHARED_KEYS.match(k)) and int(match[1]) >= config.first_shared]:
        del state[key]
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)


def column_major_keys(state: dict[str, torch.Tensor]) -> list[str]:
    """None: the teaching model multiplies by transformers' (out, in) weights as they are."""
    return []
