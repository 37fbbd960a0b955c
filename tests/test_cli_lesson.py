"""`kvviz lesson` and `kvviz --lesson`: the list (text and JSON, no model loaded), slides as PNGs and one PDF
deck (a page per slide, the grid's colours on every slide with a run, never the notes), everything or
nothing on disk, one-line errors with status 2, and the built-in lesson on the embedded model in time."""

from __future__ import annotations

import json
import os
import re
from io import StringIO
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from helpers_checkpoints import save_kvviz_folder
from PySide6.QtCore import QPoint, QRect
from PySide6.QtGui import QImage
from PySide6.QtWidgets import QScrollBar

from kvviz.app import theme
from kvviz.app.export import ExportError, export_lesson, slide_file_name, slides
from kvviz.app.export import slide_layout as slides_module
from kvviz.app.export.slide_stage import SlideStage
from kvviz.cli.commands import main
from kvviz.lessons.lesson import LessonError, load_lesson, parse_lesson

ENV = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "HF_HUB_OFFLINE": "1", "PYTHONIOENCODING": "utf-8"}
BUILTIN_SLIDES = 10
STEP = """
[[step]]
title = "{title}"
text = "Some text."
prompt = "{prompt}"
cache = {cache}
advance_to = {advance_to}
max_new_tokens = {budget}
"""


def lesson_text(*steps: dict, title: str = "A lesson") -> str:
    defaults = {"title": "A step", "prompt": "Time flies", "cache": "true", "advance_to": 2, "budget": 4}
    parts = [f'title = "{title}"']
    for step in steps:
        extra = step.pop("extra", "")
        parts.append(STEP.format(**{**defaults, **step}) + extra)
    return "\n".join(parts)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A tiny model (2 layers, 64 positions) for fast exports."""
    return save_kvviz_folder(tmp_path_factory.mktemp("lesson-model") / "tiny", n_layer=2, n_head=2, n_embd=32,
                             n_ctx=64)


def pixels(path: Path) -> np.ndarray:
    image = QImage(str(path)).convertToFormat(QImage.Format.Format_RGB888)
    data = np.frombuffer(image.constBits(), dtype=np.uint8, count=image.sizeInBytes())
    return data.reshape(image.height(), image.bytesPerLine())[:, : image.width() * 3].reshape(
        image.height(), image.width(), 3).astype(np.int16)


def count_near(rgb_pixels: np.ndarray, hex_colour: str, tolerance: int = 12) -> int:
    colour = np.array(theme.rgba(hex_colour)[:3], dtype=np.int16)
    return int((np.abs(rgb_pixels - colour).max(axis=2) <= tolerance).sum())


def pdf_pages(data: bytes) -> int:
    """Page objects of a PDF (`/Type /Page`, not the `/Type /Pages` tree)."""
    return len(re.findall(rb"/Type\s*/Page(?![A-Za-z])", data))


# ----- --list -----


def test_list_json_has_exactly_the_titles_and_question_keys(capsys):
    assert main(["lesson", "--list", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    lesson = load_lesson()
    assert set(result) == {"title", "steps"} and result["title"] == lesson.title == "The KV cache in six steps"
    assert all(set(step) == {"title", "question"} for step in result["steps"])
    assert result["steps"] == [{"title": s.title, "question": s.question} for s in lesson.steps]
    assert result["steps"][0] == {"title": "The prompt goes in", "question": "next_kv_with_cache"}
    assert result["steps"][-1]["question"] is None


def test_list_prints_a_row_per_step(capsys, tmp_path):
    assert main(["lesson", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "The KV cache in six steps (built-in): 6 steps, 4 questions, 10 slides"
    assert re.fullmatch(r"  1  The prompt goes in +question: next_kv_with_cache", lines[1])
    assert re.fullmatch(r"  5  Memory for time +question: none", lines[5])
    assert re.fullmatch(r"  6  The output is unchanged +question: none", lines[6]) and len(lines) == 7
    path = tmp_path / "one.toml"
    path.write_text(lesson_text({"title": "Only"}, title="Mine"), encoding="utf-8")
    assert main(["lesson", "--list", "--file", str(path)]) == 0
    assert capsys.readouterr().out.splitlines() == [f"Mine ({path}): 1 step, 0 questions, 1 slide",
                                                   "  1  Only  question: none"]


# ----- --export -----


@pytest.fixture(scope="module")
def builtin_export(tiny, tmp_path_factory):
    """The built-in lesson exported on the tiny model (PNG and PDF, 800 pixels wide) through the command
    line, every slide's text as paint_slide received it, and the printed lines."""
    out = tmp_path_factory.mktemp("built-in") / "slides"
    received = []
    original = slides_module.paint_slide

    def recording(painter, text, view):
        received.append(text)
        return original(painter, text, view)

    slides_module.paint_slide = recording
    try:
        with mock.patch("sys.stdout", new=StringIO()) as stdout:
            status = main(["lesson", "--export", str(out), "--model", str(tiny), "--format", "png,pdf",
                           "--width", "800"])
        printed = stdout.getvalue().splitlines()
    finally:
        slides_module.paint_slide = original
    assert status == 0
    return out, received, printed


