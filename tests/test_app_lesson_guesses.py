"""Predict, then reveal, by keyboard alone in every question of every built-in lesson (issue #36: the serving
lesson's guess field never got the keyboard): the typed guess is shown beside the measured answer."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

from kvviz.app.assembly import open_window
from kvviz.app.settings import app_settings
from kvviz.app.window.main_window import MainWindow
from kvviz.lessons.lesson import BUILTIN_LESSONS

DIGITS = {str(n): getattr(Qt.Key, f"Key_{n}") for n in range(10)}


def settle(qtbot, win: MainWindow) -> None:
    qtbot.waitUntil(lambda: win.lesson.ready and not win.scheduler.pending, timeout=60_000)


def cut_in_panel(panel) -> list[str]:
    """The lesson panel's texts that do not get the height their wrapped lines need, or end below it."""
    QApplication.processEvents()  # its layout, after the last change
    labels = {"title": panel.title, "text": panel.text, "question": panel.question, "answer": panel.answer,
              "hint": panel.hint}
    return [name for name, label in labels.items() if label.isVisible() and label.text() and (
        label.height() < label.heightForWidth(label.width()) - 1 or label.geometry().bottom() > panel.height())]


@pytest.mark.parametrize("name", list(BUILTIN_LESSONS))
def test_every_question_takes_a_typed_guess_and_shows_it_with_the_measured_answer(qtbot, app_model, name,
                                                                                   monkeypatch):
    """At 1280x720, a projector's, where the panel's texts must also fit whole at every slide."""
    from kvviz.app.window import main_window

    monkeypatch.setattr(main_window, "fit_to_screen", lambda _window: None)  # the offscreen screen is 800 wide
    win = open_window(app_model, "hello", settings=app_settings(), lesson=name)
    qtbot.addWidget(win)
    win.resize(1280, 690)
    win.show()
    win.activateWindow()  # as a lecturer's window is: the keyboard goes to it
    try:
        settle(qtbot, win)
        lesson, panel = win.lesson, win.lesson.panel
        asked = 0
        for slide in range(len(lesson.lesson.slides())):
            assert not cut_in_panel(panel), (name, slide, cut_in_panel(panel))
            if lesson.step.question and not lesson.revealed:
                asked += 1
                guess = str(10 + slide)
                qtbot.waitUntil(lambda: QApplication.focusWidget() is panel.guess_edit, timeout=10_000)
                for digit in guess:
                    qtbot.keyClick(QApplication.focusWidget(), DIGITS[digit])
                qtbot.keyClick(QApplication.focusWidget(), Qt.Key.Key_Return)
                settle(qtbot, win)
                qtbot.waitUntil(lambda: "measured" in panel.answer_text(), timeout=60_000)
                assert lesson.revealed and panel.answer_text().startswith(f"you said {guess} \u00b7 measured "), \
                    (name, slide, panel.answer_text())
                assert not cut_in_panel(panel), (name, slide, cut_in_panel(panel))
            elif slide < len(lesson.lesson.slides()) - 1:
                qtbot.keyClick(win, Qt.Key.Key_PageDown)
                settle(qtbot, win)
        assert asked == sum(1 for step in lesson.lesson.steps if step.question)
    finally:
        win.close()


def test_the_paging_lesson_started_from_the_help_menu_takes_the_guess_by_keyboard(qtbot, app_model):
    """The lecturer's path: the free app, Help > serving lesson, then digits and Enter at its first question."""
    win = open_window(app_model, "hello", settings=app_settings())
    qtbot.addWidget(win)
    win.show()
    win.activateWindow()
    try:
        qtbot.waitUntil(lambda: win.session.plan is not None, timeout=60_000)
        win.actions["lesson_paging"].trigger()
        settle(qtbot, win)
        lesson, panel = win.lesson, win.lesson.panel
        while not lesson.step.question:
            qtbot.keyClick(win, Qt.Key.Key_PageDown)
            settle(qtbot, win)
        qtbot.waitUntil(lambda: QApplication.focusWidget() is panel.guess_edit, timeout=10_000)
        for digit in "36":
            qtbot.keyClick(QApplication.focusWidget(), DIGITS[digit])
        qtbot.keyClick(QApplication.focusWidget(), Qt.Key.Key_Return)
        settle(qtbot, win)
        qtbot.waitUntil(lambda: "measured" in panel.answer_text(), timeout=60_000)
        assert panel.answer_text().startswith("you said 36 \u00b7 measured ")
    finally:
        win.close()
