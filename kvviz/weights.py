"""Model sources: the embedded default, checkpoint folders and files, the hub, random weights."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from kvviz.model import GPT, PRESETS, GPTConfig
from kvviz.resources import DEFAULT_MODEL_NAME, default_model_dir

HUB_MODELS = {
    "gpt2": "openai-community/gpt2",
    "gpt2-medium": "openai-community/gpt2-medium",
    "gpt2-large": "openai-community/gpt2-large",
    "gpt2-xl": "openai-community/gpt2-xl",
}
RANDOM_SEED = 123
# Buffers some checkpoints carry that are not weights (causal masks).
IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias")
HEADS_BY_WIDTH = {768: 12, 1024: 16, 1280: 20, 1600: 25}

ProgressCallback = Callable[[int, int], None]  # (bytes done, bytes total)


class ModelLoadError(ValueError):
    """A model source that cannot be used; the message is one line that names the culprit."""


def _first_line(exc: BaseException) -> str:
    """An exception's message as one plain line (no terminal colour codes), or its type's name."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip()
    return text.splitlines()[0].strip() if text else exc.__class__.__name__


@dataclass(frozen=True)
class LoadedModel:
    """A ready model and where it came from."""

    model: GPT
    name: str  # short name for display: "gpt2", "random:gpt2", a folder's name
    source: str  # where the weights came from, for Help > About
    config: GPTConfig

    @property
    def num_parameters(self) -> int:
        return self.model.num_parameters()


def describe_sources() -> str:
    return (f"the embedded default ({DEFAULT_MODEL_NAME}), {', '.join(HUB_MODELS)} (downloaded once), "
            f"random:<{'|'.join(PRESETS)}>, or a path to a checkpoint folder or .safetensors file")


def config_from_json(path: Path) -> GPTConfig:
    """A GPTConfig from a transformers GPT-2 `config.json`."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{path}: not a readable JSON config ({exc.__class__.__name__})") from exc
    if not isinstance(raw, dict):
        raise ModelLoadError(f"{path}: the config is not a JSON object")
    model_type = raw.get("model_type")
    if model_type != "gpt2":
        raise ModelLoadError(f"{path}: model_type is {model_type!r}, but kvviz runs GPT-2 checkpoints only")
    activation = raw.get("activation_function", "gelu_new")
    if activation not in ("gelu_new", "gelu_pytorch_tanh"):
        raise ModelLoadError(f"{path}: activation_function {activation!r} is not GPT-2's tanh GELU")
    if raw.get("n_inner") not in (None, 4 * raw.get("n_embd", 768)):
        raise ModelLoadError(f"{path}: n_inner={raw['n_inner']} is not 4 * n_embd, which kvviz requires")
    try:
        return GPTConfig(
            vocab_size=int(raw.get("vocab_size", 50257)),
            n_ctx=int(raw.get("n_positions", raw.get("n_ctx", 1024))),
            n_layer=int(raw.get("n_layer", 12)),
            n_head=int(raw.get("n_head", 12)),
            n_embd=int(raw.get("n_embd", 768)),
            layer_norm_epsilon=float(raw.get("layer_norm_epsilon", 1e-5)),
            name=path.parent.name,
        )
    except (TypeError, ValueError) as exc:
        raise ModelLoadError(f"{path}: {exc}") from exc


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


def _read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise ModelLoadError(f"{path}: no such file")
    suffix = path.suffix.lower()
    if suffix not in (".safetensors", ".pth", ".pt", ".bin"):
        raise ModelLoadError(f"{path}: unsupported file type {suffix!r}; use .safetensors (or a .pth state dict)")
    try:
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
        raise ModelLoadError(f"{path}: corrupt or truncated checkpoint ({_first_line(exc)})") from exc
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ModelLoadError(f"{path}: not a state dict (a dict of tensor names to tensors)")
    return state


def normalize_keys(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Keys as kvviz names them: `transformer.` prefix added (hub layout), masks and lm_head dropped."""
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
    try:
        vocab_size, n_embd = (int(n) for n in state["transformer.wte.weight"].shape)
        n_ctx = int(state["transformer.wpe.weight"].shape[0])
    except KeyError as exc:
        raise ModelLoadError(f"{origin}: tensor {exc.args[0]} is missing; this is not a GPT-2 checkpoint") from exc
    except ValueError as exc:
        raise ModelLoadError(f"{origin}: tensor transformer.wte.weight is not a matrix; not GPT-2") from exc
    layers = {k.split(".")[2] for k in state if k.startswith("transformer.h.")}
    if not all(layer.isdigit() for layer in layers):
        raise ModelLoadError(f"{origin}: unexpected tensor names under transformer.h; not a GPT-2 checkpoint")
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
        return GPTConfig(vocab_size=vocab_size, n_ctx=n_ctx, n_layer=len(layers), n_head=n_head, n_embd=n_embd,
                         name=name)
    except ValueError as exc:
        raise ModelLoadError(f"{origin}: {exc}") from exc


