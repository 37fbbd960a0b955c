"""The built-in lesson "draft, verify, roll back" (issue #39): it loads, its speculative steps name their drafter, its
questions are answered from the records of the step's rounds (equal to a hand count), the rounds its text describes
are the rounds the embedded model makes, and the app walks it by clicker with those answers."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from kvviz.app.assembly import open_window
from kvviz.app.settings import app_settings
from kvviz.core.records import RunRequest
from kvviz.lessons.lesson import (
    BUILTIN_LESSONS,
    QUESTIONS,
    LessonError,
    format_answer,
    load_lesson,
    measured_answer,
    parse_lesson,
)

NAME = "kv-speculative"


@pytest.fixture(scope="module")
def lesson():
    return load_lesson(NAME)


@pytest.fixture(scope="module")
def engine(lesson):
    from kvviz.engine.engine import Engine
    from kvviz.sources.weights import load_model

    loaded = load_model(lesson.steps[0].model)
    return Engine(loaded.model, loaded.tokenizer)


def step_records(engine, step) -> list:
    """Every record of the step's run, one a round (one a token for plain decoding)."""
    request = RunRequest(0, step.prompt, True, step.max_new_tokens, **step.drafter_fields())
    return list(engine.run(engine.plan(request)))


def answered(engine, step) -> tuple[object, object, float]:
    """(the record at advance_to, the record of the next round, the measured answer), as the app takes them."""
    records = step_records(engine, step)
    shown = next(r for r in records if r.new_tokens == step.advance_to)  # the step lands on a round's end
    answer = next(r for r in records if r.new_tokens > step.advance_to)
    return shown, answer, measured_answer(step.question, shown, answer)


def kept(records) -> list[int]:
    out: list[int] = []
    for record in records:  # (a plain cached run's last pass fills the cache: no token)
        out.extend(record.speculation.token_ids if record.speculation is not None else (record.token_id,))
    return [token for token in out if token is not None]


def test_the_lesson_loads_with_its_drafters_and_questions(lesson):
    assert NAME in BUILTIN_LESSONS and lesson.title == "Speculative decoding: draft, verify, roll back"
    assert [step.question for step in lesson.steps] == [
        None, "positions_held_after_next", None, "acceptance_rate_after_next", "acceptance_rate_after_next", None]
    assert {step.question for step in lesson.steps if step.question} <= set(QUESTIONS)
    assert all(step.speculative and (step.draft_tokens, step.prompt_lookup) == (4, 3) for step in lesson.steps[:5])
    assert not lesson.steps[-1].speculative  # plain greedy decoding, to compare the text with
    assert all(step.use_cache and not step.compare for step in lesson.steps)
    assert len(lesson.slides()) == len(lesson.steps) + 3


def test_the_cache_after_a_round_of_2_of_4_drafts_is_measured_and_counts_by_hand(lesson, engine):
    step = lesson.steps[1]
    shown, answer, measured = answered(engine, step)
    round_ = answer.speculation
    assert (len(round_.drafted), round_.accepted) == (4, 2)  # what the step's text says of the round
    prompt = len(engine.encode_prompt(step.prompt))
    assert prompt == 26 and shown.new_tokens == 1
    # before the round: the prompt's positions, and the tokens so far but the newest (pending); the round feeds the
    # pending token and 4 drafts, keeps the pending token and the 2 accepted drafts, and rolls 2 back
    before = prompt + shown.new_tokens - 1
    assert shown.positions_held == before == 26
    assert measured == answer.positions_held == before + 1 + 2 == 29
    assert round_.rolled_back == (29, 31) and round_.rolled_back_count == 2
    assert format_answer(step.question, measured) == "29 positions"


