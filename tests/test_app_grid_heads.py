"""The K/V grid's layers opened into their heads (layers x heads x positions), fed a real run of the embedded
model: double-click a row to expand it, click it to choose its layer, hover a cell for its bytes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from helpers_checkpoints import lockstep_ids, plan_ids
from helpers_qt import drawn_left_labels, geometries, settle_layouts
from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtWidgets import QToolTip

from kvviz.app import theme
from kvviz.app.views.grid.cell_states import COMPUTED, REUSED
from kvviz.app.views.grid.kv_grid import KVGridView

PROMPT = "Time flies fast"  # 3 GPT-2 tokens
N = 6


@pytest.fixture(scope="module")
def engine(app_model):
    from kvviz.engine.engine import Engine
    from kvviz.sources.weights import load_model

    return Engine(load_model(app_model).model)


def with_heads(engine, plan):
    """`plan` with the model's heads, head size and bytes per number (however far the engine fills them)."""
    if plan.n_head:
        return plan
    cfg = engine.model.config
    return dataclasses.replace(plan, n_head=cfg.n_head, head_dim=cfg.head_dim, dtype_bytes=4)


@pytest.fixture(scope="module")
def run(engine):
    """run(use_cache) -> (plan, records) of PROMPT, computed once."""
    runs: dict[bool, tuple] = {}

    def make(use_cache: bool = True):
        if use_cache not in runs:
            plan = with_heads(engine, plan_ids(engine, engine.encode_prompt(PROMPT), N, use_cache, prompt=PROMPT))
            runs[use_cache] = plan, list(engine.run(plan))
        return runs[use_cache]

    return make


@pytest.fixture
def grid(qtbot, run):
    widget = KVGridView()
    qtbot.addWidget(widget)
    widget.resize(900, 560)
    widget.show()
    qtbot.waitExposed(widget)
    plan, records = run(True)
    widget.reset(plan)
    widget.apply(records[:4])
    widget.refresh()
    return widget


def cell_point(grid: KVGridView, row: int, position: int) -> QPoint:
    """The plot's viewport pixel at the middle of a drawn cell (display row, position)."""
    vb = grid.plot_item.getViewBox()
    return grid.plot_widget.mapFromScene(vb.mapViewToScene(QPointF(position + 0.5, row + 0.5)))


def row_pixels(grid: KVGridView) -> int:
    """Pixels per drawn row of the grid's image."""
    return grid.image_item.image.shape[1] // grid.cell_states().shape[1]


def test_expanding_a_layer_shows_its_heads_and_collapsing_restores_it(grid, run):
    plan, _records = run(True)
    n_layer, n_head = plan.n_layer, plan.n_head
    assert n_head > 1
    before_image = grid.image_item.image.copy()
    assert grid.display_rows() == [(layer, None) for layer in range(n_layer)]
    assert np.array_equal(grid.display_states(), grid.cell_states())

    grid.expand_layer(2)
    rows = grid.display_rows()
    assert grid.expanded_layers() == (2,)
    assert rows[:3] == [(0, None), (1, None), (2, None)]
    assert rows[3:3 + n_head] == [(2, head) for head in range(n_head)]
    assert rows[3 + n_head:] == [(layer, None) for layer in range(3, n_layer)]
    states = grid.display_states()
    assert states.shape == (n_layer + n_head, plan.width)
    for row, (layer, _head) in enumerate(rows):
        assert np.array_equal(states[row], grid.cell_states()[layer])
    assert {COMPUTED, REUSED} <= set(np.unique(states[3:3 + n_head]).tolist())
    assert grid.cell_states().shape == (n_layer, plan.width), "cell_states stays per layer"
    size = row_pixels(grid)
    assert grid.image_item.image.shape[0] == (n_layer + n_head) * size
    assert grid.image_item.image.shape[0] - before_image.shape[0] == n_head * size

    grid.expand_layer(4)
    assert grid.expanded_layers() == (2, 4)
    assert len(grid.display_rows()) == n_layer + 2 * n_head
    grid.expand_layer(2, False)
    grid.expand_layer(4, False)
    assert grid.expanded_layers() == ()
    assert grid.display_rows() == [(layer, None) for layer in range(n_layer)]
    assert np.array_equal(grid.image_item.image, before_image)


def row_band(plot_widget, row: int) -> tuple[float, float]:
    """The viewport's pixel rows a display row's cells cover: (top, bottom)."""
    vb = plot_widget.getPlotItem().getViewBox()
    return tuple(plot_widget.mapFromScene(vb.mapViewToScene(QPointF(0, y))).y() for y in (row, row + 1))


