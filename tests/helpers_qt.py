"""Qt test helpers shared by the window tests."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, QPointF
from PySide6.QtGui import QImage, QPainter
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


def drawn_left_labels(plot_widget) -> list[tuple[str, float, float]]:
    """A cell plot's left-axis labels as pyqtgraph draws them: (text, top, bottom) in the viewport's pixels."""
    axis = plot_widget.getPlotItem().getAxis("left")
    image = QImage(max(1, int(axis.width())), max(1, int(axis.height())), QImage.Format.Format_ARGB32)
    painter = QPainter(image)
    painter.setFont(axis.style["tickFont"])  # as AxisItem.paint does
    _axis_spec, _tick_specs, text_specs = axis.generateDrawSpecs(painter)
    painter.end()
    labels = []
    for rect, _flags, text in text_specs:
        top, bottom = (plot_widget.mapFromScene(axis.mapToScene(QPointF(0, y))).y()
                       for y in (rect.top(), rect.bottom()))
        labels.append((text, top, bottom))
    return sorted(labels, key=lambda label: label[1])
