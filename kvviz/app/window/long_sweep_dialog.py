"""View > Long speed sweep (Shift+S): how far the long sweep goes, before it starts."""

from __future__ import annotations

from PySide6.QtWidgets import QComboBox, QDialog, QWidget

from kvviz.app.window.dialog_form import settings_form

FIRST_LENGTH = 64  # the sweep's lengths double from here
LONGEST_OFFERED = 1 << 17  # where the context is not known


def longest_lengths(context: int) -> list[int]:
    """The longest lengths offered: doubling from twice the first length to the context (the context itself
    last when it is no power of two); up to LONGEST_OFFERED for an unknown context (0)."""
    limit = context if context > 0 else LONGEST_OFFERED
    lengths, n = [], 2 * FIRST_LENGTH
    while n <= limit:
        lengths.append(n)
        n *= 2
    if context > 2 * FIRST_LENGTH and (not lengths or lengths[-1] != context):
        lengths.append(context)
    return lengths


class LongSweepDialog(QDialog):
    """Asks how long the long sweep's longest length is; `chosen()` gives it once accepted (None: as far as the
    command goes, the model's context or less)."""

    def __init__(self, model_name: str, context: int, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Long speed sweep")
        self.length_box = QComboBox()
        self.length_box.addItem("as the command chooses", None)
        for n in longest_lengths(context):
            self.length_box.addItem(f"{n:,} positions", n)
        settings_form(self, f"Time a cached token step of {model_name} with every kind of cache it runs (exact, "
                            f"int8, int4, fp8 and a window; MLA's naive and absorbed steps), at lengths doubling "
                            f"from {FIRST_LENGTH}, each beside what the bandwidth bound predicts. It runs in the "
                            f"background and stops while the run computes; long lengths take minutes.",
                      [("longest length", self.length_box)])

    def chosen(self) -> int | None:
        return self.length_box.currentData()