def build_model(config: GPTConfig, state: dict[str, torch.Tensor], origin: str, dtype: torch.dtype) -> GPT:
    """A GPT with `state` loaded, after checking every tensor's presence and shape."""
    with torch.device("meta"):
        model = GPT(config)
    expected = {k: v.shape for k, v in model.state_dict().items()}
    for key, shape in expected.items():
        if key not in state:
            raise ModelLoadError(f"{origin}: tensor {key} is missing")
        if tuple(state[key].shape) != tuple(shape):
            raise ModelLoadError(f"{origin}: tensor {key} has shape {tuple(state[key].shape)}, expected {tuple(shape)}")
    unexpected = sorted(set(state) - set(expected))
    if unexpected:
        raise ModelLoadError(f"{origin}: unexpected tensor {unexpected[0]} ({len(unexpected)} in all)")
    model.load_state_dict({k: v.to(dtype) for k, v in state.items()}, assign=True)
    return model.eval()


def load_checkpoint(path: Path, dtype: torch.dtype = torch.float32) -> GPT:
    """A checkpoint folder (config.json + model.safetensors) or a single weights file."""
    if path.is_dir():
        weights = path / "model.safetensors"
        if not weights.is_file():
            raise ModelLoadError(f"{path}: folder has no model.safetensors")
        config_path = path / "config.json"
        state = normalize_keys(_read_state_dict(weights))
        if config_path.is_file():
            config = config_from_json(config_path)
        else:
            config = infer_config(state, path.name, str(weights))
        return build_model(config.with_name(path.name), state, str(weights), dtype)
    state = normalize_keys(_read_state_dict(path))
    sibling = path.parent / "config.json"
    config = config_from_json(sibling) if sibling.is_file() else infer_config(state, path.stem, str(path))
    name = path.parent.name if path.stem == "model" else path.stem
    return build_model(config.with_name(name), state, str(path), dtype)


def save_checkpoint(model: GPT, out_dir: Path, dtype: torch.dtype = torch.float32) -> Path:
    """Write `config.json` and `model.safetensors` as transformers' save_pretrained does, atomically."""
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()}
    weights = out_dir / "model.safetensors"
    tmp_weights = out_dir / ".model.safetensors.tmp"
    save_file(state, str(tmp_weights), metadata={"format": "pt"})
    os.chmod(tmp_weights, 0o644)
    os.replace(tmp_weights, weights)
    tmp_config = out_dir / ".config.json.tmp"
    tmp_config.write_text(json.dumps(config_to_json(model.config), indent=2) + "\n", encoding="utf-8")
    os.replace(tmp_config, out_dir / "config.json")
    return weights


def random_model(preset: str, dtype: torch.dtype = torch.float32) -> GPT:
    """Untrained weights from a fixed seed, GPT-2's initialisation (the book's benchmark setup)."""
    if preset not in PRESETS:
        raise ModelLoadError(f"unknown preset {preset!r} in random:{preset}; choose from {', '.join(PRESETS)}")
    config = PRESETS[preset].with_name(f"random:{preset}")
    model = GPT(config)
    model.init_weights(torch.Generator().manual_seed(RANDOM_SEED))
    return model.to(dtype).eval()


HUB_FILES = ("config.json", "model.safetensors")


def cached_hub_model(name: str, cache_dir: str | Path | None = None) -> Path | None:
    """The cache folder of a hub GPT-2 that was downloaded before, or None; never touches the network."""
    from huggingface_hub import try_to_load_from_cache

    paths = [try_to_load_from_cache(HUB_MODELS[name], filename, cache_dir=cache_dir) for filename in HUB_FILES]
    if not all(isinstance(p, str) and Path(p).is_file() for p in paths):
        return None
    folders = {Path(p).parent for p in paths}  # type: ignore[arg-type]
    return folders.pop() if len(folders) == 1 else None


