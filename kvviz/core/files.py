"""Paths as typed, and writing files whole or not at all: every file kvviz writes goes through here."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from kvviz.core.errors import KvvizError


def user_path(text: Path | str) -> Path:
    """`text` as a path with a leading `~` or `~user` expanded: every path a user types comes through here.
    KvvizError (one line) for a user this system does not know."""
    path = Path(text)
    try:
        return path.expanduser()
    except RuntimeError as exc:  # pathlib: "Could not determine home directory."
        user = path.parts[0][1:] if path.parts else ""
        raise KvvizError(f"{text}: there is no user named {user!r} here" if user else
                         f"{text}: the home folder is not known (HOME is not set)") from exc


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


STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


def python_stop_handlers() -> dict[int, object]:
    """Each stop signal (Ctrl+C, SIGTERM, SIGHUP) with the handler Python starts with: a handler is taken over
    only where it is still this one (not ignored, as in a background job, and not a host's own)."""
    return {number: signal.default_int_handler if number == signal.SIGINT else signal.SIG_DFL
            for number in STOP_SIGNALS}


class StopRequested(KeyboardInterrupt):
    """Ctrl+C, SIGTERM (`kill`, `timeout`) or SIGHUP (the terminal closed): unwinds as Ctrl+C does, so that
    every file set removes its temporary files and leaves the earlier files whole; `signum` says which."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


_stops_noted: list[int] = []  # stop signals received while stops were deferred
_deferring = [0]


def request_stop(signum: int, frame: object) -> None:
    """A signal handler: raise StopRequested now, or, inside `stops_deferred`, note it for `check_stop`."""
    if _deferring[0]:
        _stops_noted.append(signum)
        return
    raise StopRequested(signum)


def check_stop() -> None:
    """Raise StopRequested for a stop signal noted while stops were deferred: call it where raising is safe."""
    if _stops_noted:
        raise StopRequested(_stops_noted[0])


@contextlib.contextmanager
def stops_deferred() -> Iterator[None]:
    """Within the block a stop signal is noted, not raised: Qt's painting calls back into Python, where an
    exception is swallowed or leaves a painter half-open; `check_stop` raises it at a safe point (every file
    staged, every frame), and so does the end of the block."""
    _deferring[0] += 1
    try:
        yield
    finally:
        _deferring[0] -= 1
    check_stop()


@contextlib.contextmanager
def stop_signals_held() -> Iterator[None]:
    """Ctrl+C, SIGTERM and SIGHUP wait until the block ends (where the platform can hold signals)."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDWR | getattr(os, "O_BINARY", 0))  # Windows syncs writable files only
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FileSet:
    """Files that replace their previous versions together, or not at all (see `replacing_together`).

    Each file is first written beside its target under a hidden temporary name (`stage`, `write`); only
    when every one is whole does `commit` move the previous files (and the `stale` ones) aside, rename the
    new ones into place and delete the old; a failure in between puts the previous files back.
    """

    def __init__(self, stale: Callable[[], list[Path]] | None = None) -> None:
        self._staged: dict[Path, Path] = {}  # target -> its temporary file beside it
        self._stale = stale
        self._committed: list[Path] = []

    @property
    def targets(self) -> list[Path]:
        """The files this set writes (or, once committed, wrote), in the order they were staged."""
        return list(self._staged) or list(self._committed)

    def stage(self, target: Path | str) -> Path:
        """A new empty temporary file beside `target` for a writer that needs a name (a video muxer);
        it becomes `target` at the commit. Made with mode 0o666, so the umask applies as for any new file."""
        check_stop()
        target = Path(target)
        temporary = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
        os.close(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666))
        self.discard(target)
        self._staged[target] = temporary
        return temporary

    def write(self, target: Path | str, data: bytes) -> Path:
        """Stage `data` as the next version of `target`; returns `target`."""
        temporary = self.stage(target)
        with open(temporary, "wb") as handle:
            handle.write(data)
        return Path(target)

    def discard(self, target: Path | str | None = None) -> None:
        """Remove the temporary file of `target` (of every target when None); the previous files stay."""
        for key in [Path(target)] if target is not None else list(self._staged):
            temporary = self._staged.pop(key, None)
            if temporary is not None:
                with contextlib.suppress(OSError):
                    os.unlink(temporary)

    def commit(self) -> list[Path]:
        """Put every staged file in place and remove the previous and stale ones; all of it or none of it."""
        for temporary in self._staged.values():
            _fsync_path(temporary)
        check_stop()
        with stop_signals_held():
            stale = [path for path in (self._stale() if self._stale else []) if path not in self._staged]
            aside: list[tuple[Path, Path]] = []
            placed: list[Path] = []
            try:
                for old in [*stale, *self._staged]:
                    if old.is_file() or old.is_symlink():
                        backup = old.with_name(f".{old.name}.{secrets.token_hex(4)}.old")
                        os.replace(old, backup)
                        aside.append((old, backup))
                for target, temporary in self._staged.items():
                    os.replace(temporary, target)
                    placed.append(target)
            except BaseException:
                for target in placed:
                    with contextlib.suppress(OSError):
                        os.unlink(target)
                for old, backup in reversed(aside):
                    with contextlib.suppress(OSError):
                        os.replace(backup, old)
                raise
            for _, backup in aside:
                with contextlib.suppress(OSError):
                    os.unlink(backup)
        self._committed, self._staged = list(self._staged), {}
        return list(self._committed)


