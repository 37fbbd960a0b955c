"""What the worker thread does besides running the engine: it checks that a model computes in the number type it
was loaded in, and says in one sentence why a load or a step failed."""

from __future__ import annotations

from kvviz.core.errors import as_sentence, first_line, is_out_of_memory


def describe_load_error(source: str, exc: BaseException) -> str:
    """One sentence for a model that failed to load."""
    from kvviz.core.errors import KvvizError

    label = source or "the embedded model"
    if isinstance(exc, (KvvizError, DtypeUnsupported)):
        return as_sentence(first_line(exc))
    if is_out_of_memory(exc):
        return f"Not enough memory to load {label}; choose a smaller model."
    return as_sentence(f"Could not load {label}: {first_line(exc)}")


class DtypeUnsupported(Exception):
    """A model loaded in a number type its device cannot compute in."""


def check_dtype_runs(model, dtype: str) -> None:
    """One token through `model` in `dtype`: a DtypeUnsupported sentence if the device cannot compute in it."""
    if dtype == "float32":
        return
    import torch

    try:
        with torch.inference_mode():
            model(torch.zeros((1, 1), dtype=torch.long, device=next(model.parameters()).device))
    except (RuntimeError, TypeError) as exc:
        if is_out_of_memory(exc):
            raise
        device = next(model.parameters()).device.type
        raise DtypeUnsupported(f"{dtype} cannot run on {device} here ({first_line(exc)}); "
                               "the previous precision is kept.") from exc


def describe_run_error(model_name: str, exc: BaseException) -> str:
    """One sentence for a generation step that failed."""
    if is_out_of_memory(exc):
        return f"Not enough memory to continue with {model_name}; lower max new tokens or choose a smaller model."
    return as_sentence(f"Generation with {model_name} stopped: {first_line(exc)}")


def log_unexpected(what: str, exc: BaseException) -> None:
    """The traceback of a failure that is no bad input (not a KvvizError, not out of memory) to the log file: the
    window says one sentence, the log the details."""
    from kvviz.core.errors import KvvizError
    from kvviz.core.log import log_error

    if not isinstance(exc, KvvizError) and not is_out_of_memory(exc):
        log_error(what, exc)
