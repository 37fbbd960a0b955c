"""Where a lesson step points the audience: a frame around one view, or View > Memory or View > Speed opened."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, QTimer
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QWidget

from kvviz.app.lesson.frame import FocusFrame
from kvviz.app.theme import Theme
from kvviz.lessons.lesson import Lesson, LessonStep

if TYPE_CHECKING:
    from kvviz.app.run.session import RunSession
    from kvviz.app.window.speed_panel import SpeedPanel
    from kvviz.app.window.workspace import Workspace

SPEED_SWEEP_DELAY_MS = 4000


class LessonFocus(QObject):
    """Frames the view a step's `focus` names (the grid, the chart or the counter, or their compare-mode
    counterparts), and opens View > Memory or View > Speed for a memory or speed step, closing what it opened
    when the lesson moves on. The speed sweep of a lesson that needs it is measured in the background from
    SPEED_SWEEP_DELAY_MS after `start_sweep_soon`, while the earlier steps play."""

    def __init__(self, workspace: Workspace, central: QWidget, memory_action: Callable[[], QAction], speed: SpeedPanel,
                 show_speed: Callable[[], None], session: RunSession, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._workspace = workspace
        self._memory_action = memory_action  # View > Memory (the window's actions are made after the lesson's)
        self._speed = speed
        self._show_speed = show_speed  # the window's View > Speed, without taking the keys
        self._session = session
        self.frame = FocusFrame(workspace.run_view.parentWidget())
        self.memory_frame = FocusFrame(central)  # the memory view is a column beside the views
        self.lesson: Lesson | None = None
        self._memory_view_opened = False  # by a memory step, which closes it again when the lesson moves on
        self._speed_view_opened = False  # by a speed step, likewise
        self._attention_opened = False  # View > Attention, by a step answered from the attention weights, likewise
        self._sweep_timer = QTimer(self, singleShot=True, interval=SPEED_SWEEP_DELAY_MS, timeout=self.prepare_speed)

    @property
    def target(self) -> QWidget | None:
        """The view framed now (None: all of them)."""
        return self.memory_frame.target or self.frame.target

    def point_at(self, step: LessonStep) -> None:
        """Frame, or open, what `step` points at."""
        self._show_memory_view(step.focus == "memory")
        self._show_speed_view(step.focus == "speed")
        self.memory_frame.frame(self._workspace.memory_view if step.focus == "memory" else None)
        if step.serving or step.focus in ("all", "memory", "speed"):  # (serving: its page is the whole view)
            target = None
        elif step.compare:
            compare = self._workspace.compare_view
            target = {"grid": compare.grid_splitter, "chart": compare.time_plot, "counter": compare.counts}[step.focus]
        else:
            _, grid, chart, counter = self._workspace.run_view.views()
            target = {"grid": grid, "chart": chart, "counter": counter}[step.focus]
        self.frame.frame(target)

    def attention_for(self, step: LessonStep, checked: bool) -> bool:
        """Whether `step`'s run records attention and shows the attention view, View > Attention being `checked`:
        a step answered from the weights opens it; the next step closes it if that step opened it."""
        if step.needs_attention:
            self._attention_opened = self._attention_opened or not checked
            return True
        opened, self._attention_opened = self._attention_opened, False
        return checked and not opened

    def clear(self) -> None:
        """Nothing framed, and the views the lesson opened closed again; no sweep waiting to start (the attention
        view goes back to the free app's own, which give_back sets)."""
        self._attention_opened = False
        self.frame.frame(None)
        self.memory_frame.frame(None)
        self._show_memory_view(False)
        self._show_speed_view(False)
        self._sweep_timer.stop()

    def start_sweep_soon(self) -> None:
        self._sweep_timer.start()

    def set_theme(self, chosen: Theme) -> None:
        for frame in (self.frame, self.memory_frame):
            frame.set_theme(chosen)

    def _show_memory_view(self, on: bool) -> None:
        action = self._memory_action()
        if on and not action.isChecked():
            action.setChecked(True)
            self._memory_view_opened = True
        elif not on and self._memory_view_opened:
            self._memory_view_opened = False
            action.setChecked(False)

    def _show_speed_view(self, on: bool) -> None:
        speed = self._speed
        if on and not speed.isVisible():
            self.prepare_speed()
            self._show_speed()  # the clicker's keys go on driving the lesson
            self._speed_view_opened = speed.isVisible()
        elif not on and self._speed_view_opened:
            self._speed_view_opened = False
            speed.close()

    def prepare_speed(self) -> None:
        """Start the speed sweep of the loaded model in the background, once, when a step of the lesson shows
        or says the speed."""
        info = self._session.model_info
        if info is not None and self.lesson is not None and any(step.needs_speed for step in self.lesson.steps):
            self._speed.prepare(self._session.source or "", info.dtype, info.name)
