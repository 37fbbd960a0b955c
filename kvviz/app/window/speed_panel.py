"""View > Speed of a token step (S): the speed view in a window of its own, and the sweeps behind it (cached
against uncached; the long sweep of every kind of cache, Shift+S), which run in the background, one at a time,
and keep their results for the model and precision they measured."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import QDialog, QVBoxLayout, QWidget

from kvviz.app.run.speed_runner import SpeedSweeper
from kvviz.app.views.speed_view import SpeedView
from kvviz.app.window.long_sweep_dialog import LongSweepDialog
from kvviz.measure.speed import SweepResult

LONG_SIZE = (980, 720)  # pixels the window grows to for the long sweep, where the screen has room


class SpeedPanel(QDialog):
    """The speed view and its sweeper. `measure(source, dtype, model_name)` starts a sweep of that model (the
    one under way is cancelled); `prepare(...)` starts one only when neither a result nor a sweep of that
    model and precision exists yet; `show_for(...)` does that and shows the window. Closing the window leaves
    a sweep running (the lesson waits for it); its Cancel button, or a new model, stops it.

    The long sweep (`long_sweeper`) starts from the view's Long sweep button, Shift+S, or `ask_long()`, which
    asks for its longest length first (`measure_long(max_length)` starts it as asked). Starting either sweep
    cancels the other: two sweeps at once would time each other."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Speed of a token step")
        self.setWindowFlag(Qt.WindowType.WindowContextHelpButtonHint, False)
        self.view = SpeedView()
        self.sweeper = SpeedSweeper(self)
        self.long_sweeper = SpeedSweeper(self, long=True)
        self._target: tuple[str, str, str] = ("", "float32", "")  # source, dtype, model name
        self.context = 0  # the model's context: the longest length a long sweep is offered (0: not known)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.view)
        self.resize(760, 520)
        QShortcut(QKeySequence("S"), self, self.close)
        QShortcut(QKeySequence("Shift+S"), self, self.ask_long)

        self.view.measure_requested.connect(lambda: self.measure(*self._target))
        self.view.long_requested.connect(self.ask_long)
        self.view.cancel_requested.connect(self.cancel)
        view = self.view
        for sweeper, partial, result in ((self.sweeper, view.show_partial, view.show_result),
                                         (self.long_sweeper, view.show_long_partial, view.show_long_result)):
            sweeper.progressed.connect(view.show_progress)
            sweeper.measured_part.connect(partial)
            sweeper.paused_changed.connect(view.show_paused)
            sweeper.finished.connect(result)
            sweeper.failed.connect(view.show_failure)
            sweeper.cancelled.connect(view.show_cancelled)

    @property
    def result(self) -> SweepResult | None:
        """The last sweep's result, when it measured the model and precision asked for last."""
        if self.sweeper.result is None or self.sweeper.measured != self._target[:2]:
            return None
        return self.sweeper.result

    def measure(self, source: str, dtype: str, model_name: str) -> None:
        self._target = (source, dtype, model_name)
        self.long_sweeper.cancel()
        self.view.show_started(model_name)
        self.sweeper.start(source, dtype)

    def ask_long(self) -> None:
        """Ask for the long sweep's longest length, and start it (the window's model and precision)."""
        if self.long_sweeper.running:
            return
        dialog = LongSweepDialog(self._target[2] or "the model", self.context, self)
        if dialog.exec():
            self.measure_long(dialog.chosen())

    def measure_long(self, max_length: int | None = None) -> None:
        """The long sweep of the window's model and precision, up to `max_length` (None: the command's choice)."""
        source, dtype, model_name = self._target
        self.sweeper.cancel()
        self.view.show_long_started(model_name)
        self.long_sweeper.start(source, dtype, max_length)
        self._make_room()

    def _make_room(self) -> None:
        """The long sweep's chart says more (a legend, the crossover): the window grows to LONG_SIZE, within the
        screen."""
        screen = self.screen().availableGeometry()
        width = min(max(self.width(), LONG_SIZE[0]), screen.width() - 40)
        height = min(max(self.height(), LONG_SIZE[1]), screen.height() - 60)
        self.resize(max(width, self.minimumWidth()), max(height, self.minimumHeight()))

    def pause(self, on: bool) -> None:
        """Stop the sweep under way while the live run computes (`on`), and let it go on after."""
        self.sweeper.pause(on)
        self.long_sweeper.pause(on)

    def cancel(self) -> None:
        self.sweeper.cancel()
        self.long_sweeper.cancel()

    def prepare(self, source: str, dtype: str, model_name: str) -> None:
        self._target = (source, dtype, model_name)
        if self.result is None and self.sweeper.running_for != (source, dtype):
            self.measure(source, dtype, model_name)

    def show_for(self, source: str, dtype: str, model_name: str, activate: bool = True, long: bool = False) -> None:
        """Show the window (measuring first when needed); without `activate` the keys stay with the main window
        (a lesson's clicker keys go on driving the lesson). `long`: ask for the long sweep instead."""
        if long:
            self._target = (source, dtype, model_name)
        else:
            self.prepare(source, dtype, model_name)
        self.setAttribute(Qt.WidgetAttribute.WA_ShowWithoutActivating, not activate)
        self.setWindowFlag(Qt.WindowType.WindowDoesNotAcceptFocus, not activate)
        self.show()
        self.raise_()
        if activate:
            self.activateWindow()
        elif self.parentWidget() is not None:
            self.parentWidget().activateWindow()  # where a platform activates a shown window regardless
        if long:
            self.ask_long()

    def shut_down(self) -> None:
        """End a sweep under way (the window closes)."""
        self.cancel()
