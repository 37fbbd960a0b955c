"""What the app shows of a model whose layers differ, read from real runs of tiny models of each family: the grid
names each layer's kind (a window, a shared layer that draws no cells and names its source, a linear-attention
state as one block with its bytes), the legend names what is on screen, the memory view draws a growing part and
a flat part that sum to the model's line (Gemma 3's and Qwen3.5's published shapes at 32k and 128k by hand count),
the attention view gives a learned sink its own entry and says why a linear layer has no weights, the counter adds
up bytes by kind, and compare mode says why cached and uncached stay exact."""

from __future__ import annotations

import pytest
import torch
from helpers_checkpoints import plan_ids
from helpers_qt import drawn_left_labels
from PySide6.QtWidgets import QLabel
from test_layer_kinds import CASES

from kvviz.app.theme import DARK
from kvviz.app.views.attention_view import AttentionView
from kvviz.app.views.counter import CounterPanel
from kvviz.app.views.grid.cell_states import COMPUTED, SHARED, STATE, STATE_NAMES
from kvviz.app.views.grid.grid_title import grid_title
from kvviz.app.views.grid.kv_grid import KVGridView
from kvviz.app.views.memory_view import PART_NAMES, MemoryView
from kvviz.core.records import RunRequest
from kvviz.engine.engine import Engine
from kvviz.lessons.lesson import measured_answer
from kvviz.models.gemma3 import PRESETS as GEMMA3
from kvviz.models.gemma3 import Gemma3
from kvviz.models.qwen3_5 import PRESETS as QWEN35
from kvviz.models.qwen3_5 import Qwen35

PROMPT = [5, 17, 3, 42, 8, 29, 11]  # 7 positions: the windows of 4 slide


def _run(family: str, attention: bool = False, use_cache: bool = True):
    build, _kinds, bytes_at = CASES[family]
    torch.manual_seed(3)
    model = build()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.normal_(0.0, 0.2 if parameter.dim() > 1 else 0.05)
            if "norm" in name:
                parameter.add_(1.0)
    engine = Engine(model.eval())
    plan = plan_ids(engine, PROMPT, 4, use_cache, attention=attention)
    return plan, list(engine.run(plan)), bytes_at


def _legend_shown(grid: KVGridView, state: int) -> bool:
    label = next(w for w in grid.findChildren(QLabel) if w.text() == STATE_NAMES[state])
    return label.isVisibleTo(grid)


@pytest.mark.parametrize("family", ["gemma4", "qwen3.5"])
def test_the_grid_names_each_layers_kind_and_draws_shared_and_state_rows_as_such(qtbot, family):
    plan, records, _ = _run(family)
    grid = KVGridView()
    qtbot.addWidget(grid)
    grid.resize(900, 500)
    grid.show()
    grid.reset(plan)
    grid.apply(records[:2])  # the prompt, then the first one-token step
    grid.refresh()
    def labels() -> list[str]:  # as the axis draws them, once the laid-out grid has room for every row's
        return [text for text, *_ in drawn_left_labels(grid.plot_widget)]

    states = grid.cell_states()
    if family == "gemma4":  # sliding, global, sliding, global, then two shared layers reading 2 and 3
        expected = ["L0 window 4", "L1 full", "L2 window 4", "L3 full", "L4 \u2192 L2", "L5 \u2192 L3"]
        qtbot.waitUntil(lambda: labels() == expected)
        assert (states[4:] == SHARED).all() and not (states[:4] == SHARED).any()
        assert _legend_shown(grid, SHARED) and not _legend_shown(grid, STATE)
    else:  # three Gated DeltaNet layers, attention, two more: a state of 1,792 bytes each
        qtbot.waitUntil(lambda: labels() == [f"L{i} state 1.75 KiB" for i in range(3)] + ["L3 full"] + [
            f"L{i} state 1.75 KiB" for i in (4, 5)])
        state_rows = states[[0, 1, 2, 4, 5]]
        assert (state_rows[:, :7] == STATE).all(), "one block after the prompt"
        grid.apply(records[2:3])
        grid.refresh()
        step = grid.cell_states()
        assert (step[[0, 1, 2, 4, 5], 8] == COMPUTED).all() and (step[[0, 1, 2, 4, 5], :8] == STATE).all()
        assert "reused 8" in grid.title.text()  # the attention layer read 8 positions; a state layer reads none
        assert _legend_shown(grid, STATE) and not _legend_shown(grid, SHARED)
        info = grid.cell_info(0, 2)
        assert "1,792 bytes" in info and "keeps no position" in info


@pytest.mark.parametrize(("family", "growing_layers"), [("gemma3", 2), ("qwen3.5", 1)])
def test_the_memory_view_draws_a_growing_part_and_a_flat_part_that_sum_to_the_model_line(qtbot, family,
                                                                                        growing_layers):
    plan, records, bytes_at = _run(family)
    view = MemoryView()
    qtbot.addWidget(view)
    view.reset(plan)
    view.apply(records)
    view.refresh()
    x, total = view.model_line()
    parts_x, growing, flat = view.model_parts()
    assert (parts_x == x).all() and torch.allclose(torch.tensor(growing + flat), torch.tensor(total))
    at = list(x).index(1000.0)
    assert total[at] == sum(bytes_at(1000))  # the family's own formula: the hand count of test_layer_kinds
    assert growing[at] == growing_layers * 1000 * 2 * 2 * 16 * 4  # the full layers: 2 KV heads of 16, float32
    assert set(PART_NAMES) <= set(view.end_labels())
    positions, measured = view.points()
    assert measured[-1] == records[-1].cache_bytes and total[list(x).index(positions[-1])] == measured[-1]
    assert "grows: " in view.formula.text() and "flat: " in view.formula.text()


