"""What the main window remembers between launches, restored when it opens and saved when it closes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvviz.app import theme
from kvviz.app.settings import load_geometry, save_geometry
from kvviz.app.window.presentation import fit_to_screen

if TYPE_CHECKING:
    from kvviz.app.window.main_window import MainWindow

DEFAULT_SIZE = (1600, 1000)  # the first launch's window, or the screen if it is smaller


def restore_window(window: MainWindow, prompt: str | None) -> None:
    """Set `window` as it was left: run settings (`prompt` unless None), view options, zoom, geometry."""
    window.controls.restore(window.settings, prompt)
    window.actions["colour_blind"].setChecked(window.settings.colour_blind)
    window.actions["compare"].setChecked(window.settings.compare)
    window.actions[f"theme_{theme.current().name}"].setChecked(True)
    window.presentation.set_zoom(window.settings.zoom)
    window.run_view.main_splitter.setSizes([430, 0, 520])
    window.run_view.bottom_splitter.setSizes([1000, 360])
    geometry = load_geometry(window.store)
    if geometry is None or not window.restoreGeometry(geometry):
        screen = window.screen().availableGeometry()
        window.resize(min(DEFAULT_SIZE[0], screen.width()), min(DEFAULT_SIZE[1], screen.height()))
        window.move(screen.topLeft())
    fit_to_screen(window)  # the geometry may come from a larger screen than this one


def save_window(window: MainWindow) -> None:
    """Remember what `restore_window` sets, the model and its precision; a lesson's run settings are its own."""
    if not window.lesson.active:  # a lesson's settings are its own: the free app's were kept when it began
        window.controls.store(window.settings)
    window.settings.colour_blind = window.actions["colour_blind"].isChecked()
    window.settings.zoom = window.presentation.remembered_zoom
    window.settings.theme = window.presentation.theme.name
    if window.session.source is not None:
        window.settings.model_source = window.session.source
    window.settings.dtype = window.session.model_info.dtype if window.session.model_info else window.session.dtype
    window.settings.save(window.store)
    if not window.presentation.presenter:
        save_geometry(window.store, window.saveGeometry())