def test_export_writes_a_png_per_slide_and_a_deck(builtin_export):
    out, _, printed = builtin_export
    names = sorted(p.name for p in out.iterdir())
    assert names == [slide_file_name(n, BUILTIN_SLIDES) for n in range(1, BUILTIN_SLIDES + 1)] + ["kvviz-lesson.pdf"]
    assert names[0] == "kvviz-lesson-01.png"
    assert pdf_pages((out / "kvviz-lesson.pdf").read_bytes()) == BUILTIN_SLIDES
    assert len(printed) == BUILTIN_SLIDES + 2  # the speed sweep's line first, a line per slide, the deck's
    assert printed[0].startswith("measuring the speed of a token step of tiny on this machine")
    printed = printed[1:]
    for number, line in enumerate(printed[:-1], start=1):
        assert line.startswith(f"slide {number}/{BUILTIN_SLIDES}: step ") and line.endswith(
            f" -> {out / slide_file_name(number, BUILTIN_SLIDES)}")
    assert printed[1] == (f"slide 2/10: step 1 of 6, \u201cThe prompt goes in\u201d, answer: 2 (measured) -> "
                          f"{out / 'kvviz-lesson-02.png'}")
    assert printed[-1] == f"deck of 10 pages -> {out / 'kvviz-lesson.pdf'}"


def test_every_slide_shows_its_focus_in_the_grid_colours(builtin_export):
    """A grid (or "all") slide is mostly amber and teal cells once a pass ran; a counter slide shows the chart's
    two curves and the counter's numbers in them."""
    out, _, _ = builtin_export
    lesson = load_lesson()
    for number, (index, revealed) in enumerate(lesson.slides(), start=1):
        step = lesson.steps[index]
        image = pixels(out / slide_file_name(number, BUILTIN_SLIDES))
        assert image.shape == (450, 800, 3)  # 16:9
        amber, teal = count_near(image, theme.DARK.amber), count_near(image, theme.DARK.teal)
        area = image.shape[0] * image.shape[1]
        if step.focus in ("chart", "counter", "speed"):  # curves (the speed sweep's two, in the same colours)
            # a curve 2 px wide across the chart holds some 300-500 px of an 800x450 slide (343 amber and 426
            # teal measured on the counter slide of "Time flies")
            assert amber > 0.0006 * area and teal > 0.0006 * area, (number, amber, teal)
        elif step.advance_to or revealed:
            assert amber + teal > 0.02 * area, (number, amber + teal)
        else:  # before the first step: no cell computed, only the legend's swatches
            assert amber + teal < 0.01 * area, (number, amber + teal)


