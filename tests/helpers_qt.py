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


def settle_layouts() -> None:
    """Run the layout passes Qt has posted until none is left (a layout that changes a size asks its parent
    for another pass): what a resize or a new font changes is in place afterwards."""
    for _ in range(4):
        QApplication.sendPostedEvents(None, QEvent.Type.LayoutRequest.value)
        QApplication.processEvents()


def geometries(widgets) -> list[tuple[int, int, int, int]]:
    """Where each widget is, relative to its window, and its size."""
    return [(*w.mapTo(w.window(), w.rect().topLeft()).toTuple(), w.width(), w.height()) for w in widgets]


def download_until_cancelled(window, total: int = 500 * 2**20):
    """A stand-in for `download_hub_model` that reports its first MiB of `total` bytes, then waits on the worker's
    cancel event (no polling) and reports again, which raises DownloadCancelled as a real download's next
    progress would."""

    def fake_download(name, progress=None, **_kwargs):
        progress(2**20, total)
        cancelled = window().session.controller.worker.cancel_download
        if not cancelled.wait(60):
            raise AssertionError("the download was not cancelled")
        progress(2 * 2**20, total)
        raise AssertionError("a cancelled download went on")

    return fake_download
