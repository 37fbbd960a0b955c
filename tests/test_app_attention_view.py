"""View > Attention (A): the newest query's weights of one layer, columns under the grid's, chosen by a grid row."""

from __future__ import annotations

import struct
from dataclasses import replace

import numpy as np
import pytest
from helpers_checkpoints import plan_ids
from PySide6.QtCore import QPointF, Qt

from kvviz.app.views.attention_view import AttentionView
from kvviz.app.views.grid.kv_grid import KVGridView
from kvviz.core.records import AttentionWeights

PROMPT = "Time flies fast"


@pytest.fixture(scope="module")
def engine(app_model):
    from kvviz.engine.engine import Engine
    from kvviz.sources.weights import load_model

    return Engine(load_model(app_model).model)


def _weights(layers: int, heads: int, positions: int, seed: int) -> AttentionWeights:
    """Made-up rows that sum to 1, so the view's numbers can be checked against literals of our own."""
    rows = np.random.default_rng(seed).random((layers, heads, positions)).astype(np.float32) + 0.01
    rows /= rows.sum(axis=-1, keepdims=True)
    return AttentionWeights(layers, heads, positions, rows.astype("=f4").tobytes())


def test_the_strip_shows_the_records_weights_of_the_chosen_layer(qtbot, engine):
    plan = plan_ids(engine, engine.encode_prompt(PROMPT), 3, True, prompt=PROMPT)
    plan = replace(plan, attention=True)
    heads = plan.n_head
    records = [replace(r, attention=_weights(plan.n_layer, heads, r.fed_stop, seed=r.step))
               for r in engine.run(plan)]
    view = AttentionView()
    qtbot.addWidget(view)
    view.reset(plan)
    view.apply(records[:2])
    view.refresh()
    layer = plan.n_layer - 1
    view.set_layer(layer)
    expected = np.frombuffer(records[1].attention.data, dtype="=f4").reshape(plan.n_layer, heads, -1)[layer]
    assert np.array_equal(view.strip_values(), expected)
    row = records[1].attention.row(layer, 2)
    assert view.top_positions(2)[0] == (int(np.argmax(row)), pytest.approx(max(row)))
    position = records[1].fed_stop - 1
    info = view.cell_info(2, position)
    assert f"layer {layer}, head 2, position {position}" in info and f"weight {row[position]:.4f}" in info
    # past the query's position nothing was attended: the strip's cells there are empty, not zero-weight
    view.apply(records[2:])
    view.refresh()
    last = records[-1]  # the pass that fills the cache with the last token: its query is the last position
    assert view.strip_values().shape == (heads, last.fed_stop) == (heads, plan.width)
    view.reset(plan)
    view.apply(records[:1])
    view.refresh()
    assert np.isnan(view._strip[:, records[0].fed_stop:]).all() and not np.isnan(view._strip[:, :3]).any()


def test_weights_survive_the_bytes_layout(qtbot):
    """AttentionWeights.row reads (layers, heads, positions) row-major float32: a literal check."""
    data = struct.pack("=8f", 0.5, 0.5, 1.0, 0.0, 0.25, 0.75, 0.1, 0.9)
    weights = AttentionWeights(2, 2, 2, data)
    assert weights.row(1, 0) == (0.25, 0.75)
    assert weights.layer(0) == ((0.5, 0.5), (1.0, 0.0))
    assert [[list(h) for h in layer] for layer in (weights.layer(0), weights.layer(1))] == weights.as_lists()
    with pytest.raises(ValueError):
        AttentionWeights(2, 2, 3, data)


def _column_x(plot_widget, x: float) -> float:
    """The global x pixel of view coordinate `x` in a plot."""
    vb = plot_widget.getPlotItem().getViewBox()
    scene = vb.mapViewToScene(QPointF(x, 0.5))
    return plot_widget.mapToGlobal(plot_widget.mapFromScene(scene)).x()


