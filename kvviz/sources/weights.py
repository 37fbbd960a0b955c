"""Model sources: the embedded default, checkpoint folders and files, the hub, random weights."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from kvviz.core.errors import DownloadCancelled, ModelLoadError, first_line
from kvviz.core.files import user_path, write_atomically
from kvviz.core.resources import DEFAULT_MODEL_NAME, EMBEDDED_MODELS, embedded_model_dir
from kvviz.models.families import DEFAULT_FAMILY, PRESETS, Family, family_of, family_of_config
from kvviz.models.gpt2 import GPTConfig
from kvviz.models.products import column_major
from kvviz.sources.hub import HUB_MODELS, ProgressCallback, cached_hub_model, download_hub_model

__all__ = [  # the hub's and the errors' names are re-exported: loading a model is one import
    "HUB_MODELS", "DownloadCancelled", "LoadedModel", "ModelLoadError", "ProgressCallback", "cached_hub_model",
    "check_device", "download_hub_model", "load_checkpoint", "load_model", "random_model", "save_checkpoint",
]
RANDOM_SEED = 123



@dataclass(frozen=True)
class LoadedModel:
    """A ready model and where it came from."""

    model: torch.nn.Module  # a family's teaching model (kvviz.models.families)
    name: str  # short name for display: "gpt2", "random:gpt2", a folder's name
    source: str  # where the weights came from, for Help > About
    config: GPTConfig  # the model's config (its family's config class)
    tokenizer: object = None  # the checkpoint's own tokenizer (core.tokenizer.JsonTokenizer); None: GPT-2's

    @property
    def num_parameters(self) -> int:
        return self.model.num_parameters()


def describe_sources() -> str:
    return (f"the embedded models ({DEFAULT_MODEL_NAME}, the default, and {', '.join(EMBEDDED_MODELS[1:])}), "
            f"{', '.join(HUB_MODELS)} (downloaded once), "
            f"random:<{'|'.join(PRESETS)}>, or a path to a checkpoint folder or .safetensors file")


def _read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise ModelLoadError(f"{path}: no such file")
    suffix = path.suffix.lower()
    if suffix not in (".safetensors", ".pth", ".pt", ".bin"):
        raise ModelLoadError(f"{path}: unsupported file type {suffix!r}; use .safetensors (or a .pth state dict)")
    try:
        with path.open("rb"):  # safetensors reports an unreadable file as "No such file or directory"
            pass
        if suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path))
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except PermissionError as exc:
        raise ModelLoadError(f"{path}: cannot be read ({exc.strerror})") from exc
    except Exception as exc:  # safetensors and torch raise several types for corrupt files
        if "weights only load failed" in str(exc).lower():
            raise ModelLoadError(
                f"{path}: refused: the file holds Python objects besides tensors, and kvviz loads .pth files "
                "with weights_only=True (save a plain state dict, or convert it to .safetensors)"
            ) from exc
        raise ModelLoadError(f"{path}: corrupt or truncated checkpoint ({first_line(exc)})") from exc
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ModelLoadError(f"{path}: not a state dict (a dict of tensor names to tensors)")
    return state


DTYPE_NAMES = ("float32", "bfloat16", "float16")


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype called `name` (one of DTYPE_NAMES), or a one-line ModelLoadError."""
    if name not in DTYPE_NAMES:
        raise ModelLoadError(f"dtype must be one of {', '.join(DTYPE_NAMES)}, got {name!r}")
    return getattr(torch, name)


WEIGHT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _finite(tensor: torch.Tensor) -> bool:
    """Whether every value of a floating-point `tensor` is finite: its least and greatest are (aminmax carries a NaN
    to both; one pass, no tensor of flags, 20-40x faster than isfinite(...).all() on a CPU)."""
    if tensor.numel() == 0:
        return True
    least, greatest = torch.aminmax(tensor)
    return bool(torch.isfinite(least)) and bool(torch.isfinite(greatest))


