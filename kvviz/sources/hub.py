"""Checkpoints from the Hugging Face hub (GPT-2, SmolLM2, Qwen2.5, Gemma 3): found in the local cache, or downloaded
once, quietly."""

from __future__ import annotations

import contextlib
import io
import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from kvviz.core.errors import DownloadCancelled, ModelLoadError, first_line

HUB_MODELS = {
    "gpt2": "openai-community/gpt2",
    "gpt2-medium": "openai-community/gpt2-medium",
    "gpt2-large": "openai-community/gpt2-large",
    "gpt2-xl": "openai-community/gpt2-xl",
    "smollm2-135m": "HuggingFaceTB/SmolLM2-135M",  # Apache-2.0; GQA: 9 query heads on 3 KV heads
    "smollm2-360m": "HuggingFaceTB/SmolLM2-360M",  # Apache-2.0; GQA: 15 on 5
    "qwen2.5-0.5b": "Qwen/Qwen2.5-0.5B",  # Apache-2.0; GQA: 14 on 2, q/k/v biases
    "gemma-3-270m": "google/gemma-3-270m",  # Gemma Terms of Use (gated: accept them, log in); MQA: 4 on 1
}
ProgressCallback = Callable[[int, int], None]  # (bytes done, bytes total); may raise DownloadCancelled

GPT2_FILES = ("config.json", "model.safetensors")
LLAMA_FILES = ("config.json", "tokenizer.json", "model.safetensors")  # the family tokenizes with its own


def hub_files(name: str) -> tuple[str, ...]:
    """The files a hub model needs, its weights last: GPT-2 tokenizes with tiktoken, the others with their own."""
    return GPT2_FILES if name.startswith("gpt2") else LLAMA_FILES


def cached_hub_model(name: str, cache_dir: str | Path | None = None) -> Path | None:
    """The cache folder of a hub model that was downloaded before, or None; never touches the network."""
    from huggingface_hub import constants, try_to_load_from_cache

    repo_id = HUB_MODELS[name]
    repo_folder = Path(cache_dir or constants.HF_HUB_CACHE) / f"models--{repo_id.replace('/', '--')}"
    try:
        paths = [try_to_load_from_cache(repo_id, filename, cache_dir=cache_dir) for filename in hub_files(name)]
    except (UnicodeDecodeError, ValueError, OSError) as exc:  # a damaged entry: refs/main not text, unreadable...
        bad = _damaged_file(repo_folder)
        raise ModelLoadError(f"{name}: the Hugging Face cache entry {bad or repo_folder} is damaged "
                             f"({first_line(exc)}); delete {bad or repo_folder} to download it again") from exc
    if not all(isinstance(p, str) and Path(p).is_file() for p in paths):
        return None
    folders = {Path(p).parent for p in paths}  # type: ignore[arg-type]
    return folders.pop() if len(folders) == 1 else None


def _damaged_file(repo_folder: Path) -> Path | None:
    """The first reference in a hub repo's cache folder that cannot be read as text, or None."""
    refs = repo_folder / "refs"
    for ref in sorted(refs.rglob("*")) if refs.is_dir() else []:
        try:
            if ref.is_file():
                ref.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            return ref
    return None


def download_hub_model(name: str, progress: ProgressCallback | None = None,
                       endpoint: str | None = None, cache_dir: str | Path | None = None) -> Path:
    """Fetch a hub model's files (`hub_files`) into the HF cache; return the folder.

    Downloaded once: a model already in the cache is used without asking the hub. huggingface_hub
    writes to a temporary file and renames it when complete, so an interrupted download leaves no
    half-written weights; the next call starts over. With `progress`, the download reports to it
    alone (no progress bar, no log lines on the terminal), and DownloadCancelled raised by it stops
    the download and passes through unchanged.
    """
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    if name not in HUB_MODELS:
        raise ModelLoadError(f"{name}: unknown hub model; choose from {', '.join(HUB_MODELS)}")
    cached = cached_hub_model(name, cache_dir)
    if cached is not None:
        return cached
    repo_id = HUB_MODELS[name]
    kwargs: dict = {"repo_id": repo_id, "cache_dir": cache_dir}
    if endpoint is not None:
        kwargs["endpoint"] = endpoint
    quiet = progress is not None
    try:
        with _hub_logs_silenced() if quiet else contextlib.nullcontext():
            *small, weights = hub_files(name)
            paths = [hf_hub_download(filename=filename, tqdm_class=_quiet_tqdm() if quiet else None, **kwargs)
                     for filename in small]
            paths.append(hf_hub_download(filename=weights, tqdm_class=_quiet_tqdm(progress) if quiet else None,
                                         **kwargs))
    except DownloadCancelled:
        raise
    except LocalEntryNotFoundError as exc:
        raise ModelLoadError(
            f"{name}: not downloaded yet and the Hugging Face hub cannot be reached; connect once to fetch {repo_id}"
        ) from exc
    except Exception as exc:  # HTTP errors, dropped connections, full disks: huggingface_hub raises many types
        raise ModelLoadError(
            f"{name}: download of {repo_id} failed ({first_line(exc)}); nothing partial was kept, try again"
        ) from exc
    folder = Path(paths[-1]).parent
    if any(Path(path).parent != folder for path in paths):
        raise ModelLoadError(f"{name}: config and weights landed in different folders of the cache")
    return folder


class _Discard(io.TextIOBase):
    def write(self, text: str) -> int:
        return len(text)


def _quiet_tqdm(progress: ProgressCallback | None = None) -> type:
    """A tqdm class for huggingface_hub that draws nothing and reports each update to `progress`."""
    from tqdm import tqdm

    class QuietTqdm(tqdm):
        def __init__(self, *args, **kwargs) -> None:
            kwargs.update(file=_Discard(), disable=False)  # counts bytes, as a bar would, but draws on nothing
            super().__init__(*args, **kwargs)

        def update(self, n: float | None = 1) -> bool | None:
            result = super().update(n)
            if progress is not None:
                progress(int(self.n), int(self.total or 0))
            return result

    return QuietTqdm


class _ThreadsFilter(logging.Filter):
    """Drops log records made by the threads in `threads`."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: set[int] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        return record.thread not in self.threads


_SILENCED = _ThreadsFilter()


@contextlib.contextmanager
def _hub_logs_silenced() -> Iterator[None]:
    """No huggingface_hub log lines (retries, its Xet notice) from this thread meanwhile: they go to stderr."""
    for name, logger in list(logging.Logger.manager.loggerDict.items()):
        if name.split(".")[0] == "huggingface_hub" and isinstance(logger, logging.Logger):
            if _SILENCED not in logger.filters:
                logger.addFilter(_SILENCED)
    thread = threading.get_ident()
    _SILENCED.threads.add(thread)
    try:
        yield
    finally:
        _SILENCED.threads.discard(thread)
