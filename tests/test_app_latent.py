"""Latent attention (MLA) shown honestly, with the attention of the DeepSeek-V2-Lite preset
(`random:deepseek-v2-lite-attention`: 16 heads, latent 512, RoPE key 64, keys of 128 + 64 and values of 128 per
head): the grid and its legend say the latent is computed and reused (each head's K and V are rebuilt from it every
pass), a layer opened into its parts draws them in proportion to their numbers, and the counter sets the numbers a
layer caches against what multi-head attention with the same heads would keep. Every figure below is a hand count
from the preset's sizes."""

from __future__ import annotations

import pytest
from helpers_checkpoints import plan_ids
from helpers_qt import drawn_left_labels

from kvviz.app.views.counter import CounterPanel
from kvviz.app.views.grid.kv_grid import KVGridView

PRESET = "random:deepseek-v2-lite-attention"


@pytest.fixture(scope="module")
def latent_run():
    """The preset's attention (its heads, latent, RoPE key and head sizes) on 2 layers and a narrow stream: the same
    numbers a layer and position, in a fraction of the time the 27-layer preset takes to build."""
    import dataclasses

    import torch

    from kvviz.engine.engine import Engine
    from kvviz.models.deepseek import PRESETS, Deepseek

    config = dataclasses.replace(PRESETS[PRESET.removeprefix("random:")], n_layer=2, vocab_size=300, n_embd=64,
                                 intermediate_size=64)
    model = Deepseek(config)
    model.init_weights(torch.Generator().manual_seed(0))
    engine = Engine(model.eval())
    plan = plan_ids(engine, [5, 17, 42], 2)
    return plan, list(engine.run(plan))


@pytest.fixture
def latent_grid(qtbot, latent_run):
    grid = KVGridView()
    qtbot.addWidget(grid)
    grid.resize(900, 900)
    grid.show()
    qtbot.waitExposed(grid)
    plan, records = latent_run
    grid.reset(plan)
    grid.apply(records)
    grid.refresh()
    return grid


def legend_texts(grid: KVGridView) -> list[str]:
    return [text.text() for _swatch, text, _state in grid.legend_row._entries if not text.parentWidget().isHidden()]


def test_the_legend_title_and_tooltips_of_a_latent_cache_say_the_latent_is_reused(latent_grid):
    texts = legend_texts(latent_grid)
    assert "latent reused from the cache (each head's K/V rebuilt from it)" in texts
    assert "latent computed this step" in texts
    assert not any("K/V reused" in text or "K/V computed" in text for text in texts)
    assert "latent (K/V rebuilt from it) per layer and position" in latent_grid.title.text()
    info = latent_grid.cell_info(0, 0)  # the prompt's first position: computed at step 1, reused since
    assert "latent computed at step 1" in info and "latent reused from the cache" in info
    assert "K/V computed" not in info
    assert "(512 + 64) × 4 bytes = 2,304 bytes" in info  # what the cache keeps of the layer and position
    assert "multi-head attention with its 16 heads would keep 16 × (192 + 128) × 4 = 20,480 bytes" in info


def test_a_cache_of_heads_keeps_its_k_v_words(qtbot, latent_grid, app_model):
    from kvviz.engine.engine import Engine
    from kvviz.sources.weights import load_model

    engine = Engine(load_model(app_model).model)
    plan = plan_ids(engine, engine.encode_prompt("Time flies"), 1)
    latent_grid.reset(plan)
    latent_grid.apply(list(engine.run(plan)))
    latent_grid.refresh()
    assert "K/V reused from the cache" in legend_texts(latent_grid)
    assert "<b>K/V per layer and position</b>" in latent_grid.title.text()


def test_a_layer_opened_draws_the_latent_eight_times_as_tall_as_the_rope_key(qtbot, latent_grid):
    """512 numbers against 64: 8 rows and 1, each labelled once with its numbers (as H opens layer 0)."""
    latent_grid.toggle_heads()  # View > Heads, key H: layer 0
    rows = latent_grid.display_rows()
    assert rows[:11] == [(0, None)] + [(0, 0)] * 8 + [(0, 1)] + [(1, None)]
    assert len(rows) == 2 + 9
    labels = dict((text, middle) for middle, text in latent_grid._rows.labels())
    assert labels["L0 latent c_kv (512)"] == pytest.approx(1 + 8 / 2)  # the middle of rows 1 to 8
    assert labels["L0 RoPE key k_pe (64)"] == pytest.approx(9.5)
    image = latent_grid.image_item.image
    assert image.shape[0] % len(rows) == 0  # every display row the same pixels: the latent's 8 are 8 times the key's
    qtbot.waitUntil(lambda: "L0 latent c_kv (512)" in [t for t, _, _ in drawn_left_labels(latent_grid.plot_widget)],
                    timeout=5_000)
    latent_grid.set_selected_layer(0)  # its outline covers its own row, the latent's 8 and the key's 1
    assert latent_grid._plot._outline.rect().height() == pytest.approx(10, abs=0.1)


def test_the_counter_sets_the_latent_against_multi_head_attention_with_the_same_heads(qtbot, latent_run):
    plan, records = latent_run
    counter = CounterPanel()
    qtbot.addWidget(counter)
    counter.show()
    counter.reset(plan)
    counter.apply(records)
    counter.refresh()
    text = counter.latent_note.text()
    assert counter.heading.text() == "Latent computations"  # one latent a position: each head's K/V rebuilt from it
    assert counter.latent_note.isVisible()
    assert "512 latent + 64 RoPE = 576 numbers a layer and position" in text
    # 5,120 / 576 = 8.89
    assert "multi-head attention with its 16 heads: 16 \u00d7 (192 + 128) = 5,120, 8.9\u00d7 more" in text
    assert "A position, 2 layers: 4,608 bytes against 40,960" in text  # 2 × 576 × 4 and 2 × 5,120 × 4
    assert records[-1].cache_bytes == 5 * 2 * 576 * 4  # the latent's bytes are what the cache measures (5 positions)


def test_the_counter_of_a_cache_of_heads_has_no_latent_line(qtbot, app_model):
    from kvviz.engine.engine import Engine
    from kvviz.sources.weights import load_model

    engine = Engine(load_model(app_model).model)
    plan = plan_ids(engine, engine.encode_prompt("Time flies"), 1)
    counter = CounterPanel()
    qtbot.addWidget(counter)
    counter.show()
    counter.reset(plan)
    assert counter.latent_note.isHidden() and counter.latent_note.text() == ""
    assert counter.heading.text() == "K/V computations"
    assert plan.multi_head_numbers == 0


def test_part_rows_are_proportional_and_say_so_where_they_cannot_be():
    from kvviz.app.views.grid.grid_rows import GridRows, part_rows

    assert part_rows((512, 64)) == (8, 1) and part_rows((16, 8)) == (2, 1)  # V2-Lite, the tests' small MLA
    assert part_rows((4096, 2)) == (16, 1)  # capped: 2,048 rows would bury the other layers
    rows = GridRows(2, 2, [1], parts=("latent c_kv", "RoPE key k_pe"), sizes=(4096, 2))
    assert [text for _, text in rows.labels()] == ["L0", "L1", "L1 latent c_kv (4096, not to scale)",
                                                   "L1 RoPE key k_pe (2)"]
