"""The banner above the views: what is loading, why a run stopped, what went wrong."""

from __future__ import annotations

from PySide6.QtWidgets import QLabel, QWidget


class Banner(QLabel):
    """One wrapped line of text, hidden when empty; `alert` colours it as an error (see kvviz.qss)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("banner")
        self.setWordWrap(True)
        self.hide()

    @property
    def alert(self) -> bool:
        return self.property("alert") == "true"

    def say(self, text: str, alert: bool = False) -> None:
        self.setProperty("alert", "true" if alert else "false")
        self.style().unpolish(self)
        self.style().polish(self)
        self.setText(text)
        self.setVisible(bool(text))
