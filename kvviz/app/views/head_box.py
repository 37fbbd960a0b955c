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

    def set_heads(self, heads: int, group: int = 1) -> bool:
        """Offer `heads` query heads (`group` of them sharing each KV head), with no signal; True when the items
        changed (and "all heads" is chosen)."""
        names = [f"head {h}" if group == 1 else f"head {h} (kv{h // group})" for h in range(heads)]
        if [self.itemText(i) for i in range(1, self.count())] == names:
            return False
        self.blockSignals(True)
        self.clear()
        self.addItem("all heads", ALL_HEADS)
        for head, name in enumerate(names):
            self.addItem(name, head)
        self.blockSignals(False)
        return True
