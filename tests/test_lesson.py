"""Lessons (kvviz.lessons.lesson): the built-in lesson, one-line errors for every malformed file, answers measured
from real records equal to hand counts, and the example lesson of docs/lessons.md, parsed and exported."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers_checkpoints import plan_ids, save_kvviz_folder, tiny_kvviz_model

from kvviz.engine.engine import Engine
from kvviz.lessons.lesson import QUESTIONS, LessonError, format_answer, load_lesson, measured_answer, parse_lesson

LESSON_DOC = Path(__file__).resolve().parents[1] / "docs" / "lessons.md"
SOURCE = "my-lesson.toml"
STEP = """
[[step]]
title = "A step"
text = "Some text."
prompt = "Time flies"
cache = true
advance_to = 2
max_new_tokens = 4
"""


def documented_example() -> str:
    """The ```toml block after `<!-- lesson:example -->` in docs/lessons.md."""
    match = re.search(r"<!-- lesson:example -->\s*```toml\n(.*?)```", LESSON_DOC.read_text(encoding="utf-8"), re.DOTALL)
    assert match, "docs/lessons.md lost its example lesson"
    return match.group(1)


def test_the_builtin_lesson_has_five_steps_and_questions():
    lesson = load_lesson()
    assert len(lesson.steps) >= 5
    assert sum(1 for step in lesson.steps if step.question) >= 2
    assert {step.question for step in lesson.steps if step.question} <= set(QUESTIONS)
    assert any(step.compare for step in lesson.steps) and any(not step.use_cache for step in lesson.steps)
    assert len(lesson.slides()) == len(lesson.steps) + sum(1 for step in lesson.steps if step.question)
    assert lesson.source.endswith("kv-cache.toml")


# a measured figure stated in words: "5x faster", "6.8x", "87%", "3 times"
CLAIMED_FIGURE = re.compile(r"\d+(\.\d+)?\s*(x\b|\u00d7|%|times\b)|faster|slower", re.IGNORECASE)


def test_the_builtin_lesson_states_no_figure_the_screen_could_contradict():
    """Its speed step says what the sweep measured on this machine ({measured_speed}) and shows it; no text
    claims a speed-up or any other measured figure of its own (it once said "about 5x faster")."""
    lesson = load_lesson()
    for step in lesson.steps:
        for text in (step.title, step.text, step.question_text):
            assert not CLAIMED_FIGURE.search(text), (step.title, text)
    speed_steps = [step for step in lesson.steps if step.focus == "speed"]
    assert len(speed_steps) == 1 and "{measured_speed}" in speed_steps[0].text


def test_measured_speed_is_said_where_the_text_asks_for_it():
    lesson = parse_lesson(with_second_step(text='"At this length: {measured_speed} That is all."',
                                           focus='"speed"'), SOURCE)
    first, second = lesson.steps
    assert not first.needs_speed and second.needs_speed
    assert second.text_with("measured 3.1\u00d7.") == "At this length: measured 3.1\u00d7. That is all."
    assert second.text_with(None) == "At this length: (being measured on this machine\u2026) That is all."
    with pytest.raises(LessonError, match=r"^my-lesson.toml: step 2: notes: \{measured_speed\} belongs in a "):
        parse_lesson(with_second_step(notes='"{measured_speed}"'), SOURCE)


def with_second_step(**changes: str | None) -> str:
    """A two-step lesson whose second step has `changes` (a TOML value as text; None drops the key)."""
    lines = []
    for line in STEP.strip().splitlines():
        key = line.split("=", 1)[0].strip()
        if key in changes:
            if changes[key] is not None:
                lines.append(f"{key} = {changes.pop(key)}")
            else:
                changes.pop(key)
            continue
        lines.append(line)
    lines += [f"{key} = {value}" for key, value in changes.items()]
    return 'title = "A lesson"\n' + STEP + "\n" + "\n".join(lines) + "\n"


MALFORMED = [
    pytest.param(with_second_step(colour='"red"'), "colour", "unknown key", id="unknown-key"),
    pytest.param(with_second_step(advance_to='"3"'), "advance_to", "expected a whole number, got '3'",
                 id="wrong-type"),
    pytest.param(with_second_step(advance_to="9"), "advance_to", "is more than max_new_tokens (4)",
                 id="advance-past-the-budget"),
    pytest.param(with_second_step(question='"next_kv_tomorrow"'), "question", "unknown quantity 'next_kv_tomorrow'",
                 id="unknown-question"),
    pytest.param(with_second_step(cache='"maybe"'), "cache", "expected true, false or \"compare\", got 'maybe'",
                 id="cache-maybe"),
    pytest.param(with_second_step(prompt=None), "prompt", "missing", id="missing-key"),
    pytest.param(with_second_step(advance_to="4", question='"avoided_after_next"'), "question",
                 "no next step to reveal it", id="question-without-a-next-step"),
    pytest.param(with_second_step(max_new_tokens="0", advance_to="0"), "max_new_tokens", "is not from 1 to",
                 id="no-budget"),
    pytest.param(with_second_step(focus='"everything"'), "focus", "expected one of grid", id="unknown-focus"),
    pytest.param(with_second_step(title='"  "'), "title", "is empty", id="empty-title"),
    pytest.param(with_second_step(title='"Clear \\u001b[2J the screen"'), "title",
                 "holds the control character \\x1b; a lesson is plain text", id="escape-in-a-title"),
    pytest.param(with_second_step(title='"Ding \\u0007"'), "title", "control character \\x07", id="bell-in-a-title"),
    pytest.param(with_second_step(model='"gpt2\\u0000x"'), "model", "control character \\x00", id="nul-in-a-model"),
    pytest.param(with_second_step(**{'"bad\\nkey\\u001b]0;owned\\u0007"': "1"}), "bad\\nkey\\x1b]0;owned\\x07",
                 "unknown key", id="controls-in-a-key"),
]


@pytest.mark.parametrize(("text", "key", "fragment"), MALFORMED)
def test_every_malformed_step_is_one_line_naming_file_step_and_key(text, key, fragment):
    with pytest.raises(LessonError) as caught:
        parse_lesson(text, SOURCE)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{SOURCE}: step 2: {key}: "), message
    assert fragment in message, message


@pytest.mark.parametrize("text", ["x = " + "[" * 100_000 + "]" * 100_000, "x = " + "{a = " * 3000 + "1" + "}" * 3000],
                         ids=["arrays", "inline-tables"])
def test_deep_nesting_is_one_line(text):
    with pytest.raises(LessonError, match=rf"^{SOURCE}: (larger than 32 KB|arrays or tables nested too deeply)"):
        parse_lesson(text, SOURCE)
    with pytest.raises(LessonError, match=rf"^{SOURCE}: arrays or tables nested too deeply to be a lesson$"):
        parse_lesson(text[:10_000] + text[-10_000:], SOURCE)


def test_a_file_larger_than_any_lesson_is_refused_unread(tmp_path):
    path = tmp_path / "dotted.toml"
    path.write_text("".join(f"a{i}.b{i}.c{i}.d{i} = {i}\n" for i in range(4000)), encoding="utf-8")  # about 80 KB
    with pytest.raises(LessonError, match=r"dotted\.toml: larger than 32 KB; a lesson file is at most that$"):
        load_lesson(path)


def test_bad_toml_names_the_file_and_the_line(tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text('title = "x"\n[[step]]\ntitle = \n', encoding="utf-8")
    with pytest.raises(LessonError) as caught:
        load_lesson(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: not valid TOML") and "line 3" in message and "\n" not in message


def test_a_missing_file_and_a_lesson_without_steps_are_one_line(tmp_path):
    with pytest.raises(LessonError, match=r"nowhere\.toml: no such lesson file$"):
        load_lesson(tmp_path / "nowhere.toml")
    with pytest.raises(LessonError, match=rf"^{SOURCE}: step: a lesson needs at least one \[\[step\]\]$"):
        parse_lesson('title = "Nothing"\n', SOURCE)
    with pytest.raises(LessonError, match=rf"^{SOURCE}: title: "):
        parse_lesson(STEP, SOURCE)


def test_the_documented_example_parses():
    lesson = parse_lesson(documented_example(), "docs/lessons.md")
    assert len(lesson.steps) == 3
    assert [step.cache for step in lesson.steps] == [False, True, "compare"]
    assert [step.question for step in lesson.steps] == ["next_kv_without_cache", "avoided_after_next", None]
    assert lesson.steps[0].notes  # the example shows notes too: the slides must leave them out
    assert len(lesson.slides()) == 5


# ----- measured answers, from a tiny model's real records -----


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine(tiny_kvviz_model(n_layer=3, n_head=2, n_embd=32, n_ctx=64))


def token_steps(engine: Engine, prompt: str, use_cache: bool, budget: int) -> list[list]:
    """The run's records grouped by token step: [[pass, (filling pass)], ...]."""
    plan = plan_ids(engine, engine.encode_prompt(prompt), budget, use_cache)
    steps: list[list] = []
    for record in engine.run(plan, top_candidates=1):
        if record.token_id is None:
            steps[-1].append(record)
        else:
            steps.append([record])
    return steps


def answer(engine: Engine, question: str, prompt: str, use_cache: bool, budget: int, advance_to: int) -> float:
    """The step's question answered as a lesson does: the last record at `advance_to` token steps (None
    at 0) against the last record of the next token step."""
    steps = token_steps(engine, prompt, use_cache, budget)
    previous = steps[advance_to - 1][-1] if advance_to else None
    return measured_answer(question, previous, steps[advance_to][-1])


def test_measured_answers_equal_hand_counts(engine):
    assert len(engine.encode_prompt("Time flies")) == 2 and len(engine.encode_prompt("Time flies fast")) == 3
    # Without the cache, step 4 feeds the 2 prompt tokens and the 3 generated ones.
    assert answer(engine, "next_kv_without_cache", "Time flies", False, 12, 3) == 5
    # With it: the prefill computes the prompt, a middle step one column, the last step two (token and filling pass).
    assert answer(engine, "next_kv_with_cache", "Time flies", True, 12, 0) == 2
    assert answer(engine, "next_kv_with_cache", "Time flies", True, 12, 3) == 1
    assert answer(engine, "next_kv_with_cache", "Time flies fast", True, 12, 11) == 2
    # P = 3, N = 12: 3+4+...+14 = 102 without, 15 with: 87 avoided, 6.8x.
    assert answer(engine, "avoided_after_next", "Time flies fast", True, 12, 11) == 87
    ratio = answer(engine, "ratio_after_next", "Time flies fast", True, 12, 11)
    assert ratio == pytest.approx(102 / 15) and format_answer("ratio_after_next", ratio) == "6.8x"
    # After step 4 (P = 2, 3 tokens before it) the cache holds 2 + 3 positions; after the last step all 3 + 12.
    per_position = 2 * 3 * 2 * 16 * 4  # K and V, 3 layers, 2 heads of 16, float32: by hand
    assert per_position == 2 * 3 * 2 * 16 * 4
    assert answer(engine, "cache_bytes_after_next", "Time flies", True, 12, 3) == 5 * per_position
    assert answer(engine, "cache_bytes_after_next", "Time flies fast", True, 12, 11) == 15 * per_position
    assert answer(engine, "cache_bytes_after_next", "Time flies", False, 12, 3) == 0
    assert format_answer("cache_bytes_after_next", 15 * per_position) == f"{15 * per_position:,} bytes"


# ----- the documented example, exported with the command line -----


def test_the_documented_example_exports_with_the_cli(qtbot, tmp_path, capsys):
    from kvviz.cli.commands import main

    lesson_file = tmp_path / "example.toml"
    lesson_file.write_text(documented_example(), encoding="utf-8")
    model = save_kvviz_folder(tmp_path / "tiny", n_layer=2, n_head=2, n_embd=32, n_ctx=64)
    out = tmp_path / "slides"
    assert main(["lesson", "--file", str(lesson_file), "--export", str(out), "--model", str(model),
                 "--width", "640"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 6 and lines[-1] == f"deck of 5 pages -> {out / 'kvviz-lesson.pdf'}"
    assert "answer: 5 (measured)" in lines[1]  # step 1: without the cache, step 4 feeds 2 + 3 tokens
    assert "answer: 9 (measured)" in lines[3]  # step 2: after step 4, 2+3+4+5 = 14 without, 5 with
    assert sorted(p.name for p in out.iterdir()) == [*(f"kvviz-lesson-0{n}.png" for n in range(1, 6)),
                                                     "kvviz-lesson.pdf"]


def test_a_fifo_is_refused_instead_of_waited_on(tmp_path):
    import os
    import threading

    from kvviz.lessons.lesson import LessonError, load_lesson

    fifo = tmp_path / "lesson.toml"
    os.mkfifo(fifo)
    errors: list[str] = []

    def load() -> None:
        try:
            load_lesson(fifo)
        except LessonError as exc:
            errors.append(str(exc))

    reader = threading.Thread(target=load, daemon=True)
    reader.start()
    reader.join(10)
    if reader.is_alive():
        with open(fifo, "w"):  # let the stuck reader go before failing
            pass
        pytest.fail("load_lesson waited on a FIFO")
    assert errors == [f"{fifo}: not a regular file"]


def test_the_sink_share_is_the_mean_over_layers_and_heads_of_the_weight_on_the_first_positions():
    """Hand numbers: two heads over three positions, (0.5, 0.25, 0.25) and (0.1, 0.2, 0.7): one sink gets
    (0.5 + 0.1) / 2 = 30 %, two get (0.75 + 0.3) / 2 = 52.5 %."""
    import struct
    from dataclasses import replace

    from kvviz.core.records import AttentionWeights

    engine = Engine(tiny_kvviz_model())
    record = list(engine.run(plan_ids(engine, [1, 2], 1)))[-1]
    weights = AttentionWeights(1, 2, 3, struct.pack("=6f", 0.5, 0.25, 0.25, 0.1, 0.2, 0.7))
    record = replace(record, attention=weights)
    assert measured_answer("sink_attention_share", None, record, 1) == pytest.approx(30.0)
    assert measured_answer("sink_attention_share", None, record, 2) == pytest.approx(52.5)
    assert format_answer("sink_attention_share", 52.5) == "52.5 %"
    with pytest.raises(LessonError, match="step 1: question: sink_attention_share asks about the sinks: give sinks"):
        parse_lesson('title = "x"\n[[step]]\ntitle = "s"\ntext = "t"\nprompt = "p"\ncache = true\nadvance_to = 1\n'
                     'max_new_tokens = 4\nwindow = 4\nquestion = "sink_attention_share"\n', "bad.toml")
