"""A veil over views whose content no longer matches what the lecturer asked for: a model loading, a run being
prepared. It says so in words ("Loading SmolLM2-135M…", "Preparing step 3…") until the new content arrives, so
that an old grid is never read under a new step's text."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, Qt, QTimer
from PySide6.QtWidgets import QLabel, QWidget

SHOW_AFTER_MS = 120  # a run that is ready sooner never flashes the veil


class StaleCover(QLabel):
    """Covers `covered` (its child, kept its size) while `say(text)` has text; `say(None)` lifts it."""

    def __init__(self, covered: QWidget) -> None:
        super().__init__(covered)
        self.setObjectName("staleCover")
        self.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.setWordWrap(True)
        self.setAttribute(Qt.WidgetAttribute.WA_TransparentForMouseEvents)  # the keys and clicks go on as ever
        self._text = ""
        self._timer = QTimer(self, singleShot=True, interval=SHOW_AFTER_MS, timeout=self._show_now)
        covered.installEventFilter(self)
        self.hide()

    @property
    def text_shown(self) -> str:
        """What the veil says now ("" when lifted)."""
        return self.text() if self.isVisible() else ""

    def say(self, text: str | None) -> None:
        if not text:
            self._timer.stop()
            self.hide()
            return
        self._text = text
        if self.isVisible():
            self.setText(text)
        elif not self._timer.isActive():
            self._timer.start()

    def _show_now(self) -> None:
        self.setText(self._text)
        self.setGeometry(self.parentWidget().rect())
        self.raise_()
        self.show()

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if event.type() == QEvent.Type.Resize and watched is self.parentWidget():
            self.setGeometry(self.parentWidget().rect())
        return False
