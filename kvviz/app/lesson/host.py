"""What lesson mode uses of the window it walks through a lesson."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from PySide6.QtGui import QAction
from PySide6.QtWidgets import QWidget

if TYPE_CHECKING:
    from kvviz.app.run.session import RunSession
    from kvviz.app.settings import AppSettings
    from kvviz.app.window.controls import RunControls
    from kvviz.app.window.serving_mode import ServingMode
    from kvviz.app.window.speed_panel import SpeedPanel
    from kvviz.app.window.workspace import Workspace


class LessonHost(Protocol):
    """What lesson mode uses of the window it walks through a lesson (kvviz.app.window.main_window.MainWindow)."""

    session: RunSession
    controls: RunControls
    settings: AppSettings
    workspace: Workspace
    speed: SpeedPanel
    serving: ServingMode
    actions: dict[str, QAction]

    def centralWidget(self) -> QWidget: ...

    def load_model(self, source: str) -> None: ...

    def focus_grid(self) -> None: ...

    def show_speed(self, activate: bool = True) -> None: ...
