"""The app's colours, in one place: a `Theme` per look (DARK, LIGHT), the current one, and the style sheet
generated from it. In both, amber = K/V computed this step (the run without the cache), teal = K/V reused
from the cache (the run with it), pink = what speculative decoding drafted.

Views take their colours from the theme they are given (`set_theme(theme)`, the current one when they
are made); `stylesheet(theme)` fills resources/styles/kvviz.qss's `{field}` placeholders with a theme's
colours. LIGHT's amber, teal and pending cells keep at least 3:1 contrast (WCAG) with its white background,
so they still read on a white slide and a bright projector.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache


@dataclass(frozen=True)
class Theme:
    """Every colour the views and the style sheet use, as "#RRGGBB"."""

    name: str  # "dark" or "light": the --theme value and the remembered setting
    # what the cells, curves and counts mean
    amber: str  # K/V computed in this step; the run without the cache
    teal: str  # K/V reused from the cache; the run with it
    pending: str  # a token exists but its K/V has not been computed yet
    empty: str  # the position does not exist yet
    grid_line: str  # between the grid's cells, and the colour-blind patterns on them
    alert: str  # errors, a broken cache, runs that part
    evicted: str  # K/V a window evicted from the cache
    shared: str  # a layer that keeps no K/V of its own (it reads an earlier layer's)
    state: str  # a linear-attention layer's fixed-size state
    drafted: str  # speculative decoding: a drafted token the target accepted (its K/V computed this step, kept)
    rolled_back: str  # a drafted token the target rejected: its K/V rolled back (drawn struck through, in foreground)
    # surfaces
    background: str  # the window, the plots, exported images and slides
    surface: str  # panels on the background: counter, lesson panel, menu and status bars, text areas
    field: str  # text fields, lists, spin boxes
    raised: str  # buttons, table headers, the chips of generated tokens
    pressed: str  # a pressed button
    menu: str  # drop-down menus and tooltips
    border: str  # panel and field borders
    border_strong: str  # button borders, scroll-bar handles
    chip: str  # a prompt token's chip
    chip_edge: str  # its edge
    amber_tint: str  # the banner's background, the primary button's
    alert_tint: str  # an alert banner's background, a chip where the runs part
    # text and lines
    foreground: str  # text
    muted: str  # secondary text, axes
    disabled: str  # a disabled button's text
    on_amber: str  # text on an amber fill (the newest token's chip)
    banner_text: str  # the banner's text on amber_tint
    frame: str  # lesson mode's outline around the view it points at
    cell_gap: float = 0.0  # the grid's gap between cells, as a share of a cell (0: a 1-pixel line)
    # other models' lines in the memory view (gpt2-xl, Llama-3-8B, Llama-3-70B, Mistral-7B, Falcon-7B, DeepSeek-V2,
    # DeepSeek-V2-Lite),
    # told apart from one another and from teal (this run's); each also has its dash, and its name in its colour
    series: tuple[str, ...] = ("#56B4E9", "#E8E8E8", "#F07AA8", "#B9A3FF", "#F0E442", "#FF7B5C", "#9BD770")


DARK = Theme(
    name="dark",
    amber="#F5A623", teal="#1FA6A0", pending="#68707E", empty="#262A33", grid_line="#14161B", alert="#FF6B5B",
    evicted="#CBB8FF", shared="#31363F", state="#5A7BD8", drafted="#E46FC0", rolled_back="#7A4F70",
    background="#1B1E24", surface="#20242B", field="#2A2F38", raised="#2E3440", pressed="#3A4150",
    menu="#252A32", border="#3C4350", border_strong="#454D5C", chip="#3A404C", chip_edge="#6A7282",
    amber_tint="#3A2A12", alert_tint="#3A1815",
    foreground="#E6E8EC", muted="#9AA1AD", disabled="#646B78", on_amber="#1B1E24", banner_text="#F5A623",
    frame="#FFFFFF",
)

LIGHT = Theme(
    name="light",
    amber="#C87400", teal="#129A93", pending="#8A919C", empty="#E6E9EE", grid_line="#FFFFFF", alert="#C62828",
    evicted="#4E3596", shared="#F4F5F7", state="#3B5BB5", drafted="#B8368A", rolled_back="#EDB8DC",
    background="#FFFFFF", surface="#F4F5F7", field="#FFFFFF", raised="#ECEEF2", pressed="#DCE0E6",
    menu="#FFFFFF", border="#C9CED6", border_strong="#A9B0BB", chip="#E6E9EE", chip_edge="#A9B0BB",
    amber_tint="#FFF1DC", alert_tint="#FDECEA",
    foreground="#1B1E24", muted="#5B6270", disabled="#9AA1AD", on_amber="#1B1E24", banner_text="#7A4600",
    frame="#1B1E24", cell_gap=0.18,  # white between mid-tone cells keeps a light slide light
    series=("#0072B2", "#3A3F48", "#C0306A", "#6A4FB3", "#7A6A00", "#C4410C", "#3F7F1F"),
)

THEMES = {theme.name: theme for theme in (DARK, LIGHT)}
DEFAULT = DARK.name
COLOUR_FIELDS = tuple(f.name for f in dataclasses.fields(Theme) if f.name != "name")

_current = DARK


def current() -> Theme:
    """The theme the app shows (and exports with) now."""
    return _current


def get(name: str) -> Theme:
    """The theme called `name`; ValueError for any other name."""
    try:
        return THEMES[name]
    except KeyError:
        raise ValueError(f"unknown theme {name!r}: choose {' or '.join(THEMES)}") from None


def set_current(name: str) -> Theme:
    """Make the theme called `name` the current one, and return it; ValueError for an unknown name."""
    global _current
    _current = get(name)
    return _current


@contextlib.contextmanager
def using(name: str | None) -> Iterator[Theme]:
    """The theme called `name` current inside the block (an export in a chosen theme), the previous one after.
    None keeps the current theme."""
    previous = _current
    chosen = set_current(name) if name is not None else previous
    try:
        yield chosen
    finally:
        set_current(previous.name)


def rgba(hex_colour: str, alpha: int = 255) -> tuple[int, int, int, int]:
    value = hex_colour.lstrip("#")
    return int(value[0:2], 16), int(value[2:4], 16), int(value[4:6], 16), alpha


PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")  # a style sheet's own braces are followed by a space or a line end


@cache
def _template() -> str:
    from kvviz.core.resources import resource_path

    return resource_path("styles", "kvviz.qss").read_text(encoding="utf-8")


@cache
def _icons_folder() -> str:
    from kvviz.core.resources import resource_path

    return resource_path("icons").as_posix()


def stylesheet(theme: Theme | None = None) -> str:
    """The app's style sheet (widgets, dialogs, menus, tables) in `theme`'s colours (default: the current one);
    its images (the spin boxes' arrows) from resources/icons."""
    fields = {**dataclasses.asdict(theme or _current), "icons": _icons_folder()}
    return PLACEHOLDER.sub(lambda match: str(fields[match.group(1)]), _template())
