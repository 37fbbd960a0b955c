"""Caches that evict: a sliding window (Mistral's, or asked for) and attention sinks with a window (StreamingLLM),
against transformers where it has them, and cached against uncached under the same rule everywhere."""

from __future__ import annotations

import pytest
import torch
from helpers_checkpoints import peer_greedy, plan_ids, spread_peer

from kvviz.engine.engine import Engine, GenerationError
from kvviz.sources.weights import load_checkpoint, load_model

transformers = pytest.importorskip("transformers")

PROMPT_IDS = [464, 290, 17, 818, 262, 329, 11]


def tokens(records) -> list[int]:
    return [r.token_id for r in records if r.token_id is not None]


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):
    """A MistralForCausalLM with random weights and a sliding window of 8, saved as a Hugging Face folder."""
    config = transformers.MistralConfig(vocab_size=1000, hidden_size=64, intermediate_size=112, num_hidden_layers=3,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                        sliding_window=8, tie_word_embeddings=False, attn_implementation="eager")
    peer = spread_peer(transformers.MistralForCausalLM, config, 27)
    folder = tmp_path_factory.mktemp("mistral") / "model"
    peer.save_pretrained(folder)
    return peer, load_checkpoint(folder)


def test_a_mistral_window_of_8_over_40_tokens_matches_transformers_cached_and_uncached(mistral):
    peer, model = mistral
    assert model.config.sliding_window == 8  # read from config.json
    engine = Engine(model)
    cached = list(engine.run(plan_ids(engine, PROMPT_IDS, 40, use_cache=True)))
    uncached = list(engine.run(plan_ids(engine, PROMPT_IDS, 40, use_cache=False)))
    with torch.no_grad():
        reference = peer_greedy(peer, PROMPT_IDS, 40)
        sequence = torch.tensor([PROMPT_IDS + reference])
        expected = peer(sequence).logits[0]  # (T, V): every query attends to its window only
        ours = model(sequence, kv_cache=engine._new_cache(0, "", engine.policy()))[0]
    assert tokens(cached) == tokens(uncached) == reference
    assert len(set(reference)) > 5, "weights this flat would not test much"
    assert torch.allclose(ours, expected, atol=1e-4, rtol=0)
    # the cache holds the window, not the sequence: 8 positions x 2 x 3 layers x 2 KV heads x 16 x 4 bytes
    assert cached[-1].positions_held == 8 and cached[-1].cache_bytes == 8 * 2 * 3 * 2 * 16 * 4
    assert max(r.positions_held for r in cached) == 8
    assert cached[10].kv_evicted == (cached[10].fed_start - 8, cached[10].fed_start - 7)


@pytest.mark.parametrize("model_name", ["random:kvviz-shakespeare-gqa", "random:kvviz-shakespeare"])
def test_sinks_and_a_window_keep_at_most_their_positions_cached_as_uncached(model_name):
    """--sinks 4 --window 16: the first 4 positions and the last 16, greedy and seeded."""
    from kvviz.engine.engine import SamplingSettings

    engine = Engine(load_model(model_name).model)
    for sampling in (SamplingSettings(), SamplingSettings(temperature=1.0, top_k=20, seed=3)):
        runs = [list(engine.run(plan_ids(engine, PROMPT_IDS, 30, use_cache, sampling, window=16, sinks=4), sampling))
                for use_cache in (True, False)]
        assert tokens(runs[0]) == tokens(runs[1]), (model_name, sampling)
        assert max(r.positions_held for r in runs[0]) == 20


