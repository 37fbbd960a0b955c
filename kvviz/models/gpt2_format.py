"""GPT-2's checkpoint format: transformers' `config.json` fields and the state dict's keys and shapes.

What a model family's checkpoints look like, apart from how files are read, checked and downloaded
(`weights.py`): another family's format is a file like this one.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from kvviz.core.errors import ModelLoadError
from kvviz.models.config_json import read_config, shown
from kvviz.models.gpt2 import GPTConfig

# Buffers some checkpoints carry that are not weights (causal masks).
IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias")
HEADS_BY_WIDTH = {768: 12, 1024: 16, 1280: 20, 1600: 25}


def config_from_json(path: Path) -> GPTConfig:
    """A GPTConfig from a transformers GPT-2 `config.json`."""
    raw = read_config(path)
    model_type = raw.get("model_type")
    if model_type != "gpt2":
        raise ModelLoadError(f"{path}: model_type is {shown(model_type)}, but kvviz runs GPT-2 checkpoints only")
    activation = raw.get("activation_function", "gelu_new")
    if activation not in ("gelu_new", "gelu_pytorch_tanh"):
        raise ModelLoadError(f"{path}: activation_function {shown(activation)} is not GPT-2's tanh GELU")
    n_embd = _positive_whole(raw, path, 768, "n_embd")
    if raw.get("n_inner") is not None and raw.get("n_inner") != 4 * n_embd:
        raise ModelLoadError(f"{path}: n_inner={shown(raw['n_inner'])} is not 4 * n_embd, which kvviz requires")
    try:
        return GPTConfig(
            vocab_size=_positive_whole(raw, path, 50257, "vocab_size"),
            n_ctx=_positive_whole(raw, path, 1024, "n_positions", "n_ctx"),
            n_layer=_positive_whole(raw, path, 12, "n_layer"),
            n_head=_positive_whole(raw, path, 12, "n_head"),
            n_embd=n_embd,
            layer_norm_epsilon=_layer_norm_epsilon(raw, path),
            name=path.parent.name,
        )
    except ValueError as exc:  # GPTConfig's own checks (heads that do not divide the width)
        raise ModelLoadError(f"{path}: {exc}") from exc


def _positive_whole(raw: dict, path: Path, default: int, *keys: str) -> int:
    """The first of `keys` in a config as a positive whole number (1e3 and 1000.0 count as 1000)."""
    key = next((k for k in keys if k in raw), keys[0])
    value = raw.get(key, default)
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ModelLoadError(f"{path}: {key}={shown(value)} is not a positive whole number")
    return value


def _layer_norm_epsilon(raw: dict, path: Path) -> float:
    value = raw.get("layer_norm_epsilon", 1e-5)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        raise ModelLoadError(f"{path}: layer_norm_epsilon={shown(value)} is not a number between 0 and 1")
    return float(value)


def config_to_json(config: GPTConfig) -> dict:
    """The transformers `config.json` for `config`, loadable by GPT2LMHeadModel."""
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": config.vocab_size,
        "n_positions": config.n_ctx,
        "n_ctx": config.n_ctx,
        "n_embd": config.n_embd,
        "n_layer": config.n_layer,
        "n_head": config.n_head,
        "n_inner": None,
        "activation_function": "gelu_new",
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "layer_norm_epsilon": config.layer_norm_epsilon,
        "initializer_range": 0.02,
        "bos_token_id": 50256,
        "eos_token_id": 50256,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
    }


def normalize_keys(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Keys as kvviz names them: `transformer.` prefix added (hub layout), masks and lm_head dropped. kvviz's GPT-2
    ties its output head to the token embedding, as GPT-2 does; a checkpoint with a head of its own (an untied
    `lm_head.weight`, as the book's GPTModel trains its `out_head`) is refused rather than run with the wrong head."""
    head = state.get("lm_head.weight")
    embedding = state.get("transformer.wte.weight", state.get("wte.weight"))
    if head is not None and (embedding is None or head.shape != embedding.shape or not torch.equal(head, embedding)):
        raise ModelLoadError("tensor lm_head.weight is an output head of its own (tie_word_embeddings false); kvviz "
                             "runs GPT-2 with its head tied to the token embedding, so these logits would be wrong")
    out: dict[str, torch.Tensor] = {}
    for key, tensor in state.items():
        if key.endswith(IGNORED_SUFFIXES) or key == "lm_head.weight":
            continue
        out[key if key.startswith("transformer.") else f"transformer.{key}"] = tensor
    return out