def test_a_in_the_window_records_attention_under_the_grid_and_a_grid_row_chooses_the_layer(qtbot, app_model):
    from kvviz.app.assembly import open_window
    from kvviz.app.settings import app_settings

    window = open_window(app_model, PROMPT, settings=app_settings())
    qtbot.addWidget(window)
    window.resize(1400, 900)
    window.show()
    session = window.session
    qtbot.waitUntil(lambda: session.plan is not None, timeout=60_000)
    for n in (1, 2):
        session.step()
        qtbot.waitUntil(lambda n=n: session.steps_done == n, timeout=30_000)
    assert not session.plan.attention and session.last_record.attention is None  # nothing recorded while closed
    view = window.run_view.attention
    qtbot.keyClick(window, Qt.Key.Key_A)
    assert view.isVisible() and window.actions["attention"].isChecked()
    qtbot.waitUntil(lambda: session.plan is not None and session.plan.attention and session.steps_done == 2,
                    timeout=30_000)  # replayed
    window.redraw()
    record = session.last_record
    assert record.attention is not None and record.attention.positions == record.fed_stop
    assert np.array_equal(view.strip_values(), np.array(record.attention.layer(view.layer), dtype=np.float32))

    grid = window.grid
    qtbot.waitUntil(lambda: view.plot_widget.width() > 0, timeout=5_000)
    for position in (0, 3, session.plan.width - 1):  # the strip's columns lie under the grid's
        assert abs(_column_x(view.plot_widget, position + 0.5) - _column_x(grid.plot_widget, position + 0.5)) <= 1

    layer = session.plan.n_layer - 2
    vb = grid.plot_item.getViewBox()
    point = grid.plot_widget.mapFromScene(vb.mapViewToScene(QPointF(1.5, layer + 0.5)))
    qtbot.mouseClick(grid.plot_widget.viewport(), Qt.MouseButton.LeftButton, pos=point)
    qtbot.waitUntil(lambda: view.layer == layer, timeout=5_000)
    window.redraw()
    assert np.array_equal(view.strip_values(), np.array(session.last_record.attention.layer(layer), dtype=np.float32))

    qtbot.keyClick(window, Qt.Key.Key_A)
    assert not view.isVisible()
    qtbot.waitUntil(lambda: session.plan is not None and not session.plan.attention and session.steps_done == 2,
                    timeout=30_000)
    assert session.last_record.attention is None  # closed: the run records none again
    window.close()


def test_the_grid_outlines_the_layer_the_attention_view_shows(qtbot, engine):
    grid, view = KVGridView(), AttentionView()
    for widget in (grid, view):
        qtbot.addWidget(widget)
    view.layer_shown.connect(grid.set_selected_layer)
    plan = plan_ids(engine, engine.encode_prompt(PROMPT), 3, True, prompt=PROMPT)
    for widget in (grid, view):
        widget.reset(plan)
    shown: list = []
    view.layer_shown.connect(shown.append)
    view.layer_spin.setValue(3)
    assert view.layer == 3 and shown == [3]


def test_the_attention_view_exports_as_stills_and_as_an_animation(qtbot, engine, tmp_path):
    import xml.etree.ElementTree as ET

    from PySide6.QtGui import QImage

    from kvviz.app.export import export_widget
    from kvviz.app.export.animation import AnimationSource, AnimationSpec, write_animation

    plan = plan_ids(engine, engine.encode_prompt(PROMPT), 3, True, prompt=PROMPT, attention=True)
    records = tuple(engine.run(plan))
    assert all(r.attention is not None for r in records)
    view = AttentionView()
    qtbot.addWidget(view)
    view.resize(1200, 360)
    view.reset(plan)
    view.apply(records)
    view.show()
    view.refresh()
    png = export_widget(view, tmp_path / "attention.png", width=900)
    assert QImage(str(png)).width() == 900
    ET.fromstring(export_widget(view, tmp_path / "attention.svg").read_bytes())
    assert export_widget(view, tmp_path / "attention.pdf").read_bytes().startswith(b"%PDF")
    source = AnimationSource(plan, records)
    assert "attention" in source.targets
    assert "attention" not in AnimationSource(plan_ids(engine, engine.encode_prompt(PROMPT), 3), records).targets
    paths = write_animation(source, "attention", [tmp_path / "attention.gif"], AnimationSpec(1, len(records), 2.0, 0.0,
                                                                                              320))
    assert paths == [tmp_path / "attention.gif"] and paths[0].read_bytes().startswith(b"GIF8")


def test_the_heading_keeps_a_reading_pace_while_records_pour_in_and_always_ends_on_the_last(qtbot, engine):
    """Records redrawn as fast as they come: the heading changes a few times a second at most (nobody reads
    faster), shows the last query once the records stop, and a layer chosen shows its heading at once."""
    plan = replace(plan_ids(engine, engine.encode_prompt(PROMPT), 40, True, prompt=PROMPT), attention=True)
    records = [replace(r, attention=_weights(plan.n_layer, plan.n_head, r.fed_stop, seed=r.step))
               for r in engine.run(plan)]
    view = AttentionView()
    qtbot.addWidget(view)
    view.reset(plan)
    headings = []
    view.heading.setText = lambda text, original=view.heading.setText: (headings.append(text), original(text))
    for record in records:  # 41 redraws within a few ms
        view.apply([record])
        view.refresh()
    assert len(headings) <= 2  # the first at once, the rest waits for the pace
    last_query = f"(position {records[-1].fed_stop - 1})"
    qtbot.waitUntil(lambda: last_query in headings[-1], timeout=2_000)  # the last state, once the pace allows
    assert len(headings) <= 3
    for record in records[-3:]:  # a few more redraws, the last of them held back by the pace
        view.apply([record])
        view.refresh()
    layer = plan.n_layer - 1
    view.set_layer(layer)
    assert headings[-1].startswith(f"<b>Attention, layer {layer}</b>") and last_query in headings[-1]  # at once
