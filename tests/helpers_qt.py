"""Qt test helpers shared by the window tests."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject
from PySide6.QtWidgets import QApplication


class LayoutRequests(QObject):
    """Counts the relayouts asked of the `watched` widgets while in a `with` block."""

    def __init__(self, watched) -> None:
        super().__init__()
        self.watched = {id(w) for w in watched}
        self.count = 0

    def __enter__(self) -> LayoutRequests:
        QApplication.instance().installEventFilter(self)
        return self

    def __exit__(self, *exc) -> None:
        QApplication.sendPostedEvents(None, QEvent.Type.LayoutRequest.value)
        QApplication.instance().removeEventFilter(self)

    def eventFilter(self, obj, event) -> bool:
        if event.type() == QEvent.Type.LayoutRequest and id(obj) in self.watched:
            self.count += 1
        return False
