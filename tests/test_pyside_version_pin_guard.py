"""The guard of pyproject's PySide6 version pin, not a test of kvviz: PySide6 6.12.0 on CPython 3.11
drops a reference to None on every void Qt call (QLabel.setText, QPainter.setPen, ...), until CPython
aborts with "none_dealloc: deallocating None". pyproject.toml excludes it; this test fails if it comes back."""

from __future__ import annotations

import sys


def test_pyside_pin_guard_void_qt_calls_keep_references_to_none(qtbot):
    from PySide6.QtWidgets import QLabel

    label = QLabel()
    qtbot.addWidget(label)
    before = sys.getrefcount(None)
    for _ in range(1000):
        label.setText("x")
    assert before - sys.getrefcount(None) < 100, "this PySide6 loses references to None; see pyproject.toml"
