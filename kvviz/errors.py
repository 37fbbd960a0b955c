"""kvviz's error types and the two questions every error path asks: its first line, and is it out of memory."""

from __future__ import annotations

import re

_ANSI_COLOUR = re.compile(r"\x1b\[[0-9;]*m")


class KvvizError(ValueError):
    """Bad input or an impossible request: the CLI prints its first line and exits with 2, the app shows it."""


class ModelLoadError(KvvizError):
    """A model source that cannot be used: one line that starts with the source as typed ("gpt2: ...")."""


def first_line(exc: BaseException) -> str:
    """An exception's message as one plain line (no terminal colour codes), or its type's name."""
    text = _ANSI_COLOUR.sub("", str(exc)).strip()
    return text.splitlines()[0].strip() if text else exc.__class__.__name__


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