def no_overlap(labels: list[tuple[str, float, float]]) -> bool:
    return all(below[1] >= above[2] for above, below in zip(labels, labels[1:], strict=False))


def assert_every_row_labelled(plot_widget, display_rows: list[tuple[int, int | None]]) -> None:
    """One label per display row, "L2" or "L2 h0", inside its row's band, no two overlapping."""
    labels = drawn_left_labels(plot_widget)
    expected = [f"L{layer}" if head is None else f"L{layer} h{head}" for layer, head in display_rows]
    assert [text for text, _top, _bottom in labels] == expected
    for row, (_text, top, bottom) in enumerate(labels):
        band_top, band_bottom = row_band(plot_widget, row)
        assert band_top - 1 <= (top + bottom) / 2 <= band_bottom + 1, (row, top, bottom, band_top, band_bottom)
    assert no_overlap(labels), labels


def test_every_row_is_labelled_on_the_left_axis_without_overlap(grid):
    assert_every_row_labelled(grid.plot_widget, grid.display_rows())
    grid.expand_layer(1)
    assert_every_row_labelled(grid.plot_widget, grid.display_rows())
    assert [text for text, *_ in drawn_left_labels(grid.plot_widget)][:5] == ["L0", "L1", "L1 h0", "L1 h1", "L1 h2"]


def test_the_labels_shrink_to_fit_a_squeezed_grid(qtbot, run):
    """The grid's axes on a plot squeezed below a line of its font per row (an export at a small size)."""
    from PySide6.QtGui import QFont, QFontMetricsF

    from kvviz.app.views.base import cell_plot
    from kvviz.app.views.grid.grid_rows import GridAxes, GridRows
    from kvviz.app.views.grid.grid_state import GridState

    plan, _records = run(True)
    plot_widget, plot_item, _image = cell_plot(0)
    qtbot.addWidget(plot_widget)
    full = QFont(plot_widget.font())
    full.setPointSizeF(9.0)
    axes = GridAxes(plot_widget, plot_item)
    axes.set_font(full, plan)
    rows, cells = GridRows(plan.n_layer, plan.n_head, [1]), GridState(plan)
    plot_item.getViewBox().setRange(xRange=(0, cells.width), yRange=(0, len(rows)), padding=0)
    small = QFont(full)
    small.setPointSizeF(6.0)
    line = {name: QFontMetricsF(font).height() * 0.8 for name, font in (("full", full), ("small", small))}
    pitch = (line["small"] + line["full"]) / 2  # rows too thin for the full font, not for a 6 pt one
    vb = plot_item.getViewBox()
    plot_widget.resize(700, 300)
    plot_widget.show()
    qtbot.waitUntil(lambda: vb.height() > 0, timeout=3_000)
    plot_widget.resize(700, 300 + round(len(rows) * pitch - vb.height()))
    qtbot.waitUntil(lambda: abs(vb.height() - len(rows) * pitch) < 2, timeout=3_000)
    axes.update(cells, rows)
    display = [(int(layer), None if head < 0 else int(head))
               for layer, head in zip(rows.layers, rows.heads, strict=True)]
    assert_every_row_labelled(plot_widget, display)
    assert 6.0 <= axes.left_font().pointSizeF() < full.pointSizeF()


def test_rows_too_thin_for_any_font_keep_every_layers_label():
    from kvviz.app.views.grid.grid_rows import GridRows

    rows = GridRows(6, 6, expanded=range(6))  # 42 rows, room for 10 labels
    ticks = rows.left_ticks(10)
    texts = [text for _y, text in ticks]
    assert [t for t in texts if " " not in t] == [f"L{layer}" for layer in range(6)]
    assert any(" h" in t for t in texts)  # heads where there is room between the layers
    assert min(np.diff([y for y, _text in ticks])) >= 42 / 10
    assert GridRows(6, 6, expanded=[2]).left_ticks(12) == [(r + 0.5, text) for r, text in enumerate(
        ["L0", "L1", "L2"] + [f"L2 h{h}" for h in range(6)] + ["L3", "L4", "L5"])]