def _check_finite(state: dict[str, torch.Tensor], origin: str, where: str) -> None:
    """ModelLoadError naming the first tensor that holds NaN or an infinity (`where`: after a conversion)."""
    for key, tensor in state.items():
        if tensor.is_floating_point() and tensor.dtype not in WEIGHT_DTYPES:
            raise ModelLoadError(f"{origin}: tensor {key} is {str(tensor.dtype).removeprefix('torch.')}; kvviz reads "
                                 "float32, float16 and bfloat16 weights (dequantize the checkpoint first)")
        if tensor.is_floating_point() and not _finite(tensor):
            problem = "NaN" if bool(torch.isnan(tensor).any()) else "infinite values"
            raise ModelLoadError(f"{origin}: tensor {key} holds {problem}{where}; these weights cannot be run "
                                 f"(train, save or download them again)")


def build_model(family: Family, config, state: dict[str, torch.Tensor], origin: str, dtype: torch.dtype):
    """`family`'s model of `config` with `state` loaded, after checking every tensor's presence and shape."""
    with torch.device("meta"):
        model = family.model(config)
    expected = {k: v.shape for k, v in model.state_dict().items()}
    for key, shape in expected.items():
        if key not in state:
            raise ModelLoadError(f"{origin}: tensor {key} is missing")
        if tuple(state[key].shape) != tuple(shape):
            raise ModelLoadError(f"{origin}: tensor {key} has shape {tuple(state[key].shape)}, expected {tuple(shape)}")
    unexpected = sorted(set(state) - set(expected))
    if unexpected:
        raise ModelLoadError(f"{origin}: unexpected tensor {unexpected[0]} ({len(unexpected)} in all)")
    _check_finite(state, origin, "")
    state = {k: v.to(dtype) for k, v in state.items()}
    _check_finite(state, origin, f" once in {str(dtype).removeprefix('torch.')}")
    for key in family.checkpoint.column_major_keys(state):
        state[key] = column_major(state[key])  # the head shares wte; Conv1D multiplies by row blocks
    model.load_state_dict(state, assign=True)
    return model.eval()


def load_checkpoint(path: Path, dtype: torch.dtype = torch.float32):
    """A checkpoint folder (config.json + model.safetensors) or a single weights file (its config.json beside
    it, if any), of any family in FAMILIES (by the config's model_type; GPT-2 without a config)."""
    if path.is_dir():
        config_path, name = path / "config.json", path.name
        weights = path / "model.safetensors"
        if weights.is_file():
            state = _read_state_dict(weights)
        elif (path / SHARD_INDEX).is_file():
            weights, state = path / SHARD_INDEX, _read_shards(path)
        else:
            raise ModelLoadError(f"{path}: folder has no model.safetensors")
    else:
        weights, config_path = path, path.parent / "config.json"
        name = path.parent.name if path.stem == "model" else path.stem
        state = _read_state_dict(weights)
    if config_path.exists() and not config_path.is_file():
        raise ModelLoadError(f"{config_path}: not a regular file (a config.json is a JSON file)")
    if not config_path.exists() and not any(key.startswith(("transformer.", "wte.", "h.")) for key in state):
        raise ModelLoadError(f"{config_path}: missing; kvviz reads a checkpoint without one as GPT-2 only, and "
                             f"{Path(str(weights)).name}'s tensors are not GPT-2's")
    family = family_of_config(config_path) if config_path.is_file() else DEFAULT_FAMILY
    checkpoint = family.checkpoint
    try:
        state = checkpoint.normalize_keys(state)
    except ModelLoadError as exc:
        raise ModelLoadError(f"{weights}: {exc}") from exc
    if config_path.is_file():
        config = checkpoint.config_from_json(config_path)
        checkpoint.check_config_fits(config, state, str(weights), config_path)
    else:
        config = checkpoint.infer_config(state, name, str(weights))
    return build_model(family, config.with_name(name), state, str(weights), dtype)