def test_slides_say_title_place_question_and_answer_and_never_the_notes(builtin_export):
    out, received, _ = builtin_export
    lesson = load_lesson()
    notes = [step.notes for step in lesson.steps if step.notes]
    assert len(notes) >= 3
    assert len(received) == 2 * BUILTIN_SLIDES  # each slide drawn twice: the PNG and the deck's page
    for text in received:
        for note in notes:
            assert all(note not in str(value) for value in vars(text).values())
    deck = (out / "kvviz-lesson.pdf").read_bytes()
    assert all(note.encode() not in deck for note in notes)
    by_slide = received[::2]
    assert [t.place for t in by_slide[:3]] == ["step 1 of 6", "step 1 of 6", "step 2 of 6"]
    assert by_slide[0].question and not by_slide[0].answer
    assert by_slide[1].answer == "Answer: 2 (measured)"  # the prefill computes both prompt tokens
    assert by_slide[3].answer == "Answer: 5 (measured)"  # without the cache, step 4 feeds 2 + 3 tokens
    assert by_slide[5].answer == "Answer: 1 (measured)"
    assert by_slide[7].answer == "Answer: 76 (measured)"
    assert by_slide[8].question == "" and by_slide[8].title == "Memory for time"
    assert by_slide[9].title == "The output is unchanged"
    assert "with and without KV cache in lockstep" in by_slide[9].footer


def test_a_question_reveals_the_run_one_step_further(tiny):
    from kvviz.engine.engine import Engine
    from kvviz.sources.weights import load_model

    engine = Engine(load_model(str(tiny)).model)
    lesson = parse_lesson(lesson_text(
        {"prompt": "Time flies fast", "advance_to": 11, "budget": 12, "extra": 'question = "avoided_after_next"'},
        {"cache": "false", "advance_to": 0, "budget": 3, "extra": 'question = "next_kv_without_cache"'},
        {"cache": '"compare"', "advance_to": 3, "budget": 3}), "test.toml")
    last = slides.run_step(engine, "tiny", lesson, 0)
    assert [r.new_tokens for r in last.shown] == list(range(1, 12))
    assert [r.new_tokens for r in last.advanced] == [*range(1, 13), 12]  # and the pass that fills the cache
    assert last.advanced[-1].token_id is None and last.answer == 87
    first = slides.run_step(engine, "tiny", lesson, 1)
    assert first.shown == () and len(first.advanced) == 1 and first.answer == 2
    both = slides.run_step(engine, "tiny", lesson, 2)
    assert both.plan.twin is not None and both.answer is None and both.shown == both.advanced
    assert [r.new_tokens for r in both.shown] == [1, 2, 3, 3] and all(r.twin for r in both.shown[:3])


def test_a_failed_export_keeps_none_of_its_files(tiny, tmp_path, qtbot, monkeypatch):
    lesson = parse_lesson(lesson_text({"extra": 'question = "next_kv_with_cache"'}, {}), "test.toml")
    out = tmp_path / "new" / "slides"

    def full_disk(self):
        raise ExportError("kvviz-lesson.pdf: could not be written (No space left on device)")

    monkeypatch.setattr(slides_module.Deck, "data", full_disk)
    lines = []
    with pytest.raises(ExportError, match="No space left"):
        export_lesson(lesson, out, "png,pdf", width=320, model=str(tiny), progress=lines.append)
    assert len(lines) == 3 and not (tmp_path / "new").exists()  # three PNGs written, then removed
    monkeypatch.undo()

    def closed_output(line):
        raise OSError("standard output is closed")

    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "other.txt").write_text("mine", encoding="utf-8")
    with pytest.raises(OSError):
        export_lesson(lesson, tmp_path / "kept", "png", width=320, model=str(tiny), progress=closed_output)
    assert [p.name for p in (tmp_path / "kept").iterdir()] == ["other.txt"]


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


