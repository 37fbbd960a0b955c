"""How a token is written in the views: Qt-free, so that what a view knows of a run can be tested without Qt."""

from __future__ import annotations


def chip_text(label: str) -> str:
    """A token label with its whitespace made visible, for chips, ticks and tooltips."""
    if label == "":
        return "\u2205"
    return label.replace(" ", "\u00b7").replace("\n", "\u21b5").replace("\t", "\u21e5").replace("\r", "\u240d")
