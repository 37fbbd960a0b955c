"""What the main window remembers between launches, restored when it opens and saved when it closes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from PySide6.QtGui import QAction
from PySide6.QtWidgets import QMainWindow

from kvviz.app import theme
from kvviz.app.settings import AppSettings, SettingsFile, load_geometry, save_geometry
from kvviz.app.window.presentation import Presentation, fit_to_screen

if TYPE_CHECKING:
    from kvviz.app.run.session import RunSession
    from kvviz.app.views.run_view import RunView
    from kvviz.app.window.controls import RunControls



def restore_window(window: QMainWindow, store: SettingsFile, settings: AppSettings, controls: RunControls,
                   actions: Mapping[str, QAction], presentation: Presentation, run_view: RunView,
                   prompt: str | None) -> None:
    """Set `window` as it was left: run settings (`prompt` unless None), view options, zoom, geometry."""
    controls.restore(settings, prompt)
    actions["colour_blind"].setChecked(settings.colour_blind)
    actions["scores"].setChecked(settings.scores)
    actions["compare"].setChecked(settings.compare)
    actions[f"theme_{theme.current().name}"].setChecked(True)
    presentation.set_zoom(settings.zoom)
    run_view.main_splitter.setSizes([430, 0, 520])
    run_view.bottom_splitter.setSizes([1000, 460])  # the counter's notes a line each at 1280 pixels
    geometry = load_geometry(store)
    if geometry is None or not window.restoreGeometry(geometry):  # the first launch fills the screen
        screen = window.screen().availableGeometry()  # (fit_to_screen takes the window manager's frame off)
        window.resize(screen.width(), screen.height())
        window.move(screen.topLeft())
    fit_to_screen(window)  # the geometry may come from a larger screen than this one


def save_window(window: QMainWindow, store: SettingsFile, settings: AppSettings, controls: RunControls | None,
                actions: Mapping[str, QAction], presentation: Presentation, session: RunSession) -> None:
    """Remember what `restore_window` sets, the model and its precision; `controls` None: the run settings
    are a lesson's, not remembered (the free app's were kept when it began)."""
    if controls is not None:
        controls.store(settings)
    settings.colour_blind = actions["colour_blind"].isChecked()
    settings.scores = actions["scores"].isChecked()
    settings.zoom = presentation.remembered_zoom
    settings.theme = presentation.theme.name
    if session.source is not None:
        settings.model_source = session.source
    settings.dtype = session.model_info.dtype if session.model_info else session.dtype
    settings.save(store)
    if not presentation.presenter:
        save_geometry(store, window.saveGeometry())
