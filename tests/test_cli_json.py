"""--json output parses in strict parsers: a number that is not finite is null, never a bare NaN."""

from __future__ import annotations

import json

from kvviz.cli import json_output as cli_json


def refuse(constant: str):
    raise ValueError(f"not JSON: {constant}")


def test_numbers_that_are_not_finite_are_null_at_any_depth():
    text = cli_json.dumps({"loss": float("nan"), "steps": [{"ms": float("inf")}, (1.5, -float("inf"))], "n": 3})
    assert json.loads(text, parse_constant=refuse) == {"loss": None, "steps": [{"ms": None}, [1.5, None]], "n": 3}
