"""`kvviz lesson --export`: a lesson as 16:9 slides, one PNG per slide and one PDF deck with a page per slide.

Each slide shows a step's title (big), its text and its place in the lesson over the app's own views in
the step's state: the part of the window the step's `focus` names, in large type (`slide_stage`), reset
with the step's plan and fed the records of its run advanced `advance_to` token steps, as `kvviz export`
feeds them. A question step makes two slides: the question, at `advance_to`; then the answer, measured
from the run advanced one token step more (a trace step's: its trace served to `advance_to` passes, then on to the
pass whose record answers). The deck is the only PDF (no PDF per slide). Notes are the
lecturer's: `slide_text` leaves them out, so no slide ever receives them.

Qt loads with this module; torch and the engine only when `export_lesson` runs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kvviz.app import theme as themes
from kvviz.app.export.caption import model_with_precision, shorten_caption
from kvviz.app.export.files import (
    DEFAULT_PNG_WIDTH,
    ExportError,
    all_or_nothing,
    check_png_width,
    parse_formats,
    write_export,
)
from kvviz.app.export.headless import ensure_application, without_offscreen_chatter
from kvviz.app.export.slide_layout import Deck, SlideText, slide_png, view_rect
from kvviz.app.export.slide_stage import SlideStage
from kvviz.core.errors import KvvizError, first_line
from kvviz.core.files import check_stop, folder_problem, stops_deferred, user_path
from kvviz.lessons.lesson import Answer, Lesson, LessonError, LessonStep, format_answer, measured_answer
from kvviz.lessons.perplexity import PERPLEXITY_TOKENS, Perplexities, perplexity_runs

LESSON_FORMATS = ("png", "pdf")
DECK_NAME = "kvviz-lesson.pdf"
SLIDE_NAME = re.compile(r"kvviz-lesson-[0-9]{2,}\.png")  # a slide of any deck (see slide_file_name)

if TYPE_CHECKING:
    from kvviz.core.batch_records import BatchSpeed
    from kvviz.core.records import RunPlan, StepRecord
    from kvviz.core.serve_records import ServeMeasure
    from kvviz.engine.engine import Engine
    from kvviz.measure.speed import SweepResult

@dataclass(frozen=True)
class StepRun:
    """A step's run: its plan, its records advanced `advance_to` token steps (`shown`), and for a
    question one token step more (`advanced`) with the measured answer."""

    plan: RunPlan
    shown: tuple[StepRecord, ...]
    advanced: tuple[StepRecord, ...]
    answer: Answer | None
    speed: SweepResult | None = None  # the speed sweep of the step's model, for a step that needs it
    batch_speed: BatchSpeed | None = None  # a serving step's batch against one at a time, once its batch is done
    measured: ServeMeasure | None = None  # a trace step's figures per request, once its trace is done


def earlier_deck(out_dir: Path) -> list[Path]:
    """The files of a deck exported into `out_dir` before (kvviz-lesson-NN.png, kvviz-lesson.pdf)."""
    if not out_dir.is_dir():
        return []
    return sorted(path for path in out_dir.iterdir() if SLIDE_NAME.fullmatch(path.name) or path.name == DECK_NAME)


def slide_file_name(number: int, total: int) -> str:
    """kvviz-lesson-01.png, ...: numbered from 1, as many digits as the last one needs (at least two)."""
    return f"kvviz-lesson-{number:0{max(2, len(str(total)))}d}.png"


def slide_text(lesson: Lesson, index: int, revealed: bool, run: StepRun, dtype: str = "float32") -> SlideText:
    """What the slide of step `index` says, before (`revealed` False) or after its question's answer; its
    footer names the run, in `dtype`."""
    step = lesson.steps[index]
    records = run.advanced if revealed else run.shown
    answer = ""
    if revealed and step.question and run.answer is not None:
        precision = "" if step.serving or not records else records[-1].cache_precision  # a batch's answer: blocks
        answer = f"Answer: {format_answer(step.question, run.answer, precision)} (measured)"
    measured = run.speed.headline() if run.speed is not None else None
    return SlideText(title=step.title, text=step.text_with(measured), place=f"step {index + 1} of {len(lesson.steps)}",
                     question=step.question_text, answer=answer, footer=_footer(step, run.plan, records, dtype))


def _footer(step: LessonStep, plan: RunPlan, records: tuple[StepRecord, ...], dtype: str) -> str:
    if step.serves_trace:
        cache = {"off": "no prefix cache", "hash": "prefix cache by block hash"}.get(plan.prefix_cache,
                                                                                    "radix-tree prefix cache")
        chunks = f"chunks of {plan.chunk}" if plan.chunk else "whole prompts"
        done = plan.steps_done(records[-1]) if records else 0
        return shorten_caption(f"{len(plan.requests)} requests over time \u2014 "
                               f"{model_with_precision(plan.model_name, dtype)}, {done} passes done, {cache}, "
                               f"{chunks}, {plan.num_blocks} blocks of {plan.block_size} positions, greedy")
    if step.serving:
        done = records[-1].step + 1 if records else 0
        return shorten_caption(f"{len(step.prompts)} requests \u2014 {model_with_precision(plan.model_name, dtype)}, "
                               f"{done} of {plan.passes} passes, blocks of {step.block_size} positions, "
                               f"{step.max_new_tokens} new tokens each, greedy")
    made = records[-1].new_tokens if records else 0
    if step.compare and plan.against_lossy:
        first, second = plan.lockstep_names
        mode = f"the {first} and {'' if second[:1].isupper() else 'the '}{second} in lockstep"  # H2O, the window
    elif step.compare:
        mode = "with and without KV cache in lockstep"
    else:
        mode = "with KV cache" if step.use_cache else "without KV cache"
    if plan.drafter is not None:
        mode += f", speculative: {plan.drafter.describe()}"
    return shorten_caption(f"\u201c{step.prompt}\u201d \u2014 {model_with_precision(plan.model_name, dtype)}, "
                           f"{made} of {plan.budget} new "
                           f"token{'' if plan.budget == 1 else 's'}, {mode}, greedy")


# ----- the runs -----


def measure_perplexities(engine: Engine, step: LessonStep, tokens: int = PERPLEXITY_TOKENS,
                         known: dict | None = None) -> Perplexities:
    """The answer to `step`'s perplexity question: each policy perplexity_runs names, measured on the first `tokens`
    tokens of the shipped held-out text (kvviz.measure.quality), teacher-forced one token a pass. `known` keeps what
    was measured on this engine, by policy and tokens, for the next question (the app's lesson mode measures with it
    too, in the background). KvvizError (one line) for a policy the model refuses."""
    from kvviz.measure.quality import heldout_ids, perplexity

    known = {} if known is None else known
    ids = heldout_ids(engine.tokenizer, tokens)
    measured = []
    for run in perplexity_runs(step):
        policy = engine.policy(**run.fields)
        if (policy, tokens) not in known:
            known[policy, tokens] = perplexity(engine, ids, policy).value
        measured.append((run.label, known[policy, tokens]))
    return Perplexities(tokens, tuple(measured))


def run_step(engine: Engine, model_name: str, lesson: Lesson, index: int, known: dict | None = None) -> StepRun:
    """Plan step `index`'s run and take its records up to `advance_to` token steps (one more for a
    question); with the cache, the filling pass only after the run's last token. A perplexity question's answer is
    measured on the held-out text (measure_perplexities, with `known`). LessonError (naming the file, the step and
    the key) when the model cannot run it."""
    from kvviz.core.records import RunRequest
    from kvviz.engine.run import start_run

    step = lesson.steps[index]
    where = f"{lesson.source}: step {index + 1}: "
    if step.serves_trace:
        return _run_trace_step(engine, model_name, step, where)
    if step.serving:
        return _run_batch_step(engine, model_name, step, where)
    request = RunRequest(0, step.prompt, step.use_cache or step.compare, step.max_new_tokens, compare=step.compare,
                         attention=step.needs_attention, **step.cache_fields(), **step.drafter_fields())
    try:
        if step.draft_model and engine.draft is None:  # speculative decoding with a draft model: loaded once
            from kvviz.sources.weights import attach_draft

            attach_draft(engine, step.draft_model, engine.dtype)
        run = start_run(engine, request, model_name)
    except KvvizError as exc:
        raise LessonError(f"{where}prompt: {first_line(exc)}") from exc
    plan = run.plan
    reach = step.advance_to + (1 if step.question else 0)
    if reach > plan.budget:
        needs = f"advance_to {step.advance_to}" + (" and the question's step" if step.question else "")
        raise LessonError(f"{where}advance_to: {model_name} holds {plan.n_ctx} tokens, room for "
                          f"{plan.budget} new after the prompt; {needs} take{'' if step.question else 's'} {reach}")
    records: list[StepRecord] = []
    if reach:
        try:
            for passes in run.token_steps():
                records.extend(passes)
                if passes[-1].final or passes[0].new_tokens >= reach:
                    break
        finally:
            run.close()
    shown = tuple(r for r in records if r.new_tokens <= step.advance_to)
    answer = None
    if step.measures_perplexity:
        try:
            answer = measure_perplexities(engine, step, known=known)
        except KvvizError as exc:
            raise LessonError(f"{where}question: {first_line(exc)}") from exc
    elif step.question:
        answer = measured_answer(step.question, shown[-1] if shown else None, records[-1], step.sinks)
    return StepRun(plan=plan, shown=shown, advanced=tuple(records), answer=answer)


def _run_batch_step(engine: Engine, model_name: str, step: LessonStep, where: str) -> StepRun:
    """A serving step's batch: its records up to `advance_to` passes (`shown`), and all of them (`advanced`, for
    the question's answer and the speed, measured as the app measures it once the batch is done)."""
    from kvviz.engine.serving import measure_speed, plan_batch, run_batch
    from kvviz.lessons.lesson import measured_batch_answer

    try:
        plan = plan_batch(engine, [engine.encode_prompt(p) for p in step.prompts], step.max_new_tokens,
                          step.block_size, texts=list(step.prompts), model_name=model_name)
    except KvvizError as exc:
        raise LessonError(f"{where}prompts: {first_line(exc)}") from exc
    records = tuple(run_batch(engine, plan))
    shown = records[: step.advance_to]
    answer = measured_batch_answer(step.question, records[-1]) if step.question else None
    # a slide that shows the batch done shows its speed, measured as the app measures it
    speed = measure_speed(engine, plan) if step.question or step.advance_to == plan.passes else None
    return StepRun(plan=plan, shown=shown, advanced=records, answer=answer, batch_speed=speed)


