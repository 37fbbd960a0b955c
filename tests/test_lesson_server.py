"""The built-in lesson "A server's cache" (kv-server, issue #42): trace steps that serve the built-in trace pass by
pass, and two questions answered from the records of the passes, never from a formula: the prefix-cache hits of a
follow-up (its admission's cached tokens) and the blocks a preemption frees (a small pool forces one). Their
answers equal hand counts; a bad trace step is one line; in the app the lesson runs to each question and the
measured answer appears beside the guess."""

from __future__ import annotations

import json

import pytest
from PySide6.QtCore import Qt

from kvviz.app.export.slides import run_step
from kvviz.engine.engine import Engine
from kvviz.lessons.lesson import BUILTIN_LESSONS, LessonError, format_answer, load_lesson, parse_lesson

NAME = "kv-server"
SOURCE = "server-lesson.toml"
SYSTEM = ("You are a helpful assistant who answers questions about the plays of William Shakespeare, briefly and "
          "kindly, quoting a line where one helps, naming the play and the act, and saying plainly when you do not "
          "know the answer to it.")


@pytest.fixture(scope="module")
def lesson():
    return load_lesson(NAME)


@pytest.fixture(scope="module")
def engine() -> Engine:
    from kvviz.sources.weights import load_model

    loaded = load_model(None)
    return Engine(loaded.model, loaded.tokenizer)


def trace_step(**keys: str) -> str:
    lines = "\n".join(f"{key} = {value}" for key, value in keys.items())
    return f'title = "Serving"\n[[step]]\ntitle = "a"\ntext = "b"\n{lines}\n'


def question_step(lesson, question: str) -> int:
    return next(index for index, step in enumerate(lesson.steps) if step.question == question)


def test_the_lesson_serves_the_built_in_trace_in_six_steps_and_asks_two_questions(lesson):
    assert NAME in BUILTIN_LESSONS and lesson.title == "A server's cache: requests over time"
    assert len(lesson.steps) == 6 and len(lesson.slides()) == 8
    assert all(step.serves_trace and step.serving and not step.batch for step in lesson.steps)
    assert [step.question for step in lesson.steps if step.question] == ["prefix_hits_at_admission",
                                                                          "blocks_freed_by_preemption"]
    hits = lesson.steps[question_step(lesson, "prefix_hits_at_admission")]
    assert hits.request == "follow-up 1"
    assert hits.question_text == ("When follow-up 1 is admitted, how many of its prompt tokens will the prefix cache "
                                  "already hold?")
    assert hits.serve_request(7) == load_lesson(NAME).steps[0].serve_request(7)  # the defaults: radix, chunks of 16
    freed = lesson.steps[question_step(lesson, "blocks_freed_by_preemption")].serve_request()
    assert (freed.trace_path, freed.prefix_cache, freed.num_blocks, freed.chunk, freed.block_size) == (
        None, "radix", 15, 32, 16)  # the built-in trace on a small pool
    assert lesson.steps[-1].serve_request().prefix_cache == "off"
    assert format_answer("prefix_hits_at_admission", 53.0) == "53 tokens"
    assert format_answer("blocks_freed_by_preemption", 1.0) == "1 block"


def test_the_answers_are_measured_from_the_passes_and_equal_the_hand_counts(lesson, engine):
    """As the slides take them (kvviz.app.export.slides.run_step), and the app's lesson mode alike: the records up
    to the step's pass, then on to the first pass whose record answers."""
    tokens = engine.tokenizer.encode
    hits_at = question_step(lesson, "prefix_hits_at_admission")
    run = run_step(engine, "kvviz-shakespeare", lesson, hits_at)
    plan = run.plan
    follow_up, chat = plan.requests[4], plan.requests[0]
    assert (follow_up.name, chat.name) == ("follow-up 1", "chat 1")
    # Hand count: chat 1's prompt is the 46-token system prompt, " Question:" (2) and " Who is Hamlet?" (5): 53
    # tokens, and follow-up 1 begins with all of them. Chat 1 finished before follow-up 1 arrived; its blocks stay
    # cached, holding its prompt and then its own answer, whose first token is not the follow-up's next one
    # (" Answer"): the longest common prefix, which the radix tree finds, is 53.
    assert [len(tokens(text)) for text in (SYSTEM, SYSTEM + " Question:", chat.prompt)] == [46, 48, 53]
    assert follow_up.prompt_ids[:53] == chat.prompt_ids
    assert run.shown[-1].states[0] == "finished" and run.shown[-1].states[4] == "not arrived"
    assert run.shown[-1].outputs[0][0] != follow_up.prompt_ids[53]
    assert run.answer == 53
    assert run.advanced[-1].admitted == (4,) and run.advanced[-1].cached_tokens == (53,)  # the pass it arrives in
    assert run.shown[-1].step == 28 and run.advanced[-1].step == 30  # nothing runs in pass 29

    freed_at = question_step(lesson, "blocks_freed_by_preemption")
    run = run_step(engine, "kvviz-shakespeare", lesson, freed_at)
    before, answer = run.shown[-1], run.advanced[-1]
    document = 3
    # Hand count: the document has prefilled 4 chunks of 32 tokens when the pool runs out: 128 positions, 8 blocks
    # of 16 that no chat shares (its prompt begins with other tokens): the blocks only it holds.
    assert plan.requests[document].name == "document" and before.lengths[document] == 4 * 32
    assert not set(before.tables[document]) & {b for i, table in enumerate(before.tables) if i != document
                                               for b in table}
    assert answer.preempted[0] == document and run.answer == 128 // 16 == 8
    assert not any(r.preempted for r in run.shown)  # the first preemption: in the pass after the question's


