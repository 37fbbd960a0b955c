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
    """A line per run of alike layers: what they keep and their bytes at `context` tokens, e.g.
    "layers 0-4  window (512): 512 tokens, 524,288 bytes each"."""
    shapes, sizes = arch.layer_shapes, arch.layer_bytes(context, precision, batch)
    lines, start = [], 0
    for i in range(1, len(shapes) + 1):
        if i < len(shapes) and shapes[i] == shapes[start] and sizes[i] == sizes[start]:
            continue
        shape, size = shapes[start], sizes[start]
        layers = f"layer {start}" if i - start == 1 else f"layers {start}-{i - 1}"
        if shape.kind == "shared":
            what = f"shared: reads layer {shape.source}'s keys and values, keeps 0 bytes"
        elif shape.kind == "state":
            what = f"state: {size:,} bytes each, whatever the length"
        else:
            window = f" ({shape.window:,})" if shape.kind == "window" else ""
            what = f"{shape.kind}{window}: {shape.tokens_held(context):,} tokens, {size:,} bytes each"
        lines.append(f"{layers}  {what}")
        start = i
    return lines


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
