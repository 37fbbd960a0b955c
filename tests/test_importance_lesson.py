"""The built-in lesson "Which tokens can we forget?" (kv-importance, issue #40): it loads with its three measured
questions and the eviction settings its steps run with; the positions H2O keeps are a direct run's, the ones H2O's
rule picks from the scores that run recorded (as the step's texts say); the perplexities equal a plain masked pass
of the model (a causal mask for the full cache, a band for a window, the band and the first columns for sinks) and
a direct measurement of H2O; the app measures them on a thread of its own and takes guesses of positions."""

from __future__ import annotations

import math
import threading

import pytest
import torch
import torch.nn.functional as F

from kvviz.app.export.slides import measure_perplexities, run_step
from kvviz.core.records import RunRequest
from kvviz.engine.engine import Engine
from kvviz.engine.run import start_run
from kvviz.lessons.lesson import BUILTIN_LESSONS, LessonError, format_answer, load_lesson, parse_lesson
from kvviz.lessons.perplexity import PERPLEXITY_TOKENS, Perplexities
from kvviz.measure.quality import heldout_ids

NAME = "kv-importance"
MODEL = "kvviz-shakespeare"


@pytest.fixture(scope="module")
def lesson():
    return load_lesson(NAME)


@pytest.fixture(scope="module")
def engine() -> Engine:
    from kvviz.sources.weights import load_model

    loaded = load_model(MODEL)
    return Engine(loaded.model, loaded.tokenizer)


def question_step(lesson, question: str) -> int:
    return next(index for index, step in enumerate(lesson.steps) if step.question == question)


def test_the_lesson_loads_with_three_measured_questions_and_its_eviction_settings(lesson):
    assert NAME in BUILTIN_LESSONS and lesson.title == "Which tokens can we forget?"
    asked = [step.question for step in lesson.steps if step.question]
    assert asked == ["kept_positions_after_next", "window_vs_importance_perplexity", "sink_perplexity_ratio"]
    assert len(lesson.slides()) == len(lesson.steps) + 3 and all(step.model == MODEL for step in lesson.steps)
    kept, versus, sinks = (lesson.steps[question_step(lesson, q)] for q in asked)
    assert (kept.evict, kept.budget, versus.evict, versus.budget) == ("h2o", 8, "h2o", 32)
    assert versus.cache_fields() == {"window": 0, "sinks": 0, "kv_dtype": "", "evict": "h2o", "budget": 32,
                                     "observe": 0, "pool": 0}
    assert (sinks.window, sinks.sinks, sinks.evict) == (28, 4, "")
    assert versus.question_text == ("How many times H2O's perplexity will a window's be, each keeping 32 positions "
                                    "a layer?")
    assert sinks.question_text == ("How many times the perplexity with the 4 sinks will a plain window's be, each "
                                   "keeping 32 positions?")
    assert f"the first {PERPLEXITY_TOKENS} tokens" in versus.text and f"same {PERPLEXITY_TOKENS} tokens" in sinks.text
    assert any(step.compare and step.evict for step in lesson.steps)  # the full cache against H2O, in lockstep


@pytest.mark.parametrize(("extra", "said"), [
    ('evict = "h2o"\nbudget = 8\nwindow = 4', "step 1: window: a step that evicts by importance takes no window"),
    ("budget = 8", "step 1: budget: goes with evict"),
    ('evict = "lru"\nbudget = 8', "step 1: evict: expected one of h2o, tova, snapkv, pyramidkv, got 'lru'"),
    ('evict = "h2o"', "step 1: budget: 0 is not from 1 to 4096"),
    ('evict = "h2o"\nbudget = 8\nobserve = 2', "step 1: observe: goes with snapkv or pyramidkv, not h2o"),
    ('question = "kept_positions_after_next"', "step 1: question: kept_positions_after_next asks about eviction"),
    ('question = "sink_perplexity_ratio"', "step 1: question: sink_perplexity_ratio asks about the sinks"),
])
def test_a_step_s_eviction_is_checked_in_one_line(extra, said):
    text = ('title = "L"\n[[step]]\ntitle = "S"\ntext = "T"\nprompt = "Time flies"\ncache = true\nadvance_to = 1\n'
            f"max_new_tokens = 4\n{extra}\n")
    with pytest.raises(LessonError) as caught:
        parse_lesson(text, "my.toml")
    assert str(caught.value).startswith(f"my.toml: {said}") and "\n" not in str(caught.value)


def test_h2o_keeps_what_a_direct_run_keeps_by_its_rule_the_first_positions_and_the_recent(lesson, engine):
    index = question_step(lesson, "kept_positions_after_next")
    step = lesson.steps[index]
    answer = run_step(engine, MODEL, lesson, index).answer  # what the slides (and the app, from its record) answer
    run = start_run(engine, RunRequest(0, step.prompt, True, step.max_new_tokens, evict="h2o", budget=8), MODEL)
    records = []
    try:
        for passes in run.token_steps():
            records.extend(passes)
            if passes[0].new_tokens > step.advance_to:
                break
    finally:
        run.close()
    eviction = records[-1].eviction
    layer = eviction.layers[0]
    fed = len(layer.heads)
    assert (fed, len(engine.encode_prompt(step.prompt))) == (18, 15)  # the text: positions 0 to 17, the prompt 0-14
    recent = set(range(fed - 4, fed))  # H2O's rule: the most recent half of the budget, and the heavy hitters
    heavy = sorted(set(range(fed)) - recent, key=lambda p: (-layer.scores[p], p))[:4]
    assert answer == layer.kept() == tuple(sorted(recent | set(heavy)))
    assert all(layer.heads[p] == eviction.kv_heads for p in answer)  # every head of layer 0 keeps the same
    assert sorted(heavy) == [0, 1, 2, 3]  # the next step says so: the heavy hitters are the first positions
    assert format_answer(step.question, answer) == "0\u20133, 14\u201317"
    later = run_step(engine, MODEL, lesson, index + 1).shown[-1].eviction.layers[0].kept()
    assert later[:4] == (0, 1, 2, 3) and len(later) == 8  # ... and stay, at the next step's token


