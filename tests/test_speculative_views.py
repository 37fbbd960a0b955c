"""The views of speculative decoding, fed a real speculative run (prompt lookup, k = 4) of a tiny Llama whose
embeddings are zero, so that it always picks token 0 (test_speculative's hand-counted round): the prompt
[7, 0, 0, 0, 3, 9, 7] gives round 0 (the prompt's pass, token 1 at position 7), then round 1, which feeds the pending
token at 7 and the drafts [0, 0, 3, 9] at 8..11, accepts two (8, 9), adds its own 0 at 10 and rolls back 10 and 11,
then round 2 (6 new tokens in all), which feeds 10 and the draft 0 at 11 and accepts it.

The K/V grid draws the drafts (accepted, and rejected struck through for one step), the counter counts them, the
token strip shows every token a round adds, and the chart puts target passes against tokens generated."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_speculative import _llama

from kvviz.app import theme
from kvviz.app.theme import DARK, LIGHT
from kvviz.app.views.attention_state import AttentionState
from kvviz.app.views.counter import CounterPanel
from kvviz.app.views.grid.cell_states import (
    COMPUTED,
    DRAFTED,
    EMPTY,
    PENDING,
    REUSED,
    ROLLED_BACK,
    STATE_NAMES,
)
from kvviz.app.views.grid.grid_cells import cell_tile, state_colours
from kvviz.app.views.grid.kv_grid import KVGridView
from kvviz.app.views.memory_state import MemoryState
from kvviz.app.views.status import StatusLine
from kvviz.app.views.token_strip import TokenStrip
from kvviz.app.views.work_chart import WorkChart
from kvviz.core.records import RunRequest
from kvviz.engine.engine import Engine

PROMPT = [7, 0, 0, 0, 3, 9, 7]
N = 6


@pytest.fixture(scope="module")
def engine() -> Engine:
    model = _llama(1)
    with torch.no_grad():
        model.model.embed_tokens.weight.zero_()  # tied: the head is zero too, every logit 0: token 0 each time
    return Engine(model)


@pytest.fixture(scope="module")
def run(engine):
    """(plan, records) of the speculative run, and of the same prompt decoded plainly."""
    runs = {}
    for name, fields in (("speculative", {"draft_tokens": 4, "prompt_lookup": 1}), ("plain", {})):
        plan = engine.plan(RunRequest(0, "", True, N, **fields), PROMPT)
        runs[name] = plan, list(engine.run(plan))
    plan, records = runs["speculative"]
    rounds = [r.speculation for r in records]  # the hand count this file checks the views against
    assert [(r.fed_start, r.fed_stop) for r in records] == [(0, 7), (7, 12), (10, 12)]
    assert [(s.drafted, s.accepted, s.rolled_back) for s in rounds[1:]] == [((0, 0, 3, 9), 2, (10, 12)),
                                                                            ((0,), 1, (12, 12))]
    return runs


def _grid(qtbot, plan) -> KVGridView:
    view = KVGridView()
    qtbot.addWidget(view)
    view.resize(900, 420)
    view.show()
    qtbot.waitExposed(view)
    view.reset(plan)
    return view


def _columns(states: np.ndarray) -> list[int]:
    """The state of each position, checked to be the same in every layer row."""
    assert (states == states[0]).all(), states
    return states[0].tolist()


def test_a_round_shows_its_drafts_accepted_and_rolled_back_then_clears_them(qtbot, run):
    plan, records = run["speculative"]
    view = _grid(qtbot, plan)
    view.apply(records[:1])
    view.refresh()
    assert _columns(view.cell_states()) == [COMPUTED] * 7 + [PENDING] + [EMPTY] * 5  # round 0: a plain prefill
    view.apply(records[1:2])
    view.refresh()
    # the pending token computed (amber), the drafts the target accepted drafted, the two it rejected struck through
    assert _columns(view.cell_states()) == [REUSED] * 7 + [COMPUTED, DRAFTED, DRAFTED, ROLLED_BACK, ROLLED_BACK,
                                                            EMPTY]
    title = view.title.text()
    assert "step 2 (round 1, tokens 2\u20134: 2 of 4 drafts accepted, 2 rolled back)" in title
    assert "computed 5 positions" in title and "reused 7" in title
    info = view.cell_info(1, 10)  # the rejected draft 3 ("$") stood where the target's own token 0 ("!") goes
    assert "token: !" in info and "the draft $" in info and "rejected" in info and "rolled back" in info
    assert "the draft *" in view.cell_info(0, 11) and "(not generated yet)" in view.cell_info(0, 11)
    assert "accepted" in view.cell_info(2, 9) and "stays in the cache" in view.cell_info(2, 9)
    view.apply(records[2:])
    view.refresh()
    # the accepted drafts 8 and 9 are read from the cache now (teal); 10 is computed, 11 drafted and accepted
    assert _columns(view.cell_states()) == [REUSED] * 10 + [COMPUTED, DRAFTED, PENDING]
    assert "round 2, tokens 5\u20136: 1 of 1 draft accepted" in view.title.text()


def test_rolled_back_positions_past_the_text_are_struck_through_for_one_step_then_gone(qtbot):
    """A target (random weights) that rejects all four drafts of a round, and then drafts nothing: the round's
    rolled-back positions past the text are struck through at its record, and empty at the next one."""
    prompt = [5, 17, 3, 42, 8, 5, 17, 3, 42, 8, 1, 2, 3, 4, 5, 17]  # lookup of 17 proposes 3, 42, 8, 1, then 2, 3...
    engine = Engine(_llama(3))
    plan = engine.plan(RunRequest(0, "", True, 16, draft_tokens=4, prompt_lookup=1), prompt)
    records = list(engine.run(plan))[:4]
    third, fourth = records[2], records[3]
    assert (third.fed_start, third.fed_stop, third.speculation.accepted, third.speculation.rolled_back) == \
        (17, 22, 0, (18, 22))
    assert (fourth.fed_start, fourth.fed_stop, fourth.speculation.drafted) == (18, 19, ())
    view = _grid(qtbot, plan)
    view.apply(records[:3])
    assert _columns(view.cell_states())[16:23] == [REUSED, COMPUTED] + [ROLLED_BACK] * 4 + [EMPTY]
    view.apply(records[3:])
    # 18 is the pending token, computed now; 19 the text's next token; 20 and 21 are gone (no token is there)
    assert _columns(view.cell_states())[16:23] == [REUSED, REUSED, COMPUTED, PENDING, EMPTY, EMPTY, EMPTY]
    assert "position does not exist yet" in view.cell_info(0, 20) and "computed at" not in view.cell_info(0, 20)


def test_the_grid_draws_drafts_in_their_colour_and_rejected_ones_struck_through(qtbot, run):
    plan, records = run["speculative"]
    view = _grid(qtbot, plan)
    view.apply(records[:2])
    view.refresh()
    image = view.image_item.image  # (rows × s, positions × s, 4), as CellTiles paints it
    s = image.shape[1] // plan.width
    assert image.shape[0] == plan.n_layer * s

    def pixel(layer: int, position: int, y: int, x: int) -> tuple[int, ...]:
        return tuple(int(v) for v in image[layer * s + y, position * s + x, :3])

    shown = theme.current()
    drafted, rolled, ink = (theme.rgba(c)[:3] for c in (shown.drafted, shown.rolled_back, shown.foreground))
    for layer in range(plan.n_layer):
        assert pixel(layer, 8, 2, 2) == drafted and pixel(layer, 9, 2, 2) == drafted
        assert pixel(layer, 7, 2, 2) == theme.rgba(shown.amber)[:3]
        for position in (10, 11):
            assert pixel(layer, position, 2, 2) == rolled  # faded above the line
            struck = [y for y in range(s) if pixel(layer, position, y, s // 2) == ink]
            assert struck and s // 4 < struck[0] <= struck[-1] < 3 * s // 4  # one line across the middle
            assert pixel(layer, position, struck[0], s - 1) == ink  # through the gap: 10 and 11 read as one line


@pytest.mark.parametrize("palette", [DARK, LIGHT], ids=["dark", "light"])
def test_drafted_cells_have_their_own_colour_and_pattern_in_both_themes(palette):
    colours = state_colours(palette)
    others = {colour for state, colour in colours.items() if state not in (DRAFTED, ROLLED_BACK)}
    assert palette.drafted not in others and palette.rolled_back not in others
    assert contrast(palette.drafted, palette.background) >= 3.0  # a slide on a projector
    assert contrast(palette.foreground, palette.rolled_back) >= 3.0  # the strike on the faded cell
    tiles = {state: cell_tile(state, 16, True, palette) for state in STATE_NAMES}
    for state, tile in tiles.items():  # colour-blind mode: a pattern of their own
        if state != DRAFTED:
            assert not np.array_equal(tiles[DRAFTED], tile), state
    plain = cell_tile(DRAFTED, 16, False, palette)
    assert not np.array_equal(plain, tiles[DRAFTED])  # the hollow square is the colour-blind pattern
    line = np.array(theme.rgba(palette.grid_line))
    assert (np.abs(tiles[DRAFTED][1:13, 1:13].astype(int) - line).max(axis=2) == 0).sum() >= 20
    ink = np.array(theme.rgba(palette.foreground))
    for colour_blind in (False, True):  # struck through in every look
        struck = cell_tile(ROLLED_BACK, 16, colour_blind, palette)
        assert (struck == ink).all(axis=2).all(axis=1).sum() >= 1  # a whole row of the text's colour


def test_the_legend_names_the_drafts_for_a_speculative_run_only(qtbot, run):
    view = _grid(qtbot, run["plain"][0])
    legend = view.legend_row
    assert not legend.is_shown(DRAFTED) and not legend.is_shown(ROLLED_BACK) and legend.is_shown(COMPUTED)
    view.reset(run["speculative"][0])
    assert legend.is_shown(DRAFTED) and legend.is_shown(ROLLED_BACK)
    texts = [text.text() for _swatch, text, state in legend._entries if state in (DRAFTED, ROLLED_BACK)]
    assert texts == ["draft accepted: K/V computed this step, kept",
                     "draft rejected: K/V rolled back (struck through for one step)"]
    view.reset(run["plain"][0])
    assert not legend.is_shown(DRAFTED)


def test_a_plain_run_draws_no_draft(qtbot, run):
    plan, records = run["plain"]
    view = _grid(qtbot, plan)
    for record in records:
        view.apply([record])
        states = view.cell_states()
        assert not np.isin(states, (DRAFTED, ROLLED_BACK)).any()
    assert _columns(view.cell_states()) == [REUSED] * 12 + [COMPUTED]  # the last pass fills the cache


def test_the_memory_view_measures_the_cache_after_the_rollback(run):
    """The cache's bytes are measured after a round's crop: they are the bytes of the positions it kept (7, then
    10, then 12), not of every position it fed (12 at round 1)."""
    plan, records = run["speculative"]
    memory = MemoryState(plan)
    for record in records:
        memory.apply(record)
    assert sorted(memory.points) == [7, 10, 12]
    per_position = {n: b / n for n, b in memory.points.items()}
    assert per_position[7] == per_position[10] == per_position[12] == plan.cache_bytes_per_position


def test_the_counter_counts_the_drafts(qtbot, run):
    plan, records = run["speculative"]
    counter = CounterPanel()
    qtbot.addWidget(counter)
    counter.show()
    counter.reset(plan)
    assert counter.speculation.isVisibleTo(counter)
    assert counter.values()["drafted"] is None and counter.speculation.shown_texts()["drafted"][0] == "\u2013"
    counter.apply(records[:2])
    counter.refresh()
    values = counter.values()
    assert (values["drafted"], values["accepted"], values["rolled_back"]) == (4, 2, 2)
    assert values["acceptance_rate"] == 0.5 and values["tokens_per_target_pass"] == 2.0
    shown = counter.speculation.shown_texts()
    assert shown["drafted"][0] == "4" and shown["accepted"][0] == "2" and shown["rolled_back"][0] == "2"
    assert shown["acceptance_rate"] == ("50%", "2 of 4 drafts")
    assert shown["tokens_per_target_pass"][0] == "2.00" and "4 tokens, 2 passes" in shown[
        "tokens_per_target_pass"][1]
    counter.apply(records[2:])
    counter.refresh()
    values = counter.values()
    assert (values["drafted"], values["accepted"], values["rolled_back"]) == (5, 3, 2)
    assert values["acceptance_rate"] == 0.6 and values["tokens_per_target_pass"] == 2.0
    assert counter.speculation.shown_texts()["acceptance_rate"] == ("60%", "3 of 5 drafts")
    assert "6 tokens, 3 passes" in counter.speculation.shown_texts()["tokens_per_target_pass"][1]
    assert "Speculative decoding: prompt lookup of 1-grams, 4 drafts a round" == counter.speculation.heading.text()
    counter.reset(run["plain"][0])  # a plain run: as before, no drafts
    assert not counter.speculation.isVisibleTo(counter) and "drafted" not in counter.values()


def test_the_token_strip_and_the_attention_view_take_every_token_a_round_adds(qtbot, run):
    plan, records = run["speculative"]
    strip = TokenStrip()
    qtbot.addWidget(strip)
    strip.resize(600, 80)
    strip.show()
    strip.reset(plan)
    prompt = list(plan.prompt_labels)
    assert prompt == ["(", "!", "!", "!", "$", "*", "("]
    strip.apply(records[:1])
    assert strip.tokens() == [*prompt, "!"] and strip.newest_index == 7
    strip.apply(records[1:2])  # the accepted drafts 0, 0 and the target's own 0: three chips
    assert strip.tokens() == [*prompt, "!", "!", "!", "!"]
    assert list(strip.accepted_indices) == [8, 9] and strip.newest_index == 10
    strip.apply(records[2:])
    assert len(strip.tokens()) == len(prompt) + N and list(strip.accepted_indices) == [11]
    assert strip.newest_index == 12
    attention = AttentionState(plan)
    for record in records:
        attention.apply(record)
    assert attention.labels == [*prompt, *["!"] * N]
    assert "no single query's weights" in AttentionState(plan).heading(0)


def test_the_token_strip_shows_a_rounds_own_tokens_in_order(qtbot):
    """A target with weights: the chips are the rounds' token labels, every one, in order."""
    engine = Engine(_llama(1))
    prompt = [5, 17, 3, 42, 8, 5, 17, 3, 42, 8, 5, 17]
    plan = engine.plan(RunRequest(0, "", True, 12, draft_tokens=3, prompt_lookup=2), prompt)
    records = list(engine.run(plan))
    assert any(len(r.speculation.token_ids) > 1 for r in records)  # a round added several tokens
    strip = TokenStrip()
    qtbot.addWidget(strip)
    strip.reset(plan)
    strip.apply(records)
    labels = [engine.tokenizer.token_label(t) for r in records for t in r.speculation.token_ids]
    assert strip.tokens() == [*plan.prompt_labels, *labels] and len(labels) == 12


