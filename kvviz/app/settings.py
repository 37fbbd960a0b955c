"""What the app remembers (QSettings, INI format, per user), as typed dataclasses: each key, type,
default and range is written once, in a field.

Values are read as plain text from the INI file (`ini_file`: never through QSettings, which would
unpickle some), then parsed here. A value that does not parse is ignored (the default stays); a number
out of range is clamped to it. Writing goes through QSettings.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, TypeVar

from PySide6.QtCore import QByteArray, QSettings

from kvviz.app.ini_file import safe_values
from kvviz.app.theme import DEFAULT as DEFAULT_THEME
from kvviz.app.theme import THEMES
from kvviz.core.memory import DTYPE_BYTES

ORGANIZATION = "kvviz"
APPLICATION = "kvviz"

T = TypeVar("T", bound="TypedSettings")


def app_settings() -> QSettings:
    """The user's kvviz settings; tests redirect them with QSettings.setPath(IniFormat, UserScope, dir)."""
    return QSettings(QSettings.Format.IniFormat, QSettings.Scope.UserScope, ORGANIZATION, APPLICATION)


def setting(key: str, default: Any, low: float | None = None, high: float | None = None) -> Any:
    """A dataclass field stored under `key`, clamped to [low, high] when read."""
    return field(default=default, metadata={"key": key, "low": low, "high": high})


def _plain(value: str | list[str] | None) -> str | None:
    """A stored value as plain text, or None for anything else (lists, @ByteArray and other objects)."""
    if not isinstance(value, str):
        return None
    if value.startswith("@@"):  # QSettings doubles a string's leading "@"
        return value[1:]
    return None if value.startswith("@") else value


def _parse(text: str, kind: type, low: float | None, high: float | None) -> Any:
    """`text` as `kind`, clamped; raises ValueError when it does not parse."""
    if kind is bool:
        lowered = text.strip().lower()
        if lowered in ("true", "1", "yes", "on"):
            return True
        if lowered in ("false", "0", "no", "off"):
            return False
        raise ValueError(text)
    if kind is str:
        return text
    number = float(text) if kind is float else int(text.strip(), 10)
    if isinstance(number, float) and not math.isfinite(number):
        raise ValueError(text)
    if low is not None:
        number = max(kind(low), number)
    if high is not None:
        number = min(kind(high), number)
    return number


@dataclass
class TypedSettings:
    """Base of the settings dataclasses: `load` reads every field from QSettings' INI file as plain
    text (never unpickling anything), `save` writes them through QSettings."""

    @classmethod
    def load(cls: type[T], store: QSettings) -> T:
        stored = safe_values(store) or {}
        values = {}
        for f in dataclasses.fields(cls):
            meta = f.metadata
            text = _plain(stored.get(meta["key"]))
            if text is None:
                continue
            try:
                values[f.name] = _parse(text, type(f.default), meta["low"], meta["high"])
            except (TypeError, ValueError, OverflowError):
                continue  # the default stays
        return cls(**values)

    def save(self, store: QSettings) -> None:
        if safe_values(store) is None:
            return  # QSettings would unpickle what the file holds while it merges: write nothing
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
    compare: bool = setting("view/compare", False)  # compare mode; "break the cache" is never remembered
    zoom: float = setting("view/zoom", 1.0, 0.7, 2.3)
    theme: str = setting("view/theme", DEFAULT_THEME)  # "dark" or "light"
    model_source: str = setting("model/source", "")
    dtype: str = setting("model/dtype", "float32")  # Run > Precision

    def __post_init__(self) -> None:
        if self.theme not in THEMES:  # a stored name kvviz does not know: the default
            self.theme = DEFAULT_THEME
        if self.dtype not in DTYPE_BYTES:
            self.dtype = "float32"


def load_geometry(store: QSettings) -> QByteArray | None:
    """The saved window geometry, if it is a byte array (restoreGeometry checks the rest)."""
    value = (safe_values(store) or {}).get("window/geometry")
    if not isinstance(value, str) or not value.startswith("@ByteArray(") or not value.endswith(")"):
        return None
    return QByteArray(value[len("@ByteArray("):-1].encode("latin-1", errors="replace"))


def save_geometry(store: QSettings, geometry: QByteArray) -> None:
    if safe_values(store) is None:
        return
    store.setValue("window/geometry", geometry)
    store.sync()
