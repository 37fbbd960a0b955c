"""Writing files whole or not at all: every file kvviz writes goes through here."""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


@contextlib.contextmanager
def atomic_writer(path: Path | str) -> Iterator[BinaryIO]:
    """A binary file to write `path` through: it replaces `path` only when the block ends without
    an exception; otherwise nothing is left behind, not even the temporary file.

    The temporary file sits beside `path` (same file system, so the final rename is atomic) and is
    created with mode 0o666, so the process umask applies as for any new file: the umask itself is
    never read or changed (other threads may be creating files meanwhile).
    """
    path = Path(path)
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


@contextlib.contextmanager
def atomic_path(path: Path | str) -> Iterator[Path]:
    """A temporary path beside `path` for a library that writes (and perhaps reads back) a file by name,
    such as a video muxer: it replaces `path` only when the block ends without an exception; otherwise
    nothing is left behind. Made as `atomic_writer` makes its file (mode 0o666, the umask untouched)."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    os.close(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666))
    try:
        yield temporary
        fd = os.open(temporary, os.O_RDWR | getattr(os, "O_BINARY", 0))  # Windows syncs writable files only
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def write_atomically(path: Path | str, data: bytes) -> Path:
    """Write `data` to `path` whole or not at all (see `atomic_writer`); returns `path`."""
    with atomic_writer(path) as handle:
        handle.write(data)
    return Path(path)


def folder_problem(out_dir: Path) -> str | None:
    """Why no file can be created in `out_dir` (or in it once made), as a clause; None when one can.

    A scratch folder is made and removed in `out_dir`, or in its nearest existing parent: permission
    bits alone would pass root, a read-only file system or /proc. Nothing is left behind.
    """
    try:
        folder = out_dir.absolute()
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
        if folder == out_dir.absolute() and not folder.is_dir():
            return "exists and is not a folder"
        if not folder.is_dir():
            return f"cannot be made a folder: {folder} is not a folder"
        os.rmdir(tempfile.mkdtemp(prefix=".kvviz-check-", dir=folder))
    except OSError as exc:
        return f"no file can be written there ({exc.strerror or str(exc).splitlines()[0]})"
    return None