def _read_shards(folder: Path) -> dict[str, torch.Tensor]:
    """The weights of a checkpoint saved in shards: every file its `model.safetensors.index.json` names, each
    holding the tensors the index says (ModelLoadError naming a shard that is missing or holds others)."""
    index_path = folder / SHARD_INDEX
    try:
        weight_map = json.loads(index_path.read_text(encoding="utf-8"))["weight_map"]
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise TypeError("weight_map is not a map of tensor names to file names")
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, RecursionError) as exc:
        raise ModelLoadError(f"{index_path}: not a readable shard index ({first_line(exc)})") from exc
    state: dict[str, torch.Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        shard_path = folder / shard
        if Path(shard).name != shard or not shard.endswith(".safetensors"):
            raise ModelLoadError(f"{index_path}: shard {shard!r} is not a .safetensors file in the folder")
        if not shard_path.is_file():
            raise ModelLoadError(f"{shard_path}: shard missing (named in {SHARD_INDEX})")
        state.update(_read_state_dict(shard_path))
    missing = sorted(set(weight_map) - set(state))
    if missing:
        raise ModelLoadError(f"{index_path}: tensor {missing[0]} is in none of its shards ({len(missing)} in all)")
    return state


SHARD_INDEX = "model.safetensors.index.json"
CHECKPOINT_FILES = ("model.safetensors", "config.json")


def save_checkpoint(model: torch.nn.Module, out_dir: Path, dtype: torch.dtype = torch.float32) -> Path:
    """Write `config.json` and `model.safetensors` as transformers' save_pretrained does: both or neither.

    Both files are written whole (and synced) into a temporary folder inside `out_dir` before
    either is put in place, by two renames in a row; should the second rename fail, the first is
    undone. A failed save (a full disk, an interrupt) leaves `out_dir` as it was, with no temporary
    file behind. Other files in `out_dir` are left alone. Returns the weights' path.
    """
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()}
    staging = Path(tempfile.mkdtemp(prefix=".kvviz-save-", suffix=".tmp", dir=out_dir))
    try:
        weights = staging / "model.safetensors"
        save_file(state, str(weights), metadata={"format": "pt"})
        with open(weights, "rb") as handle:
            os.fsync(handle.fileno())
        config = family_of(model).checkpoint.config_to_json(model.config)
        write_atomically(staging / "config.json", (json.dumps(config, indent=2) + "\n").encode())
        _move_in_together(staging, out_dir, CHECKPOINT_FILES)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir / "model.safetensors"


def _move_in_together(staging: Path, out_dir: Path, names: tuple[str, ...]) -> None:
    """Rename `staging/name` onto `out_dir/name` for each name; if one rename fails, undo the earlier ones."""
    done: list[tuple[Path, Path | None]] = []  # (target, its previous content kept in staging, or None)
    try:
        for name in names:
            target, previous = out_dir / name, staging / f"previous-{name}"
            if target.is_file():
                try:
                    os.link(target, previous)  # the old file stays where it is until the rename replaces it
                except OSError:
                    shutil.copy2(target, previous)  # file systems without hard links
            os.replace(staging / name, target)
            done.append((target, previous if previous.exists() else None))
    except BaseException:
        for target, previous in reversed(done):
            with contextlib.suppress(OSError):
                if previous is None:
                    target.unlink()
                else:
                    os.replace(previous, target)
        raise


