"""The command line's argument types: each turns one value into what a command takes, or into one line
saying what is wrong with it."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from kvviz.core.errors import KvvizError
from kvviz.core.files import user_path
from kvviz.core.records import MAX_PROMPT_CHARACTERS

TEMPERATURES = (0.01, 100.0)  # besides 0 (greedy); below 0.01 the softmax of a float32 model overflows


def _shown(text: str) -> str:
    """`text` quoted for a message, cut short when long (a 5,000-digit number, say)."""
    return repr(text if len(text) <= 40 else text[:30] + "...")


def whole_number(low: int = 1, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: a whole number from `low` to `high` (no upper bound if None)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{_shown(text)} is not a whole number") from None
        if value < low:
            raise argparse.ArgumentTypeError(
                f"must be a positive integer, got {value}" if low == 1 else f"must be at least {low:,}, got {value}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"must be at most {high:,}, got {_shown(text)}")
        return value

    parse.__name__ = "whole number"
    return parse


positive_int = whole_number(1)


def window_size(text: str) -> tuple[int, int]:
    """'1920x1080' -> (1920, 1080)."""
    width, _, height = text.lower().partition("x")
    try:
        size = (int(width), int(height))
    except ValueError:
        raise argparse.ArgumentTypeError(f"give the size as WIDTHxHEIGHT, e.g. 1920x1080, got {_shown(text)}") from None
    if not all(200 <= side <= 8192 for side in size):
        raise argparse.ArgumentTypeError(f"each side must be 200 to 8192 pixels, got {_shown(text)}")
    return size


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{_shown(text)} is not a number") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be 0 or a positive number, got {_shown(text)}")
    return value


MAX_FPS = 60.0  # kvviz.app.export.animation's bounds, for an animation's --fps and --hold-last
MAX_HOLD = 60.0


def frames_per_second(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{_shown(text)} is not a number") from None
    if not 0 < value <= MAX_FPS:  # NaN too
        raise argparse.ArgumentTypeError(f"must be more than 0 and at most {MAX_FPS:g}, got {_shown(text)}")
    return value


def hold_seconds(text: str) -> float:
    value = non_negative_float(text)
    if value > MAX_HOLD:
        raise argparse.ArgumentTypeError(f"must be 0 to {MAX_HOLD:g} seconds, got {_shown(text)}")
    return value


def step_range(text: str) -> tuple[int, int]:
    """'3-9' -> (3, 9): steps A to B, counted from 1, A at most B."""
    first, dash, last = text.strip().partition("-")
    if not dash or not (first.strip().isdigit() and last.strip().isdigit()) or len(text) > 20:
        raise argparse.ArgumentTypeError(f"give the steps as A-B, e.g. 1-9, got {_shown(text)}")
    a, b = int(first), int(last)
    if a < 1:
        raise argparse.ArgumentTypeError(f"steps count from 1, got {_shown(text)}")
    if a > b:
        raise argparse.ArgumentTypeError(f"{_shown(text)} runs backwards; give A-B with A at most B")
    return a, b


def temperature(text: str) -> float:
    value = non_negative_float(text)
    low, high = TEMPERATURES
    if value != 0 and not low <= value <= high:
        raise argparse.ArgumentTypeError(f"must be 0 (greedy) or from {low:g} to {high:g}, got {_shown(text)}")
    return value


def prompt_text(text: str) -> str:
    """The prompt as given, unless it holds bytes that are not UTF-8 (they reach Python as surrogates) or is
    longer than the app's prompt field takes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        byte = ord(text[exc.start]) - 0xDC00
        detail = f"byte 0x{byte:02x}" if 0x80 <= byte <= 0xFF else f"character {exc.start}"
        raise argparse.ArgumentTypeError(f"not valid UTF-8 text ({detail})") from None
    if len(text) > MAX_PROMPT_CHARACTERS:
        raise argparse.ArgumentTypeError(f"{len(text):,} characters; a prompt is at most {MAX_PROMPT_CHARACTERS:,}")
    return text


def _no_nul(text: str) -> str:
    if "\0" in text:
        raise argparse.ArgumentTypeError("a path cannot hold a NUL character")
    return text


def path_text(text: str) -> Path:
    """An argparse type for a path that must be named: not empty (that would mean the current folder); `~` and
    `~user` expanded, as a shell would."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty; name a folder or file")
    try:
        return user_path(_no_nul(text))
    except KvvizError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
