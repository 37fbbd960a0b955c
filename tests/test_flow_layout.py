"""The run controls' flow layout survives layout queries while the window's widgets are torn down (a
segmentation fault in CI: a query reached a QWidgetItem Qt had already freed)."""

from __future__ import annotations

import shiboken6
from PySide6.QtWidgets import QLabel, QWidget

from kvviz.app.views.flow_layout import FlowLayout


def two_labels(qtbot) -> tuple[FlowLayout, QLabel, QLabel]:
    host = QWidget()
    qtbot.addWidget(host)
    layout = FlowLayout(host, spacing=4)
    first, second = QLabel("first"), QLabel("second")
    layout.addWidget(first)
    layout.addWidget(second)
    return layout, first, second


def test_a_query_never_touches_an_item_qt_freed(qtbot):
    layout, first, second = two_labels(qtbot)
    full = layout.heightForWidth(40)  # narrow: one label a line
    shiboken6.delete(layout.itemAt(0))  # freed under the layout, as in a window's teardown
    assert layout.heightForWidth(40) == full  # the widgets are still there: laid out as before, no crash


def test_a_widget_destroyed_in_the_middle_of_a_query_is_skipped(qtbot):
    layout, first, second = two_labels(qtbot)
    one_line = layout.heightForWidth(1000)
    real_hint = first.sizeHint
    first.sizeHint = lambda: (shiboken6.delete(second), real_hint())[1]
    assert layout.heightForWidth(40) == one_line  # only `first` is left, on one line