def infer_config(state: dict[str, torch.Tensor], name: str, origin: str | None = None) -> GPTConfig:
    """A config from tensor shapes alone, for a bare checkpoint without `config.json`.

    The head count is not in the tensors: GPT-2's own widths map to their head counts, and other
    widths get heads of 64 dimensions, as in every GPT-2. `origin` (the file) is named in errors.
    """
    origin = origin or name
    vocab_size, n_embd, n_ctx, n_layer = _tensor_dims(state, origin)
    if n_embd in HEADS_BY_WIDTH:
        n_head = HEADS_BY_WIDTH[n_embd]
    elif n_embd % 64 == 0:
        n_head = n_embd // 64
    else:
        raise ModelLoadError(
            f"{origin}: width {n_embd} does not tell the number of attention heads; put the checkpoint's "
            "config.json beside it"
        )
    try:
        return GPTConfig(vocab_size=vocab_size, n_ctx=n_ctx, n_layer=n_layer, n_head=n_head, n_embd=n_embd,
                         name=name)
    except ValueError as exc:
        raise ModelLoadError(f"{origin}: {exc}") from exc


def _tensor_dims(state: dict[str, torch.Tensor], origin: str) -> tuple[int, int, int, int]:
    """(vocab_size, n_embd, n_ctx, n_layer) as the checkpoint's tensors have them."""
    try:
        vocab_size, n_embd = (int(n) for n in state["transformer.wte.weight"].shape)
        n_ctx = int(state["transformer.wpe.weight"].shape[0])
    except KeyError as exc:
        raise ModelLoadError(f"{origin}: tensor {exc.args[0]} is missing; this is not a GPT-2 checkpoint") from exc
    except (ValueError, IndexError) as exc:
        raise ModelLoadError(f"{origin}: tensor transformer.wte.weight is not a matrix; not GPT-2") from exc
    layers = {k.split(".")[2] for k in state if k.startswith("transformer.h.")}
    if not all(layer.isdigit() for layer in layers):
        raise ModelLoadError(f"{origin}: unexpected tensor names under transformer.h; not a GPT-2 checkpoint")
    return vocab_size, n_embd, n_ctx, len(layers)


def check_config_fits(config: GPTConfig, state: dict[str, torch.Tensor], origin: str, config_path: Path) -> None:
    """A config.json may not describe a model larger than the tensors beside it: checked before anything of
    its size is built (a smaller one fails `build_model`'s tensor checks, which name the tensor)."""
    vocab_size, n_embd, n_ctx, n_layer = _tensor_dims(state, origin)
    for key, said, found in (("vocab_size", config.vocab_size, vocab_size), ("n_embd", config.n_embd, n_embd),
                             ("n_positions", config.n_ctx, n_ctx), ("n_layer", config.n_layer, n_layer)):
        if said > found:
            raise ModelLoadError(f"{config_path}: {key}={shown(said)}, more than the weights in "
                                 f"{Path(origin).name} have ({found})")


def column_major_keys(state: dict[str, torch.Tensor]) -> list[str]:
    """The tensors GPT keeps column-major (see `kvviz.models.products.column_major`): the embedding and every Conv1D
    weight."""
    return [k for k in state if k == "transformer.wte.weight" or (k.startswith("transformer.h.") and k.endswith(
        ("c_attn.weight", "c_proj.weight", "c_fc.weight")))]