def two_requests(folder) -> None:
    trace = [{"arrive_at_pass": 0, "prompt": "ROMEO:", "max_new_tokens": 4, "name": "romeo"},
             {"arrive_at_pass": 2, "prompt": "ROMEO: and", "max_new_tokens": 3}]
    (folder / "two.jsonl").write_text("\n".join(map(json.dumps, trace)), encoding="utf-8")


def test_a_question_the_trace_never_answers_is_one_line_when_the_slides_run_it(engine, tmp_path):
    two_requests(tmp_path)
    source = str(tmp_path / SOURCE)
    lesson = parse_lesson(trace_step(trace='"two.jsonl"', advance_to="3", question='"blocks_freed_by_preemption"'),
                          source)  # 64 blocks: nothing is ever preempted
    with pytest.raises(LessonError) as caught:
        run_step(engine, "kvviz-shakespeare", lesson, 0)
    assert str(caught.value) == (f"{source}: step 1: question: no request is preempted after pass 3: a smaller pool "
                                 "(num_blocks) or larger chunks make the scheduler preempt")


BASE = {"trace": '"server"', "advance_to": "3"}
MALFORMED = [
    pytest.param(trace_step(**{**BASE, "trace": '"missing.jsonl"'}), "trace", "missing.jsonl: no such trace file",
                 id="no-file"),
    pytest.param(trace_step(**{**BASE, "trace": '"bad.jsonl"'}), "trace", "bad.jsonl, line 1: not JSON",
                 id="not-json"),
    pytest.param(trace_step(**{**BASE, "trace": '"  "'}), "trace", "is empty", id="empty"),
    pytest.param(trace_step(trace='"server"'), "advance_to", "missing", id="no-advance"),
    pytest.param(trace_step(**BASE, prompt='"hi"'), "prompt", "a trace step's requests are its trace's", id="prompt"),
    pytest.param(trace_step(**BASE, max_new_tokens="4"), "max_new_tokens", "no max_new_tokens", id="budget"),
    pytest.param(trace_step(**BASE, prefix_cache='"lru"'), "prefix_cache", "expected one of off, hash, radix",
                 id="prefix-cache"),
    pytest.param(trace_step(**BASE, num_blocks="0"), "num_blocks", "0 is not from 1 to 65,536", id="no-blocks"),
    pytest.param(trace_step(**BASE, chunk="-1"), "chunk", "-1 is not from 0", id="negative-chunk"),
    pytest.param(trace_step(**BASE, block_size="300"), "block_size", "300 is not from 1 to 256", id="block-size"),
    pytest.param(trace_step(**{**BASE, "advance_to": "-1"}), "advance_to", "-1 is not from 0", id="advance"),
    pytest.param(trace_step(**BASE, question='"blocks_at_end"'), "question", "a trace step asks prefix_hits",
                 id="batch-question"),
    pytest.param(trace_step(**BASE, question='"prefix_hits_at_admission"'), "request", "missing", id="no-request"),
    pytest.param(trace_step(**BASE, question='"prefix_hits_at_admission"', request='"chat 9"'), "request",
                 "the trace has no request named 'chat 9'; its requests: chat 1, chat 2", id="unknown-request"),
    pytest.param(trace_step(**BASE, request='"chat 1"'), "request", "goes with question", id="request-alone"),
    pytest.param(trace_step(**BASE, focus='"chart"'), "focus", "a trace step shows 'serving', 'timeline', 'blocks'",
                 id="focus"),
    pytest.param(trace_step(prompt='"hi"', cache="true", advance_to="1", max_new_tokens="4", chunk="8"), "chunk",
                 "goes with trace", id="chunk-without-trace"),
    pytest.param(trace_step(prompt='"hi"', cache="true", advance_to="1", max_new_tokens="4",
                            question='"blocks_freed_by_preemption"'), "question", "give trace too",
                 id="question-without-trace"),
]