def download_hub_model(name: str, progress: ProgressCallback | None = None,
                       endpoint: str | None = None, cache_dir: str | Path | None = None) -> Path:
    """Fetch `config.json` and `model.safetensors` for a hub GPT-2 into the HF cache; return the folder.

    Downloaded once: a model already in the cache is used without asking the hub. huggingface_hub
    writes to a temporary file and renames it when complete, so an interrupted download leaves no
    half-written weights; the next call starts over.
    """
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    if name not in HUB_MODELS:
        raise ModelLoadError(f"unknown hub model {name!r}; choose from {', '.join(HUB_MODELS)}")
    cached = cached_hub_model(name, cache_dir)
    if cached is not None:
        return cached
    repo_id = HUB_MODELS[name]
    kwargs: dict = {"repo_id": repo_id, "cache_dir": cache_dir}
    if endpoint is not None:
        kwargs["endpoint"] = endpoint
    try:
        config_path = hf_hub_download(filename="config.json", **kwargs)
        tqdm_class = _progress_tqdm(progress) if progress is not None else None
        weights_path = hf_hub_download(filename="model.safetensors", tqdm_class=tqdm_class, **kwargs)
    except LocalEntryNotFoundError as exc:
        raise ModelLoadError(
            f"{name}: not downloaded yet and the Hugging Face hub cannot be reached; connect once to fetch {repo_id}"
        ) from exc
    except Exception as exc:  # HTTP errors, dropped connections, full disks: huggingface_hub raises many types
        raise ModelLoadError(
            f"{name}: download of {repo_id} failed ({_first_line(exc)}); nothing partial was kept, try again"
        ) from exc
    folder = Path(weights_path).parent
    if Path(config_path).parent != folder:
        raise ModelLoadError(f"{name}: config and weights landed in different folders of the cache")
    return folder


def _progress_tqdm(progress: ProgressCallback):
    from tqdm.auto import tqdm

    class CallbackTqdm(tqdm):
        def update(self, n: float | None = 1) -> bool | None:
            result = super().update(n)
            progress(int(self.n), int(self.total or 0))
            return result

    return CallbackTqdm


def check_device(device: str | torch.device) -> torch.device:
    """`device` as a torch.device, or a ModelLoadError saying why it cannot be used here."""
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise ModelLoadError(f"unknown device {str(device)!r}; use cpu, cuda or mps") from exc
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(f"device {str(device)!r} is not available here (no CUDA GPU, or torch built without CUDA)")
    if resolved.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise ModelLoadError(f"device {str(device)!r} is not available here (it needs Apple silicon)")
    if resolved.type not in ("cpu", "cuda", "mps"):
        raise ModelLoadError(f"unknown device {str(device)!r}; use cpu, cuda or mps")
    return resolved


def load_model(
    source: str | None = None,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    progress: ProgressCallback | None = None,
) -> LoadedModel:
    """Resolve a `--model` value to a ready model. `None` means the embedded default."""
    check_device(device)
    if source is None or source == "" or source == DEFAULT_MODEL_NAME:
        folder = default_model_dir()
        if not (folder / "model.safetensors").is_file():
            raise ModelLoadError(f"the embedded model is missing from {folder}; reinstall kvviz")
        model = load_checkpoint(folder, dtype)
        name, origin = DEFAULT_MODEL_NAME, f"embedded in kvviz ({folder})"
    elif source.startswith("random:"):
        preset = source.split(":", 1)[1]
        model = random_model(preset, dtype)
        name, origin = source, f"untrained GPT-2 {preset} weights, seed {RANDOM_SEED}"
    elif source in HUB_MODELS:
        folder = download_hub_model(source, progress)
        model = load_checkpoint(folder, dtype)
        model.config = model.config.with_name(source)  # not the cache folder's commit hash
        name, origin = source, f"Hugging Face hub {HUB_MODELS[source]} (cached in {folder})"
    else:
        path = Path(source).expanduser()
        if not path.exists():
            raise ModelLoadError(f"unknown model {source!r}: no such file or folder; use {describe_sources()}")
        model = load_checkpoint(path, dtype)
        name, origin = model.config.name, str(path.resolve())
    model = model.to(device)
    return LoadedModel(model=model, name=name, source=origin, config=model.config)