def test_the_acceptance_rates_are_measured_on_a_text_that_quotes_itself_and_one_that_does_not(lesson, engine):
    quoting, plain = lesson.steps[3], lesson.steps[4]
    _, quoting_round, quoting_rate = answered(engine, quoting)
    _, plain_round, plain_rate = answered(engine, plain)
    for record, rate in ((quoting_round, quoting_rate), (plain_round, plain_rate)):
        totals = record.speculation
        assert rate == pytest.approx(100 * totals.accepted_total / totals.drafted_total)
        assert rate == pytest.approx(100 * totals.acceptance_rate)
    # by hand: 8 of 12 drafts on the text that repeats a line, 2 of 11 on "Time flies", both after 12 tokens (the
    # second step's text says "after the same number of tokens")
    assert (quoting_round.speculation.accepted_total, quoting_round.speculation.drafted_total) == (8, 12)
    assert (plain_round.speculation.accepted_total, plain_round.speculation.drafted_total) == (2, 11)
    assert quoting_round.new_tokens == plain_round.new_tokens == 12
    assert format_answer(quoting.question, quoting_rate) == "66.7 %"
    assert format_answer(plain.question, plain_rate) == "18.2 %"


def test_the_last_steps_plain_text_is_the_speculative_runs(lesson, engine):
    speculative, plain = lesson.steps[4], lesson.steps[5]
    assert plain.prompt == speculative.prompt
    assert kept(step_records(engine, plain)) == kept(step_records(engine, speculative))
    rolled_back = lesson.steps[2]  # the roll-back step shows the round the question was asked of
    assert rolled_back.advance_to == answered(engine, lesson.steps[1])[1].new_tokens


def test_the_lesson_runs_in_the_app_by_clicker_with_the_measured_answers(qtbot, app_model):
    if app_model is not None:
        pytest.skip("the lesson's model is the embedded one")
    win = open_window(None, "hello", settings=app_settings())
    qtbot.addWidget(win)
    win.show()
    try:
        qtbot.waitUntil(lambda: win.session.plan is not None, timeout=60_000)
        win.actions["lesson_speculative"].trigger()

        def settle() -> None:
            qtbot.waitUntil(lambda: win.lesson.ready and not win.scheduler.pending, timeout=60_000)

        settle()
        assert win.lesson.active and win.lesson.lesson.title.startswith("Speculative decoding")
        answers, at = [], []
        for _ in range(len(win.lesson.lesson.slides()) - 1):
            qtbot.keyClick(win, Qt.Key.Key_PageDown)
            settle()
            plan = win.session.plan
            at.append((win.session.steps_done, plan.drafter is not None))
            if win.lesson.revealed:
                answers.append(win.lesson.panel.answer_text())
                record = win.session.last_record
                assert win.lesson.measured == measured_answer(win.lesson.step.question, None, record)
        assert answers == ["measured 29 positions", "measured 66.7 %", "measured 18.2 %"]
        assert at == [(1, True), (4, True), (4, True), (7, True), (12, True), (9, True), (12, True), (12, False)]
    finally:
        win.close()


def test_malformed_speculative_steps_are_one_line(lesson):
    step = """
[[step]]
title = "A step"
text = "Some text."
prompt = "Time flies"
cache = true
advance_to = 2
max_new_tokens = 4
"""
    cases = [
        ("draft_tokens = 4", "draft_tokens: give one drafter, prompt_lookup or draft_model"),
        ("draft_tokens = 4\nprompt_lookup = 2\ndraft_model = \"x\"", "draft_tokens: give one drafter"),
        ("draft_tokens = 65\nprompt_lookup = 2", "draft_tokens: 65 is not from 1 to 64"),
        ("draft_tokens = 4\nprompt_lookup = 9", "prompt_lookup: 9 is not from 1 to 8"),  # as the CLI and the app
        ("prompt_lookup = 3", "draft_tokens: 0 is not from 1 to 64"),
        ('question = "acceptance_rate_after_next"', "question: acceptance_rate_after_next asks about drafts"),
    ]
    for extra, fragment in cases:
        with pytest.raises(LessonError) as caught:
            parse_lesson('title = "A lesson"\n' + step + extra + "\n", "mine.toml")
        assert str(caught.value).startswith("mine.toml: step 1: ") and fragment in str(caught.value)
        assert "\n" not in str(caught.value)
    compare = step.replace("cache = true", 'cache = "compare"') + "draft_tokens = 4\nprompt_lookup = 2\n"
    with pytest.raises(LessonError, match=r"step 1: cache: speculative decoding checks drafts against the cache"):
        parse_lesson('title = "A lesson"\n' + compare, "mine.toml")