def test_a_re_export_replaces_the_earlier_deck_whole_or_leaves_it_exactly(tiny, tmp_path, qtbot, monkeypatch):
    longer = parse_lesson(lesson_text({}, {}, {}), "long.toml")
    shorter = parse_lesson(lesson_text({}), "short.toml")
    out = tmp_path / "slides"
    export_lesson(longer, out, "png,pdf", width=320, model=str(tiny))
    earlier = folder_bytes(out)
    assert sorted(earlier) == ["kvviz-lesson-01.png", "kvviz-lesson-02.png", "kvviz-lesson-03.png",
                               "kvviz-lesson.pdf"]

    def full_disk(self):
        raise ExportError("kvviz-lesson.pdf: could not be written (No space left on device)")

    with monkeypatch.context() as patch:  # every PNG of the new deck is whole before the PDF fails
        patch.setattr(slides_module.Deck, "data", full_disk)
        with pytest.raises(ExportError, match="No space left"):
            export_lesson(shorter, out, "png,pdf", width=200, model=str(tiny))
    assert folder_bytes(out) == earlier
    (out / "notes.txt").write_text("mine", encoding="utf-8")
    export_lesson(shorter, out, "png", width=200, model=str(tiny))
    assert sorted(folder_bytes(out)) == ["kvviz-lesson-01.png", "notes.txt"]  # no slide or PDF of the longer deck
    assert folder_bytes(out)["kvviz-lesson-01.png"] != earlier["kvviz-lesson-01.png"]


def test_pdf_alone_writes_the_deck_only(tiny, tmp_path, qtbot):
    lesson = parse_lesson(lesson_text({}, {"cache": '"compare"', "advance_to": 4}), "test.toml")
    lines: list[str] = []
    paths = export_lesson(lesson, tmp_path, "pdf", model=str(tiny), progress=lines.append)
    assert paths == [tmp_path / "kvviz-lesson.pdf"] and pdf_pages(paths[0].read_bytes()) == 2
    assert lines == ["slide 1/2: step 1 of 2, \u201cA step\u201d", "slide 2/2: step 2 of 2, \u201cA step\u201d",
                     f"deck of 2 pages -> {paths[0]}"]


# ----- errors: one line, status 2 -----


def one_line_error(capsys, args: list[str]) -> str:
    assert main(args) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvviz: "), captured.err
    return lines[0]


def test_bad_lessons_and_options_are_one_line_and_status_2(capsys, tmp_path, tiny):
    bad_toml = tmp_path / "bad.toml"
    bad_toml.write_text("title = \n", encoding="utf-8")
    unknown = tmp_path / "unknown.toml"
    unknown.write_text(lesson_text({"extra": 'question = "next_kv_tomorrow"'}), encoding="utf-8")
    too_long = tmp_path / "too-long.toml"  # the tiny model holds 64 tokens: 62 new after "Time flies"
    too_long.write_text(lesson_text({}, {"advance_to": 100, "budget": 100}), encoding="utf-8")
    other_model = tmp_path / "other-model.toml"
    other_model.write_text(lesson_text({}, {"extra": 'model = "no-such-model"'}), encoding="utf-8")
    out = str(tmp_path / "out")
    expected = [
        (["lesson", "--list", "--file", str(bad_toml)], f"kvviz: {bad_toml}: not valid TOML"),
        (["lesson", "--export", out, "--file", str(unknown)], f"kvviz: {unknown}: step 1: question: unknown quantity"),
        (["lesson", "--list", "--file", str(tmp_path / "none.toml")], "none.toml: no such lesson file"),
        (["lesson", "--export", out, "--model", str(tiny), "--file", str(too_long)],
         f"kvviz: {too_long}: step 2: advance_to: tiny holds 64 tokens, room for 62 new after the prompt"),
        (["lesson", "--export", out, "--model", str(tiny), "--file", str(other_model)],
         f"kvviz: {other_model}: step 2: model: no-such-model: unknown model"),
        (["lesson", "--export", "/dev/null"], "kvviz: /dev/null: exists and is not a folder"),
        (["lesson", "--export", out, "--format", "png,svg"], "kvviz: a lesson exports png and pdf, not svg"),
        (["lesson", "--export", out, "--json"], "kvviz: --json goes with --list, not with --export"),
        (["lesson", "--list", "--model", str(tiny)], "kvviz: --model goes with --export, not with --list"),
        (["lesson", "--export", out, "--width", "10"], "kvviz: width must be 64 to 8192 pixels, got 10"),
        (["--lesson", str(bad_toml)], f"kvviz: {bad_toml}: not valid TOML"),
        (["--lesson", str(tmp_path)], f"kvviz: {tmp_path}: is a folder, not a lesson file"),
    ]
    for args, fragment in expected:
        assert fragment in one_line_error(capsys, args), args
    assert not (tmp_path / "out").exists()
    with pytest.raises(SystemExit) as exited:
        main(["lesson"])
    assert exited.value.code == 2 and "one of the arguments --list --export is required" in capsys.readouterr().err


