"""The attention view's choice of head."""

from __future__ import annotations

from PySide6.QtWidgets import QComboBox, QWidget

ALL_HEADS = -1


class HeadBox(QComboBox):
    """A run's heads to outline one of, after "all heads" (ALL_HEADS); each item's data is its head."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.addItem("all heads", ALL_HEADS)
        self.setToolTip("Outline one head and list its top positions")

    def set_heads(self, heads: int) -> bool:
        """Offer `heads` heads, with no signal; True when the items changed (and "all heads" is chosen)."""
        if self.count() == heads + 1:
            return False
        self.blockSignals(True)
        self.clear()
        self.addItem("all heads", ALL_HEADS)
        for head in range(heads):
            self.addItem(f"head {head}", head)
        self.blockSignals(False)
        return True
