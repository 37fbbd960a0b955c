"""The export dialog's animation rows (steps, speed, hold) and the progress dialog an animation is written under."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import QDoubleSpinBox, QFormLayout, QHBoxLayout, QLabel, QProgressDialog, QSpinBox, QWidget

from kvviz.app.export.animation import (
    MAX_FPS,
    MAX_HOLD,
    AnimationCancelled,
    AnimationSource,
    AnimationSpec,
    write_animation,
)


def _seconds_box(low: float, high: float, suffix: str) -> QDoubleSpinBox:
    box = QDoubleSpinBox()
    box.setRange(low, high)
    box.setDecimals(1)
    box.setSingleStep(0.5)
    box.setSuffix(suffix)
    return box


class AnimationRows(QObject):
    """Steps `first` to `last` of the run so far (the whole run at first; the two boxes keep first <= last),
    frames a second and the last frame's hold, as three rows of a form, shown only for an animation."""

    changed = Signal()

    def __init__(self, steps: int, fps: float, hold: float, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.steps = max(1, steps)
        self.first_box, self.last_box = QSpinBox(), QSpinBox()
        for box, value in ((self.first_box, 1), (self.last_box, self.steps)):
            box.setRange(1, self.steps)
            box.setValue(value)
            box.valueChanged.connect(self._on_steps_changed)
        self.fps_box = _seconds_box(0.1, MAX_FPS, " frames a second")
        self.fps_box.setValue(fps)
        self.hold_box = _seconds_box(0.0, MAX_HOLD, " s longer")
        self.hold_box.setValue(hold)
        for box in (self.fps_box, self.hold_box):
            box.valueChanged.connect(self.changed)
        self._form: QFormLayout | None = None
        self._rows: list[int] = []

    def add_to(self, form: QFormLayout) -> None:
        steps_row = QHBoxLayout()
        steps_row.addWidget(self.first_box)
        steps_row.addWidget(QLabel("to"))
        steps_row.addWidget(self.last_box)
        steps_row.addWidget(QLabel(f"of {self.steps} (steps count forward passes)"), 1)
        self._form = form
        for text, buddy, field in (("S&teps:", self.first_box, steps_row), ("S&peed:", self.fps_box, self.fps_box),
                                   ("&Hold the last frame:", self.hold_box, self.hold_box)):
            label = QLabel(text)
            label.setBuddy(buddy)
            self._rows.append(form.rowCount())
            form.addRow(label, field)

    def set_shown(self, shown: bool) -> None:
        for row in self._rows:
            self._form.setRowVisible(row, shown)

    def spec(self, width: int, caption: bool) -> AnimationSpec:
        return AnimationSpec(self.first_box.value(), self.last_box.value(), self.fps_box.value(),
                             self.hold_box.value(), width, caption)

    def _on_steps_changed(self, _value: int) -> None:
        first, last = self.first_box.value(), self.last_box.value()
        if first > last:  # the box just moved pushes the other one along
            (self.last_box if self.sender() is self.first_box else self.first_box).setValue(
                first if self.sender() is self.first_box else last)
        self.changed.emit()


def write_with_progress(parent: QWidget, source: AnimationSource, target: str, path: Path, spec: AnimationSpec,
                        on_frame: Callable[[QProgressDialog, int, int], None] | None = None) -> bool:
    """Write the animation to `path` under a window-modal progress dialog; False when Cancel was pressed
    (nothing written). Raises ExportError, as `write_animation` does."""
    progress = QProgressDialog(f"Rendering {spec.frames} frames\u2026", "Cancel", 0, spec.frames, parent)
    progress.setWindowTitle("Export animation")
    progress.setWindowModality(Qt.WindowModality.WindowModal)
    progress.setMinimumDuration(0)
    progress.setAutoClose(False)
    progress.setValue(0)

    def report(done: int, total: int) -> None:
        progress.setValue(done)  # a modal progress dialog processes events: the window stays live
        if on_frame is not None:
            on_frame(progress, done, total)
        if progress.wasCanceled():
            raise AnimationCancelled

    try:
        write_animation(source, target, [path], spec, report)
    except AnimationCancelled:
        return False
    finally:
        progress.close()
        progress.deleteLater()
    return True