def masked_perplexity(model, ids: list[int], window: int = 0, sinks: int = 0) -> float:
    """Perplexity of `ids` from one pass of the GPT-2 model with an explicit attention mask, no cache: each query
    sees every earlier position (window 0), or the last `window` with itself and the first `sinks`."""
    T = len(ids)
    idx = torch.tensor(ids)
    query, key = torch.arange(T)[:, None], torch.arange(T)[None, :]
    allowed = key <= query
    if window:
        allowed &= (key > query - window) | (key < sinks)
    t = model.transformer
    with torch.no_grad():
        x = t.wte(idx) + t.wpe(torch.arange(T))  # (T, C)
        for block in model.blocks:
            a = block.attn
            q, k, v = (z.view(T, a.n_head, -1).transpose(0, 1) for z in a.c_attn(block.ln_1(x)).split(a.n_embd, 1))
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)  # (nh, T, hs)
            x = x + a.c_proj(y.transpose(0, 1).reshape(T, a.n_embd))
            x = x + block.mlp(block.ln_2(x))
        logits = t.ln_f(x) @ t.wte.weight.T  # (T, V)
        return math.exp(F.cross_entropy(logits[:-1].double(), idx[1:]).item())


def test_the_perplexity_answers_equal_a_masked_pass_and_a_direct_measurement(lesson, engine):
    """On the first 48 tokens of the passage (the lesson takes 128; the rule is the same, the budget of 32 binds
    either way): the window's, the sinks' and the full cache's perplexities equal a plain pass of the model with the
    window's mask written out; the answers' words give them."""
    versus = lesson.steps[question_step(lesson, "window_vs_importance_perplexity")]
    sinks = lesson.steps[question_step(lesson, "sink_perplexity_ratio")]
    known: dict = {}
    tokens = 48
    cost = measure_perplexities(engine, versus, tokens, known=known)
    sink = measure_perplexities(engine, sinks, tokens, known=known)
    ids = heldout_ids(engine.tokenizer, tokens)
    window, full = masked_perplexity(engine.model, ids, 32), masked_perplexity(engine.model, ids)
    with_sinks = masked_perplexity(engine.model, ids, 28, 4)
    h2o = dict(cost.measured)["H2O"]
    assert dict(cost.measured) == pytest.approx({"window": window, "H2O": h2o, "full cache": full}, rel=1e-5)
    assert dict(sink.measured) == pytest.approx({"window": window, "with sinks": with_sinks}, rel=1e-5)
    assert len({round(v, 3) for v in (window, h2o, full, with_sinks)}) == 4  # each policy really changed the cache
    assert format_answer(versus.question, cost) == (f"{window / h2o:.2f}x (window {window:.1f}, H2O {h2o:.1f}, "
                                                    f"full cache {full:.1f})")
    assert format_answer(sinks.question, sink) == f"{window / with_sinks:.2f}x (window {window:.1f}, with sinks " \
                                                  f"{with_sinks:.1f})"


def test_the_app_measures_perplexity_on_its_own_thread_and_takes_positions_as_a_guess(qtbot, monkeypatch, lesson):
    from PySide6.QtGui import QValidator
    from PySide6.QtWidgets import QWidget

    from kvviz.app.export import slides
    from kvviz.app.lesson.guess_edit import GuessEdit
    from kvviz.app.lesson.perplexity_answers import PerplexityAnswers
    from kvviz.app.run.worker import running_threads

    threads = []

    def measured_here(engine, step, tokens=PERPLEXITY_TOKENS, known=None):
        threads.append((threading.current_thread(), engine.model.config.n_layer))
        return Perplexities(tokens, (("window", 3.0), ("H2O", 2.0)))

    monkeypatch.setattr(slides, "measure_perplexities", measured_here)
    window = QWidget()
    answers = PerplexityAnswers(window)
    step = lesson.steps[question_step(lesson, "window_vs_importance_perplexity")]
    key = (MODEL, "float32", step)
    with qtbot.waitSignal(answers.measured, timeout=30_000) as got:
        assert answers.ask(key, step) is None
    assert got.args[0] == key and got.args[1].ratio == 1.5 and answers.ask(key, step) is got.args[1]  # kept
    assert threads == [(threads[0][0], 6)] and threads[0][0] is not threading.main_thread()
    window.close()  # ends the measuring thread
    assert not running_threads()
    guess = GuessEdit()
    assert guess.validator().validate("0-3,14-17", 0)[0] == QValidator.State.Acceptable
