"""A serving trace: requests that arrive over time, as JSON lines `{"arrive_at_pass": 0, "prompt": "...",
"max_new_tokens": 16}` (kvviz serve-trace, the serving view). Torch-free: read and checked before any model loads;
what needs the model (a prompt's tokens against the pool and the context) is checked by the engine's plan."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from kvviz.core.errors import KvvizError
from kvviz.core.resources import resource_path

MAX_TRACE_REQUESTS = 256
MAX_ARRIVAL = 100_000  # passes
MAX_TRACE_TOKENS = 4096  # new tokens a request may ask for
MAX_TRACE_BYTES = 4 * 1024 * 1024
BUILTIN_TRACE = "server"  # resources/traces/server.jsonl: a shared system prompt, follow-ups, a long document
FIELDS = ("arrive_at_pass", "prompt", "max_new_tokens")


class TraceError(KvvizError):
    """A trace that cannot run: the message is one line that names the line of the file."""


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace: it joins the waiting queue at pass `arrive_at_pass` (0 is the first pass)."""

    arrive_at_pass: int
    prompt: str
    max_new_tokens: int
    name: str = ""  # a short label for the views ("system 1", "document"); the trace's own "name" field, if any


def builtin_trace_path() -> Path:
    return resource_path("traces", f"{BUILTIN_TRACE}.jsonl")


def read_trace(path: str | Path | None = None) -> tuple[TraceRequest, ...]:
    """The requests of the trace at `path` (None: the built-in one), checked (TraceError)."""
    file = builtin_trace_path() if path is None else Path(path)
    try:
        if file.stat().st_size > MAX_TRACE_BYTES:
            raise TraceError(f"{file}: larger than {MAX_TRACE_BYTES // (1024 * 1024)} MiB; a trace is a few "
                             "hundred requests at most")
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TraceError(f"{file}: no such file") from None
    except IsADirectoryError:
        raise TraceError(f"{file}: a folder, not a trace file") from None
    except UnicodeDecodeError:
        raise TraceError(f"{file}: not UTF-8 text; a trace is JSON lines") from None
    except OSError as exc:
        raise TraceError(f"{file}: cannot be read ({exc.strerror or exc})") from None
    return parse_trace(text, str(file))


def parse_trace(text: str, source: str = "the trace") -> tuple[TraceRequest, ...]:
    """The requests of JSON lines `text` (blank lines and lines starting with # skipped), checked: each an object
    with the three fields, arrivals never going back, at least one request (TraceError, naming the line)."""
    requests: list[TraceRequest] = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{source}, line {number}"
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{where}: not JSON ({exc.msg}); a trace has one JSON object a line") from None
        if not isinstance(item, dict):
            raise TraceError(f"{where}: a JSON {type(item).__name__}, not an object with {', '.join(FIELDS)}")
        missing = [f for f in FIELDS if f not in item]
        if missing:
            raise TraceError(f"{where}: no {' and no '.join(missing)}; each request has {', '.join(FIELDS)}")
        unknown = sorted(set(item) - set(FIELDS) - {"name"})
        if unknown:
            raise TraceError(f"{where}: unknown field {unknown[0]!r}; a request has {', '.join(FIELDS)} (and a "
                             "name)")
        arrive, prompt, budget, name = item["arrive_at_pass"], item["prompt"], item["max_new_tokens"], \
            item.get("name", "")
        if not _whole(arrive) or not 0 <= arrive <= MAX_ARRIVAL:
            raise TraceError(f"{where}: arrive_at_pass must be a whole number from 0 to {MAX_ARRIVAL}, got "
                             f"{json.dumps(arrive)}")
        if not _whole(budget) or not 1 <= budget <= MAX_TRACE_TOKENS:
            raise TraceError(f"{where}: max_new_tokens must be a whole number from 1 to {MAX_TRACE_TOKENS}, got "
                             f"{json.dumps(budget)}")
        if not isinstance(prompt, str) or not prompt.strip():
            raise TraceError(f"{where}: the prompt must be text to continue, got {json.dumps(prompt)[:40]}")
        if not isinstance(name, str) or len(name) > 40:
            raise TraceError(f"{where}: a name is text of at most 40 characters")
        if requests and arrive < requests[-1].arrive_at_pass:
            raise TraceError(f"{where}: arrives at pass {arrive}, before the request above it (pass "
                             f"{requests[-1].arrive_at_pass}); a trace lists requests in the order they arrive")
        if len(requests) == MAX_TRACE_REQUESTS:
            raise TraceError(f"{source}: more than {MAX_TRACE_REQUESTS} requests")
        requests.append(TraceRequest(arrive, prompt, budget, name or f"r{len(requests) + 1}"))
    if not requests:
        raise TraceError(f"{source}: no request; a trace has one JSON object a line")
    return tuple(requests)


def _whole(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)