@pytest.mark.parametrize(("model", "config", "at_32k", "at_128k"), [
    # Gemma 3 1B: 22 local layers of 512 positions, 4 global ones, 1 KV head of 256, float32
    (Gemma3, GEMMA3["gemma-3-1b"], 22 * 512 * 2 * 256 * 4 + 4 * 32768 * 2 * 256 * 4,
     22 * 512 * 2 * 256 * 4 + 4 * 131072 * 2 * 256 * 4),
    # Qwen3.5-0.8B: 6 attention layers of 2 KV heads of 256; 18 Gated DeltaNet states of (2 x 16 x 128 + 16 x 128)
    # channels x 3 inputs and 16 heads x 128 x 128, whatever the length
    (Qwen35, QWEN35["qwen3.5-0.8b"], 6 * 32768 * 2 * 2 * 256 * 4 + 18 * (6144 * 3 + 16 * 128 * 128) * 4,
     6 * 131072 * 2 * 2 * 256 * 4 + 18 * (6144 * 3 + 16 * 128 * 128) * 4),
])
def test_the_published_shapes_lines_at_32k_and_128k_are_the_families_formula(qtbot, model, config, at_32k, at_128k):
    with torch.device("meta"):  # the plan needs the shape, not the weights
        engine = Engine(model(config))
    plan = engine.plan(RunRequest(0, "", True, 4), [1, 2, 3])
    view = MemoryView()
    qtbot.addWidget(view)
    view.set_scale("linear")
    view.reset(plan)
    view.dtype_box.setCurrentText("float32")
    x, total = view.model_line()
    assert total[list(x).index(32768.0)] == at_32k and total[list(x).index(131072.0)] == at_128k


def test_the_attention_view_gives_a_learned_sink_its_own_column_and_says_why_a_state_has_none(qtbot):
    plan, records, _ = _run("gpt-oss", attention=True)
    view = AttentionView()
    qtbot.addWidget(view)
    view.reset(plan)
    view.apply(records)
    view.refresh()
    view._show_texts()  # the throttled texts, now
    weights = records[-2].attention  # the last token pass's
    for layer in range(weights.layers):
        for head in range(weights.heads):
            assert abs(sum(weights.row(layer, head)) + weights.sink_share(layer, head) - 1.0) < 1e-5
    lines = view.top_list.text().splitlines()
    assert len(lines) == plan.n_head and all(line.split(": ", 1)[1].startswith("sink 0.") for line in lines)
    assert "learned sink" in view.heading.text()

    plan, records, _ = _run("qwen3.5", attention=True)
    view.reset(plan)
    view.apply(records)
    view.refresh()
    view.set_layer(0)
    view._show_texts()
    assert "no attention weights over" in view.heading.text()
    view.set_layer(3)
    view._show_texts()
    assert "no attention weights" not in view.heading.text()


def test_the_counter_adds_up_each_kinds_bytes_and_compare_mode_says_why_it_stays_exact(qtbot):
    plan, records, bytes_at = _run("gemma4")
    counter = CounterPanel()
    qtbot.addWidget(counter)
    counter.reset(plan)
    counter.apply(records)
    counter.refresh()
    n = records[-1].fed_stop
    sizes = bytes_at(n)
    assert counter.layers_note.text() == (f"cache {sum(sizes):,} bytes by layer: 2 window layers "
                                          f"{sizes[0] + sizes[2]:,}, 2 full layers {sizes[1] + sizes[3]:,}, "
                                          "2 shared layers 0")
    values = counter.values()  # the shared layers compute no key or value: 4 of the 6 layers do
    assert values["with_cache_all_layers"] == 4 * values["with_cache"] == 4 * n
    assert values["without_cache_all_layers"] == 4 * values["without_cache"]
    assert counter.table.all_layers_header.text() == "all 4 computing layers"
    uncached, _records, _ = _run("qwen3.5", use_cache=False)
    title, _ = grid_title(uncached, None, "uncached", DARK)
    assert "exact: a state layer folds the same keys and values into its state either way" in title


def test_the_lessons_answers_are_measured_layer_by_layer():
    plan, records, bytes_at = _run("qwen3.5")
    state, attention = bytes_at(1)[0], bytes_at(1)[3]  # a layer's state; the attention layer's bytes a position
    assert measured_answer("cache_bytes_at_1k", records[-2], records[-1]) == 5 * state + 1000 * attention
    assert measured_answer("cache_bytes_per_token", records[-2], records[-1]) == attention
    plan, records, _ = _run("gemma4")
    assert measured_answer("shared_layer_kv", records[-2], records[-1]) == 0
    assert records[-1].kv_computed[0] == 1  # the layers below compute their key and value


def test_a_model_of_as_many_layers_whose_layers_differ_relabels_the_rows(qtbot):
    """The app's default model has 6 layers, as the lesson's Gemma 3 does: loading it after must not keep "L0"."""
    from kvviz.engine.engine import Engine as EngineOf
    from kvviz.sources.weights import load_model

    grid = KVGridView()
    qtbot.addWidget(grid)
    grid.resize(900, 500)
    grid.show()
    embedded = EngineOf(load_model(None).model)
    grid.reset(plan_ids(embedded, PROMPT, 2))
    grid.refresh()
    qtbot.waitUntil(lambda: [t for t, *_ in drawn_left_labels(grid.plot_widget)] == [f"L{i}" for i in range(6)])
    plan, records, _ = _run("gemma3")
    grid.reset(plan)
    grid.apply(records[:1])
    grid.refresh()
    expected = ["L0 window 4", "L1 window 4", "L2 full", "L3 window 4", "L4 window 4", "L5 full"]
    qtbot.waitUntil(lambda: [t for t, *_ in drawn_left_labels(grid.plot_widget)] == expected)
