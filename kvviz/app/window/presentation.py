"""Zoom, theme and presenter mode: font scale and colours for every view, full screen with less chrome."""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QFont
from PySide6.QtWidgets import QMainWindow, QWidget

from kvviz.app import theme as themes
from kvviz.app.theme import Theme
from kvviz.app.views.base import RunViewProtocol

ZOOM_STEPS = (0.7, 0.8, 0.9, 1.0, 1.1, 1.25, 1.4, 1.6, 1.8, 2.0, 2.3)
PRESENTER_ZOOM = 1.6  # on a 1080-line screen; smaller screens get less (fonts in proportion to the screen)
PRESENTER_ZOOM_LINES = 675  # screen lines per unit of presenter zoom


def presenter_zoom(screen_height: int) -> float:
    """The presenter-mode zoom for a screen `screen_height` pixels high: 1.6 at 1080, 1.14 at 768, 1.07 at 720."""
    return min(PRESENTER_ZOOM, max(1.0, screen_height / PRESENTER_ZOOM_LINES))


def fit_to_screen(window: QWidget) -> None:
    """Shrink and move `window` so that all of it is on its screen (a projector's 1024x768, a larger zoom)."""
    if window.isFullScreen() or window.isMaximized():
        return
    available = window.screen().availableGeometry()
    frame = window.frameGeometry()
    extra_w, extra_h = frame.width() - window.width(), frame.height() - window.height()  # title bar, borders
    width = min(window.width(), available.width() - extra_w)
    height = min(window.height(), available.height() - extra_h)
    if (width, height) != (window.width(), window.height()):
        window.resize(width, height)
    frame = window.frameGeometry()
    x = min(max(frame.x(), available.left()), available.right() + 1 - frame.width())
    y = min(max(frame.y(), available.top()), available.bottom() + 1 - frame.height())
    if (x, y) != (frame.x(), frame.y()):
        window.move(x, y)


class Presentation(QObject):
    """Owns the zoom level, the theme and presenter mode of `window`: scales the views' fonts and the
    controls' style sheet, gives the window and the views the theme's colours, and in presenter mode goes
    full screen and hides `chrome`."""

    presenter_changed = Signal(bool)

    def __init__(self, window: QMainWindow, views: Sequence[RunViewProtocol], chrome: Sequence[QWidget]) -> None:
        super().__init__(window)
        self._window = window
        self._views = list(views)
        self._chrome = list(chrome)
        self._base_point_size = QFont(window.font()).pointSizeF()
        self.zoom = 1.0
        self.theme = themes.current()
        self.presenter = False
        self._zoom_before_presenter = 1.0

    def add_chrome(self, widget: QWidget) -> None:
        """A widget made after the window's that presenter mode hides too (and hides now, if it is on)."""
        self._chrome.append(widget)
        if self.presenter:
            widget.hide()

    def add_view(self, view: RunViewProtocol) -> None:
        """A view made after the window's: it takes the zoom and the theme from now on, and the present ones now."""
        self._views.append(view)
        view.set_font_scale(self.zoom)

    @property
    def remembered_zoom(self) -> float:
        """The windowed zoom (presenter mode's own zoom is not remembered)."""
        return self._zoom_before_presenter if self.presenter else self.zoom

    def set_zoom(self, zoom: float) -> None:
        self.zoom = min(max(zoom, ZOOM_STEPS[0]), ZOOM_STEPS[-1])
        self._style_window()
        for view in self._views:
            view.set_font_scale(self.zoom)
        if not self.presenter:
            fit_to_screen(self._window)

    def set_theme(self, theme: Theme) -> None:
        """The window's style sheet and every view in `theme`'s colours."""
        self.theme = theme
        self._style_window()
        for view in self._views:
            view.set_theme(theme)

    def _style_window(self) -> None:
        size = self._base_point_size * self.zoom
        # Style sheets stop font propagation, so the controls get their size from the sheet.
        scaled = f"QWidget#controlsArea QWidget, QLabel#banner {{ font-size: {size:.1f}pt; }}"
        self._window.setStyleSheet(themes.stylesheet(self.theme) + scaled)

    def step_zoom(self, direction: int) -> None:
        """One zoom step in (direction > 0) or out."""
        bigger = [z for z in ZOOM_STEPS if z > self.zoom + 1e-6]
        smaller = [z for z in ZOOM_STEPS if z < self.zoom - 1e-6]
        if direction > 0 and bigger:
            self.set_zoom(bigger[0])
        elif direction < 0 and smaller:
            self.set_zoom(smaller[-1])

    def set_presenter(self, enabled: bool) -> None:
        """Full screen, larger fonts, no menu bar, status bar or sampling controls."""
        if enabled == self.presenter:
            return
        self.presenter = enabled
        if enabled:
            self._zoom_before_presenter = self.zoom
            self._window.showFullScreen()
            self.set_zoom(max(self.zoom, presenter_zoom(self._window.screen().geometry().height())))
        else:
            self._window.showNormal()
            self.set_zoom(self._zoom_before_presenter)
        for widget in self._chrome:
            widget.setVisible(not enabled)
        self.presenter_changed.emit(enabled)
