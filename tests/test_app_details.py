"""Details a lecturer sees on the projector: the counter's three columns on one baseline at every zoom, and a
window title that names the model once and the app once."""

from __future__ import annotations

import numpy as np
import pytest
from helpers_checkpoints import plan_ids, tiny_kvviz_model
from PySide6.QtGui import QImage

from kvviz.app import theme
from kvviz.app.export.render import render_png
from kvviz.app.views.counter import CounterPanel


@pytest.fixture(scope="module")
def run():
    """A tiny model's cached run of "Time flies fast" and 12 new tokens: its plan and every record."""
    from kvviz.engine.engine import Engine

    engine = Engine(tiny_kvviz_model(n_layer=6, n_head=2, n_embd=32, n_ctx=64))
    prompt = "Time flies fast"
    plan = plan_ids(engine, engine.encode_prompt(prompt), 12, True, prompt=prompt, model_name="tiny")
    return plan, list(engine.run(plan))


def ink_bottom(image: np.ndarray, left: int, right: int, top: int, bottom: int, colour: str) -> int:
    """The lowest row of `image` between `top` and `bottom` with text of `colour` between `left` and `right`:
    the baseline of digits and of letters without descenders."""
    target = np.array(theme.rgba(colour)[:3], dtype=np.int16)
    region = image[top:bottom, left:right].astype(np.int16)
    rows = np.where((np.abs(region - target).max(axis=2) <= 60).any(axis=1))[0]
    assert len(rows), (left, right, top, bottom)
    return top + int(rows.max())


@pytest.mark.parametrize("scale", [1.0, 1.6, 1.9])
def test_the_counters_columns_share_each_rows_baseline(scale, qtbot, run):
    """'with cache  15  90': the per-layer number (large) and the all-layers one (small) stood on different
    lines, the small one higher; now a row's name and both numbers end on the same pixel row."""
    plan, records = run
    counter = CounterPanel()
    qtbot.addWidget(counter)
    counter.set_font_scale(scale)
    counter.reset(plan)
    counter.apply(records)
    counter.resize(round(420 * scale), round(330 * scale))
    counter.show()
    qtbot.waitExposed(counter)
    counter.refresh()
    width = counter.width()
    image = render_png(counter, width).convertToFormat(QImage.Format.Format_RGB888)  # one image pixel per pixel
    rgb = np.frombuffer(image.constBits(), np.uint8, image.sizeInBytes()).reshape(
        image.height(), image.bytesPerLine())[:, : width * 3].reshape(image.height(), width, 3)
    assert counter.values()["with_cache"] == 15 and counter.values()["with_cache_all_layers"] == 90
    for key, colour in (("with_cache", theme.DARK.teal), ("without_cache", theme.DARK.amber)):
        labels = counter.table.labels[key]
        top = min(label.geometry().top() for label in labels)
        bottom = max(label.geometry().bottom() for label in labels) + 1
        baselines = [ink_bottom(rgb, label.geometry().left(), label.geometry().right() + 1, top, bottom, colour)
                     for label in labels]
        assert max(baselines) - min(baselines) <= 1, (key, baselines)


def test_the_window_title_names_the_model_once_and_the_app_once(window, qtbot):
    """Qt adds the application's display name ("kvviz") to every window title on Linux and Windows: the title
    itself is the model, not "kvviz — model" (shown as "kvviz — kvviz-shakespeare — kvviz")."""
    name = window.session.model_info.name
    qtbot.waitUntil(lambda: window.windowTitle() == name, timeout=10_000)
    assert "kvviz \u2014" not in window.windowTitle()


def test_the_window_title_before_a_model_is_the_apps_purpose(qtbot, app_model):
    from kvviz.app.assembly import open_window
    from kvviz.app.settings import app_settings

    window = open_window(app_model, "Hi", settings=app_settings())
    qtbot.addWidget(window)
    assert window.windowTitle() == "KV cache visualiser"
    window.close()