def test_sinks_take_a_rope_model_past_its_context_and_gpt2_says_where_it_stops():
    """A RoPE model of 32 positions generates 80 tokens with --sinks 4 --window 16, cached equal to uncached, the
    cache never past 20 positions; GPT-2's learned positions end at its context, and the plan says so."""
    from kvviz.models.llama import Llama, LlamaConfig

    model = Llama(LlamaConfig(vocab_size=1000, n_ctx=32, n_layer=3, n_head=4, n_kv_head=2, n_embd=64,
                              intermediate_size=112))
    model.init_weights(torch.Generator().manual_seed(4))
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.mul_(7.5)  # 0.15: tokens that differ from step to step
    engine = Engine(model.eval())
    cached = list(engine.run(plan_ids(engine, PROMPT_IDS, 80, True, window=16, sinks=4)))
    uncached = list(engine.run(plan_ids(engine, PROMPT_IDS, 80, False, window=16, sinks=4)))
    assert len(tokens(cached)) == 80 and tokens(cached) == tokens(uncached)
    assert len(set(tokens(cached))) > 5
    assert max(r.positions_held for r in cached) == 20 and cached[-1].sequence_length == 87 > 32

    gpt2 = Engine(load_model("random:kvviz-shakespeare").model)  # 256 learned positions
    plan = plan_ids(gpt2, PROMPT_IDS, 400, True, window=16, sinks=4)
    assert plan.budget == 256 - len(PROMPT_IDS) and plan.stop_reason == "context_full"


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"sinks": 4}, "attention sinks go with a window: give --window too"),
    ({"window": -2}, "a window and sinks are counts of positions"),
    ({"window": 8, "cache_fault": "late_write"}, "Break the cache plants its bug in a full cache"),
])
def test_what_no_window_can_do_is_one_line(kwargs, message):
    engine = Engine(load_model("random:kvviz-shakespeare").model)
    with pytest.raises(GenerationError, match=message):
        plan_ids(engine, PROMPT_IDS, 4, **kwargs)


def test_no_window_changes_nothing():
    """An exact cache is the same as before: the same tokens, counts and bytes, with or without the policy."""
    engine = Engine(load_model("random:kvviz-shakespeare").model)
    plain = list(engine.run(plan_ids(engine, PROMPT_IDS, 12)))
    assert plan_ids(engine, PROMPT_IDS, 12).policy.evicts is False
    assert plain[-1].cache_bytes == 19 * 9216 and plain[-1].positions_held == 19
    assert all(r.kv_evicted == (0, 0) for r in plain)


