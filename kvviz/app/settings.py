"""What the app remembers (QSettings, INI format, per user), as typed dataclasses: each key, type,
default and range is written once, in a field.

Values are read as plain text and parsed here, never by QSettings' own deserialiser (an INI value
such as `@Variant(...)` would otherwise be unpickled). A value that does not parse is ignored (the
default stays); a number out of range is clamped to it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, TypeVar

from PySide6.QtCore import QByteArray, QSettings

ORGANIZATION = "kvviz"
APPLICATION = "kvviz"

T = TypeVar("T", bound="TypedSettings")


def app_settings() -> QSettings:
    """The user's kvviz settings; tests redirect them with QSettings.setPath(IniFormat, UserScope, dir)."""
    return QSettings(QSettings.Format.IniFormat, QSettings.Scope.UserScope, ORGANIZATION, APPLICATION)


def setting(key: str, default: Any, low: float | None = None, high: float | None = None) -> Any:
    """A dataclass field stored under `key`, clamped to [low, high] when read."""
    return field(default=default, metadata={"key": key, "low": low, "high": high})


def _plain(raw: object) -> str | None:
    """The stored value as plain text, or None for anything else (lists, objects, byte arrays)."""
    if isinstance(raw, str):
        return raw
    if isinstance(raw, bool | int | float):
        return str(raw)
    return None


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
        if text.startswith("@"):  # QSettings' serialised objects (@Variant, @ByteArray...): never plain text
            raise ValueError(text)
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
    """Base of the settings dataclasses: `load` reads every field from QSettings, `save` writes them."""

    @classmethod
    def load(cls: type[T], store: QSettings) -> T:
        values = {}
        for f in dataclasses.fields(cls):
            meta = f.metadata
            text = _plain(store.value(meta["key"]))
            if text is None:
                continue
            kind = type(f.default)
            try:
                values[f.name] = _parse(text, kind, meta["low"], meta["high"])
            except (TypeError, ValueError, OverflowError):
                continue  # the default stays
        return cls(**values)

    def save(self, store: QSettings) -> None:
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
    zoom: float = setting("view/zoom", 1.0, 0.7, 2.3)
    model_source: str = setting("model/source", "")


def load_geometry(store: QSettings) -> QByteArray | None:
    """The saved window geometry, if it is a byte array (restoreGeometry checks the rest)."""
    value = store.value("window/geometry")
    return value if isinstance(value, QByteArray) else None


def save_geometry(store: QSettings, geometry: QByteArray) -> None:
    store.setValue("window/geometry", geometry)
    store.sync()