@pytest.mark.parametrize("zoom", [1.0, 1.6, 2.3])
def test_every_layer_and_head_is_labelled_in_the_window_at_1280x720(qtbot, app_model, zoom):
    from kvviz.app.assembly import open_window
    from kvviz.app.settings import app_settings

    window = open_window(app_model, PROMPT, settings=app_settings())
    qtbot.addWidget(window)
    window.show()
    qtbot.waitUntil(lambda: window.session.plan is not None, timeout=60_000)
    window.presentation.set_zoom(zoom)
    window.resize(1280, 690)  # a 1280x720 screen less the window's title bar
    qtbot.waitUntil(lambda: (window.width(), window.height()) == (1280, 690), timeout=5_000)
    grid = window.grid
    qtbot.waitUntil(lambda: len(drawn_left_labels(grid.plot_widget)) == window.session.plan.n_layer, timeout=5_000)
    assert_every_row_labelled(grid.plot_widget, grid.display_rows())
    qtbot.keyClick(window, Qt.Key.Key_H)  # layer 0's heads
    assert grid.expanded_layers() == (0,)
    qtbot.waitUntil(lambda: len(drawn_left_labels(grid.plot_widget)) == len(grid.display_rows()), timeout=5_000)
    assert_every_row_labelled(grid.plot_widget, grid.display_rows())
    window.close()


def test_a_double_click_expands_a_row_and_a_click_emits_its_layer(qtbot, grid, run):
    plan, _records = run(True)
    viewport = grid.plot_widget.viewport()
    with qtbot.waitSignal(grid.layer_clicked) as clicked:
        qtbot.mouseClick(viewport, Qt.MouseButton.LeftButton, pos=cell_point(grid, 3, 1))
    assert clicked.args == [3]
    assert grid.expanded_layers() == (), "a click changes nothing else"

    qtbot.mouseDClick(viewport, Qt.MouseButton.LeftButton, pos=cell_point(grid, 1, 2))
    assert grid.expanded_layers() == (1,)
    head_row = 2 + plan.n_head - 1  # layer 1's last head
    assert grid.display_rows()[head_row] == (1, plan.n_head - 1)
    with qtbot.waitSignal(grid.layer_clicked) as clicked:
        qtbot.mouseClick(viewport, Qt.MouseButton.LeftButton, pos=cell_point(grid, head_row, 0))
    assert clicked.args == [1], "a head row's click gives its layer"
    layer_3_row = 2 + plan.n_head + 1
    with qtbot.waitSignal(grid.layer_clicked) as clicked:
        qtbot.mouseClick(viewport, Qt.MouseButton.LeftButton, pos=cell_point(grid, layer_3_row, 0))
    assert clicked.args == [3], "rows under an expanded layer map to their own layer"

    qtbot.mouseDClick(viewport, Qt.MouseButton.LeftButton, pos=cell_point(grid, head_row, 3))
    assert grid.expanded_layers() == (), "a double click on a head row closes its layer"
    with qtbot.assertNotEmitted(grid.layer_clicked):
        qtbot.mouseClick(viewport, Qt.MouseButton.RightButton, pos=cell_point(grid, 0, 0))


def test_the_selected_layer_is_outlined_with_its_heads(qtbot, grid, run):
    plan, _records = run(True)
    grid.expand_layer(2)
    frame = theme.current().frame.lower()

    def outlined(row: int) -> bool:
        """Whether the frame's colour is drawn on the left edge of the cells, across `row`."""
        qtbot.wait(1)  # the scene finds the items it shows or moves in the event loop
        image = grid.plot_widget.grab().toImage()
        vb = grid.plot_item.getViewBox()
        edge = grid.plot_widget.mapFromScene(vb.mapViewToScene(QPointF(0, row + 0.3)))  # off the tick marks
        return any(image.pixelColor(edge.x() + dx, edge.y()).name() == frame for dx in range(4))

    assert not any(outlined(row) for row in range(len(grid.display_rows())))
    grid.set_selected_layer(2)
    assert grid.selected_layer() == 2
    rows = [row for row, (layer, _head) in enumerate(grid.display_rows()) if layer == 2]
    assert len(rows) == 1 + plan.n_head
    assert all(outlined(row) for row in rows)
    assert not outlined(1) and not outlined(rows[-1] + 1)
    grid.set_selected_layer(None)
    assert not any(outlined(row) for row in rows)