def test_the_app_gets_the_lesson_to_open(monkeypatch, tmp_path):
    import kvviz.app

    calls = []
    monkeypatch.setattr(kvviz.app, "launch", lambda model, prompt, lesson=None, theme=None:
                        calls.append((model, prompt, lesson)) or 0)
    path = tmp_path / "mine.toml"
    path.write_text(lesson_text({}), encoding="utf-8")
    assert main(["--lesson"]) == 0
    assert main(["--lesson", str(path), "--prompt", "hi"]) == 0
    assert main(["--model", "random:gpt2"]) == 0
    assert calls == [(None, None, ""), (None, "hi", str(path)), ("random:gpt2", None, None)]
    with pytest.raises(LessonError):
        from kvviz.cli.lesson import app_lesson

        app_lesson(str(tmp_path / "missing.toml"))


# ----- the built-in lesson on the embedded model: readable from the back of a hall, in time -----

INSTRUCTION = re.compile(r"\bpress|\bSpace\b|Page ?(Down|Up)|PgDn|PgUp|Ctrl\+|\bclick|\bF11\b", re.IGNORECASE)


@pytest.fixture(scope="module")
def builtin_deck(tmp_path_factory):
    """The README's command as a lecturer types it, `kvviz lesson --export DIR` (the embedded model, 1920 pixels,
    PNG and PDF): the folder, the printed lines and the status, and every text each slide draws, slide by slide."""
    from helpers_text import TextRecorder

    texts, bars = [], []
    original = slides.slide_png

    def recording(text, view, width):
        recorder = TextRecorder(1920, 1080)
        slides_module.paint_slide_scaled(recorder, text, view, 1920 / slides_module.SLIDE_SIZE[0])
        texts.append(recorder.texts)
        bars.append(sum(bar.isVisibleTo(view) and bar.maximum() > 0 for bar in view.findChildren(QScrollBar)))
        return original(text, view, width)

    out = tmp_path_factory.mktemp("readme") / "slides"
    slides.slide_png = recording
    try:
        with mock.patch("sys.stdout", new=StringIO()) as stdout, mock.patch("sys.stderr", new=StringIO()) as stderr:
            status = main(["lesson", "--export", str(out)])
    finally:
        slides.slide_png = original
    return out, status, stdout.getvalue(), stderr.getvalue(), texts, bars


@pytest.fixture(scope="module")
def builtin_texts(builtin_deck):
    """Every text the built-in lesson's slides draw, as a 1920x1080 slide receives it, slide by slide."""
    texts = builtin_deck[-2]
    assert len(texts) == BUILTIN_SLIDES
    return texts


def test_every_slide_is_readable_and_whole(builtin_deck, builtin_texts):
    """Tick labels, axis titles, legends, the counter and the slide's own text: 2.5 % of 1080 is 27 pixels, each
    inside the slide and its view, none over another, no scroll bar (the other decks: test_slide_labels.py)."""
    from helpers_text import slide_problems

    for number, (texts, bars) in enumerate(zip(builtin_texts, builtin_deck[-1], strict=True), start=1):
        assert len(texts) > 20  # the views were drawn
        found = slide_problems(texts, bars, 1920, 1080)
        assert not found, (number, found[:8])


def test_no_slide_carries_an_app_instruction(builtin_texts):
    """A slide is projected to people who hold no keyboard: no key to press, nothing to click."""
    for number, texts in enumerate(builtin_texts, start=1):
        said = [t.text for t in texts if INSTRUCTION.search(t.text)]
        assert not said, (number, said)
    first = " ".join(t.text for t in builtin_texts[0])
    assert "tokens ready" in first  # the grid's caption before the first step is there, without a key


