"""The error of a lesson file that cannot be used (kvviz.lessons.lesson re-exports it)."""

from __future__ import annotations

from kvviz.core.errors import KvvizError


class LessonError(KvvizError):
    """A lesson file that cannot be used; the message names the file, the step and the key."""
