"""`kvviz lesson`: a lesson's steps (--list, no model loaded), or its slides (--export, drawn by the app's
renderer, which the caller hands in: this module reaches neither Qt nor the app), and the check of
`kvviz --lesson` before the window opens."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from kvviz.cli import json_output as cli_json
from kvviz.cli.parser import UsageError
from kvviz.lessons.lesson import Lesson, load_lesson


def app_lesson(value: str | Path | None) -> str | None:
    """What `launch` gets for `kvviz --lesson [FILE]`: "" for the built-in lesson (the option without a
    FILE; argparse passes its "" through the type too), the file's path, or None without the option. The
    lesson is read now: a bad one is one line (LessonError), status 2, no window."""
    if value is None:
        return None
    path = None if value == "" else str(value)
    load_lesson(path)
    return path or ""


def lesson_json(lesson: Lesson) -> dict:
    """`kvviz lesson --list --json`: the title, and per step its title and question key (or null)."""
    return {"title": lesson.title, "steps": [{"title": s.title, "question": s.question} for s in lesson.steps]}


def lesson_lines(lesson: Lesson) -> list[str]:
    """`kvviz lesson --list`: a heading, then a row per step: number, title, question key or none."""
    from kvviz.core.counting import plural

    questions = sum(1 for step in lesson.steps if step.question)
    source = "built-in" if lesson.source in _builtin_sources() else lesson.source
    lines = [f"{lesson.title} ({source}): {plural(len(lesson.steps), 'step')}, "
             f"{plural(questions, 'question')}, {plural(len(lesson.slides()), 'slide')}"]
    width = max(len(step.title) for step in lesson.steps)
    digits = len(str(len(lesson.steps)))
    for number, step in enumerate(lesson.steps, start=1):
        lines.append(f"{number:>{digits + 2}}  {step.title:<{width}}  question: {step.question or 'none'}")
    return lines


def _builtin_sources() -> list[str]:
    from kvviz.lessons.lesson import BUILTIN_LESSONS, builtin_lesson_path

    return [str(builtin_lesson_path(name)) for name in BUILTIN_LESSONS]


def run_lesson(args: argparse.Namespace, exporter: Callable[[], Callable[..., list[Path]]]) -> int:
    """`kvviz lesson --list | --export DIR`; `exporter()` returns the app's `export_lesson` (or raises
    UsageError when the app cannot load)."""
    lesson = load_lesson(args.file)
    if args.list:
        given = [flag for flag, value in (("--format", args.format), ("--width", args.width),
                                          ("--model", args.model), ("--theme", args.theme),
                                          ("--dtype", args.dtype), ("--window", args.window or None),
                                          ("--sinks", args.sinks or None), ("--kv-dtype", args.kv_dtype))
                 if value is not None]
        if given:
            raise UsageError(f"{given[0]} goes with --export, not with --list")
        print(cli_json.dumps(lesson_json(lesson)) if args.json else "\n".join(lesson_lines(lesson)))
        return 0
    if args.json:
        raise UsageError("--json goes with --list, not with --export")
    lesson = _with_cache_options(lesson, args.window, args.sinks, args.kv_dtype or "")
    export = exporter()

    def progress(line: str) -> None:
        print(line)
        sys.stdout.flush()

    from kvviz.cli.compare import dtype_honoured

    dtype = args.dtype or "float32"
    with dtype_honoured(dtype, "cpu"):
        export(lesson, args.export, args.format or "png,pdf", width=args.width, model=args.model, progress=progress,
               theme=args.theme or "dark", dtype=dtype)
    return 0


def _takes_window(step) -> bool:
    """A step --window and --sinks change: one whose runs keep every position (cached or not), not a serving batch
    and not a step with a window or a quantized cache of its own."""
    return not (step.serving or step.window or step.kv_dtype or step.evict)


def _takes_kv_dtype(step) -> bool:
    """A step --kv-dtype changes: as for a window, and it runs with a cache (a step without one has none to
    quantize)."""
    return _takes_window(step) and step.use_cache


def _with_cache_options(lesson, window: int, sinks: int, kv_dtype: str):
    """`lesson` with every step that can take them given `window` and `sinks`, or `kv_dtype` (UsageError when no
    step can: an option is never silently ignored)."""
    from dataclasses import replace

    for flag, value, takes in (("--window", window, _takes_window), ("--kv-dtype", kv_dtype, _takes_kv_dtype)):
        if value and not any(takes(step) for step in lesson.steps):
            raise UsageError(f"{flag}: no step of the lesson {lesson.title!r} could take it (each has its own "
                             "cache settings, runs a serving batch or runs without a cache)")
    if window:
        lesson = replace(lesson, steps=tuple(replace(step, window=window, sinks=sinks) if _takes_window(step)
                                             else step for step in lesson.steps))
    if kv_dtype:
        lesson = replace(lesson, steps=tuple(replace(step, kv_dtype=kv_dtype) if _takes_kv_dtype(step) else step
                                             for step in lesson.steps))
    return lesson