def test_the_builtin_lesson_exports_on_the_embedded_model(builtin_deck):
    """The README's command: every slide a PNG of 1920x1080, the deck a PDF, the answers measured."""
    out, status, printed, said, _texts, _bars = builtin_deck
    assert status == 0 and said == "", said
    assert len(printed.splitlines()) == BUILTIN_SLIDES + 2
    assert "answer: 76 (measured)" in printed  # P = 2, N = 12 on the embedded model: 12·2 + 66 − 14
    assert pdf_pages((out / "kvviz-lesson.pdf").read_bytes()) == BUILTIN_SLIDES
    assert QImage(str(out / "kvviz-lesson-01.png")).size().toTuple() == (1920, 1080)


def test_a_memory_step_makes_a_slide_of_the_memory_view(tiny, tmp_path, qtbot, monkeypatch):
    """`focus = "memory"` puts the memory view on the step's slides (its model's line, the run's bytes on it)."""
    lesson = parse_lesson(lesson_text({}, {"extra": 'focus = "memory"'}), "test.toml")
    shown: list[tuple[str, object]] = []
    real_show = SlideStage.show

    def spy(self, step, plan, records, region, **options):
        view = real_show(self, step, plan, records, region, **options)
        points = view.points() if type(view).__name__ == "MemoryView" else None
        shown.append((type(view).__name__, points))
        return view

    monkeypatch.setattr(SlideStage, "show", spy)
    export_lesson(lesson, tmp_path, "png", width=640, model=str(tiny))
    assert [name for name, _ in shown] == ["Arrangement", "MemoryView"]
    positions, measured = shown[1][1]
    per_position = 2 * 2 * 32 * 4  # K and V, 2 layers, 32 wide, float32
    assert positions.tolist() == [2, 3] and measured.tolist() == [2 * per_position, 3 * per_position]


@pytest.mark.parametrize(("cache", "focus", "views"), [
    ("true", "grid", ["TokenStrip", "KVGridView"]),
    ("false", "counter", ["WorkChart", "CounterPanel"]),
    ("true", "chart", ["WorkChart", "CounterPanel"]),
    ("true", "all", ["TokenStrip", "KVGridView", "CounterPanel"]),
    ('"compare"', "grid", ["DivergenceBanner", "KVGridView", "KVGridView", "IdentityStrip"]),
    ('"compare"', "counter", ["CompareTimePlot", "CompareCounts"]),
    ('"compare"', "all", ["DivergenceBanner", "KVGridView", "KVGridView", "IdentityStrip"]),
])
def test_a_slide_shows_the_part_of_the_window_its_focus_names(cache, focus, views, tiny, tmp_path, qtbot,
                                                             monkeypatch):
    """The whole window does not fit a slide in type large enough for a hall: a slide shows its step's focus,
    each view laid out inside the slide's view area."""
    lesson = parse_lesson(lesson_text({"cache": cache, "extra": f'focus = "{focus}"'}), "test.toml")
    shown = []
    real_show = SlideStage.show

    def spy(self, step, plan, records, region, **options):
        view = real_show(self, step, plan, records, region, **options)
        inside = all(QRect(0, 0, round(region.width()), round(region.height())).contains(
            QRect(v.mapTo(view, QPoint(0, 0)), v.size())) for v in view.views() if v.isVisible())
        shown.append(([type(v).__name__ for v in view.views()], inside))
        return view

    monkeypatch.setattr(SlideStage, "show", spy)
    export_lesson(lesson, tmp_path, "png", width=320, model=str(tiny))
    assert shown == [(views, True)]


