"""The window's modes as its controls drive them: one protocol (step, play, reset, export, show the controls'
state) that the single run (with compare mode) and serving (kvviz.app.window.serving_mode) both keep, so that the
window sends each key to the mode that is on, with no branch on which it is."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from PySide6.QtWidgets import QWidget

    from kvviz.app.run.session import RunSession
    from kvviz.app.views.status import StatusLine
    from kvviz.app.window.controls import RunControls


class Mode(Protocol):
    def step(self) -> None: ...

    def toggle_play(self, interval_ms: int) -> None: ...

    def reset(self) -> None: ...

    def export(self, status: StatusLine) -> None: ...

    def show_state(self) -> None: ...


class RunWindow(Protocol):
    """What the single run's mode uses of the window (kvviz.app.window.main_window.MainWindow)."""

    session: RunSession
    controls: RunControls
    export_targets: Callable[[], dict[str, QWidget]]
    redraw: Callable[[], None]

    def reset_run(self, replay_to: int = 0) -> None: ...


class RunMode:
    """The single run (and compare mode's lockstep) of the window's session."""

    def __init__(self, window: RunWindow) -> None:
        self._window = window

    def step(self) -> None:
        self._window.session.step()

    def toggle_play(self, interval_ms: int) -> None:
        self._window.session.toggle_play(interval_ms)

    def reset(self) -> None:
        self._window.reset_run()

    def export(self, status: StatusLine) -> None:
        from kvviz.app.export import export_from_window

        w = self._window
        export_from_window(w, w.session, status, w.export_targets, w.controls.prompt_edit.text(), w.redraw)

    def show_state(self) -> None:
        s = self._window.session
        self._window.controls.set_state(s.can_step, s.playing, s.can_reset)