def _run_trace_step(engine: Engine, model_name: str, step: LessonStep, where: str) -> StepRun:
    """A trace step: its records until `advance_to` passes are done (`shown`, as the app's lesson mode shows them),
    and for its question on to the pass whose record answers it (`advanced`, with the answer). LessonError for a
    trace the model cannot serve, or a question the trace never answers after `advance_to`."""
    from kvviz.core.serve_records import measure
    from kvviz.engine.scheduler import plan_trace, serve
    from kvviz.lessons.trace_answers import find_trace_answer, missing_answer, reached
    from kvviz.lessons.trace_step import read_step_trace

    try:
        plan = plan_trace(engine, read_step_trace(step.trace_path), step.block_size, step.num_blocks,
                          step.prefix_cache, step.chunk, step.max_batched_tokens, model_name=model_name)
    except KvvizError as exc:
        raise LessonError(f"{where}trace: {first_line(exc)}") from exc
    records: list = []
    shown = found = None
    for record in serve(engine, plan):
        records.append(record)
        shown = reached(plan, records, step.advance_to)
        found = find_trace_answer(step.question, plan, records, shown, step.request) if (
            step.question and shown is not None) else None
        if shown is not None and (found is not None or not step.question):
            break
    if found is not None and math.isnan(found[1]):
        raise LessonError(f"{where}question: {missing_answer(step.question, step.request, step.advance_to)}")
    advanced = tuple(records[: found[0]]) if found is not None else tuple(records)
    return StepRun(plan=plan, shown=tuple(records[:shown]), advanced=advanced,
                   answer=found[1] if found is not None else None,
                   measured=measure(plan, records) if records and records[-1].final else None)


