"""Run > Sliding window: how many positions the cache keeps (0: every one) and how many attention sinks."""

from __future__ import annotations

from PySide6.QtWidgets import QDialog, QDialogButtonBox, QFormLayout, QLabel, QSpinBox, QWidget

MAX_POSITIONS = 4096


class WindowDialog(QDialog):
    """Asks for a window of W positions and S sinks; `chosen()` gives them once accepted."""

    def __init__(self, window: int, sinks: int, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Sliding window")
        note = QLabel("The cache keeps the last W positions (and the first S, as attention sinks) and evicts the "
                      "rest; every step attends to what it keeps, with the cache or without it. 0: keep every "
                      "position.")
        note.setWordWrap(True)
        self.window_spin = QSpinBox()
        self.window_spin.setRange(0, MAX_POSITIONS)
        self.window_spin.setSpecialValueText("off: every position")
        self.window_spin.setValue(window)
        self.sinks_spin = QSpinBox()
        self.sinks_spin.setRange(0, 64)
        self.sinks_spin.setValue(sinks)
        self.window_spin.valueChanged.connect(lambda w: self.sinks_spin.setEnabled(w > 0))
        self.sinks_spin.setEnabled(window > 0)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        form = QFormLayout(self)
        form.addRow(note)
        form.addRow("window W (positions)", self.window_spin)
        form.addRow("attention sinks S", self.sinks_spin)
        form.addRow(buttons)

    def chosen(self) -> tuple[int, int]:
        window = self.window_spin.value()
        return window, self.sinks_spin.value() if window else 0
