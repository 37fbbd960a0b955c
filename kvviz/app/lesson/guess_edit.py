"""The field a lesson's question takes the audience's guess in."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QRegularExpression, Qt
from PySide6.QtGui import QKeyEvent, QRegularExpressionValidator
from PySide6.QtWidgets import QLineEdit, QWidget

GUESS_PATTERN = r"([0-9][0-9 ,.\x{2009}-]{0,39}x?)?"  # empty, 90, 6.8, 6.8x, 36,864; positions: 0-3,14,15
GUESS_CHARACTERS = "0123456789,.-x"  # what typing puts into the guess field; other keys reach the shortcuts
GUESS_EDIT_KEYS = (Qt.Key.Key_Backspace, Qt.Key.Key_Delete, Qt.Key.Key_Home, Qt.Key.Key_End, Qt.Key.Key_Return,
                   Qt.Key.Key_Enter)


class GuessEdit(QLineEdit):
    """The guess field: digits, separators and the editing keys go in; every other key (Space, letters, the
    lesson's arrows, Esc) goes on to the window's shortcuts, so a question's focused field swallows none."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setPlaceholderText("?")
        self.setAlignment(Qt.AlignmentFlag.AlignRight)
        self.setValidator(QRegularExpressionValidator(QRegularExpression(GUESS_PATTERN), self))
        self.setToolTip("The audience's guess (optional): type it, then Enter or Page Down measures")

    def event(self, event: QEvent) -> bool:
        if event.type() == QEvent.Type.ShortcutOverride and not self._takes(event):
            event.ignore()  # the shortcut, if any, fires
            return True
        return super().event(event)

    @staticmethod
    def _takes(event: QKeyEvent) -> bool:
        if event.modifiers() & (Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.MetaModifier):
            return True  # copy, paste, undo, select all: QLineEdit decides
        text = event.text()
        return event.key() in GUESS_EDIT_KEYS or (len(text) == 1 and text in GUESS_CHARACTERS)
