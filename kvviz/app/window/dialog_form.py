"""What the Run menu's dialogs share: a note over rows of settings, then OK and Cancel."""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtWidgets import QDialog, QDialogButtonBox, QFormLayout, QLabel, QSpinBox, QWidget


def settings_form(dialog: QDialog, note: str, rows: Sequence[tuple[str, QWidget] | QWidget]) -> QFormLayout:
    """Lay out `dialog`: `note` wrapped across its width, then each row (a label and its field, or a widget alone),
    then OK (accept) and Cancel (reject)."""
    label = QLabel(note)
    label.setWordWrap(True)
    label.setMinimumWidth(440)
    buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
    buttons.accepted.connect(dialog.accept)
    buttons.rejected.connect(dialog.reject)
    form = QFormLayout(dialog)
    form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.FieldsStayAtSizeHint)
    form.addRow(label)
    for row in rows:
        form.addRow(*row) if isinstance(row, tuple) else form.addRow(row)
    form.addRow(buttons)
    return form


def spin(low: int, high: int, value: int, special: str = "") -> QSpinBox:
    """A spin box from `low` to `high` at `value`; `special` is what it shows at `low`."""
    box = QSpinBox()
    box.setRange(low, high)
    if special:
        box.setSpecialValueText(special)
    box.setValue(value)
    return box
