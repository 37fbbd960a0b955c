"""`kvviz memory`: KV-cache bytes per token and at a context length, for a model or a reference architecture."""

from __future__ import annotations

import argparse

from kvviz.cli import json_output as cli_json
from kvviz.core.errors import KvvizError, ModelLoadError, visible
from kvviz.core.files import user_path
from kvviz.core.memory import Architecture, find_architecture, format_bytes, reference_architectures


def model_architecture(source: str | None) -> Architecture:
    """The KV-cache shape of a `--model` value, read from its config as its family states it
    (kvviz.models.cache_shape: a latent for MLA, the model's own sliding window): no weights are loaded and
    nothing is downloaded (the GPT-2 names and random:<preset> use their published configs)."""
    from kvviz.core.resources import DEFAULT_MODEL_NAME, EMBEDDED_MODELS, embedded_model_dir
    from kvviz.models.cache_shape import cache_shape
    from kvviz.models.families import PRESETS, read_family_config
    from kvviz.sources.weights import load_model

    name = source or DEFAULT_MODEL_NAME
    preset = name.split(":", 1)[1] if name.startswith("random:") else name
    if name in EMBEDDED_MODELS:
        config = read_family_config(embedded_model_dir(name) / "config.json")[1]
    elif preset in PRESETS:
        config = PRESETS[preset][1]
    elif name.startswith("random:"):
        raise ModelLoadError(f"{name}: unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
    else:
        path = user_path(name)
        if path.is_dir() and (path / "config.json").is_file():
            config = read_family_config(path / "config.json")[1]
        else:  # a .safetensors file, or a folder without config.json: the shapes come from its tensors
            config = load_model(name).config
    return cache_shape(config, visible(name), "the model's config")  # a folder's name may hold control bytes


def layer_lines(arch: Architecture, context: int, precision: str, batch: int) -> list[str]:
    """A line for each kind of layer the model has: how many, what they keep and their bytes at `context` tokens,
    and which layers they are, e.g. "22 window (512) layers: 512 tokens, 1,048,576 bytes each (layers 0-4, 6-10,
    ...)"."""
    groups: dict[tuple, list[int]] = {}
    for i, (shape, size) in enumerate(zip(arch.layer_shapes, arch.layer_bytes(context, precision, batch),
                                          strict=True)):
        groups.setdefault((shape, size), []).append(i)
    lines = []
    for (shape, size), layers in groups.items():
        n = f"{len(layers)} {shape.kind}" + (f" ({shape.window:,})" if shape.kind == "window" else "")
        n += " layer" if len(layers) == 1 else " layers"
        if shape.kind == "shared":
            what = f"read layer {shape.source}'s keys and values, keep 0 bytes"
        elif shape.kind == "state":
            what = f"{size:,} bytes each, whatever the length"
        else:
            what = f"{shape.tokens_held(context):,} tokens, {size:,} bytes each"
        lines.append(f"{n}: {what} ({'layer' if len(layers) == 1 else 'layers'} {_spans(layers)})")
    return lines


def _spans(layers: list[int]) -> str:
    """Layer numbers in runs: "0-4, 6-10, 12"."""
    runs: list[list[int]] = []
    for layer in layers:
        if runs and layer == runs[-1][-1] + 1:
            runs[-1].append(layer)
        else:
            runs.append([layer])
    return ", ".join(f"{run[0]}-{run[-1]}" if len(run) > 1 else f"{run[0]}" for run in runs)


def cmd_memory(args: argparse.Namespace) -> int:
    if args.arch is not None and args.model is not None:
        raise KvvizError("give --model or --arch, not both")
    if args.arch is not None and args.arch.lower() == "list":
        for arch in reference_architectures():
            print(arch.name)
        return 0
    arch = find_architecture(args.arch) if args.arch is not None else model_architecture(args.model)
    precision = getattr(args, "kv_dtype", None) or args.dtype  # a quantized cache's, or the number type's
    if precision != args.dtype and arch.attention == "mla":
        raise KvvizError(f"--kv-dtype {precision}: {arch.name} caches latents (MLA); kvviz quantizes per-head "
                         "caches only")
    if precision == "int4" and arch.head_dim % 2:
        raise KvvizError(f"--kv-dtype int4 packs two numbers a byte; {arch.name}'s head size {arch.head_dim} is odd")
    if precision != args.dtype and arch.differs:
        raise KvvizError(f"--kv-dtype {precision}: {arch.name}'s layers differ; kvviz quantizes the caches of models "
                         "whose layers are alike")
    per_token = arch.bytes_per_token(precision, args.batch)
    total = arch.cache_bytes(args.context, precision, args.batch)
    held = arch.layer_tokens_held(args.context)
    if args.json:
        print(cli_json.dumps({
            "name": arch.name,
            "attention": arch.attention,
            "layers": arch.layers,
            "kv_heads": arch.kv_heads if arch.attention != "mla" else None,
            "head_dim": arch.head_dim if arch.attention != "mla" else None,
            "latent_dim": arch.latent_dim if arch.attention == "mla" else None,
            "rope_dim": arch.rope_dim if arch.attention == "mla" else None,
            "sliding_window": arch.sliding_window,
            "window_first_layer": arch.window_first_layer if arch.sliding_window else None,
            "dtype": args.dtype,
            "kv_dtype": getattr(args, "kv_dtype", None),
            "precision": precision,
            "batch": args.batch,
            "context": args.context,
            "tokens_held": arch.tokens_held(args.context),  # a windowed layer's
            "tokens_held_per_layer": list(held),
            "layer_kinds": list(arch.layer_kinds),
            "bytes_per_layer": list(arch.layer_bytes(args.context, precision, args.batch)),
            "fixed_bytes": arch.fixed_bytes(precision, args.batch),  # a linear-attention state's, whatever the length
            "model_context": arch.context,
            "bytes_per_token": per_token,
            "bytes": total,
            "formula": arch.formula(precision, args.batch),
            "source": arch.source,
        }, indent=2))
        return 0
    print(arch.describe())
    print(f"  bytes per token  {arch.formula(precision, args.batch)}")
    window = ""
    if arch.tokens_held(args.context) != args.context:
        windowed = arch.windowed_layers
        layers = "each layer" if windowed == arch.layers else f"{windowed} of {arch.layers} layers"
        window = f" ({layers} holds {arch.tokens_held(args.context):,} of them)"
    print(f"  at {args.context:,} tokens{window}: {total:,} bytes = {format_bytes(total)}")
    if arch.differs:
        for line in layer_lines(arch, args.context, precision, args.batch):
            print(f"    {line}")
    if arch.context is not None and args.context > arch.context:
        print(f"  (a what-if: the model itself takes at most {arch.context:,} tokens)")
    if arch.source:
        print(f"  source: {arch.source}")
    return 0
