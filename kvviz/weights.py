"""Model sources: the embedded default, checkpoint folders and files, the hub, random weights."""

from __future__ import annotations

import json
import os
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
    try:
        if suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path))
        if suffix in (".pth", ".pt", ".bin"):
            state = torch.load(str(path), map_location="cpu", weights_only=True)
            if not isinstance(state, dict):
                raise ModelLoadError(f"{path}: not a state dict")
            return state
    except ModelLoadError:
        raise
    except Exception as exc:  # safetensors and torch raise several types for corrupt files
        detail = str(exc).splitlines()[0] if str(exc) else exc.__class__.__name__
        raise ModelLoadError(f"{path}: corrupt or truncated checkpoint ({detail})") from exc
    raise ModelLoadError(f"{path}: unsupported file type {suffix!r}; use .safetensors (or a .pth state dict)")


def normalize_keys(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Keys as kvviz names them: `transformer.` prefix added (hub layout), masks and lm_head dropped."""
    out: dict[str, torch.Tensor] = {}
    for key, tensor in state.items():
        if key.endswith(IGNORED_SUFFIXES) or key == "lm_head.weight":
            continue
        out[key if key.startswith("transformer.") else f"transformer.{key}"] = tensor
    return out


def infer_config(state: dict[str, torch.Tensor], name: str) -> GPTConfig:
    """A config from tensor shapes alone, for a bare checkpoint without `config.json`."""
    try:
        vocab_size, n_embd = state["transformer.wte.weight"].shape
        n_ctx = state["transformer.wpe.weight"].shape[0]
    except KeyError as exc:
        raise ModelLoadError(f"{name}: tensor {exc.args[0]} is missing; this is not a GPT-2 checkpoint") from exc
    layers = {int(k.split(".")[2]) for k in state if k.startswith("transformer.h.")}
    n_head = HEADS_BY_WIDTH.get(int(n_embd), max(1, int(n_embd) // 64))
    return GPTConfig(vocab_size=int(vocab_size), n_ctx=int(n_ctx), n_layer=len(layers), n_head=n_head,
                     n_embd=int(n_embd), name=name)


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
        config = config_from_json(config_path) if config_path.is_file() else infer_config(state, path.name)
        return build_model(config.with_name(path.name), state, str(weights), dtype)
    state = normalize_keys(_read_state_dict(path))
    sibling = path.parent / "config.json"
    config = config_from_json(sibling) if sibling.is_file() else infer_config(state, path.stem)
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


def download_hub_model(name: str, progress: ProgressCallback | None = None,
                       endpoint: str | None = None) -> Path:
    """Fetch `config.json` and `model.safetensors` for a hub GPT-2 into the HF cache; return the folder.

    huggingface_hub writes to a temporary file and renames it when complete, so an interrupted
    download leaves no half-written weights; the next call resumes or starts over.
    """
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    repo_id = HUB_MODELS[name]
    kwargs: dict = {"repo_id": repo_id}
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
    except HfHubHTTPError as exc:
        raise ModelLoadError(f"{name}: download of {repo_id} failed ({str(exc).splitlines()[0]})") from exc
    except OSError as exc:
        raise ModelLoadError(f"{name}: download of {repo_id} failed ({exc})") from exc
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


def load_model(
    source: str | None = None,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    progress: ProgressCallback | None = None,
) -> LoadedModel:
    """Resolve a `--model` value to a ready model. `None` means the embedded default."""
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
        name, origin = source, f"Hugging Face hub {HUB_MODELS[source]} (cached in {folder})"
    else:
        path = Path(source).expanduser()
        if not path.exists():
            raise ModelLoadError(f"unknown model {source!r}: no such file or folder; use {describe_sources()}")
        model = load_checkpoint(path, dtype)
        name, origin = model.config.name, str(path.resolve())
    model = model.to(device)
    return LoadedModel(model=model, name=name, source=origin, config=model.config)
