"""Large models fit a 720p projector (issue #36, section 4): with 30 or 48 layers the grid's rows become thin lines
(labelled every few layers) so that the counter, the chart and the attention strip stay on screen with every grid
row, in the plain window, with A open, in compare mode and in F11; nothing scrolls."""

from __future__ import annotations

import pytest
from helpers_checkpoints import save_kvviz_folder
from PySide6.QtCore import QPoint
from PySide6.QtWidgets import QScrollArea, QWidget

from kvviz.app.settings import app_settings
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


OPEN = pytest.mark.xfail(strict=True, reason="open (#36 section 4): with A or T the counter's least height (251 px at "
                                            "720p) leaves the views 38-105 px short; they scroll")


@pytest.mark.parametrize("keys", ["", "F11", pytest.param("F11+A", marks=OPEN), pytest.param("F11+T", marks=OPEN)])
def test_every_grid_row_the_counter_chart_and_strip_fit_720p(qtbot, deep_model, monkeypatch, keys):
    window = MainWindow(deep_model, "Time flies", settings=app_settings())
    qtbot.addWidget(window)
    monkeypatch.setattr(window, "showFullScreen", lambda: window.resize(SCREEN[0], SCREEN[1] + 30))
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
        scroll = window.findChild(QScrollArea, "runScroll")
        assert scroll.verticalScrollBar().maximum() == 0, "the views scroll: something is below the fold"
        views = window.compare_view if keys == "T" else window.run_view
        shown = [views.counter, views.chart] if keys != "T" else [window.compare_view]
        if keys == "A":
            shown.append(window.run_view.attention)
        for widget in shown:
            assert _on_screen(window, widget), type(widget).__name__
        grids = ([window.compare_view.cached_grid, window.compare_view.uncached_grid] if keys == "T"
                 else [window.grid])
        for grid in grids:
            assert _on_screen(window, grid.plot_widget)
            box = grid.plot_item.getViewBox().sceneBoundingRect()
            assert box.height() / len(grid.display_rows()) >= 2  # every row is drawn, a line at least
    finally:
        window.close()
