"""The command line: `kvviz` opens the app; `kvviz generate|compare|count|bench|export|lesson|memory|train`
work headless. `main` is in `commands`, which imports nothing heavy before the command is known."""

from kvviz.cli.commands import main

__all__ = ["main"]
