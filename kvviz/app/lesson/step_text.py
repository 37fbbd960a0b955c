"""The lesson panel's lines of text: a step's words kept whole, its "step k of n", and the answer line."""

from __future__ import annotations

import re

WORD_JOINER = "\u2060"  # no line break on either side
SLASH_IN_A_WORD = re.compile(r"(?<=\S)/(?=\S)")


def keep_together(text: str) -> str:
    """`text` with no line break after a slash inside a word: "K/V" never wraps as "K/" and "V", nor
    "N(N\u22121)/2" after its slash (a word joiner follows the slash; it has no width and draws nothing)."""
    return SLASH_IN_A_WORD.sub("/" + WORD_JOINER, text)


def step_position(number: int, count: int) -> str:
    """The step's place in the lesson: "step 2 of 5", and " \u00b7 the last" after it on the last step."""
    last = " \u00b7 the last" if number == count else ""
    return f"step {number} of {count}{last}"


def answer_line(guess: str, measured: str | None, measuring: bool) -> str:
    """What the answer line says: the guess and the measured answer, or that it is being (or can be) measured."""
    if measured is not None:
        return f"you said {guess} \u00b7 measured {measured}" if guess else f"measured {measured}"
    return "measuring\u2026" if measuring else "Enter or Page Down: measure"
