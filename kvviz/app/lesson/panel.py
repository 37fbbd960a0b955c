"""Lesson mode's column beside the views (or strip above them): the step's title and text, its question and
the measured answer, the lecturer's notes (the frame around a view is frame.py's)."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, QRect, Qt, Signal
from PySide6.QtGui import (
    QFont,
    QFontMetrics,
    QResizeEvent,
    QShowEvent,
)
from PySide6.QtWidgets import QBoxLayout, QFrame, QGridLayout, QHBoxLayout, QLabel, QSizePolicy, QSpacerItem, QWidget

from kvviz.app import theme as themes
from kvviz.app.lesson.guess_edit import GuessEdit
from kvviz.app.lesson.notes import LessonNotes
from kvviz.app.lesson.sizing import STRIP_FONT, column_width, fits_beside
from kvviz.app.lesson.step_text import answer_line, keep_together, step_position
from kvviz.app.theme import Theme
from kvviz.lessons.lesson import LessonStep

TEXT_LEAST_POINTS = 10.0  # the column's text shrinks to fit its height down to this (at zoom 1), no further
QWIDGETSIZE_MAX = (1 << 24) - 1


class LessonPanel(QFrame):
    """The lesson step on screen, big enough for the back row: "step 2 of 5", the title, the text; for a
    question, the question, a field for the audience's guess and, once measured, a line with the guess and
    the answer ("you said 80 \u00b7 measured 87") and the key that goes on; the step's notes, for the lecturer:
    small, and hidden until shown (the "lesson_notes" action, N, or the notes button; in presenter mode they
    show in a window of their own, off the projected one). Nothing it shows before the reveal may give the answer away.

    A column beside the views, so that the grid and the chart keep their height on a 720-line screen;
    its width follows the zoom, at most 30% of the window. A window too narrow to keep the views
    readable beside it (1024x768) gets a strip above them instead (`placed`), in the place of the run
    controls, which lesson mode then hides.

    Signals: `guess_entered` (Enter in the guess field), `guess_edited(str)`, `placed(bool)`.
    """

    guess_entered = Signal()
    guess_edited = Signal(str)
    placed = Signal(bool)  # True: a column beside the views; False: a strip above them

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("lessonPanel")
        self.set_theme(themes.current())
        self._font_scale = 1.0
        self._fitting = False  # see _fit_text
        self._measured: str | None = None
        self._measuring = False
        self._has_question = False
        self._last = False  # the lesson's last slide: no "next" hint
        self._precision = ""  # shown in a strip, where the run controls (and their precision) are hidden
        self._step_position = ""
        self._watched_window: QWidget | None = None
        self._columns_beside = 0  # pixels other columns beside the views take (the memory view)
        self._above: tuple[QBoxLayout, int] | None = None  # where the strip goes: (layout, index)
        self._beside: QBoxLayout | None = None  # where the column goes: at its end
        self._spacer = QSpacerItem(0, 0, QSizePolicy.Policy.Minimum, QSizePolicy.Policy.Expanding)
        self._strip_top = QHBoxLayout()  # the strip's first line: title, notes, step number
        self._strip_question = QHBoxLayout()  # and its last: question, guess, answer
        for row in (self._strip_top, self._strip_question):
            row.setSpacing(12)
        self.beside = True

        self.title = QLabel()
        self.title.setWordWrap(True)
        self.position = QLabel()
        self.position.setObjectName("muted")
        self.lecturer_notes = LessonNotes()  # shown, hidden, detached in presenter mode: see LessonNotes
        self.notes_button = self.lecturer_notes.button
        self.text = QLabel()
        self.text.setWordWrap(True)
        self.question = QLabel()
        self.question.setWordWrap(True)
        self.guess_label = QLabel("your guess")
        self.guess_label.setObjectName("muted")
        self.guess_edit = GuessEdit()
        self.guess_edit.returnPressed.connect(self.guess_entered)
        self.guess_edit.textEdited.connect(self._on_guess_edited)
        self.guess_label.setBuddy(self.guess_edit)
        self.answer = QLabel()
        self.answer.setObjectName("answer")
        self.hint = QLabel()  # after the reveal: the key that goes on
        self.hint.setObjectName("muted")
        self.notes = self.lecturer_notes.label

        self.grid = QGridLayout(self)
        self.grid.setHorizontalSpacing(10)
        self._arrange(True)

    # ----- what it shows -----
    def show_step(self, step: LessonStep, number: int, count: int, revealed: bool, guess: str = "") -> None:
        """Show `step`, number `number` of `count`; its question without the answer yet (set_answer adds it)."""
        self.title.setText(keep_together(step.title))
        self._step_position = step_position(number, count)
        self._show_position()
        self.text.setText(keep_together(step.text))
        self.question.setText(keep_together(step.question_text))
        self._has_question = bool(step.question)
        self._last = number == count
        self.question.setVisible(self._has_question)
        self.guess_edit.setText(guess)
        self._measured, self._measuring = None, revealed
        self._show_answer()
        self.lecturer_notes.set_text(keep_together(step.notes))
        self._fit_text()

    def set_answer(self, measured: str | None) -> None:
        """The measured answer (format_answer's text), shown with the guess; None: not measured."""
        self._measured, self._measuring = measured, False
        self._show_answer()

    def answer_text(self) -> str:
        return self.answer.text()

    def guess(self) -> str:
        return self.guess_edit.text().strip()

    def focus_guess(self) -> None:
        """Keyboard focus in the guess field (a question before its answer): typed digits go in."""
        if self.guess_edit.isVisibleTo(self):
            self.guess_edit.setFocus(Qt.FocusReason.OtherFocusReason)
            self.guess_edit.end(False)

    def set_precision(self, dtype: str) -> None:
        """The loaded model's precision, said in the strip's first line (the run controls that say it are
        hidden while the panel is a strip)."""
        self._precision = dtype
        self._show_position()

    def _show_position(self) -> None:
        precision = f" \u00b7 {self._precision}" if self._precision and not self.beside else ""
        self.position.setText(self._step_position + precision)

    def _on_guess_edited(self, text: str) -> None:
        self.guess_edited.emit(text.strip())
        self._show_answer()

    def _show_answer(self) -> None:
        measured = self._measured is not None
        self.answer.setObjectName("answer" if measured else "muted")
        self.answer.setText(answer_line(self.guess(), self._measured, self._measuring))
        self.answer.setFont(self._font(14.0, bold=True) if measured else self._font(11.0))
        self.answer.setVisible(self._has_question)
        asking = self._has_question and not measured
        had_focus = self.guess_edit.hasFocus()
        self.guess_label.setVisible(asking)
        self.guess_edit.setVisible(asking)
        self._fit_text()
        if had_focus and not asking:
            self.setFocus(Qt.FocusReason.OtherFocusReason)  # not onto the next widget in the chain: the window's
        self.hint.setText("Page Down: next" if measured and not self._last else "")
        self.hint.setVisible(measured and not self._last)
        self.answer.style().unpolish(self.answer)
        self.answer.style().polish(self.answer)

    # ----- where it goes -----
    def set_places(self, above: QBoxLayout, index: int, beside: QBoxLayout) -> None:
        """Where the panel may go: a strip in `above` at `index`, or a column at the end of `beside`
        (where it is now)."""
        self._above, self._beside = (above, index), beside
        self._fit()

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        window = self.window()
        if window is not self and window is not self._watched_window:
            window.installEventFilter(self)
            self._watched_window = window
        self._fit()

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if event.type() == QEvent.Type.Resize and self.isVisible():
            self._fit()
        return False

    def set_columns_beside(self, width: int) -> None:
        """Other columns beside the views take `width` pixels (the memory view): the views keep their width
        beside them and the lesson's column too, or the lesson goes above them."""
        if width != self._columns_beside:
            self._columns_beside = width
            self._fit()

    def _fit(self) -> None:
        """A column beside the views when they keep the width they need beside it, else a strip above them."""
        window_width = self.window().width() if self.window() is not self else 0
        width = column_width(self._font_scale, window_width)
        beside = fits_beside(window_width, width, self._columns_beside, self._font_scale)
        if beside != self.beside and self._above is not None and self._beside is not None:
            above, index = self._above
            (above if self.beside is False else self._beside).removeWidget(self)
            if beside:
                self._beside.addWidget(self)
            else:
                above.insertWidget(index, self)
            self.beside = beside
            self._arrange(beside)
            self._show_position()
            self.placed.emit(beside)
        if beside:
            self.setFixedWidth(max(width, self.grid.minimumSize().width()))  # at a small zoom, its widest row
        else:
            self.setMinimumWidth(0)
            self.setMaximumWidth(QWIDGETSIZE_MAX)

    def _arrange(self, beside: bool) -> None:
        """A column: step number, title, text, question, guess, answer, and the notes at the bottom; or a
        strip: title, notes and step number on one line, the text, then the question with the guess and the
        answer on its right."""
        grid = self.grid
        for widget in self._widgets():
            for layout in (grid, self._strip_top, self._strip_question):
                layout.removeWidget(widget)
        for item in (self._spacer, self._strip_top, self._strip_question):
            grid.removeItem(item)
        for index in range(9):
            grid.setRowStretch(index, 0)
            grid.setColumnStretch(index, 0)
        if beside:
            places = {self.position: (0, 0, 1, 2), self.notes_button: (0, 2, 1, 1), self.title: (1, 0, 1, 3),
                      self.text: (2, 0, 1, 3), self.question: (3, 0, 1, 3), self.guess_label: (4, 0, 1, 1),
                      self.guess_edit: (4, 1, 1, 1), self.answer: (5, 0, 1, 3), self.hint: (6, 0, 1, 3),
                      self.notes: (8, 0, 1, 3)}
            for widget, (row, column, rows, columns) in places.items():
                grid.addWidget(widget, row, column, rows, columns)
            grid.addItem(self._spacer, 7, 0, 1, 3)
            grid.setRowStretch(7, 1)
            grid.setColumnStretch(2, 1)
            grid.setContentsMargins(14, 8, 12, 10)
        else:
            for widget, stretch in ((self.title, 0), (self.notes, 1), (self.position, 0), (self.notes_button, 0)):
                self._strip_top.addWidget(widget, stretch)
            for widget, stretch in ((self.question, 1), (self.guess_label, 0), (self.guess_edit, 0), (self.answer, 0),
                                    (self.hint, 0)):
                self._strip_question.addWidget(widget, stretch)
            grid.addLayout(self._strip_top, 0, 0)
            grid.addWidget(self.text, 1, 0)
            grid.addLayout(self._strip_question, 2, 0)
            grid.setContentsMargins(12, 4, 10, 4)
        grid.setVerticalSpacing(8 if beside else 3)
        for label in (self.title, self.position, self.answer):
            label.setWordWrap(beside or label is not self.position)  # a strip's title and answer wrap at a large zoom
        self._apply_fonts()

    def _widgets(self) -> tuple[QWidget, ...]:
        return (self.position, self.notes_button, self.title, self.text, self.question, self.guess_label,
                self.guess_edit, self.answer, self.hint, self.notes)

    # ----- theme and zoom -----
    def set_theme(self, theme: Theme) -> None:
        self.setStyleSheet(
            f"QFrame#lessonPanel {{ background: {theme.surface}; border: 1px solid {theme.border}; "
            f"border-left: 4px solid {theme.foreground}; border-radius: 6px; }}"
            " QFrame#lessonPanel QLabel { background: transparent; border: none; }"
            f" QFrame#lessonPanel QLabel#muted {{ color: {theme.muted}; }}"
            f" QFrame#lessonPanel QLabel#answer {{ background: {theme.raised}; border-radius: 4px; padding: 1px 8px; }}"
            " QFrame#lessonPanel QToolButton { padding: 1px 6px; }")

    def set_font_scale(self, scale: float) -> None:
        self._font_scale = scale
        self._apply_fonts()
        self._fit()

    def _font(self, points: float, bold: bool = False) -> QFont:
        font = QFont(self.font())
        font.setPointSizeF(points * self._font_scale * (1.0 if self.beside else STRIP_FONT))
        font.setBold(bold)
        return font

    def _apply_fonts(self) -> None:
        self.title.setFont(self._font(18.0, bold=True))
        self.text.setFont(self._font(15.0))
        self.question.setFont(self._font(14.0, bold=True))
        for widget in (self.guess_label, self.guess_edit):
            widget.setFont(self._font(14.0))
        for widget in (self.position, self.notes, self.notes_button):
            widget.setFont(self._font(9.5))
        self.hint.setFont(self._font(11.0))
        self.guess_edit.setFixedWidth(self.guess_edit.fontMetrics().horizontalAdvance("0000000") + 16)
        self._show_answer()  # (it sets the answer's font, and fits the text)

    def _fit_text(self) -> None:
        """The column's text in the largest font, from 15 points down to TEXT_LEAST_POINTS, with which all the
        column says fits its height: at 720p a long step (the paging lesson's first) was cut at the bottom. The
        sizes are tried on the text's metrics, and the font is set once, only when it changes."""
        if not self.beside or self.height() <= 0 or self._fitting or not self.text.text():
            return
        self._fitting = True
        try:
            width = max(1, self.text.width())
            others = self.grid.totalHeightForWidth(self.width()) - self.text.heightForWidth(width)
            flags = int(Qt.TextFlag.TextWordWrap)
            size = 15.0
            while True:
                font = self._font(size)
                needed = QFontMetrics(font).boundingRect(QRect(0, 0, width, 100_000), flags, self.text.text())
                if others + needed.height() <= self.height() or size <= TEXT_LEAST_POINTS:
                    break
                size -= 0.5
            if font != self.text.font():
                self.text.setFont(font)
        finally:
            self._fitting = False

    def event(self, event: QEvent) -> bool:
        handled = super().event(event)
        if event.type() == QEvent.Type.LayoutRequest:  # anything shown, hidden or reworded: fit the text again
            self._fit_text()
        return handled

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._fit_text()