def _legend(chart: WorkChart) -> list[str]:
    return [label.text for _sample, label in chart.legend.items]


def test_the_chart_puts_target_passes_against_tokens_generated(qtbot, run):
    plan, records = run["speculative"]
    chart = WorkChart()
    qtbot.addWidget(chart)
    chart.resize(700, 420)
    chart.show()
    chart.reset(plan)
    assert chart.passes_shown and _legend(chart) == ["plain decoding: one target pass a token",
                                                     "speculative decoding (measured)"]
    assert chart.work_plot.titleLabel.text == "Target passes against tokens generated"
    assert not chart.with_curve.isVisible() and chart.passes.speculative_curve.isVisible()
    chart.apply(records)
    chart.refresh()
    data = chart.passes_data()
    assert data["plain"][0].tolist() == [0, 1, 4, 6] and data["plain"][1].tolist() == [0, 1, 4, 6]  # y = x
    assert data["speculative"][0].tolist() == [0, 1, 4, 6] and data["speculative"][1].tolist() == [0, 1, 2, 3]
    x, y = chart.passes.speculative_curve.getData()  # what is drawn
    assert x.tolist() == [0, 1, 4, 6] and y.tolist() == [0, 1, 2, 3]
    x, y = chart.passes.plain_curve.getData()
    assert x.tolist() == [0, 1, 4, 6] and y.tolist() == [0, 1, 4, 6]
    chart.reset(run["plain"][0])  # a plain run: the K/V curves back, as before
    assert not chart.passes_shown and _legend(chart) == ["without cache", "with cache (measured)"]
    assert chart.work_plot.titleLabel.text == "Cumulative K/V computations per layer"
    assert chart.with_curve.isVisible() and not chart.passes.speculative_curve.isVisible()
    chart.apply(run["plain"][1])
    chart.refresh()
    assert chart.with_curve.getData()[0].tolist() == list(range(1, N + 2))


def test_the_status_line_names_the_drafter(qtbot, run):
    status = StatusLine()
    qtbot.addWidget(status)
    status.reset(run["speculative"][0])
    assert "speculative: prompt lookup of 1-grams, 4 drafts a round" in status.text()
    status.reset(run["plain"][0])
    assert "speculative" not in status.text()


def contrast(a: str, b: str) -> float:
    """WCAG 2.x contrast of two "#RRGGBB" colours."""

    def luminance(colour: str) -> float:
        channels = [c / 255 for c in theme.rgba(colour)[:3]]
        linear = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
        return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]

    high, low = sorted((luminance(a), luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)
