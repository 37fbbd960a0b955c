"""The run controls' flow layout survives a layout query while the window's widgets are torn down (a
segmentation fault in CI: heightForWidth reached a QWidgetItem Qt had already deleted)."""

from __future__ import annotations

import shiboken6
from PySide6.QtWidgets import QLabel, QWidget

from kvviz.app.flow_layout import FlowLayout


def test_a_layout_query_skips_items_already_deleted(qtbot):
    host = QWidget()
    qtbot.addWidget(host)
    layout = FlowLayout(host, spacing=4)
    first, second = QLabel("first"), QLabel("second")
    layout.addWidget(first)
    layout.addWidget(second)
    full = layout.heightForWidth(40)  # narrow: one label a line
    shiboken6.delete(layout.itemAt(0))  # as Qt deletes an item of a widget destroyed with its window
    assert layout.heightForWidth(40) < full and layout.count() == 1
    assert layout.itemAt(0).widget() is second


def test_an_item_deleted_in_the_middle_of_a_query_ends_it_quietly(qtbot):
    """A widget's size hint can let Qt delete a later item while the layout goes through them."""
    host = QWidget()
    qtbot.addWidget(host)
    layout = FlowLayout(host)
    first, second = QLabel("first"), QLabel("second")
    layout.addWidget(first)
    layout.addWidget(second)
    doomed = layout.itemAt(1)
    real_hint = first.sizeHint
    first.sizeHint = lambda: (shiboken6.delete(doomed), real_hint())[1]
    assert layout.heightForWidth(40) >= 0  # no exception escapes into Qt's event loop
