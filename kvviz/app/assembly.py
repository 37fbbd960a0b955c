"""The app's window as it opens: the main window, with lesson mode attached to it. The window knows lesson mode
only as a slot (kvviz.app.window.lesson_slot); lesson mode knows the window it walks (LessonHost)."""

from __future__ import annotations

from kvviz.app.lesson.mode import LessonMode
from kvviz.app.lesson.panel import LessonPanel
from kvviz.app.settings import SettingsFile
from kvviz.app.window.main_window import MainWindow


def open_window(model: str | None = None, prompt: str | None = None, settings: SettingsFile | None = None,
                unattended: bool = False, lesson: str | None = None, theme_name: str | None = None) -> MainWindow:
    """The main window (see MainWindow for `model`, `prompt`, `settings`, `unattended` and `theme_name`) with lesson
    mode attached; `lesson`, a lesson file to start in lesson mode with ("" or "builtin": the built-in lesson; None:
    the free app, L opens the built-in lesson)."""
    window = MainWindow(model, prompt, settings=settings, unattended=unattended, theme_name=theme_name)
    attach_lesson_mode(window, lesson)
    return window


def attach_lesson_mode(window: MainWindow, source: str | None = None) -> LessonMode:
    """Lesson mode on `window`: its panel a column beside the views (zoomed with them, its notes in a window of
    their own in presenter mode, its precision the run's), its keys and Esc, and the lesson `source` opened."""
    panel = LessonPanel()
    panel.hide()
    window.workspace.set_side_panel(panel)
    window.presentation.add_view(panel)
    window.precision.show_in(panel.set_precision)
    # presenter mode: the notes hide, and N shows them in a window of their own, never on the projected one
    notes = panel.lecturer_notes
    window.presentation.presenter_changed.connect(lambda on: (notes.set_shown(False),
                                                              notes.set_detached(window if on else None)))
    mode = LessonMode(window, panel, source)
    window.lesson = mode
    window.workspace.focus_elsewhere = mode.take_focus
    if source is not None:
        mode.open(source)
    return mode
