"""A checkpoint's transformers `config.json`, read once for every family (one line for a file that is no JSON
object)."""

from __future__ import annotations

import json
from pathlib import Path

from kvviz.core.errors import ModelLoadError


def read_config(path: Path) -> dict:
    """The JSON object in `path`, or a ModelLoadError naming the file."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ModelLoadError(f"{path}: not a readable JSON config ({exc.__class__.__name__})") from exc
    if not isinstance(raw, dict):
        raise ModelLoadError(f"{path}: the config is not a JSON object")
    return raw


def shown(value: object) -> str:
    """A config value as a message quotes it: JSON, at most 40 characters (a type name for others)."""
    text = json.dumps(value) if isinstance(value, (int, float, str, bool, dict, list)) or value is None \
        else type(value).__name__
    return text if len(text) <= 40 else text[:37] + "..."
