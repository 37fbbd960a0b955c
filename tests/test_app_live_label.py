"""LiveLabel: texts that change every redraw repaint the label and leave the layouts alone."""

from __future__ import annotations

from helpers_qt import LayoutRequests
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QApplication, QHBoxLayout, QLabel, QVBoxLayout, QWidget

from kvviz.app.views.live_label import LiveLabel


def _in_a_panel(qtbot, *labels, row: bool = False):
    panel = QWidget()
    layout = QHBoxLayout(panel) if row else QVBoxLayout(panel)
    for label in labels:
        layout.addWidget(label)
    layout.addStretch(1)
    qtbot.addWidget(panel)
    panel.resize(320, 200)
    panel.show()
    qtbot.waitExposed(panel)
    return panel


def test_a_longer_text_than_reserved_grows_the_label(qtbot):
    plain = QLabel("0123456789 0123456789")
    number = LiveLabel("1", rich=False)
    number.reserve("22")
    panel = _in_a_panel(qtbot, number, row=True)  # as wide as it asks, the rest stretch
    QApplication.sendPostedEvents()
    with LayoutRequests([panel]) as requests:
        number.setText("0123456789 0123456789")
    assert requests.count == 1
    qtbot.waitUntil(lambda: number.width() >= plain.sizeHint().width() - 2)


def test_it_paints_its_text_in_its_colour(qtbot):
    label = LiveLabel("", rich=False)
    label.setStyleSheet("color: #ff0000; background: #000000;")
    label.setAutoFillBackground(True)
    panel = _in_a_panel(qtbot, label)
    blank = label.grab().toImage()
    label.setText("\u2588\u2588\u2588 painted")
    image = label.grab().toImage()
    reds = [(x, y) for x in range(image.width()) for y in range(image.height())
            if QColor(image.pixel(x, y)).red() > 200 and QColor(image.pixel(x, y)).green() < 60]
    assert reds and blank != image and panel.isVisible()


def test_right_aligned_numbers_end_at_the_right_edge(qtbot):
    label = LiveLabel("1", rich=False)
    label.setAlignment(Qt.AlignmentFlag.AlignRight)
    label.setStyleSheet("color: #ffffff; background: #000000;")
    label.setAutoFillBackground(True)
    label.setFixedWidth(200)
    panel = _in_a_panel(qtbot, label)
    image = label.grab().toImage()
    lit = [x for x in range(image.width()) for y in range(image.height()) if QColor(image.pixel(x, y)).value() > 128]
    assert lit and min(lit) > 150 and panel.isVisible()  # a "1" drawn in the rightmost 50 of 200 pixels