def _step_engines(lesson: Lesson, model: str | None, dtype: str = "float32") -> list[tuple[str, Engine]]:
    """(model name, engine) per step: `model` until a step names its own, which later steps keep;
    each model loaded once, in `dtype`."""
    from kvviz.engine.engine import Engine
    from kvviz.sources.weights import load_model, torch_dtype

    loaded: dict[str | None, tuple[str, Engine]] = {}
    current, named_at = model, 0
    engines = []
    for number, step in enumerate(lesson.steps, start=1):
        if step.model is not None:
            current, named_at = step.model, number
        if current not in loaded:
            try:
                ready = load_model(current, dtype=torch_dtype(dtype))
            except KvvizError as exc:
                if not named_at:
                    raise
                raise LessonError(f"{lesson.source}: step {named_at}: model: {first_line(exc)}") from exc
            loaded[current] = (ready.name, Engine(ready.model, ready.tokenizer))
        engines.append(loaded[current])
    return engines


def _with_speed(lesson: Lesson, engines: list[tuple[str, Engine]], runs: list[StepRun],
                progress: Callable[[str], None] | None) -> list[StepRun]:
    """The runs, those of steps that show or say the speed with the speed sweep of their model, measured
    here (once per model) as the app measures it."""
    from dataclasses import replace

    from kvviz.measure.speed_sweep import run_sweep

    sweeps: dict[int, SweepResult] = {}
    out = []
    for step, (name, engine), run in zip(lesson.steps, engines, runs, strict=True):
        if step.needs_speed:
            if id(engine) not in sweeps:
                if progress is not None:
                    progress(f"measuring the speed of a token step of {name} on this machine (both modes, "
                             f"interleaved)\u2026")
                sweeps[id(engine)] = run_sweep(engine, model_name=name)
            run = replace(run, speed=sweeps[id(engine)])
        out.append(run)
    return out


