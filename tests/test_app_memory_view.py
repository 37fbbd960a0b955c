"""The memory view: the run's measured cache bytes on its model's line, reference lines from their
configs (a sliding window flattens), every line in a colour and dash of its own and named at its end, log or
linear axes, and M in the window."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from helpers_checkpoints import plan_ids
from PySide6.QtCore import QPointF, Qt

from kvviz.app.views.memory_view import PART_NAMES, SHOWN_REFERENCES, MemoryView

PROMPT = "Time flies fast"  # 3 tokens


@pytest.fixture(scope="module")
def engine(app_model):
    from kvviz.engine.engine import Engine
    from kvviz.sources.weights import load_model

    return Engine(load_model(app_model).model)


def test_measured_points_lie_on_the_models_line(qtbot, engine):
    plan = plan_ids(engine, engine.encode_prompt(PROMPT), 12, True)
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
    from kvviz.app.assembly import open_window
    from kvviz.app.settings import app_settings

    window = open_window(app_model, PROMPT, settings=app_settings())
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


# ----- every line told apart: colour, dash, its name at its end; log or linear axes -----

# Machado, Oliveira & Fernandes (2009), severity 1.0, on linear RGB: how the colours look to a dichromat
CVD = {"protanopia": ((0.152286, 1.052583, -0.204868), (0.114503, 0.786281, 0.099216),
                      (-0.003882, -0.048116, 1.051998)),
       "deuteranopia": ((0.367322, 0.860646, -0.227968), (0.280085, 0.672501, 0.047413),
                        (-0.011820, 0.042940, 0.968881))}
LYING_ON_EACH_OTHER = (("gpt2-xl", "Llama-3-70B"), ("Llama-3-8B", "Mistral-7B"), ("this model", "Falcon-7B"))


def linear_rgb(hex_colour: str) -> np.ndarray:
    c = np.array([int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)]) / 255
    return np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)


def lab(rgb: np.ndarray) -> np.ndarray:
    """CIE L*a*b* (D65) of linear sRGB."""
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]) @ np.clip(rgb, 0, 1)
    t = xyz / np.array([0.95047, 1.0, 1.08883])
    f = np.where(t > (6 / 29) ** 3, np.cbrt(t), t / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def delta_e(a: str, b: str, vision: str | None = None) -> float:
    """CIE76 colour difference of two colours, as seen with normal vision or `vision`."""
    ra, rb = linear_rgb(a), linear_rgb(b)
    if vision is not None:
        ra, rb = np.array(CVD[vision]) @ ra, np.array(CVD[vision]) @ rb
    return float(np.linalg.norm(lab(ra) - lab(rb)))


def test_the_colour_difference_formula_gives_known_values():
    assert delta_e("#FFFFFF", "#000000") == pytest.approx(100.0, abs=0.1)
    assert delta_e("#FF0000", "#00FF00", "deuteranopia") < delta_e("#FF0000", "#00FF00") / 2  # red/green merge
    assert delta_e("#0000FF", "#FFFF00", "deuteranopia") > 80  # blue/yellow stays


def pens(view: MemoryView) -> dict[str, object]:
    return {name: curve.opts["pen"] for name, curve in view.curves().items()}


def dashes(pen) -> tuple[float, ...]:
    return () if pen.style() == Qt.PenStyle.SolidLine else tuple(pen.dashPattern())


@pytest.mark.parametrize("palette_name", ["dark", "light"])
def test_every_line_has_a_colour_and_a_dash_of_its_own(qtbot, palette_name):
    from test_app_theme import contrast

    from kvviz.app import theme

    palette = theme.get(palette_name)
    view = MemoryView()
    qtbot.addWidget(view)
    view.set_theme(palette)
    drawn = pens(view)
    assert set(drawn) == {"this model", *PART_NAMES, *SHOWN_REFERENCES}
    parts = {name: drawn.pop(name) for name in PART_NAMES}  # a hybrid model's two parts: its own colour, dashed
    assert {pen.color().name().upper() for pen in parts.values()} == {palette.teal}
    assert len({dashes(pen) for pen in parts.values()} - {()}) == 2
    colours = {name: pen.color().name().upper() for name, pen in drawn.items()}
    assert colours["this model"] == palette.teal and palette.amber not in colours.values()
    references = [name for name in drawn if name != "this model"]
    assert len({dashes(drawn[name]) for name in references}) == len(references), "a dash pattern each"
    assert dashes(drawn["this model"]) == () and all(
        drawn["this model"].widthF() >= 1.5 * drawn[name].widthF() for name in references), "this model: wide, solid"
    for name in references:  # lines, and the names written in their colours: as text
        assert contrast(colours[name], palette.background) >= 4.5, (name, colours[name])
    assert contrast(palette.teal, palette.background) >= 3.0  # the run's teal, bold, as everywhere in the app
    for a, b in itertools.combinations(colours, 2):
        assert delta_e(colours[a], colours[b]) >= 30, (a, b)
    for a, b in LYING_ON_EACH_OTHER:  # and told apart by colour-blind eyes too, not by the dash alone
        for vision in CVD:
            assert delta_e(colours[a], colours[b], vision) >= 20, (a, b, vision)
    for name, text in view.end_labels().items():
        assert text.color.name().upper() == colours[name]


def label_boxes(view: MemoryView) -> dict[str, object]:
    return {name: text.sceneBoundingRect() for name, text in view.end_labels().items()}


def end_point(view: MemoryView, name: str) -> QPointF:
    x, y = view.curves()[name].getData()
    return view.plot_item.getViewBox().mapViewToScene(QPointF(float(x[-1]), float(y[-1])))


def assert_named_at_their_ends(view: MemoryView) -> None:
    """Each line's name just right of its end, in the view box, level with it or stacked near it, none on
    another."""
    box = view.plot_item.getViewBox().sceneBoundingRect()
    boxes = label_boxes(view)
    assert set(boxes) == {"this model", *SHOWN_REFERENCES}
    for name, rect in boxes.items():
        assert view.end_labels()[name].toPlainText() == name
        end = end_point(view, name)
        assert 0 <= rect.left() - end.x() <= 12, (name, rect, end)
        assert abs(rect.center().y() - end.y()) <= 3 * rect.height(), (name, rect, end)
        assert box.adjusted(-1, -1, 1, 1).contains(rect), (name, rect, box)
    for a, b in itertools.combinations(boxes, 2):
        overlap = boxes[a].intersected(boxes[b])
        assert overlap.height() <= 1 or overlap.width() <= 1, (a, b, boxes[a], boxes[b])


@pytest.fixture
def shown(qtbot, engine):
    """A memory view of a 3-token run, at the size of its column."""
    plan = plan_ids(engine, engine.encode_prompt(PROMPT), 4, True)
    view = MemoryView()
    qtbot.addWidget(view)
    view.resize(460, 640)
    view.show()
    qtbot.waitExposed(view)
    view.reset(plan)
    view.apply(list(engine.run(plan)))
    view.refresh()
    return view


def test_every_line_is_named_at_its_end_at_a_readable_size(qtbot, shown):
    assert_named_at_their_ends(shown)
    tick = shown.plot_item.getAxis("left").style["tickFont"].pointSizeF()
    assert all(text.textItem.font().pointSizeF() >= max(10.0, tick) for text in shown.end_labels().values())
    near = label_boxes(shown)
    assert abs(near["gpt2-xl"].center().y() - near["Llama-3-70B"].center().y()) >= near["gpt2-xl"].height() - 1
    shown.set_font_scale(1.6)  # presenter mode
    qtbot.waitUntil(lambda: all(t.textItem.font().pointSizeF() == 16.0 for t in shown.end_labels().values()))
    assert_named_at_their_ends(shown)


def test_linear_axes_show_the_growth_as_straight_lines_from_zero(qtbot, shown, engine):
    config = engine.model.config
    per_token = 2 * config.n_layer * config.n_head * (config.n_embd // config.n_head) * 4  # float32, by hand
    assert shown.scale() == "log" and shown.scale_box.findText("linear") >= 0
    shown.set_scale("linear")
    for name in ("bottom", "left"):
        assert shown.plot_item.getAxis(name).logMode is False
    x, y = shown.model_curve.getData()  # the plot's own coordinates, now bytes and tokens
    assert x[-1] == 131072 and y[-1] == 131072 * per_token and np.array_equal(y, x * per_token)
    vb = shown.plot_item.getViewBox()
    (x_low, x_high), (y_low, y_high) = vb.viewRange()
    assert x_low == 0 and x_high >= 131072 and y_low == 0
    llama = shown.reference_curves["Llama-3-70B"].getData()[1][-1]
    assert llama == 2 * 80 * 8 * 128 * 4 * 131072 and y_high >= llama  # in the run's float32: every end is in
    pixels = [vb.mapViewToScene(QPointF(float(a), float(b))) for a, b in zip(x[::20], y[::20], strict=True)]
    slopes = {round((p.y() - pixels[0].y()) / (p.x() - pixels[0].x()), 3) for p in pixels[1:]}
    assert len(slopes) == 1, "a straight line on the screen"
    origin = vb.mapViewToScene(QPointF(0, 0))
    assert abs((pixels[0].y() - origin.y()) / (pixels[0].x() - origin.x() or 1) - slopes.pop()) < 0.01, "through 0"
    assert [line.value() for line in shown.budget_lines] == [8e9, 24e9, 80e9]
    assert "128k" in [text for _value, text in shown.plot_item.getAxis("bottom")._tickLevels[0]]
    assert_named_at_their_ends(shown)
    shown.set_scale("log")
    assert shown.plot_item.getAxis("bottom").logMode is True
    assert np.allclose(10 ** shown.model_curve.getData()[1], y)
    assert_named_at_their_ends(shown)
    with pytest.raises(ValueError, match="scale must be one of"):
        shown.set_scale("semilog")


def test_at_1280x720_the_memory_column_shows_the_whole_plot(qtbot, app_model):
    from kvviz.app.assembly import open_window
    from kvviz.app.settings import app_settings

    window = open_window(app_model, PROMPT, settings=app_settings())
    qtbot.addWidget(window)
    window.show()
    qtbot.waitUntil(lambda: window.session.plan is not None, timeout=60_000)
    window.resize(1280, 690)  # a 1280x720 screen less the title bar
    qtbot.waitUntil(lambda: (window.width(), window.height()) == (1280, 690), timeout=5_000)
    qtbot.keyClick(window, Qt.Key.Key_M)
    memory = window.workspace.memory_view
    qtbot.waitUntil(lambda: memory.isVisible() and memory.plot_widget.height() >= 250, timeout=5_000)
    qtbot.waitUntil(lambda: memory.visibleRegion().boundingRect().height() == memory.height(), timeout=5_000)
    axis = memory.plot_item.getAxis("bottom")  # the context axis, at the plot's foot, is on the screen
    foot = memory.plot_widget.mapTo(memory, memory.plot_widget.mapFromScene(axis.sceneBoundingRect().bottomLeft()))
    assert foot.y() <= memory.height()
    window.close()


# ----- like with like: every line in one precision, named on the axis -----

def test_every_line_is_drawn_in_one_precision_and_the_axis_names_it(qtbot):
    """A model with DeepSeek-V2-Lite's cache (27 layers x (512 + 64) numbers, on a narrow residual stream) lies on
    DeepSeek-V2-Lite's reference line in the run's float32 and in bfloat16; its measured points show only in the
    precision they were measured in."""
    import torch

    from kvviz.engine.engine import Engine
    from kvviz.models.deepseek import Deepseek, DeepseekConfig

    model = Deepseek(DeepseekConfig(vocab_size=1000, n_ctx=64, n_layer=27, n_head=2, n_embd=32, intermediate_size=32,
                                    kv_lora_rank=512, qk_nope_head_dim=8, qk_rope_head_dim=64, v_head_dim=8))
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.ones_like(p) if "norm" in name else 0.02 * torch.randn_like(p))
    engine = Engine(model.eval())
    plan = plan_ids(engine, [464, 290, 17], 1, True)
    view = MemoryView()
    qtbot.addWidget(view)
    view.reset(plan)
    view.apply(list(engine.run(plan)))
    view.refresh()
    for precision, size in (("float32", 4), ("bfloat16", 2)):
        view.dtype_box.setCurrentText(precision)
        x, y = view.model_line()
        assert y[-1] == 131072 * 27 * 576 * size  # by hand
        ref_x, ref_y = view.reference_line("DeepSeek-V2-Lite")
        assert np.interp(x, ref_x, ref_y) == pytest.approx(y)
        assert view.plot_item.getAxis("left").labelText == f"bytes, {precision}"
        assert f"in {precision}: {27 * 576 * size:,} bytes per token" in view.formula.text()
    assert view.points()[0].size == 0 and "choose float32 to see the points" in view.formula.text()
    view.dtype_box.setCurrentText("float32")
    assert view.points()[1].tolist() == [3 * 27 * 576 * 4, 4 * 27 * 576 * 4]  # measured, at 3 and 4 positions
    # a step at 4 positions, a layer: the naive one rebuilds 2 heads x (72 + 8) numbers x 4 positions x 4 bytes =
    # 2,560 bytes = 2.5 KiB; the absorbed one 2 scores x 4 positions x 4 bytes = 32 bytes; the latent 576 x 4
    assert ("a decode step keeps the latent, 2,304 bytes a position and layer; to attend at 4 positions the naive "
            "step (deepseek.py) rebuilds each head's key and value, 2 \u00d7 (72 + 8) numbers a position: 2.5 KiB a "
            "layer; the absorbed step (deepseek_fast.py) scores the latents, 2 numbers a position: 32 B"
            ) in view.formula.text()


def test_on_a_slide_the_gb_labels_stand_apart_and_axis_titles_and_controls_read_as_the_ticks(qtbot, engine):
    view = MemoryView()
    qtbot.addWidget(view)
    view.resize(1100, 700)
    view.set_font_scale(1.9)  # a slide's
    view.show()
    qtbot.waitExposed(view)
    plan = plan_ids(engine, engine.encode_prompt(PROMPT), 2, True)
    view.reset(plan)
    view.refresh()

    def boxes():
        return [line.label.sceneBoundingRect() for line in view.budget_lines]

    for scale in ("log", "linear"):
        view.set_scale(scale)
        qtbot.waitUntil(lambda: all(not b.isEmpty() for b in boxes()))
        for a, b in itertools.combinations(boxes(), 2):
            assert not a.intersects(b), (scale, a, b)
    tick = view.plot_item.getAxis("left").style["tickFont"].pointSizeF()
    for name in ("left", "bottom"):
        assert view.plot_item.getAxis(name).label.font().pointSizeF() >= tick
    view.batch_spin.setValue(16)
    axis = view.plot_item.getAxis("left")
    title, room = axis.label.sceneBoundingRect(), axis.sceneBoundingRect()
    assert title.left() >= 0 and title.top() >= room.top() and title.bottom() <= room.bottom(), (title, room)
    assert all(widget.font().pointSizeF() >= tick for widget in view.controls)
