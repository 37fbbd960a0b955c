"""JSON as every strict parser reads it: what kvviz prints with --json."""

from __future__ import annotations

import json
import math


def finite(value: object) -> object:
    """`value` with every NaN or infinite float (in dicts, lists, tuples) as None: JSON has no NaN."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    return value


def dumps(value: object, indent: int | None = None) -> str:
    """`json.dumps(value)`, with null for a number that is not finite (never the bare NaN strict parsers refuse)."""
    return json.dumps(finite(value), allow_nan=False, indent=indent)