@pytest.mark.parametrize(("text", "key", "fragment"), MALFORMED)
def test_every_bad_trace_step_is_one_line_naming_file_step_and_key(text, key, fragment, tmp_path):
    (tmp_path / "bad.jsonl").write_text("{nope\n", encoding="utf-8")
    source = str(tmp_path / SOURCE)  # a trace file is found beside the lesson file
    with pytest.raises(LessonError) as caught:
        parse_lesson(text, source)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{source}: step 1: {key}: "), message
    assert fragment in message, message


def test_a_trace_beside_the_lesson_file_is_read_with_it(tmp_path):
    two_requests(tmp_path)
    path = tmp_path / "lesson.toml"
    path.write_text(trace_step(trace='"two.jsonl"', advance_to="2", question='"prefix_hits_at_admission"',
                               request='"r2"', prefix_cache='"hash"', block_size="4"), encoding="utf-8")
    step = load_lesson(path).steps[0]
    request = step.serve_request()
    assert request.trace_path == str(tmp_path / "two.jsonl")
    assert (request.prefix_cache, request.block_size, request.num_blocks, request.chunk) == ("hash", 4, 64, 16)


def test_the_app_runs_the_lesson_to_each_question_and_shows_the_measured_answer(qtbot, app_model, tmp_path):
    from kvviz.app.assembly import open_window
    from kvviz.app.settings import app_settings

    win = open_window(app_model, "hello", settings=app_settings())
    qtbot.addWidget(win)
    win.show()
    lesson, batch = win.lesson, win.serving.batch
    try:
        qtbot.waitUntil(lambda: win.session.plan is not None, timeout=60_000)
        win.actions["lesson_server"].trigger()  # Help > Lesson: a server's cache
        qtbot.waitUntil(lambda: lesson.ready, timeout=60_000)
        assert lesson.lesson.title == load_lesson(NAME).title
        for answer in (53, 8):
            for _ in range(len(lesson.lesson.steps)):  # through the steps between, each replaced by the next at once
                if lesson.step.question:
                    break
                qtbot.keyClick(win, Qt.Key.Key_PageDown)
            qtbot.waitUntil(lambda: lesson.ready, timeout=60_000)
            step = lesson.step
            assert win.serving.active and batch.plan.num_blocks == step.num_blocks
            assert batch.plan.steps_done(batch.records[-1]) == step.advance_to  # the question: at its pass
            qtbot.keyClick(win, Qt.Key.Key_PageDown)  # the answer: on to the pass that holds it
            qtbot.waitUntil(lambda: lesson.ready, timeout=60_000)
            assert lesson.revealed and lesson.measured == answer
            assert lesson.panel.answer_text().endswith(f"measured {format_answer(step.question, answer)}")
            record = batch.records[-1]
            assert (record.cached_tokens if answer == 53 else record.freed_blocks) == (answer,)
            qtbot.keyClick(win, Qt.Key.Key_PageDown)
        # A trace beside a lesson file, asked before its first pass. Hand count: r2 ("ROMEO: and") arrives at pass 2
        # while romeo ("ROMEO:", 3 tokens) runs; the cache holds romeo's 3 prompt tokens, then its first answer token,
        # a line break, where r2 goes on with " and": 3 tokens found cached.
        two_requests(tmp_path)
        asked = trace_step(trace='"two.jsonl"', advance_to="0", block_size="4", request='"r2"',
                           question='"prefix_hits_at_admission"')
        (tmp_path / "two.toml").write_text(asked, encoding="utf-8")
        lesson.switch(str(tmp_path / "two.toml"))
        qtbot.waitUntil(lambda: lesson.ready, timeout=60_000)
        assert batch.records == [] and batch.plan.requests[1].name == "r2"  # the question: before pass 0
        qtbot.keyClick(win, Qt.Key.Key_PageDown)
        qtbot.waitUntil(lambda: lesson.ready, timeout=60_000)
        assert batch.records[0].output_labels[0] == ("\n",)  # romeo's first token, chosen at pass 0
        assert lesson.measured == 3 and batch.records[-1].step == 2 and batch.records[-1].admitted == (1,)
    finally:
        win.close()
