"""Projector screens: the window fits 1024x768 and 1280x720, windowed and in presenter mode, and every
panel keeps a size at which its numbers can be read."""

from __future__ import annotations

import pytest
from helpers_qt import settle_layouts
from PySide6.QtWidgets import QLabel, QScrollArea

from kvviz.app.assembly import open_window
from kvviz.app.settings import app_settings
from kvviz.app.window.presentation import ZOOM_STEPS, presenter_zoom

TITLE_BAR = 30  # what a window manager's frame takes of the screen's height, about


@pytest.fixture
def window(qtbot, app_model):
    win = open_window(app_model, "Time flies fast", settings=app_settings())
    qtbot.addWidget(win)
    win.show()
    qtbot.waitUntil(lambda: win.session.plan is not None, timeout=60_000)
    for _ in range(3):
        with qtbot.waitSignal(win.session.record_computed, timeout=30_000):
            win.session.step()
    win.redraw()
    yield win
    win.close()


def _labels_whole(widget) -> list[str]:
    """Labels drawn smaller than their text needs (clipped numbers), by text."""
    return [label.text() for label in widget.findChildren(QLabel)
            if label.isVisible() and label.text() and not label.wordWrap()
            and (label.height() < label.sizeHint().height() or label.width() < label.sizeHint().width())]


@pytest.mark.parametrize(("width", "height"), [(1024, 768), (1280, 720)])
@pytest.mark.parametrize("presenter", [False, True])
def test_every_panel_fits_a_projector_screen(qtbot, window, width, height, presenter):
    if presenter:  # as set_presenter does, without asking the offscreen screen for full screen
        window.menuBar().hide()
        window.statusBar().hide()
        for widget in window.controls.settings_widgets:
            widget.hide()
        window.presentation.set_zoom(presenter_zoom(height))
        height += TITLE_BAR  # full screen: no title bar
    window.resize(width, height - TITLE_BAR)
    qtbot.waitUntil(lambda: window.width() == width and window.height() == height - TITLE_BAR, timeout=5_000)
    scroll = window.findChild(QScrollArea)
    settle_layouts()  # the layout passes a resize posts
    assert scroll.horizontalScrollBar().maximum() == 0, "the views are wider than the screen"
    assert scroll.verticalScrollBar().maximum() == 0, "the views do not fit the screen's height"
    scale = window.presentation.zoom
    assert window.chart.height() >= 180 * scale
    assert window.grid.plot_widget.height() >= 80 * scale
    assert _labels_whole(window.counter) == []
    assert window.counter.x() + window.counter.width() <= window.run_view.width()


@pytest.mark.parametrize("zoom", ZOOM_STEPS)
def test_zooming_never_grows_the_window_past_its_screen(qtbot, window, zoom):
    screen = window.screen().availableGeometry()
    window.resize(screen.width(), screen.height())
    window.presentation.set_zoom(zoom)
    settle_layouts()  # the layout passes a resize posts
    assert window.width() <= screen.width() and window.height() <= screen.height()
    assert _labels_whole(window.counter) == [] or window.findChild(QScrollArea).verticalScrollBar().maximum() > 0


def test_a_short_chart_gives_the_small_plots_room_to_the_work_plot(qtbot, window):
    window.resize(1400, 1000)
    qtbot.waitUntil(lambda: window.chart.height() >= 290, timeout=5_000)
    assert window.chart.small_plots_shown
    window.resize(1024, 600)
    qtbot.waitUntil(lambda: window.chart.height() < 290, timeout=5_000)
    assert not window.chart.small_plots_shown
    qtbot.waitUntil(lambda: window.chart.work_plot.height() > 0.8 * window.chart.height(), timeout=5_000)


def test_the_end_of_a_run_is_said_in_room_kept_for_it(qtbot, window):
    """Ending a run says why in the counter without asking the layout for more room: where the counter had
    none to spare (View > Attention open at 1400x900), a note shown at the end of every run relayouted the
    run view and repainted every plot in one pass of the event loop."""
    counter = window.counter
    asked = (counter.sizeHint(), counter.minimumSizeHint())
    session = window.session
    with qtbot.waitSignal(window.run_done, timeout=60_000):
        for _ in range(session.plan.budget):
            session.step()  # queued on the worker; the run ends after the last one
    window.redraw()
    assert counter.progress.text().endswith("; done")
    assert (counter.sizeHint(), counter.minimumSizeHint()) == asked