def test_a_cached_cells_tooltip_states_its_bytes(grid, engine, run):
    plan, _records = run(True)
    cfg = engine.model.config
    layer_line, head_line = {  # the embedded model (6 heads of 32 numbers); the tiny stand-in (2 of 16)
        (6, 32): ("K and V: 2 \u00d7 6 heads \u00d7 32 \u00d7 4 bytes = 1,536 bytes",
                  "K and V of head 1: 2 \u00d7 32 \u00d7 4 bytes = 256 bytes"),
        (2, 16): ("K and V: 2 \u00d7 2 heads \u00d7 16 \u00d7 4 bytes = 256 bytes",
                  "K and V of head 1: 2 \u00d7 16 \u00d7 4 bytes = 128 bytes"),
    }[(cfg.n_head, cfg.head_dim)]
    assert grid.cell_states()[0, 0] == REUSED
    assert layer_line in grid.cell_info(0, 0).splitlines()
    head_info = grid.cell_info(0, 0, head=1).splitlines()
    assert head_info[0] == "layer 0, head 1, position 0"
    assert head_line in head_info
    computed = int(np.flatnonzero(grid.cell_states()[0] == COMPUTED)[0])
    assert layer_line in grid.cell_info(0, computed).splitlines()
    pending = plan.width - 1 if grid.cell_states()[0, -1] else None
    for position in (computed + 1, pending):  # not in the cache (yet): no bytes
        if position is not None:
            assert "bytes" not in grid.cell_info(0, position)
    assert grid.cell_info(0, 0, head=plan.n_head) == ""


def test_an_uncached_cells_tooltip_says_its_kv_is_not_kept(qtbot, run):
    plan, records = run(False)
    grid = KVGridView()
    qtbot.addWidget(grid)
    grid.reset(plan)
    grid.apply(records[:3])
    grid.refresh()
    assert grid.cell_states()[0, 0] == COMPUTED
    info = grid.cell_info(0, 0).splitlines()
    assert "K and V: recomputed each pass, not kept (no cache)" in info
    assert "K and V of head 2: recomputed each pass, not kept (no cache)" in grid.cell_info(0, 0, 2).splitlines()
    assert "bytes" not in grid.cell_info(0, 0)


def test_hover_over_a_head_row_shows_the_heads_tooltip(qtbot, grid):
    grid.expand_layer(1)
    head_row = 2 + 1  # layer 1's head 1
    assert grid.display_rows()[head_row] == (1, 1)
    qtbot.mouseMove(grid.plot_widget.viewport(), cell_point(grid, head_row, 0))
    qtbot.waitUntil(lambda: QToolTip.text().startswith("layer 1, head 1, position 0"), timeout=3_000)
    qtbot.wait(50)  # pyqtgraph passes on at most one mouse move in 10 ms
    qtbot.mouseMove(grid.plot_widget.viewport(), cell_point(grid, grid.display_rows().index((2, None)), 0))
    qtbot.waitUntil(lambda: QToolTip.text().startswith("layer 2, position 0"), timeout=3_000)


def test_expansion_survives_a_new_run_and_is_dropped_with_its_layer(grid, run):
    plan, records = run(True)
    grid.expand_layer(1)
    grid.expand_layer(plan.n_layer - 1)
    grid.reset(plan)
    assert grid.expanded_layers() == (1, plan.n_layer - 1)
    assert len(grid.display_rows()) == plan.n_layer + 2 * plan.n_head
    grid.apply(records)
    grid.refresh()
    assert grid.image_item.image.shape[0] == len(grid.display_rows()) * row_pixels(grid)
    assert np.array_equal(grid.display_states(), grid.cell_states()[[layer for layer, _ in grid.display_rows()]])

    grid.reset(dataclasses.replace(plan, n_layer=plan.n_layer - 1))  # a model without the last layer
    assert grid.expanded_layers() == (1,)
    grid.reset(dataclasses.replace(plan, n_head=0, n_kv_head=0))  # a plan that does not know its heads: nothing to open
    assert grid.expanded_layers() == ()
    grid.expand_layer(1)
    assert grid.expanded_layers() == () and len(grid.display_rows()) == plan.n_layer
    grid.reset(plan)
    with pytest.raises(ValueError, match="layer 99"):
        grid.expand_layer(99)


def test_theme_patterns_and_font_scale_keep_the_head_rows(qtbot, grid, run):
    plan, records = run(True)
    grid.expand_layer(0)
    rows = len(grid.display_rows())
    for change in (lambda: grid.set_colour_blind(True), lambda: grid.set_theme(theme.LIGHT),
                   lambda: grid.set_font_scale(1.6), lambda: grid.set_colour_blind(False)):
        change()
        assert grid.image_item.image.shape[0] == rows * row_pixels(grid)
        assert grid.display_rows()[1] == (0, 0)
    settle_layouts()  # the new fonts' relayout is done
    before = geometries([grid, grid.plot_widget])
    for record in records[4:]:  # steps with heads open move nothing
        grid.apply([record])
        grid.refresh()
        settle_layouts()
        assert geometries([grid, grid.plot_widget]) == before


