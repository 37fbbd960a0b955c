"""View > Speed of a token step (S): the speed view in a window of its own, and the sweep behind it, which
runs in the background and keeps its result for the model and precision it measured."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import QDialog, QVBoxLayout, QWidget

from kvviz.app.run.speed_runner import SpeedSweeper
from kvviz.app.views.speed_view import SpeedView
from kvviz.measure.speed import SweepResult


class SpeedPanel(QDialog):
    """The speed view and its sweeper. `measure(source, dtype, model_name)` starts a sweep of that model (the
    one under way is cancelled); `prepare(...)` starts one only when neither a result nor a sweep of that
    model and precision exists yet; `show_for(...)` does that and shows the window. Closing the window leaves
    a sweep running (the lesson waits for it); its Cancel button, or a new model, stops it."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Speed of a token step")
        self.setWindowFlag(Qt.WindowType.WindowContextHelpButtonHint, False)
        self.view = SpeedView()
        self.sweeper = SpeedSweeper(self)
        self._target: tuple[str, str, str] = ("", "float32", "")  # source, dtype, model name
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.view)
        self.resize(760, 520)
        QShortcut(QKeySequence("S"), self, self.close)

        self.view.measure_requested.connect(lambda: self.measure(*self._target))
        self.view.cancel_requested.connect(self.sweeper.cancel)
        self.sweeper.progressed.connect(self.view.show_progress)
        self.sweeper.measured_part.connect(self.view.show_partial)
        self.sweeper.paused_changed.connect(self.view.show_paused)
        self.sweeper.finished.connect(self.view.show_result)
        self.sweeper.failed.connect(self.view.show_failure)
        self.sweeper.cancelled.connect(self.view.show_cancelled)

    @property
    def result(self) -> SweepResult | None:
        """The last sweep's result, when it measured the model and precision asked for last."""
        if self.sweeper.result is None or self.sweeper.measured != self._target[:2]:
            return None
        return self.sweeper.result

    def measure(self, source: str, dtype: str, model_name: str) -> None:
        self._target = (source, dtype, model_name)
        self.view.show_started(model_name)
        self.sweeper.start(source, dtype)

    def prepare(self, source: str, dtype: str, model_name: str) -> None:
        self._target = (source, dtype, model_name)
        if self.result is None and self.sweeper.running_for != (source, dtype):
            self.measure(source, dtype, model_name)

    def show_for(self, source: str, dtype: str, model_name: str, activate: bool = True) -> None:
        """Show the window (measuring first when needed); without `activate` the keys stay with the main window
        (a lesson's clicker keys go on driving the lesson)."""
        self.prepare(source, dtype, model_name)
        self.setAttribute(Qt.WidgetAttribute.WA_ShowWithoutActivating, not activate)
        self.setWindowFlag(Qt.WindowType.WindowDoesNotAcceptFocus, not activate)
        self.show()
        self.raise_()
        if activate:
            self.activateWindow()
        elif self.parentWidget() is not None:
            self.parentWidget().activateWindow()  # where a platform activates a shown window regardless

    def shut_down(self) -> None:
        """End a sweep under way (the window closes)."""
        self.sweeper.cancel()
