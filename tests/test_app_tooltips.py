"""Hover tooltips on the cells of the K/V grid (layers and opened heads) and of the attention strip stay while
the mouse rests: Qt's own tooltip request for a resting mouse (a QHelpEvent of type ToolTip on the viewport)
must not hide the tooltip the hover showed."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from helpers_checkpoints import plan_ids
from PySide6.QtCore import QEvent, QPoint, QPointF
from PySide6.QtGui import QHelpEvent
from PySide6.QtWidgets import QApplication, QToolTip

from kvviz.app.views.attention_view import AttentionView
from kvviz.app.views.grid.kv_grid import KVGridView
from kvviz.core.records import AttentionWeights

PROMPT = "Time flies fast"  # 3 GPT-2 tokens
QT_HIDE_DELAY_MS = 300  # Qt hides a tooltip this long after it was told to


@pytest.fixture(scope="module")
def engine(app_model):
    from kvviz.engine.engine import Engine
    from kvviz.sources.weights import load_model

    return Engine(load_model(app_model).model)


@pytest.fixture(autouse=True)
def _no_tooltip_left(qtbot):
    yield
    QToolTip.hideText()


def cell_point(plot_widget, row: int, column: int) -> QPoint:
    """The viewport pixel at the middle of the cell (row, column) of a cell plot."""
    vb = plot_widget.getPlotItem().getViewBox()
    return plot_widget.mapFromScene(vb.mapViewToScene(QPointF(column + 0.5, row + 0.5)))


def rest_on(qtbot, plot_widget, point: QPoint, first_line: str) -> None:
    """Hover `point`, then rest there: Qt sends the viewport its tooltip request, as it does ~0.7 s after the
    mouse stops; the tooltip must still say `first_line` once Qt's hide delay is over."""
    viewport = plot_widget.viewport()
    qtbot.mouseMove(viewport, point)
    qtbot.waitUntil(lambda: QToolTip.isVisible() and QToolTip.text().startswith(first_line), timeout=3_000)
    QApplication.sendEvent(viewport, QHelpEvent(QEvent.Type.ToolTip, point, viewport.mapToGlobal(point)))
    qtbot.wait(QT_HIDE_DELAY_MS + 200)  # what stays can only be seen after the moment it would have gone
    assert QToolTip.isVisible(), "the tooltip vanished while the mouse rested"
    assert QToolTip.text().startswith(first_line), QToolTip.text()


@pytest.fixture
def grid(qtbot, engine):
    widget = KVGridView()
    qtbot.addWidget(widget)
    widget.resize(900, 560)
    widget.show()
    qtbot.waitExposed(widget)
    plan = plan_ids(engine, engine.encode_prompt(PROMPT), 4, True, prompt=PROMPT)
    widget.reset(plan)
    widget.apply(list(engine.run(plan))[:3])
    widget.refresh()
    return widget


def test_a_grid_cells_tooltip_stays_while_the_mouse_rests(qtbot, grid):
    rest_on(qtbot, grid.plot_widget, cell_point(grid.plot_widget, 2, 1), "layer 2, position 1")


def test_a_head_rows_tooltip_stays_while_the_mouse_rests(qtbot, grid):
    grid.expand_layer(1)
    assert grid.display_rows()[3] == (1, 1)
    rest_on(qtbot, grid.plot_widget, cell_point(grid.plot_widget, 3, 0), "layer 1, head 1, position 0")


def test_the_tooltip_request_off_the_cells_shows_nothing(qtbot, grid):
    viewport = grid.plot_widget.viewport()
    corner = QPoint(2, viewport.height() - 2)  # on the axes, no cell under it
    QApplication.sendEvent(viewport, QHelpEvent(QEvent.Type.ToolTip, corner, viewport.mapToGlobal(corner)))
    qtbot.wait(1)
    assert not QToolTip.isVisible()


def test_an_attention_cells_tooltip_stays_while_the_mouse_rests(qtbot, engine):
    plan = replace(plan_ids(engine, engine.encode_prompt(PROMPT), 2, True, prompt=PROMPT), attention=True)
    rng = np.random.default_rng(0)

    def weights(positions: int) -> AttentionWeights:
        rows = rng.random((plan.n_layer, plan.n_head, positions)).astype(np.float32) + 0.01
        rows /= rows.sum(axis=-1, keepdims=True)
        return AttentionWeights(plan.n_layer, plan.n_head, positions, rows.astype("=f4").tobytes())

    records = [replace(r, attention=weights(r.fed_stop)) for r in engine.run(plan)]
    view = AttentionView()
    qtbot.addWidget(view)
    view.resize(900, 400)
    view.show()
    qtbot.waitExposed(view)
    view.reset(plan)
    view.apply(records[:2])
    view.refresh()
    rest_on(qtbot, view.plot_widget, cell_point(view.plot_widget, 1, 2), "layer 0, head 1, position 2")