def test_compare_grids_expand_each_on_their_own(qtbot, engine):
    from kvviz.app.views.compare.compare_view import CompareView
    from kvviz.engine.compare import Lockstep

    plan = lockstep_ids(engine, engine.encode_prompt(PROMPT), 4, True)
    if not plan.n_head:
        plan = dataclasses.replace(with_heads(engine, plan), twin=with_heads(engine, plan.twin))
    view = CompareView()
    qtbot.addWidget(view)
    view.resize(1264, 569)
    view.show()
    view.reset(plan)
    view.apply(list(Lockstep(engine, plan).records()))
    view.refresh()
    view.cached_grid.expand_layer(1)
    assert view.cached_grid.expanded_layers() == (1,) and view.uncached_grid.expanded_layers() == ()
    assert len(view.cached_grid.display_rows()) == plan.n_layer + plan.n_head
    assert len(view.uncached_grid.display_rows()) == plan.n_layer

    def column_x(grid: KVGridView) -> int:
        vb = grid.plot_item.getViewBox()
        return grid.plot_widget.mapTo(view, grid.plot_widget.mapFromScene(vb.mapViewToScene(QPointF(0, 0)))).x()

    qtbot.waitUntil(lambda: column_x(view.cached_grid) == column_x(view.uncached_grid), timeout=2_000)


def test_h_shows_the_heads_of_the_clicked_layer_in_the_window(qtbot, app_model):
    from PySide6.QtCore import QPointF, Qt

    from kvviz.app.assembly import open_window
    from kvviz.app.settings import app_settings

    window = open_window(app_model, "Time flies fast", settings=app_settings())
    qtbot.addWidget(window)
    window.show()
    qtbot.waitUntil(lambda: window.session.plan is not None, timeout=60_000)
    grid = window.grid
    qtbot.keyClick(window, Qt.Key.Key_H)
    assert grid.expanded_layers() == (0,)  # nothing selected: the first layer
    qtbot.keyClick(window, Qt.Key.Key_H)
    assert grid.expanded_layers() == ()
    vb = grid.plot_item.getViewBox()
    point = grid.plot_widget.mapFromScene(vb.mapViewToScene(QPointF(0.5, 3.5)))
    qtbot.mouseClick(grid.plot_widget.viewport(), Qt.MouseButton.LeftButton, pos=point)
    assert grid.selected_layer() == 3
    qtbot.keyClick(window, Qt.Key.Key_H)
    heads = window.session.plan.n_head
    assert grid.expanded_layers() == (3,) and len(grid.display_rows()) == window.session.plan.n_layer + heads
    window.close()


def test_an_opened_layer_is_parted_from_its_neighbours_by_a_wide_gap():
    from kvviz.app.views.grid.cell_states import HEAD_ROW, LAST_HEAD_ROW, LAYER_ROW
    from kvviz.app.views.grid.grid_cells import cell_tile
    from kvviz.app.views.grid.grid_rows import GridRows

    rows = GridRows(4, 3, expanded=[1])  # L0, L1, L1 h0..h2, L2, L3
    assert rows.kinds[:, 0].tolist() == [LAST_HEAD_ROW, HEAD_ROW, HEAD_ROW, HEAD_ROW, LAST_HEAD_ROW, LAYER_ROW,
                                         LAYER_ROW]
    def gap_below(palette, kind: int, size: int = 16) -> int:
        """Rows of the grid line's colour at the bottom of a cell."""
        tile = cell_tile(REUSED, size, False, palette, kind)
        line = np.array(theme.rgba(palette.grid_line), dtype=np.uint8)
        return int((tile[:, size // 2] == line).all(axis=1)[::-1].cumprod().sum())

    for palette in (theme.DARK, theme.LIGHT):
        assert gap_below(palette, HEAD_ROW) == 0, "inside an opened layer: a soft line, no gap"
        wide, usual = gap_below(palette, LAST_HEAD_ROW), gap_below(palette, LAYER_ROW)
        assert wide >= max(4, usual + 2), (palette.name, wide, usual)  # 4 of 16 pixels: a quarter of the row
