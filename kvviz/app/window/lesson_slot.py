"""What the window asks of lesson mode, which the app attaches once the window is built (kvviz.app.assembly): the
window knows this much of it, and imports none of it."""

from __future__ import annotations

from typing import Protocol

from kvviz.app.theme import Theme


class LessonSlot(Protocol):
    """Lesson mode as the window's actions, keys and veil see it (kvviz.app.lesson.mode.LessonMode)."""

    active: bool  # a lesson is being walked: the run is the lesson's step, the free app is kept aside
    step_number: int  # the step shown, from 1

    def set_active(self, on: bool) -> None: ...

    def switch(self, name: str) -> None: ...

    def next(self) -> None: ...

    def back(self) -> None: ...

    def escape(self) -> bool: ...

    def set_theme(self, theme: Theme) -> None: ...


class _NoLesson:
    """The window before lesson mode is attached: the free app alone."""

    active = False
    step_number = 0

    def set_active(self, on: bool) -> None:
        pass

    def switch(self, name: str) -> None:
        pass

    def next(self) -> None:
        pass

    def back(self) -> None:
        pass

    def escape(self) -> bool:
        return False

    def set_theme(self, theme: Theme) -> None:
        pass


NO_LESSON: LessonSlot = _NoLesson()