def test_generate_and_compare_take_a_window_and_report_what_it_evicted(kvviz_cli):
    import json

    done = kvviz_cli("generate", "--model", "random:kvviz-shakespeare-gqa", "--prompt", "Time flies",
                     "--max-new-tokens", "12", "--window", "4", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    # "Time flies" is 2 tokens; a window of 4: from the fourth pass on, each evicts the position 4 behind it
    assert result["evicted_per_pass"] == [[], [], [], [0], [1], [2], [3], [4], [5], [6], [7], [8], [9]]
    assert (result["positions_held"], result["cache_bytes"]) == (4, 4 * 3072)  # 2 x 6 x 2 x 32 x 4 a position
    done = kvviz_cli("compare", "--model", "kvviz-shakespeare-gqa", "--prompt", "ROMEO:\nBut soft, what light",
                     "--new-tokens", "24", "--window", "6", "--sinks", "2", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    # the full cache against the window, each run on its own: where their tokens first differ, 1-based
    loaded = load_model("kvviz-shakespeare-gqa")
    engine = Engine(loaded.model, loaded.tokenizer)
    prompt = engine.encode_prompt("ROMEO:\nBut soft, what light")
    full = tokens(engine.run(plan_ids(engine, prompt, 24)))
    windowed = tokens(engine.run(plan_ids(engine, prompt, 24, window=6, sinks=2)))
    parted = next((i + 1 for i, (a, b) in enumerate(zip(full, windowed, strict=True)) if a != b), None)
    assert parted is not None and result["summary"]["first_divergence"] == parted
    assert [s["full_token_id"] for s in result["steps"]] == full
    assert [s["windowed_token_id"] for s in result["steps"]] == windowed
    assert (result["window"], result["sinks"], result["summary"]["identical"]) == (6, 2, False)
    assert result["summary"]["windowed_cache_bytes"] == 8 * 3072  # 2 sinks + 6: all a cache of 8 positions holds
    assert result["summary"]["full_cache_bytes"] == (len(prompt) + 24) * 3072
    text = kvviz_cli("compare", "--model", "kvviz-shakespeare-gqa", "--prompt", "ROMEO:\nBut soft, what light",
                     "--new-tokens", "24", "--window", "6", "--sinks", "2").stdout
    assert f"the runs part at step {parted}:" in text and "a trade-off, not a bug" in text
    done = kvviz_cli("generate", "--prompt", "x", "--sinks", "3")
    assert (done.returncode, done.stderr) == (2, "kvviz: attention sinks go with a window: give --window too\n")


def test_the_app_shows_what_a_window_evicts_in_the_grid_its_legend_and_the_counter(qtbot, window):
    """Run > Sliding window, 4 positions and 1 sink, on "Time flies fast" (3 tokens): after 8 steps positions 0 to
    9 have been fed, 1 to 5 evicted, the sink and the last 4 held (the newest computed), and the counter says so."""
    from PySide6.QtCore import Qt

    from kvviz.app.views.grid.cell_states import COMPUTED, EVICTED, PENDING, REUSED
    from kvviz.app.window.window_dialog import WindowDialog

    dialog = WindowDialog(0, 0)
    assert not dialog.sinks_spin.isEnabled()
    dialog.window_spin.setValue(4)
    dialog.sinks_spin.setValue(1)
    assert dialog.chosen() == (4, 1)
    with qtbot.waitSignal(window.run_prepared, timeout=10_000):
        window.controls.set_window(*dialog.chosen())
    assert window.session.plan.policy.window == 4
    for _ in range(8):
        qtbot.keyClick(window, Qt.Key.Key_Space)
    qtbot.waitUntil(lambda: window.session.last_record is not None and window.session.last_record.new_tokens == 8,
                    timeout=60_000)
    window.redraw()
    states = window.grid.cell_states()[0].tolist()  # layer 0, 11 positions: 3 prompt + 8 new
    assert states[:11] == [REUSED, *[EVICTED] * 5, REUSED, REUSED, REUSED, COMPUTED, PENDING]
    assert "evicted at step" in window.grid.cell_info(0, 3) and "attention sink" in window.grid.cell_info(0, 0)
    note = window.counter.window_note
    assert note.isVisible() and note.text() == ("the cache keeps the first 1 and the last 4 positions: it holds 5 "
                                                "positions; K/V evicted: 5 per layer (30 in all 6 layers)")
    with qtbot.waitSignal(window.run_prepared, timeout=10_000):  # View > Attention under the window
        window.actions["attention"].trigger()
    qtbot.waitUntil(lambda: window.session.last_record is not None and window.session.last_record.new_tokens == 8,
                    timeout=60_000)
    weights = window.session.last_record.attention.as_lists()[0][0]  # layer 0, head 0: a weight per position
    assert len(weights) == 10 and weights[1:6] == [0.0] * 5 and weights[0] > 0 and min(weights[6:]) > 0
    assert abs(sum(weights) - 1.0) < 1e-5  # the sink and the window share all of it; evicted positions none


def test_the_memory_views_line_flattens_where_the_window_is_full():
    """Its own line: bytes per position x positions held, all of them without a window, at most W + S with one."""
    from kvviz.app.views.memory_state import MemoryState

    engine = Engine(load_model("random:kvviz-shakespeare-gqa").model)
    for window, sinks, top in ((0, 0, 131072), (16, 4, 20)):
        plan = plan_ids(engine, PROMPT_IDS, 30, True, window=window, sinks=sinks)
        state = MemoryState(plan)
        for record in engine.run(plan):
            state.apply(record)
        x, y = state.model_line()
        assert y.max() == top * 3072 and y[x == 20][0] == 20 * 3072
        measured = state.measured()[1]
        assert measured.max() == (37 if not window else 20) * 3072  # what the cache's tensors held at the end


def test_export_draws_a_windowed_run_and_its_grid_caption_counts_what_was_read(tmp_path, kvviz_cli):
    """`kvviz export --window 6 --sinks 1`: the run's images; the caption's "reused" is the 7 positions held (the
    sink and 6) that the last pass read, not the 22 before it."""
    from kvviz.app.views.grid.grid_title import grid_title

    done = kvviz_cli("export", "--model", "kvviz-shakespeare-gqa", "--prompt", "ROMEO:", "--new-tokens", "20",
                     "--window", "6", "--sinks", "1", "--out", str(tmp_path / "out"), "--format", "png",
                     "--width", "800")
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "kvviz-chart-step21.png", "kvviz-grid-step21.png", "kvviz-view-step21.png"]
    loaded = load_model("kvviz-shakespeare-gqa")
    engine = Engine(loaded.model, loaded.tokenizer)
    plan = plan_ids(engine, engine.encode_prompt("ROMEO:"), 20, window=6, sinks=1)
    last = list(engine.run(plan))[-1]
    from kvviz.app import theme

    text = grid_title(plan, last, None, theme.DARK)[0]
    assert "reused 6</span>" in text and last.positions_held == 7
    assert "6 layers \u00d7 23 positions, keeping the last 6, the sink 0" in text  # the sink marked by position


def test_the_window_lesson_exports_the_bytes_its_windows_hold(tmp_path):
    """kv-window: 8 positions held after 5 steps of a 15-token prompt, 2 x 6 layers x 2 KV heads x 32 x 4 = 3,072
    bytes each; the sink step answers the share of attention on the 4 sinks, measured."""
    import re
    from io import StringIO
    from unittest import mock

    from kvviz.cli.commands import main
    from kvviz.lessons.lesson import LessonError, load_lesson, parse_lesson

    with mock.patch("sys.stdout", new=StringIO()) as stdout:
        status = main(["lesson", "--file", "kv-window", "--export", str(tmp_path / "slides"), "--format", "png",
                       "--width", "640"])
    assert status == 0
    answers = re.findall(r"answer: (.*) \(measured\)", stdout.getvalue())
    assert answers[0] == "24,576 bytes in float32" and re.fullmatch(r"\d+\.\d %", answers[1]), answers
    steps = load_lesson("kv-window").steps
    assert [(s.window, s.sinks) for s in steps] == [(8, 0), (8, 0), (8, 4), (8, 0)]
    bad = 'title = "x"\n[[step]]\ntitle = "s"\ntext = "t"\nprompt = "p"\ncache = true\nadvance_to = 0\n' \
          'max_new_tokens = 4\nsinks = 2\n'
    with pytest.raises(LessonError, match="step 1: sinks: attention sinks go with a window: give window too"):
        parse_lesson(bad, "bad.toml")


def test_the_window_lesson_in_the_app_evicts_and_leaving_it_gives_the_free_app_its_full_cache(qtbot, app_model):
    from PySide6.QtCore import Qt

    from kvviz.app.assembly import open_window
    from kvviz.app.settings import app_settings
    from kvviz.app.views.grid.cell_states import EVICTED

    win = open_window(app_model, "hello", settings=app_settings(), lesson="kv-window")
    qtbot.addWidget(win)
    win.show()
    try:
        qtbot.waitUntil(lambda: win.lesson.ready and not win.scheduler.pending, timeout=60_000)
        plan = win.session.plan
        assert (plan.policy.window, plan.prompt_tokens, win.session.steps_done) == (8, 15, 4)
        states = win.grid.cell_states()[0]
        assert (states == EVICTED).sum() == 15 + 3 - 8  # fed 18 positions by step 4, holding 8
        qtbot.keyClick(win, Qt.Key.Key_Escape)
        qtbot.waitUntil(lambda: not win.lesson.active and win.session.plan is not None
                        and win.session.plan.prompt == "hello", timeout=60_000)
        assert (win.controls.window, win.session.plan.policy.evicts) == (0, False)
    finally:
        win.close()


def test_gpt2_says_where_sinks_cannot_take_it_and_a_lesson_export_takes_a_window(tmp_path, kvviz_cli):
    done = kvviz_cli("generate", "--model", "random:kvviz-shakespeare", "--prompt", "x " * 120,
                     "--max-new-tokens", "200", "--window", "16", "--sinks", "4")
    assert done.returncode == 0
    assert done.stderr.endswith("positions are learned, up to 256; attention sinks take a RoPE model past its "
                                "context, not this one\n")
    done = kvviz_cli("lesson", "--list", "--window", "8")
    assert (done.returncode, done.stderr) == (2, "kvviz: --window goes with --export, not with --list\n")
    lesson = tmp_path / "l.toml"
    lesson.write_text('title = "w"\n[[step]]\ntitle = "s"\ntext = "t"\nprompt = "Time flies"\ncache = true\n'
                      'advance_to = 5\nmax_new_tokens = 8\nquestion = "cache_bytes_after_next"\n', encoding="utf-8")
    done = kvviz_cli("lesson", "--file", str(lesson), "--export", str(tmp_path / "s"), "--format", "png",
                     "--width", "640", "--model", "random:kvviz-shakespeare-gqa", "--window", "4")
    assert done.returncode == 0, done.stderr
    assert "answer: 12,288 bytes in float32 (measured)" in done.stdout  # 4 positions of 3,072 bytes, not the 8 fed


def test_compare_mode_puts_the_full_cache_beside_the_window_and_words_the_parting_as_a_trade_off(qtbot, window):
    """View > Compare with a window: the full cache's grid over the window's (only the window's has evicted
    cells), the strip's rows named after them, each run's token as the engine chose it on its own, and the banner
    calling the parting a trade-off, not a bug."""
    from PySide6.QtCore import Qt

    from kvviz.app.views.grid.cell_states import EVICTED

    with qtbot.waitSignal(window.run_prepared, timeout=10_000):
        window.controls.set_window(2, 1)
    with qtbot.waitSignal(window.run_prepared, timeout=10_000):
        window.actions["compare"].trigger()
    plan = window.session.plan
    assert plan.against_lossy and plan.lockstep_names == ("full cache", "window of 2 + 1 sinks")
    budget = plan.budget
    for _ in range(budget):
        qtbot.keyClick(window, Qt.Key.Key_Space)
    qtbot.waitUntil(lambda: window.session.last_record is not None and window.session.last_record.final,
                    timeout=60_000)
    window.redraw()
    view = window.workspace.compare_view
    # to the end, the cache-filling passes included: each run's own passes in its own grid and count
    assert (view.cached_grid.cell_states() != EVICTED).all() and (view.uncached_grid.cell_states() == EVICTED).any()
    counts = view.counts.values()
    assert counts["with_cache"] == counts["without_cache"] == 3 + budget  # both computed each position once
    assert view.identity_strip.row_titles[1:3] == ("full cache", "window of 2 + 1 sinks")
    from kvviz.app.views.labels import chip_text

    loaded = load_model(window.session.source or None)  # the same model, each run on its own, headless
    engine = Engine(loaded.model, loaded.tokenizer)
    prompt = engine.encode_prompt("Time flies fast")
    runs = [tokens(engine.run(plan_ids(engine, prompt, budget, **kw))) for kw in ({}, {"window": 2, "sinks": 1})]
    labels = [[chip_text(engine.tokenizer.token_label(t)) for t in run] for run in runs]
    assert [e.cached for e in view.identity_strip.entries()] == labels[0]
    assert [e.uncached for e in view.identity_strip.entries()] == labels[1]
    assert labels[0] != labels[1], "a window of 2 should change this text"
    assert "a trade-off, not a bug" in view.banner.label.text()


def test_a_qwen2_layer_types_list_is_honoured_or_refused_in_one_line(tmp_path, kvviz_cli):
    """transformers windows the layers `layer_types` names, whatever max_window_layers says: the top layer here
    (max_window_layers 0 would window both), so kvviz gives transformers' tokens; a window under a full layer,
    a cache kvviz does not keep, is refused in one line with status 2 instead of run otherwise."""
    def qwen2(folder: str, kinds: list[str]):
        config = transformers.Qwen2Config(vocab_size=1000, hidden_size=64, intermediate_size=112,
                                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                          max_position_embeddings=128, use_sliding_window=True, sliding_window=4,
                                          max_window_layers=0, layer_types=kinds, attn_implementation="eager")
        peer = spread_peer(transformers.Qwen2ForCausalLM, config, 6)
        peer.save_pretrained(tmp_path / folder)
        return peer

    peer = qwen2("top", ["full_attention", "sliding_attention"])
    model = load_checkpoint(tmp_path / "top")
    assert (model.config.sliding_window, model.config.window_first_layer) == (4, 1)
    engine = Engine(model)
    reference = peer_greedy(peer, PROMPT_IDS, 20)
    assert tokens(engine.run(plan_ids(engine, PROMPT_IDS, 20))) == reference
    both = spread_peer(transformers.Qwen2ForCausalLM, transformers.Qwen2Config(**{
        **peer.config.to_dict(), "layer_types": None, "max_window_layers": 0}), 6)
    assert peer_greedy(both, PROMPT_IDS, 20) != reference  # max_window_layers alone would give other tokens
    qwen2("bottom", ["sliding_attention", "full_attention"])
    done = kvviz_cli("generate", "--model", str(tmp_path / "bottom"), "--prompt", "x", "--max-new-tokens", "2")
    assert done.returncode == 2 and done.stdout == "" and len(done.stderr.splitlines()) == 1, done.stderr
    assert "layer_types windows layers [0] under full ones" in done.stderr


@pytest.mark.parametrize("max_window_layers", [0, 1])
def test_a_qwen2_window_on_every_layer_or_on_the_upper_ones_matches_transformers(tmp_path, max_window_layers):
    """use_sliding_window with max_window_layers k: layers k and above keep the last 6 positions, those below
    keep every one, as transformers' Qwen2 does; 24 greedy tokens equal, cached and uncached, logits within 1e-4,
    and the cache holds 6 positions in a windowed layer and every one in a full layer."""
    config = transformers.Qwen2Config(vocab_size=1000, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                      use_sliding_window=True, sliding_window=6, max_window_layers=max_window_layers,
                                      attn_implementation="eager")
    peer = spread_peer(transformers.Qwen2ForCausalLM, config, 6)
    peer.save_pretrained(tmp_path / "qwen2")
    model = load_checkpoint(tmp_path / "qwen2")
    assert (model.config.sliding_window, model.config.window_first_layer) == (6, max_window_layers)
    engine = Engine(model)
    cached = list(engine.run(plan_ids(engine, PROMPT_IDS, 24)))
    with torch.no_grad():
        reference = peer_greedy(peer, PROMPT_IDS, 24)
        sequence = torch.tensor([PROMPT_IDS + reference])
        expected = peer(sequence).logits[0]  # (T, V)
        ours = model(sequence, kv_cache=engine._new_cache(sequence.shape[1], "", engine.policy()))[0]
    assert tokens(cached) == tokens(engine.run(plan_ids(engine, PROMPT_IDS, 24, False))) == reference
    assert torch.allclose(ours, expected, atol=1e-4, rtol=0)
    positions = len(PROMPT_IDS) + 24
    per_layer = 2 * 2 * 16 * 4  # K and V, 2 KV heads of 16 numbers, float32: 256 bytes a position and layer
    held = max_window_layers * positions + (2 - max_window_layers) * 6
    assert cached[-1].cache_bytes == held * per_layer
    from kvviz.app.views.grid.cell_states import EVICTED
    from kvviz.app.views.grid.grid_state import GridState

    grid = GridState(plan_ids(engine, PROMPT_IDS, 24))
    for record in cached:
        grid.apply(record)
    evicted = (grid.states == EVICTED).sum(axis=1)  # per layer: a full layer evicts nothing
    assert evicted.tolist() == [0 if layer < max_window_layers else positions - 6 for layer in range(2)]


def test_the_sink_step_opens_the_attention_view_answers_the_share_measured_and_the_next_step_closes_it(qtbot,
                                                                                                      app_model):
    """kv-window's third step: the attention view shows where the newest token looks; the answer is the share
    its weights give the 4 sinks, as the records the run made measured it; Page Down on closes what it opened."""
    from PySide6.QtCore import Qt

    from kvviz.app.assembly import open_window
    from kvviz.app.settings import app_settings
    from kvviz.lessons.lesson import sink_attention_share

    win = open_window(app_model, "hello", settings=app_settings(), lesson="kv-window")
    qtbot.addWidget(win)
    win.show()

    def settle():
        qtbot.waitUntil(lambda: win.lesson.ready and not win.scheduler.pending, timeout=60_000)

    try:
        settle()
        while win.lesson.step.question != "sink_attention_share":
            qtbot.keyClick(win, Qt.Key.Key_PageDown)
            settle()
        assert win.run_view.attention.isVisible() and win.actions["attention"].isChecked()
        qtbot.keyClick(win, Qt.Key.Key_PageDown)  # reveal
        settle()
        qtbot.waitUntil(lambda: "measured" in win.lesson.panel.answer_text(), timeout=60_000)
        record = win.session.last_record
        assert record.attention is not None and record.attention.positions == record.fed_stop
        assert win.lesson.panel.answer_text().endswith(f"measured {sink_attention_share(record, 4):.1f} %")
        qtbot.keyClick(win, Qt.Key.Key_PageDown)  # the next step: the view the sink step opened closes
        settle()
        assert not win.run_view.attention.isVisible() and not win.actions["attention"].isChecked()
    finally:
        win.close()


def test_sinks_leave_the_full_layers_of_a_partial_window_exact(tmp_path):
    """Qwen2 windows layer 1 only (max_window_layers 1): sinks turn the windowed layer's queries to their place in
    the cache, and leave layer 0, which keeps every position, as an exact run computes it (#37, defect 1: layer 0
    differed by 1.45 with 2 sinks)."""
    config = transformers.Qwen2Config(vocab_size=1000, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                      use_sliding_window=True, sliding_window=4, max_window_layers=1)
    spread_peer(transformers.Qwen2ForCausalLM, config, 6).save_pretrained(tmp_path / "qwen2")
    model = load_checkpoint(tmp_path / "qwen2")
    engine = Engine(model)
    ids = torch.tensor([PROMPT_IDS + PROMPT_IDS[:5]])  # 12 positions, past the window of 4 and 2 sinks
    outputs = {}
    hook = model.blocks[0].register_forward_hook(lambda _m, _i, out: outputs.setdefault(len(outputs), out.detach()))
    try:
        with torch.no_grad():
            model(ids)  # exact: no cache
            model(ids, kv_cache=engine._new_cache(ids.shape[1], "", engine.policy(sinks=2)))
    finally:
        hook.remove()
    assert engine.policy(sinks=2).first_layer == 1
    assert torch.allclose(outputs[0], outputs[1], atol=1e-5), float((outputs[0] - outputs[1]).abs().max())


@pytest.mark.parametrize("heads, kv_heads", [(2, 2), (4, 2)], ids=["MHA", "GQA"])
def test_a_window_layers_one_token_read_hides_what_it_keeps_for_a_rollback(heads, kv_heads):
    """A window that keeps 2 positions past its width (so a rollback can bring them back) holds them hidden: its
    one-token step (`decode`, which the fast files take) attends to the last 4 positions only, as the teaching
    pass's masked read over the same layer does (and unlike attention over every row it holds)."""
    from kvviz.cache.attention import attend
    from kvviz.cache.window import WindowLayer

    generator = torch.Generator().manual_seed(3)
    rows = torch.randn(2, 1, kv_heads, 11, 8, generator=generator)  # K, V for positions 0..10
    q = torch.randn(1, heads, 1, 8, generator=generator)
    fast, teaching = (WindowLayer(kv_heads, 8, window=4, sinks=0, spare=2) for _ in range(2))
    for layer in (fast, teaching):
        layer.update(torch.arange(10), rows[0, :, :, :10], rows[1, :, :, :10])
    got = fast.decode(10, q, rows[0, :, :, 10:], rows[1, :, :, 10:])
    held = teaching.update(10, rows[0, :, :, 10:], rows[1, :, :, 10:])
    assert sorted(held.positions.tolist()) == [5, 6, 7, 8, 9, 10], "6 held: the window's 4 and 2 spare"
    group = heads // kv_heads
    expected = attend(q, held.keys.repeat_interleave(group, 1), held.values.repeat_interleave(group, 1), held,
                      torch.tensor([10]))
    # by hand: softmax over positions 7..10 only
    keys, values = rows[0, 0, :, 7:].repeat_interleave(group, 0), rows[1, 0, :, 7:].repeat_interleave(group, 0)
    weights = torch.softmax((q[0, :, 0, None, :] * keys).sum(-1) / 8 ** 0.5, dim=-1)  # (heads, 4)
    by_hand = (weights[..., None] * values).sum(1)  # (heads, 8)
    assert torch.allclose(got[0, :, 0], by_hand, atol=1e-5)
    assert torch.allclose(got, expected, atol=1e-5)
