"""Large models fit a 720p projector (issue #36, section 4): with 30 or 48 layers the grid's rows become thin lines
(labelled every few layers) so that the counter, the chart and the attention strip stay on screen with every grid
row, in the plain window, with A open, in compare mode and in F11; nothing scrolls. The window is 1280 pixels
wide, as on the projector: its run settings take one line there."""

from __future__ import annotations

import pytest
from helpers_checkpoints import save_kvviz_folder
from PySide6.QtCore import QPoint
from PySide6.QtWidgets import QScrollArea, QWidget

from kvviz.app.assembly import open_window
from kvviz.app.settings import app_settings
from kvviz.app.window import main_window, presentation
from kvviz.app.window.main_window import MainWindow

SCREEN = (1280, 720 - 30)  # a projector's 720 lines, less a window manager's title bar


@pytest.fixture(scope="module", params=[30, 48], ids=lambda n: f"{n}-layers")
def deep_model(request, tmp_path_factory) -> str:
    layers = request.param
    return str(save_kvviz_folder(tmp_path_factory.mktemp("deep") / f"deep-{layers}", n_layer=layers, n_head=2,
                                 n_embd=16, n_ctx=64))


def _on_screen(window: MainWindow, widget: QWidget) -> bool:
    """All of `widget` lies inside the window (nothing below the fold)."""
    top_left = widget.mapTo(window, QPoint(0, 0))
    return (widget.isVisible() and top_left.y() >= 0 and top_left.x() >= 0
            and top_left.y() + widget.height() <= window.height() and top_left.x() + widget.width() <= window.width())


def _settle(qtbot, window: MainWindow) -> None:
    s = window.session
    qtbot.waitUntil(lambda: s.plan is not None and s.steps_done >= s.steps_target and not window.scheduler.pending,
                    timeout=60_000)
    window.redraw()
    qtbot.wait(1)  # let the layouts run once


@pytest.mark.parametrize("keys", ["", "A", "T", "F11", "F11+A", "F11+T"])
def test_every_grid_row_the_counter_chart_and_strip_fit_720p(qtbot, deep_model, monkeypatch, keys):
    # the offscreen screen is 800 pixels wide: the window is sized as on the projector, not shrunk to that screen
    monkeypatch.setattr(main_window, "fit_to_screen", lambda _window: None)
    monkeypatch.setattr(presentation, "fit_to_screen", lambda _window: None)
    zoom = presentation.presenter_zoom(SCREEN[1] + 30)
    monkeypatch.setattr(presentation, "presenter_zoom", lambda _screen_height: zoom)
    window = open_window(deep_model, "Time flies", settings=app_settings())
    qtbot.addWidget(window)
    monkeypatch.setattr(window, "showFullScreen", lambda: window.resize(SCREEN[0], SCREEN[1] + 30))
    monkeypatch.setattr(window, "showNormal", lambda: window.resize(*SCREEN))
    window.resize(*SCREEN)
    window.show()
    try:
        _settle(qtbot, window)
        window.session.step()
        _settle(qtbot, window)
        for key in keys.split("+") if keys else ():
            window.actions[{"A": "attention", "T": "compare", "F11": "presenter"}[key]].trigger()
            _settle(qtbot, window)
        keys = keys.removeprefix("F11+")
        assert window.width() == SCREEN[0]
        scroll = window.findChild(QScrollArea, "runScroll")
        assert scroll.verticalScrollBar().maximum() == 0, "the views scroll: something is below the fold"
        compare = window.workspace.compare_view if keys == "T" else None
        if compare is None:
            shown = [window.run_view.counter, window.run_view.chart] + ([window.run_view.attention] if keys == "A"
                                                                        else [])
            grids = [window.grid]
        else:
            shown = [compare.time_plot, compare.counts, compare.identity_strip]
            grids = [compare.cached_grid, compare.uncached_grid]
        for widget in shown:
            assert _on_screen(window, widget), type(widget).__name__
        for grid in grids:
            assert _on_screen(window, grid.plot_widget)
            box = grid.plot_item.getViewBox().sceneBoundingRect()
            # every row is drawn, a line of pixels at least (with A open at 720p that is what 48 rows get)
            assert box.height() / len(grid.display_rows()) >= 1
    finally:
        window.close()