def random_model(preset: str, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """Untrained weights of a published shape from a fixed seed, its family's initialisation (the book's
    benchmark setup). Their tokens are shown with GPT-2's tokenizer: untrained weights have none of their own."""
    if preset not in PRESETS:
        raise ModelLoadError(f"random:{preset}: unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
    family, config = PRESETS[preset]
    model = family.model(config.with_name(f"random:{preset}"))
    model.init_weights(torch.Generator().manual_seed(RANDOM_SEED))
    return model.to(dtype).eval()


def check_device(device: str | torch.device) -> torch.device:
    """`device` as a torch.device, or a ModelLoadError saying why it cannot be used here."""
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise ModelLoadError(f"{device}: unknown device; use cpu, cuda or mps") from exc
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(f"{device}: device not available here (no CUDA GPU, or torch built without CUDA)")
    if resolved.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise ModelLoadError(f"{device}: device not available here (it needs Apple silicon)")
    if resolved.type not in ("cpu", "cuda", "mps"):
        raise ModelLoadError(f"{device}: unknown device; use cpu, cuda or mps")
    return resolved


def load_model(
    source: str | None = None,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    progress: ProgressCallback | None = None,
) -> LoadedModel:
    """Resolve a `--model` value to a ready model. `None` means the embedded default."""
    check_device(device)
    tokenizer = None
    if source is None or source == "" or source in EMBEDDED_MODELS:
        name = source or DEFAULT_MODEL_NAME
        folder = embedded_model_dir(name)
        if not (folder / "model.safetensors").is_file():
            raise ModelLoadError(f"{name}: the embedded model is missing from {folder}; reinstall kvviz")
        model = load_checkpoint(folder, dtype)
        origin = f"embedded in kvviz ({folder})"
        tokenizer = checkpoint_tokenizer(folder, model)
    elif source.startswith("random:"):
        preset = source.split(":", 1)[1]
        model = random_model(preset, dtype)
        name, origin = source, f"untrained {PRESETS[preset][0].title} {preset} weights, seed {RANDOM_SEED}"
    elif source in HUB_MODELS:
        folder = download_hub_model(source, progress)
        model = load_checkpoint(folder, dtype)
        model.config = model.config.with_name(source)  # not the cache folder's commit hash
        name, origin = source, f"Hugging Face hub {HUB_MODELS[source]} (cached in {folder})"
        tokenizer = checkpoint_tokenizer(folder, model)
    else:
        path = user_path(source)
        if not path.exists():
            raise ModelLoadError(f"{source}: unknown model, and no such file or folder; use {describe_sources()}")
        model = load_checkpoint(path, dtype)
        name, origin = model.config.name, str(path.resolve())
        tokenizer = checkpoint_tokenizer(path, model)
    model = model.to(device)
    return LoadedModel(model=model, name=name, source=origin, config=model.config, tokenizer=tokenizer)


def checkpoint_tokenizer(path: Path, model: torch.nn.Module):
    """The tokenizer a checkpoint at `path` (a folder, or a weights file in one) brings: its `tokenizer.json`
    for a Llama-family model (ModelLoadError without one), None (GPT-2's, through tiktoken) for GPT-2."""
    if family_of(model) is DEFAULT_FAMILY:
        return None
    from kvviz.core.tokenizer import JsonTokenizer, TokenizerFilesError

    file = (path if path.is_dir() else path.parent) / "tokenizer.json"
    if not file.is_file():
        raise ModelLoadError(f"{path}: no tokenizer.json beside the weights; kvviz tokenizes a prompt with the "
                             "model's own tokenizer")
    try:
        tokenizer = JsonTokenizer(file)
    except TokenizerFilesError as exc:
        raise ModelLoadError(str(exc)) from exc
    if tokenizer.vocab_size > model.config.vocab_size:
        raise ModelLoadError(f"{file}: {tokenizer.vocab_size} tokens, more than the model's vocabulary of "
                             f"{model.config.vocab_size}")
    return tokenizer


def attach_draft(engine, source: str, dtype: torch.dtype = torch.float32, device: str = "cpu") -> LoadedModel:
    """Load the draft model `source` (any --model value) for speculative decoding on `engine`, after checking that it
    shares the target's tokenizer (ModelLoadError, one line, if not); its engine becomes `engine.draft`."""
    from kvviz.core.tokenizer import get_tokenizer
    from kvviz.engine.engine import Engine
    from kvviz.engine.speculative import same_tokenizer

    loaded = load_model(source, device, dtype)
    tokenizer = loaded.tokenizer or get_tokenizer()
    if loaded.config.vocab_size != engine.model.config.vocab_size or not same_tokenizer(tokenizer, engine.tokenizer):
        raise ModelLoadError(f"{source}: the draft model's tokenizer is not the target's ({loaded.config.vocab_size} "
                             f"tokens against {engine.model.config.vocab_size}, or another split): a draft proposes "
                             "the target's tokens")
    engine.draft = Engine(loaded.model, tokenizer, device)
    return loaded
