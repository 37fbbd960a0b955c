"""What the commands print: a result as JSON or as a table of figures."""

from __future__ import annotations

from kvviz.cli import json_output


def print_result(result: dict, as_json: bool, title: str) -> None:
    if as_json:
        print(json_output.dumps(result))
        return
    print(title)
    for key, value in result.items():
        print(f"  {key:<34}" + (f"{value:,.3f}" if isinstance(value, float) else f"{value}"))