# ----- the export -----


def lesson_formats(formats: str | list[str]) -> list[str]:
    """'png,pdf' checked: a lesson exports PNG slides and a PDF deck (no SVG)."""
    chosen = parse_formats(formats)
    for fmt in chosen:
        if fmt not in LESSON_FORMATS:
            raise ExportError(f"a lesson exports {' and '.join(LESSON_FORMATS)}, not {fmt}")
    return chosen


def export_lesson(
    lesson: Lesson,
    out_dir: Path | str,
    formats: str | list[str] = "png,pdf",
    width: int | None = None,
    model: str | None = None,
    progress: Callable[[str], None] | None = None,
    theme: str = "dark",
    dtype: str = "float32",
) -> list[Path]:
    """Write `lesson`'s slides into `out_dir`: kvviz-lesson-01.png, ... (PNG, `width` pixels wide, 16:9)
    and kvviz-lesson.pdf (a page per slide); returns the paths, in order. `model` runs the steps before
    the first that names its own model. `progress` gets one line per slide written, and one for the deck.
    `theme`: "dark" or "light" (kvviz.app.theme), the slides' colours; `dtype`: the models' number type.

    Formats, width and folder are checked before any model loads; every model before the first slide is
    drawn. Everything or nothing: the new deck replaces the folder's earlier one whole (its slides and PDF,
    however many), and a failure, an interrupt or a stop signal leaves the earlier deck exactly as it was.
    Errors are KvvizError (ExportError, LessonError, ModelLoadError) with a one-line message.
    """
    chosen = lesson_formats(formats)
    if theme not in themes.THEMES:
        raise ExportError(f"theme must be {' or '.join(themes.THEMES)}, got {theme!r}")
    width = check_png_width(DEFAULT_PNG_WIDTH if width is None else width, "width")
    if not str(out_dir).strip():
        raise ExportError("no output folder given (an empty name would mean the current folder)")
    out_dir = user_path(out_dir)
    problem = folder_problem(out_dir)
    if problem is not None:
        raise ExportError(f"{out_dir}: {problem}")
    app = ensure_application()
    engines = _step_engines(lesson, model, dtype)
    known: dict[int, dict] = {}  # perplexities measured, per engine
    runs = [run_step(engine, name, lesson, index, known.setdefault(id(engine), {}))
            for index, (name, engine) in enumerate(engines)]
    runs = _with_speed(lesson, engines, runs, progress)
    replaced = all_or_nothing(out_dir, stale=lambda: earlier_deck(out_dir))  # the whole earlier deck, or none of it
    with without_offscreen_chatter(), themes.using(theme), stops_deferred(), replaced as files:
        stage = SlideStage(app)
        deck = Deck(lesson.title) if "pdf" in chosen else None
        try:
            slides = lesson.slides()
            for number, (index, revealed) in enumerate(slides, start=1):
                check_stop()
                run = runs[index]
                text = slide_text(lesson, index, revealed, run, dtype)
                view = stage.show(lesson.steps[index], run.plan, run.advanced if revealed else run.shown,
                                  view_rect(text), speed=run.speed, batch_speed=run.batch_speed, measured=run.measured)
                line = f"slide {number}/{len(slides)}: {text.place}, \u201c{text.title}\u201d" + (
                    f", {text.answer[0].lower()}{text.answer[1:]}" if revealed else ", the question" if text.question
                    else "")
                if "png" in chosen:
                    path = out_dir / slide_file_name(number, len(slides))
                    write_export(path, slide_png(text, view, width), files)
                    line += f" -> {path}"
                if deck is not None:
                    deck.add(text, view)
                if progress is not None:
                    progress(line)
            if deck is not None:
                path = out_dir / DECK_NAME
                write_export(path, deck.data(), files)
                if progress is not None:
                    progress(f"deck of {deck.pages} page{'' if deck.pages == 1 else 's'} -> {path}")
        finally:
            if deck is not None:
                deck.close()
            stage.close()
    return files.targets
