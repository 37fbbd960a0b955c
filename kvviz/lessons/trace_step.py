"""A lesson's trace step: the serving view playing a trace of requests that arrive over time (kvviz.core.trace) on
a server of the step's settings, read from the step's TOML table and checked against the rest of it and against the
trace, which is read now: a bad trace, or a request the trace does not have, is one line before any model loads.
Torch-free and Qt-free."""

from __future__ import annotations

from pathlib import Path

from kvviz.core.errors import KvvizError, first_line
from kvviz.core.files import read_text_file, user_path
from kvviz.core.serve_records import PREFIX_CACHES
from kvviz.core.trace import BUILTIN_TRACE, MAX_TRACE_BYTES, TraceRequest, parse_trace, read_trace
from kvviz.lessons.errors import LessonError
from kvviz.lessons.questions import TRACE_QUESTIONS

REQUIRED_TRACE_KEYS = ("title", "text", "trace", "advance_to")
# the server's settings a trace step may give, with their defaults (those of kvviz serve-trace) and their ranges
SERVER_SETTINGS = {"block_size": (16, 1, 256), "num_blocks": (64, 1, 65_536), "chunk": (16, 0, 65_536),
                   "max_batched_tokens": (256, 1, 65_536)}
TRACE_ONLY_KEYS = ("prefix_cache", "chunk", "num_blocks", "max_batched_tokens", "request")  # block_size: a batch's too
NOT_WITH_TRACE = ("prompt", "prompts", "cache", "max_new_tokens", "window", "sinks", "kv_dtype", "draft_tokens",
                  "prompt_lookup", "draft_model", "evict", "budget", "observe", "pool")
# the serving view of the trace, whole (the app shows it whole) or, on a slide, the pass's decision over one part
TRACE_FOCUSES = ("serving", "timeline", "blocks", "tree")
MAX_ADVANCE = 1_000_000  # passes: past any trace's end (its arrivals are at most 100,000 passes in)


def check_no_trace_keys(item: dict, source: str, where: str) -> None:
    """A step without `trace` gives none of a trace step's settings nor asks its questions."""
    for key in TRACE_ONLY_KEYS:
        if key in item:
            raise LessonError(f"{source}: {where}{key}: goes with trace (a trace step's server): give trace too")
    if item.get("question") in TRACE_QUESTIONS:
        raise LessonError(f"{source}: {where}question: {item['question']} asks about a served trace: give trace "
                          "too")


def trace_file(value: str, source: str) -> Path | None:
    """The trace a step's `trace` names: None for "server", the built-in one; else a file, relative to the lesson
    file's folder."""
    if value == BUILTIN_TRACE:
        return None
    path = user_path(value)
    return path if path.is_absolute() else Path(source).parent / path


def read_step_trace(path: Path | None) -> tuple[TraceRequest, ...]:
    """The requests of a step's trace (None: the built-in one); KvvizError (one line) for one that cannot be used.
    A FIFO or a device is refused, not waited on, as a lesson file is."""
    if path is None:
        return read_trace(None)
    text = read_text_file(path, MAX_TRACE_BYTES, f"{MAX_TRACE_BYTES // (1024 * 1024)} MiB", "trace file")
    return parse_trace(text, str(path))


def parse_trace_step(item: dict, source: str, where: str) -> dict:
    """A step with `trace`, as LessonStep's fields: its requests served pass by pass (View > Serving, in trace
    mode), `advance_to` counting the server's passes."""
    for key in REQUIRED_TRACE_KEYS:
        if key not in item:
            raise LessonError(f"{source}: {where}{key}: missing")
    for key in NOT_WITH_TRACE:
        if key in item:
            raise LessonError(f"{source}: {where}{key}: a trace step's requests are its trace's (their prompts and "
                              f"tokens): no {key}")
    if not item["trace"].strip():
        raise LessonError(f"{source}: {where}trace: is empty; \"{BUILTIN_TRACE}\" is the built-in trace, or give a "
                          "trace file's path")
    try:
        path = trace_file(item["trace"], source)
        requests = read_step_trace(path)
    except KvvizError as exc:
        raise LessonError(f"{source}: {where}trace: {first_line(exc)}") from exc
    settings = {}
    for key, (default, least, most) in SERVER_SETTINGS.items():
        value = settings[key] = item.get(key, default)
        if not least <= value <= most:
            raise LessonError(f"{source}: {where}{key}: {value} is not from {least:,} to {most:,}")
    prefix_cache = item.get("prefix_cache", "radix")
    if prefix_cache not in PREFIX_CACHES:
        raise LessonError(f"{source}: {where}prefix_cache: expected one of {', '.join(PREFIX_CACHES)}, got "
                          f"{prefix_cache!r}"[:300])
    advance = item["advance_to"]
    if not 0 <= advance <= MAX_ADVANCE:
        raise LessonError(f"{source}: {where}advance_to: {advance} is not from 0 to {MAX_ADVANCE:,} passes")
    question, request = item.get("question"), item.get("request", "")
    if question is not None and question not in TRACE_QUESTIONS:
        raise LessonError(f"{source}: {where}question: a trace step asks {', '.join(TRACE_QUESTIONS)}, not "
                          f"{question!r}"[:300])
    if question == "prefix_hits_at_admission":
        names = [r.name for r in requests]
        if not request:
            raise LessonError(f"{source}: {where}request: missing; {question} asks about one request of the trace "
                              f"({', '.join(names)})"[:300])
        if names.count(request) != 1:
            said = "has no request" if request not in names else f"has {names.count(request)} requests"
            raise LessonError(f"{source}: {where}request: the trace {said} named {request!r}; its requests: "
                              f"{', '.join(names)}"[:300])
    elif request:
        raise LessonError(f"{source}: {where}request: goes with question = \"prefix_hits_at_admission\"")
    focus = item.get("focus", "serving")
    if focus not in TRACE_FOCUSES:
        raise LessonError(f"{source}: {where}focus: a trace step shows {', '.join(map(repr, TRACE_FOCUSES))}, not "
                          f"{focus!r}"[:300])
    for key in ("title", "text"):
        if not item[key].strip():
            raise LessonError(f"{source}: {where}{key}: is empty")
    return {"title": item["title"].strip(), "text": " ".join(item["text"].split()), "prompt": "", "cache": True,
            "advance_to": advance, "max_new_tokens": 0, "notes": item.get("notes", "").strip(),
            "model": item.get("model"), "focus": focus, "question": question,
            "trace": BUILTIN_TRACE if path is None else str(path), "prefix_cache": prefix_cache, "request": request,
            **settings}