def test_a_speed_step_shows_the_sweep_measured_here_and_says_its_figure(tiny, tmp_path, qtbot, monkeypatch):
    """`focus = "speed"` puts the speed view on the slide, drawing a sweep measured during the export, and the
    step's {measured_speed} becomes that sweep's sentence: the slide says what its curves show."""
    lesson = parse_lesson('title = "Speed"\n[[step]]\ntitle = "Time"\ntext = "Measured here: {measured_speed}"\n'
                          'prompt = "Time flies"\ncache = true\nadvance_to = 2\nmax_new_tokens = 4\n'
                          'focus = "speed"\n', "test.toml")
    shown, texts = [], []
    real_show = SlideStage.show
    real_text = slides.slide_text

    def spy(self, step, plan, records, region, **options):
        view = real_show(self, step, plan, records, region, **options)
        shown.append((view, options["speed"]))
        return view

    monkeypatch.setattr(SlideStage, "show", spy)
    monkeypatch.setattr(slides, "slide_text", lambda *a, **k: texts.append(real_text(*a, **k)) or texts[-1])
    lines = []
    export_lesson(lesson, tmp_path, "png", width=640, model=str(tiny), progress=lines.append)
    (view, sweep), = shown
    assert type(view).__name__ == "SpeedView" and sweep is not None and view.result is sweep
    assert list(view.uncached_curve.getData()[1]) == list(sweep.uncached_ms)
    assert not view.measure_button.isVisible(), "no button on a slide"
    assert texts[0].text == f"Measured here: {sweep.headline()}" and "{" not in texts[0].text
    assert lines[0].startswith("measuring the speed of a token step of tiny")


def test_lesson_export_takes_a_dtype(tiny, tmp_path, monkeypatch, capsys):
    """`kvviz lesson --export --dtype bfloat16` runs the steps in bfloat16; with --list the option is refused."""
    path = tmp_path / "l.toml"
    path.write_text(lesson_text({"advance_to": 1, "extra": 'question = "cache_bytes_after_next"'}), encoding="utf-8")
    footers = []
    original = slides_module.paint_slide
    monkeypatch.setattr(slides_module, "paint_slide", lambda painter, text, view: (
        footers.append(text.footer), original(painter, text, view)))
    assert main(["lesson", "--file", str(path), "--export", str(tmp_path / "out"), "--format", "png",
                 "--width", "320", "--model", str(tiny), "--dtype", "bfloat16"]) == 0
    assert len(footers) == 2 and all("\u2014 tiny (bfloat16), " in footer for footer in footers)  # the precision
    out = capsys.readouterr().out
    per_position = 2 * 2 * 32 * 2  # K and V, 2 layers, 32 wide, 2 bytes
    assert f"answer: {3 * per_position:,} bytes in bfloat16 (measured)" in out  # after the 2nd token: 3 positions
    assert main(["lesson", "--file", str(path), "--list", "--dtype", "float16"]) == 2
    assert "--dtype goes with --export" in capsys.readouterr().err


def test_the_sharing_lesson_exports_with_each_models_bytes_measured(tmp_path):
    """`kvviz lesson --file kv-sharing --export`: both embedded models, an MQA shape, SmolLM2-135M and its MHA
    twin, each answer measured from its cache. By hand, in float32: 2 x 6 layers x 6 heads x 32 x 4 = 9,216
    bytes a token for the GPT-2, 2 KV heads 3,072, 1 KV head 1,536; 2 x 30 x 3 x 64 x 4 = 46,080 for SmolLM2,
    x 8,192 tokens = 377,487,360, and three times that with its 9 query heads each keeping their own K/V."""
    out = tmp_path / "slides"
    with mock.patch("sys.stdout", new=StringIO()) as stdout:
        status = main(["lesson", "--file", "kv-sharing", "--export", str(out), "--format", "png,pdf",
                       "--width", "640"])
    printed = stdout.getvalue()
    assert status == 0
    answers = re.findall(r"answer: (.*) \(measured\)", printed)
    assert answers == ["9,216 bytes in float32", "3,072 bytes in float32", "1,536 bytes in float32",
                       "377,487,360 bytes (360 MiB) in float32", "1,132,462,080 bytes (1.05 GiB) in float32"], printed
    assert "MHA, GQA, MQA" in load_lesson("kv-sharing").title
    assert pdf_pages((out / "kvviz-lesson.pdf").read_bytes()) == 11 == len(list(out.glob("*.png")))
