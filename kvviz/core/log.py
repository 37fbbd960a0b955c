"""The log file: where an error the user cannot fix (a bug, not bad input) leaves its traceback, so that the one
line the user sees can point at the details. Qt-free: the command line and the app write it alike."""

from __future__ import annotations

import os
import time
import traceback
from pathlib import Path

MAX_LOG_BYTES = 1_000_000  # past this, the older half of the file goes


def log_path() -> Path:
    """$KVVIZ_LOG, else kvviz/kvviz.log in $XDG_STATE_HOME (~/.local/state)."""
    if os.environ.get("KVVIZ_LOG"):
        return Path(os.environ["KVVIZ_LOG"]).expanduser()
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "kvviz" / "kvviz.log"


def log_error(what: str, exc: BaseException) -> Path | None:
    """Append `what` and `exc`'s traceback to the log file, with the time; the file's path, or None when it
    cannot be written (the error is then only what the user was told)."""
    path = log_path()
    entry = (f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {what}\n"
             + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_file() and path.stat().st_size > MAX_LOG_BYTES:
            kept = path.read_bytes()[-MAX_LOG_BYTES // 2:]
            path.write_bytes(kept[kept.find(b"\n--- ") + 1:] if b"\n--- " in kept else b"")
        with path.open("a", encoding="utf-8") as log:
            log.write(entry)
    except OSError:
        return None
    return path
