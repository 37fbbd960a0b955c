"""kvviz's error types and the two questions every error path asks: its first line, and is it out of memory."""

from __future__ import annotations

import re

_ANSI_COLOUR = re.compile(r"\x1b\[[0-9;]*m")
# C0 and C1 controls, DEL, and the Unicode marks that reorder or hide text (bidi overrides, zero-width joiners)
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]")


def visible(text: str, keep: str = "") -> str:
    """`text` safe for a terminal or a dialog: every control character but those in `keep` written as an escape
    (ESC as \\x1b, a newline as \\n), so that none can clear a screen, retitle a terminal, ring a bell or cut
    a line."""
    return _CONTROL.sub(lambda match: match.group() if match.group() in keep else
                        match.group().encode("unicode_escape").decode("ascii"), text)


def control_characters(text: str, allowed: str = "") -> str | None:
    """The first control character of `text` not in `allowed`, written visibly, or None."""
    for match in _CONTROL.finditer(text):
        if match.group() not in allowed:
            return visible(match.group())
    return None


class KvvizError(ValueError):
    """Bad input or an impossible request: the CLI prints its first line and exits with 2, the app shows it."""


class GenerationError(KvvizError):
    """A generation request that cannot run (empty budget, prompt too long for the context)."""


class ModelLoadError(KvvizError):
    """A model source that cannot be used: one line that starts with the source as typed ("gpt2: ...")."""


def first_line(exc: BaseException) -> str:
    """An exception's message as one plain line (no terminal colour codes, no control character), or its type's
    name."""
    text = _ANSI_COLOUR.sub("", str(exc)).strip()
    return visible(text.splitlines()[0].strip()) if text else exc.__class__.__name__


def is_out_of_memory(exc: BaseException) -> bool:
    """True for an allocation failure, whichever library raised it (MemoryError, torch's OutOfMemoryError...)."""
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    message = str(exc).lower()
    return any(words in message for words in ("out of memory", "not enough memory", "allocate memory"))


def as_sentence(text: str) -> str:
    """`text` ending with a full stop, its first word capitalised unless it is a name ("gpt2:", a path)."""
    text = text.strip()
    if not text:
        return text
    first_word = text.split(None, 1)[0]
    if first_word.isalpha() and first_word.islower():
        text = text[0].upper() + text[1:]
    return text if text.endswith((".", "!", "?")) else text + "."


class DownloadCancelled(Exception):
    """The user cancelled a model download (raised from a progress callback; not an error)."""
