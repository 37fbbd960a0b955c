"""A checkpoint's transformers `config.json`, read once for every family (one line for a file that is no JSON
object)."""

from __future__ import annotations

import json
import math
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


MAX_SIZE = 10**9  # no size in a config kvviz runs comes near it (layers, heads, widths, positions, vocabulary)


def whole(raw: dict, path: Path, key: str, default: int, low: int = 0, high: int = MAX_SIZE) -> int:
    """`raw[key]` (or `default`) as a whole number from `low` to `high`, else a ModelLoadError naming the key: a
    null, a string, a fraction, a boolean or a size no machine holds (10**20, which would overflow inside torch)."""
    value = raw.get(key, default)
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ModelLoadError(f"{path}: {key}={shown(value)} is not a whole number from {low:,} to {high:,}")
    return value


def positive(raw: dict, path: Path, key: str, default: float) -> float:
    """`raw[key]` (or `default`) as a finite number above 0, else a ModelLoadError naming the key (a negative
    rope_theta or rms_norm_eps would turn every logit into NaN)."""
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ModelLoadError(f"{path}: {key}={shown(value)} is not a positive number")
    return float(value)
