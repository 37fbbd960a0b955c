"""Colours shared by every view: amber = computed this step, teal = reused from the cache."""

from __future__ import annotations

AMBER = "#F5A623"
TEAL = "#1FA6A0"
PENDING = "#5B6270"  # a token exists but its K/V has not been computed yet
EMPTY = "#262A33"  # the position does not exist yet
BACKGROUND = "#1B1E24"
FOREGROUND = "#E6E8EC"
MUTED = "#9AA1AD"
ALERT = "#FF6B5B"
GRID_LINE = "#14161B"


def rgba(hex_colour: str, alpha: int = 255) -> tuple[int, int, int, int]:
    value = hex_colour.lstrip("#")
    return int(value[0:2], 16), int(value[2:4], 16), int(value[4:6], 16), alpha


def _load_stylesheet() -> str:
    from kvviz.resources import resource_path

    return resource_path("styles", "kvviz.qss").read_text(encoding="utf-8")


STYLESHEET = _load_stylesheet()  # resources/styles/kvviz.qss: widgets, dialogs, menus, tables
