"""The memory view: the run's measured cache bytes on its model's line, reference lines from their
configs (a sliding window flattens), and M in the window."""

from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import Qt

from kvviz.app.views.memory_view import MemoryView

PROMPT = "Time flies fast"  # 3 tokens


@pytest.fixture(scope="module")
def engine(app_model):
    from kvviz.engine import Engine
    from kvviz.weights import load_model

    return Engine(load_model(app_model).model)


def test_measured_points_lie_on_the_models_line(qtbot, engine):
    plan = engine.plan(engine.encode_prompt(PROMPT), 12, True)
    records = list(engine.run(plan))
    view = MemoryView()
    qtbot.addWidget(view)
    view.reset(plan)
    view.apply(records)
    view.refresh()
    positions, measured = view.points()
    config = engine.model.config
    per_token = 2 * config.n_layer * config.n_head * (config.n_embd // config.n_head) * 4  # float32, by hand
    assert positions.tolist() == list(range(3, 16))  # the prefill's 3, then one per pass to 3 + 12
    assert measured.tolist() == [p * per_token for p in positions]  # read from the cache's tensors
    x, y = view.model_line()
    on_line = {int(a): b for a, b in zip(x, y, strict=True)}
    assert all(on_line[int(p)] == m for p, m in zip(positions, measured, strict=True))
    assert x[-1] == 131072 and y[-1] == 131072 * per_token
    curve_x, curve_y = view.points_curve.getData()  # the plot's log10 coordinates
    assert np.allclose(10**curve_x, positions) and np.allclose(10**curve_y, measured)


def test_the_sliding_window_line_flattens_at_its_window(qtbot):
    view = MemoryView()
    qtbot.addWidget(view)
    view.dtype_box.setCurrentText("bfloat16")
    x, y = view.reference_line("Mistral-7B")
    per_token = 2 * 32 * 8 * 128 * 2  # 131072, Mistral-7B's config in bf16
    assert 4096 in x.tolist()
    assert np.all(y[x >= 4096] == 4096 * per_token)
    assert np.all(y[x <= 4096] == x[x <= 4096] * per_token)
    llama_x, llama_y = view.reference_line("Llama-3-8B")  # no window: it keeps growing
    assert llama_y[-1] == 131072 * per_token
    view.batch_spin.setValue(4)
    assert view.reference_line("Mistral-7B")[1][-1] == 4 * 4096 * per_token
    assert 10 ** view.reference_curves["Mistral-7B"].getData()[1][-1] == pytest.approx(4 * 4096 * per_token)


def test_m_shows_the_memory_view_beside_a_run(qtbot, app_model):
    from kvviz.app.main_window import MainWindow
    from kvviz.app.settings import app_settings

    window = MainWindow(app_model, PROMPT, settings=app_settings())
    qtbot.addWidget(window)
    window.show()
    qtbot.waitUntil(lambda: window.session.plan is not None, timeout=60_000)
    assert not window.workspace.memory_view.isVisible()
    qtbot.keyClick(window, Qt.Key.Key_M)
    assert window.workspace.memory_view.isVisible() and window.actions["memory"].isChecked()
    for n in range(1, 4):
        qtbot.keyClick(window, Qt.Key.Key_Space)
        qtbot.waitUntil(lambda n=n: window.session.last_record is not None
                        and window.session.last_record.new_tokens == n, timeout=30_000)
    window.redraw()
    positions, measured = window.workspace.memory_view.points()
    assert positions.tolist() == [3, 4, 5]  # three passes: the prefill's 3 positions, then one each
    assert measured[-1] == window.session.last_record.cache_bytes
    qtbot.keyClick(window, Qt.Key.Key_M)
    assert not window.workspace.memory_view.isVisible()
    window.close()
