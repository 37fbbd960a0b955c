"""What the commands print: a result as JSON or as a table of figures."""

from __future__ import annotations

from kvviz.cli import json_output
from kvviz.core.errors import visible


def print_result(result: dict, as_json: bool, title: str) -> None:
    if as_json:
        print(json_output.dumps(result))
        return
    print(visible(title))
    for key, value in result.items():  # a value can hold a folder's name: shown, never obeyed by the terminal
        print(visible(f"  {key:<34}" + (f"{value:,.3f}" if isinstance(value, float) else f"{value}")))