@contextlib.contextmanager
def replacing_together(*folders: Path, stale: Callable[[], list[Path]] | None = None) -> Iterator[FileSet]:
    """Make `folders` and give a `FileSet` to write into: when the block ends without an exception its files
    replace their previous versions and `stale()` (files of an earlier set that this one has no place for);
    on any failure (a full disk, an interrupt, a stop signal, a cancel) nothing changes: the temporary
    files and the folders made here are removed, and every earlier file is left exactly as it was."""
    made = sorted({f for folder in folders for f in (folder, *folder.parents) if not f.exists()},
                  key=lambda f: len(f.parts), reverse=True)  # innermost first
    files = FileSet(stale)
    try:
        for folder in folders:
            folder.mkdir(parents=True, exist_ok=True)
        yield files
        files.commit()
    except BaseException:
        files.discard()
        for folder in made:  # one that holds something else stays
            with contextlib.suppress(OSError):
                folder.rmdir()
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


def read_text_file(file: Path, limit: int, limit_text: str, what: str, error: type[KvvizError] = KvvizError,
                   encoding: str = "utf-8") -> str:
    """The UTF-8 text of a small file a user names (a lesson, a prompts file): `error` with one line naming it for
    one that is missing, a folder, a FIFO or a device (reading could wait forever), larger than `limit` bytes
    (refused unread: `limit_text` says how large), unreadable or not UTF-8."""
    if file.exists() and not file.is_file() and not file.is_dir():
        raise error(f"{file}: not a regular file")
    try:
        with file.open("rb") as handle:
            data = handle.read(limit + 1)
        if len(data) > limit:
            raise error(f"{file}: larger than {limit_text}; a {what} is at most that")
        return data.decode(encoding)
    except FileNotFoundError as exc:
        raise error(f"{file}: no such {what}") from exc
    except IsADirectoryError as exc:
        raise error(f"{file}: is a folder, not a {what}") from exc
    except OSError as exc:
        raise error(f"{file}: cannot be read ({exc.strerror or exc})") from exc
    except UnicodeDecodeError as exc:
        raise error(f"{file}: not UTF-8 text") from exc


MAX_PROMPTS = 256  # requests one batch takes from a prompts file
MAX_PROMPTS_BYTES = 16 * 1024 * 1024  # a prompts file larger than this is refused unread


def read_prompts(path: Path | str) -> list[str]:
    """The prompts of a prompts file: one per line, blank lines skipped (KvvizError, one line, for a file that
    cannot be read, is not UTF-8 text, or holds no prompt or too many)."""
    from kvviz.core.records import MAX_PROMPT_CHARACTERS

    path = user_path(path)
    text = read_text_file(path, MAX_PROMPTS_BYTES, "16 MB", "prompts file", encoding="utf-8-sig")
    # one prompt a line: "\n" ends a line (and a "\r" before it goes), never the other breaks str.splitlines knows
    # (U+2028, a form feed, U+0085), which a prompt may hold
    prompts = [line.removesuffix("\r") for line in text.split("\n")]
    prompts = [line for line in prompts if line.strip()]
    if not prompts:
        raise KvvizError(f"{path}: holds no prompt (one prompt per line)")
    if len(prompts) > MAX_PROMPTS:
        raise KvvizError(f"{path}: holds {len(prompts)} prompts; a batch takes at most {MAX_PROMPTS}")
    for number, prompt in enumerate(prompts, 1):
        if "\0" in prompt or len(prompt) > MAX_PROMPT_CHARACTERS:
            raise KvvizError(f"{path}: prompt {number} holds a NUL character or is longer than "
                             f"{MAX_PROMPT_CHARACTERS:,} characters")
    return prompts
