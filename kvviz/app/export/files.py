"""What an export can be (formats, targets, PNG widths), its one error type, and how its files are written.

Qt-free. Every file is written whole beside its target, then renamed over it, so a failure never
leaves a half-written image or a temporary file; an export of several files replaces the previous
set together or not at all (`all_or_nothing`). The process umask is never read or changed (the
worker thread may be creating files meanwhile).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from kvviz.core.errors import KvvizError
from kvviz.core.files import FileSet, folder_problem, replacing_together, write_atomically

FORMATS = ("png", "svg", "pdf")
FORMAT_LABELS = {"png": "PNG image", "svg": "SVG drawing", "pdf": "PDF document"}
FORMAT_FILTERS = {fmt: f"{label} (*.{fmt})" for fmt, label in FORMAT_LABELS.items()}
TARGETS = ("chart", "grid", "view")  # what can be exported, in menu order
TARGET_LABELS = {"chart": "Chart", "grid": "K/V grid", "view": "Whole view", "compare": "Compare view",
                 "cached_grid": "K/V grid with cache", "uncached_grid": "K/V grid without cache",
                 "attention": "Attention strip", "serving": "Serving view", "pool": "Block pool",
                 "serving_chart": "Serving memory chart", "timeline": "Request timeline", "radix_tree": "Radix tree"}
DEFAULT_PNG_WIDTH = 1920
MIN_PNG_WIDTH = 64
MAX_PNG_WIDTH = 8192


class ExportError(KvvizError):
    """An image that cannot be written; the message is one line naming the file and the reason."""


def export_format(path: Path | str) -> str:
    """'png', 'svg' or 'pdf' from the file name's suffix; ExportError for anything else."""
    path = Path(path)
    suffix = path.suffix.lower().lstrip(".")
    if not suffix:
        raise ExportError(f"{path}: no file extension; name the file .png, .svg or .pdf")
    if suffix not in FORMATS:
        raise ExportError(f"{path}: unknown image type .{suffix}; use .png, .svg or .pdf")
    return suffix


def parse_formats(text: str | list[str] | tuple[str, ...]) -> list[str]:
    """'png,svg' or ['png', 'svg'] -> ['png', 'svg'], checked, duplicates dropped."""
    items = text.split(",") if isinstance(text, str) else list(text)
    formats: list[str] = []
    for item in items:
        fmt = item.strip().lower().lstrip(".")
        if not fmt:
            continue
        if fmt not in FORMATS:
            raise ExportError(f"unknown format {item.strip()!r}; choose from {', '.join(FORMATS)}")
        if fmt not in formats:
            formats.append(fmt)
    if not formats:
        raise ExportError(f"no image format given; choose from {', '.join(FORMATS)}")
    return formats


def check_png_width(width: object, what: str = "PNG width") -> int:
    """`width` when it is a whole number of pixels in range, else ExportError."""
    if isinstance(width, bool) or not isinstance(width, int) or not MIN_PNG_WIDTH <= width <= MAX_PNG_WIDTH:
        raise ExportError(f"{what} must be {MIN_PNG_WIDTH} to {MAX_PNG_WIDTH} pixels, got {width}")
    return width


def check_target_path(path: Path) -> None:
    """ExportError, before anything is rendered, for a path no file can be written to."""
    if path.is_dir():
        raise ExportError(f"{path}: is a folder; give a file name")
    folder = path.parent
    if not folder.exists():
        raise ExportError(f"{path}: the folder {folder} does not exist")
    if not folder.is_dir():
        raise ExportError(f"{path}: {folder} is not a folder")


def write_export(path: Path, data: bytes, files: FileSet | None = None) -> Path:
    """Write `data` to `path` whole or not at all, now or, given `files`, when that set commits;
    ExportError naming the file and the reason."""
    check_target_path(path)
    try:
        return write_atomically(path, data) if files is None else files.write(path, data)
    except OSError as exc:
        raise ExportError(f"{path}: could not be written ({exc.strerror or exc})") from exc


@contextlib.contextmanager
def all_or_nothing(*folders: Path, stale: Callable[[], list[Path]] | None = None) -> Iterator[FileSet]:
    """Make `folders` and give a FileSet to write the export's files into (`write_export(path, data, files)`):
    they replace the previous export's files, and `stale()`, together when the block ends; on any failure (a
    full disk, an interrupt, a stop signal, a cancel) the previous export stays exactly as it was, and the
    temporary files and the folders made here are removed. File system errors are one ExportError line."""
    for folder in folders:
        problem = folder_problem(folder)
        if problem is not None:
            raise ExportError(f"{folder}: {problem}")
    in_block = False
    try:
        with replacing_together(*folders, stale=stale) as files:
            in_block = True
            yield files
            in_block = False
    except OSError as exc:
        if in_block:  # the caller's own error (its output closed...): as it was
            raise
        where = os.fsdecode(exc.filename) if isinstance(exc.filename, (str, bytes)) else ", ".join(map(str, folders))
        raise ExportError(f"{where}: could not be written ({exc.strerror or exc})") from exc
