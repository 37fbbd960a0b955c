"""What the app remembers, per user: one JSON object in the platform's config folder, read into typed
dataclasses whose fields each write a key, its type, default and range once.

JSON holds only numbers, text, true/false, lists and objects, so reading the file runs nothing. A file
that is missing, unreadable, not JSON or not an object reads as empty; a value of the wrong type is
ignored (the default stays); a number out of range is clamped to it. Writes go through the atomic
writer, merged with what the file holds then (two windows sharing a home keep each other's keys).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from PySide6.QtCore import QByteArray, QStandardPaths

from kvviz.app.theme import DEFAULT as DEFAULT_THEME
from kvviz.app.theme import THEMES
from kvviz.core.files import write_atomically
from kvviz.core.memory import DTYPE_BYTES
from kvviz.core.speculation import MAX_DRAFT_TOKENS, MAX_PROMPT_LOOKUP

ORGANIZATION = "kvviz"  # the application's names, as Qt knows them
APPLICATION = "kvviz"
SETTINGS_FILE = "kvviz.json"
MAX_SETTINGS_BYTES = 1 << 20  # a settings file larger than this is not kvviz's: it reads as empty

T = TypeVar("T", bound="TypedSettings")


class SettingsFile:
    """A JSON object in a file, with the part of QSettings' interface the app uses (`value`, `setValue`,
    `sync`, `fileName`): values are read at the first question and written at `sync`."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._values: dict[str, Any] | None = None
        self._changed: dict[str, Any] = {}

    def fileName(self) -> str:  # QSettings' name
        return str(self.path)

    def values(self) -> dict[str, Any]:
        """Every stored key and value (empty for a file that is missing or not a JSON object)."""
        if self._values is None:
            self._values = {**self._read(), **self._changed}
        return self._values

    def value(self, key: str, default: Any = None) -> Any:
        return self.values().get(key, default)

    def setValue(self, key: str, value: Any) -> None:  # QSettings' name
        self.values()[key] = value
        self._changed[key] = value

    def sync(self) -> None:
        """Write the keys set here over what the file holds now; a folder that cannot take it is left alone."""
        if not self._changed:
            return
        merged = {**self._read(), **self._changed}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(self.path, (json.dumps(merged, indent=1, sort_keys=True) + "\n").encode("utf-8"))
        except (OSError, ValueError):  # a read-only home, a settings path taken by a folder: settings are not kept
            return
        self._values, self._changed = merged, {}

    def _read(self) -> dict[str, Any]:
        try:
            with self.path.open("rb") as handle:
                data = handle.read(MAX_SETTINGS_BYTES + 1)
            if len(data) > MAX_SETTINGS_BYTES:
                return {}
            values = json.loads(data.decode("utf-8"))
        except (OSError, ValueError, RecursionError):
            return {}
        return values if isinstance(values, dict) else {}


def settings_path() -> Path:
    """Where the user's settings live: kvviz/kvviz.json in the platform's config folder ($XDG_CONFIG_HOME)."""
    folder = QStandardPaths.writableLocation(QStandardPaths.StandardLocation.GenericConfigLocation)
    return Path(folder or Path.home() / ".config") / "kvviz" / SETTINGS_FILE


_OPEN: dict[Path, SettingsFile] = {}  # one per file in this process, as QSettings shares its values


def app_settings() -> SettingsFile:
    """The user's kvviz settings, shared by every part of the app (tests point `settings_path` elsewhere)."""
    path = settings_path()
    if path not in _OPEN:
        _OPEN[path] = SettingsFile(path)
    return _OPEN[path]


def setting(key: str, default: Any, low: float | None = None, high: float | None = None) -> Any:
    """A dataclass field stored under `key`, clamped to [low, high] when read."""
    return field(default=default, metadata={"key": key, "low": low, "high": high})


def _typed(value: Any, kind: type, low: float | None, high: float | None) -> Any:
    """`value` as `kind`, clamped; raises ValueError when it is not one."""
    if kind is bool or kind is str:
        if type(value) is not kind:
            raise ValueError(value)
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(value)
    if kind is int and isinstance(value, float) and not value.is_integer():
        raise ValueError(value)
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(value)
    number = kind(value)
    if low is not None:
        number = max(kind(low), number)
    if high is not None:
        number = min(kind(high), number)
    return number


@dataclass
class TypedSettings:
    """Base of the settings dataclasses: `load` reads every field from a SettingsFile, `save` writes them."""

    @classmethod
    def load(cls: type[T], store: SettingsFile) -> T:
        stored = store.values()
        values = {}
        for f in dataclasses.fields(cls):
            meta = f.metadata
            if meta["key"] not in stored:
                continue
            try:
                values[f.name] = _typed(stored[meta["key"]], type(f.default), meta["low"], meta["high"])
            except (TypeError, ValueError, OverflowError):
                continue  # the default stays
        return cls(**values)

    def save(self, store: SettingsFile) -> None:
        for f in dataclasses.fields(self):
            store.setValue(f.metadata["key"], getattr(self, f.name))
        store.sync()


@dataclass
class AppSettings(TypedSettings):
    """The window's remembered run and view settings."""

    prompt: str = setting("run/prompt", "To be, or not to be")
    use_cache: bool = setting("run/use_cache", True)
    max_new_tokens: int = setting("run/max_new_tokens", 12, 1, 4096)
    temperature: float = setting("run/temperature", 0.0, 0.0, 5.0)
    top_k: int = setting("run/top_k", 0, 0, 50257)
    seed: int = setting("run/seed", 0, 0, 2**31 - 1)
    speed_index: int = setting("view/speed_index", 2, 0, 6)
    colour_blind: bool = setting("view/colour_blind", False)
    scores: bool = setting("view/scores", False)  # View > Scores: kept cells shaded by an importance method's score
    compare: bool = setting("view/compare", False)  # compare mode; "break the cache" is never remembered
    speculative: bool = setting("run/speculative", False)  # Run > Speculative decoding: on, its drafter and k
    draft_tokens: int = setting("run/draft_tokens", 4, 1, MAX_DRAFT_TOKENS)
    prompt_lookup: int = setting("run/prompt_lookup", 3, 1, MAX_PROMPT_LOOKUP)
    draft_by_model: bool = setting("run/draft_by_model", False)  # the draft model drafts, not prompt lookup
    zoom: float = setting("view/zoom", 1.0, 0.7, 2.3)
    theme: str = setting("view/theme", DEFAULT_THEME)  # "dark" or "light"
    model_source: str = setting("model/source", "")
    dtype: str = setting("model/dtype", "float32")  # Run > Precision

    def __post_init__(self) -> None:
        if self.theme not in THEMES:  # a stored name kvviz does not know: the default
            self.theme = DEFAULT_THEME
        if self.dtype not in DTYPE_BYTES:
            self.dtype = "float32"


def load_geometry(store: SettingsFile) -> QByteArray | None:
    """The saved window geometry (base64 text), if there is one (restoreGeometry checks the rest)."""
    value = store.value("window/geometry")
    if not isinstance(value, str):
        return None
    with contextlib.suppress(binascii.Error, ValueError):
        return QByteArray(base64.b64decode(value.encode("ascii"), validate=True))
    return None


def save_geometry(store: SettingsFile, geometry: QByteArray) -> None:
    store.setValue("window/geometry", base64.b64encode(bytes(geometry.data())).decode("ascii"))
    store.sync()
