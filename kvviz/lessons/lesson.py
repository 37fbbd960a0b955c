"""Lessons: a TOML file of steps that put the app into a state, with predict-then-reveal questions.

A step names a prompt, a cache mode (`true`, `false` or `"compare"`), the token budget and how many
generation steps the run has taken when the step is shown (`advance_to`). A question names one live
quantity; its answer is measured from the record of the next generation step (a perplexity question's: on the
shipped held-out text, under the cache policies kvviz.lessons.perplexity names), never written in the file.
A step's text may say `{measured_speed}`: the app puts there what its speed sweep measured on this machine
(a "speed" focus shows the sweep itself), so no number in a lesson can be contradicted by the screen.
A trace step (`trace`) serves requests that arrive over time; its question is answered by the first pass after
`advance_to` whose record holds the answer (kvviz.lessons.trace_answers).
Torch-free and Qt-free: the CLI lists lessons without loading a model, and the app reads them as they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from kvviz.core.errors import control_characters, visible
from kvviz.core.files import read_text_file, user_path
from kvviz.core.formats import KV_DTYPES
from kvviz.core.serve_records import ServeRequest
from kvviz.core.trace import BUILTIN_TRACE
from kvviz.lessons.answers import LONG_CONTEXT as LONG_CONTEXT
from kvviz.lessons.answers import SHORT_CONTEXT as SHORT_CONTEXT
from kvviz.lessons.answers import Answer as Answer
from kvviz.lessons.answers import format_answer as format_answer
from kvviz.lessons.answers import measured_answer as measured_answer
from kvviz.lessons.answers import measured_batch_answer as measured_batch_answer
from kvviz.lessons.answers import sink_attention_share as sink_attention_share
from kvviz.lessons.errors import LessonError as LessonError
from kvviz.lessons.perplexity import question_values
from kvviz.lessons.questions import ATTENTION_QUESTIONS as ATTENTION_QUESTIONS
from kvviz.lessons.questions import BATCH_QUESTIONS as BATCH_QUESTIONS
from kvviz.lessons.questions import PERPLEXITY_QUESTIONS as PERPLEXITY_QUESTIONS
from kvviz.lessons.questions import QUESTIONS as QUESTIONS
from kvviz.lessons.questions import SINK_QUESTIONS
from kvviz.lessons.questions import SPECULATIVE_QUESTIONS as SPECULATIVE_QUESTIONS
from kvviz.lessons.questions import TRACE_QUESTIONS as TRACE_QUESTIONS
from kvviz.lessons.step_options import parse_drafter, parse_eviction
from kvviz.lessons.trace_step import check_no_trace_keys, parse_trace_step

FOCUSES = ("grid", "chart", "counter", "memory", "speed", "all", "serving")
# a serving step's: the whole serving view, its block pool and tables, or its memory chart and speed (a slide
# shows that part, large enough to read; the app shows the whole view)
SERVING_FOCUSES = ("serving", "blocks", "chart")
MAX_LESSON_PROMPTS = 16  # requests of a serving step
MEASURED_SPEED = "{measured_speed}"  # in a step's text: what the speed sweep measured on this machine, in words
SPEED_PENDING = "(being measured on this machine\u2026)"  # what the placeholder says until the sweep is done
CACHE_MODES = (True, False, "compare")
MAX_LESSON_TOKENS = 4096
LESSON_KEYS = {"title": str, "step": list}
STEP_KEYS = {"title": str, "text": str, "notes": str, "prompt": str, "cache": (bool, str), "advance_to": int,
             "max_new_tokens": int, "model": str, "focus": str, "question": str, "window": int, "sinks": int,
             "prompts": list, "block_size": int, "kv_dtype": str, "draft_tokens": int, "prompt_lookup": int,
             "draft_model": str, "evict": str, "budget": int, "observe": int, "pool": int, "trace": str,
             "prefix_cache": str, "chunk": int, "num_blocks": int, "max_batched_tokens": int, "request": str}
REQUIRED_STEP_KEYS = ("title", "text", "prompt", "cache", "advance_to", "max_new_tokens")
REQUIRED_SERVING_KEYS = ("title", "text", "prompts", "advance_to", "max_new_tokens")  # a step with `prompts`
MAX_LESSON_BYTES = 32 * 1024  # ten times the built-in lesson; anything larger is refused unread
MULTILINE_KEYS = ("text", "notes", "prompt")  # may hold tabs and line breaks; no other control character anywhere


@dataclass(frozen=True)
class LessonStep:
    """One step of a lesson: what the screen says and the state the app is put into."""

    title: str
    text: str
    prompt: str
    cache: bool | str  # True, False or "compare"
    advance_to: int  # generation steps taken when the step is shown
    max_new_tokens: int
    notes: str = ""  # for the lecturer only: never exported
    model: str | None = None  # a --model value; None keeps the model loaded
    focus: str = "all"
    question: str | None = None  # a key of QUESTIONS
    window: int = 0  # the cache keeps the last this many positions (0: every one)
    sinks: int = 0  # and the first this many, as attention sinks
    kv_dtype: str = ""  # the cache stores keys and values quantized (a key of records.KV_DTYPES; "": exact)
    prompts: tuple[str, ...] = ()  # a serving step's batch: its requests' prompts (advance_to counts its passes)
    block_size: int = 8  # a serving step's: positions per block of the paged cache
    draft_tokens: int = 0  # speculative decoding: tokens drafted a round (0: plain decoding, a token a pass)
    prompt_lookup: int = 0  # ... drafted by prompt lookup of up to this many tokens
    draft_model: str = ""  # ... or by this draft model (a --model value)
    evict: str = ""  # the cache keeps `budget` positions a layer chosen by this importance method ("": none)
    budget: int = 0
    observe: int = 0  # ... SnapKV's and PyramidKV's observation window and pooling (0: the engine's defaults)
    pool: int = 0
    trace: str = ""  # a trace step's requests: "server" (the built-in trace) or its file ("": not a trace step)
    prefix_cache: str = "radix"  # ... served with this prefix cache (off, hash, radix), prompts prefilled in chunks
    chunk: int = 16  # of this many tokens (0: whole), from a pool of `num_blocks` blocks of `block_size`, at most
    num_blocks: int = 64  # `max_batched_tokens` tokens a pass
    max_batched_tokens: int = 256
    request: str = ""  # the trace's request a question names (prefix_hits_at_admission)

    @property
    def speculative(self) -> bool:
        """The step's run decodes speculatively: a step is a round (a pass of the model) of 1 to k + 1 tokens, and
        `advance_to` counts tokens, reached by the round that reaches it."""
        return self.draft_tokens > 0

    def drafter_fields(self) -> dict:
        """The step's drafter as RunRequest fields (draft_tokens, prompt_lookup, draft_model; zeros: none)."""
        return {"draft_tokens": self.draft_tokens, "prompt_lookup": self.prompt_lookup,
                "draft_model": self.draft_model}

    def eviction_fields(self) -> dict:
        """The step's eviction by importance as RunRequest (and Engine.policy) fields (evict "": none)."""
        return {"evict": self.evict, "budget": self.budget, "observe": self.observe, "pool": self.pool}

    def cache_fields(self) -> dict:
        """Everything the step's cache keeps and how, as RunRequest fields: window, sinks, precision, eviction."""
        return {"window": self.window, "sinks": self.sinks, "kv_dtype": self.kv_dtype, **self.eviction_fields()}

    @property
    def measures_perplexity(self) -> bool:
        """The step's question is answered by perplexities measured on the held-out text, not by its run's record
        (kvviz.lessons.perplexity)."""
        return self.question in PERPLEXITY_QUESTIONS

    @property
    def serving(self) -> bool:
        """The step shows View > Serving: a batch of `prompts` from a paged cache, `max_new_tokens` each, or a
        trace served pass by pass (`serves_trace`)."""
        return bool(self.prompts or self.trace)

    @property
    def batch(self) -> bool:
        """The step serves a batch of `prompts` that start together."""
        return bool(self.prompts)

    @property
    def serves_trace(self) -> bool:
        """The step serves its `trace`: requests that arrive over time, a scheduler, a prefix cache."""
        return bool(self.trace)

    @property
    def trace_path(self) -> Path | None:
        """A trace step's trace file (None: the built-in trace)."""
        return None if self.trace == BUILTIN_TRACE else Path(self.trace)

    def serve_request(self, run_id: int = 0) -> ServeRequest:
        """A trace step's trace and server, as the app's serving view runs them."""
        path = self.trace_path
        return ServeRequest(run_id, None if path is None else str(path), self.prefix_cache, self.chunk,
                            self.block_size, self.num_blocks, self.max_batched_tokens)

    @property
    def passes(self) -> int:
        """A serving step's batch takes a prefill per request, then a pass per token for all of them."""
        return len(self.prompts) + self.max_new_tokens

    @property
    def use_cache(self) -> bool:
        """The cache mode of the run the single views show (compare mode's primary run is cached)."""
        return self.cache is not False

    @property
    def compare(self) -> bool:
        return self.cache == "compare"

    @property
    def question_text(self) -> str:
        return QUESTIONS[self.question].format(**question_values(self), request=self.request) if self.question else ""

    @property
    def needs_attention(self) -> bool:
        """The step's answer is read from the newest token's attention weights: its run records them, and the
        app opens the attention view to show them."""
        return self.question in ATTENTION_QUESTIONS

    @property
    def needs_speed(self) -> bool:
        """The step shows the speed sweep (its focus) or says what it measured (its text)."""
        return self.focus == "speed" or MEASURED_SPEED in self.text

    def text_with(self, measured_speed: str | None) -> str:
        """The text with MEASURED_SPEED replaced by the sweep's sentence (SPEED_PENDING while there is none)."""
        return self.text.replace(MEASURED_SPEED, measured_speed or SPEED_PENDING)


@dataclass(frozen=True)
class Lesson:
    """A titled list of steps, read from `source` (a path, or "built-in")."""

    title: str
    steps: tuple[LessonStep, ...]
    source: str

    def slides(self) -> list[tuple[int, bool]]:
        """(step index, revealed) per slide: a step with a question makes two, the question and the answer."""
        out: list[tuple[int, bool]] = []
        for index, step in enumerate(self.steps):
            out.append((index, False))
            if step.question:
                out.append((index, True))
        return out


BUILTIN_LESSONS = {  # name -> what it teaches; the first is the default, each is resources/lessons/<name>.toml
    "kv-cache": "the KV cache in six steps",
    "kv-sharing": "MHA, GQA, MQA: sharing keys and values across query heads",
    "kv-window": "sliding windows and attention sinks: a cache that evicts",
    "kv-paging": "serving many requests: a paged KV cache that shares prefixes",
    "kv-quantized": "a quantized KV cache: a quarter of the bytes, and the drift it costs",
    "kv-layers": "not every layer keeps a cache: local and global layers, shared KV, linear-attention state",
    "kv-speculative": "speculative decoding: draft cheaply, verify in one pass, roll the cache back",
    "kv-importance": "which tokens can we forget? eviction by importance (H2O) against a window, and its cost",
    "kv-server": "a server's cache: requests over time, chunked prefill, prefix-cache hits, a preemption",
}


def builtin_lesson_path(name: str = next(iter(BUILTIN_LESSONS))) -> Path:
    from kvviz.core.resources import resource_path

    return resource_path("lessons", f"{name}.toml")


def load_lesson(path: Path | str | None = None) -> Lesson:
    """The lesson in `path` (a built-in lesson's name, as `--model` takes a hub model's), or the default
    built-in one; LessonError (one line) for anything wrong with it."""
    if path is None or str(path) in BUILTIN_LESSONS:
        file = builtin_lesson_path(*([] if path is None else [str(path)]))
    else:
        file = user_path(path)
    text = read_text_file(file, MAX_LESSON_BYTES, f"{MAX_LESSON_BYTES // 1024} KB", "lesson file", LessonError)
    return parse_lesson(text, str(file))


def parse_lesson(text: str, source: str) -> Lesson:
    """A Lesson from TOML text; `source` names the file in errors."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_LESSON_BYTES:
        raise LessonError(f"{source}: larger than {MAX_LESSON_BYTES // 1024} KB; a lesson file is at most that")
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise LessonError(f"{source}: not valid TOML ({visible(str(exc))})") from exc
    except RecursionError as exc:
        raise LessonError(f"{source}: arrays or tables nested too deeply to be a lesson") from exc
    _check_keys(raw, LESSON_KEYS, source, "")
    title = raw.get("title")
    if not isinstance(title, str) or not title.strip():
        raise LessonError(f"{source}: title: a lesson needs a title (text)")
    _check_plain(title, source, "", "title")
    raw_steps = raw.get("step")
    if not raw_steps:
        raise LessonError(f"{source}: step: a lesson needs at least one [[step]]")
    steps = tuple(_parse_step(item, source, number) for number, item in enumerate(raw_steps, start=1))
    return Lesson(title=title.strip(), steps=steps, source=source)


def _check_keys(table: dict, allowed: dict, source: str, where: str) -> None:
    for key, value in table.items():
        if key not in allowed:
            raise LessonError(f"{source}: {where}{visible(key)[:80]}: unknown key; known: {', '.join(allowed)}")
        kind = allowed[key]
        if isinstance(value, bool) and kind is int or not isinstance(value, kind):
            names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
            raise LessonError(f"{source}: {where}{key}: expected {_kind_words(names)}, got {value!r}"[:300])


def _check_plain(value: str, source: str, where: str, key: str) -> None:
    control = control_characters(value, "\t\n\r" if key in MULTILINE_KEYS else "")
    if control is not None:
        raise LessonError(f"{source}: {where}{key}: holds the control character {control}; a lesson is plain text")


def _kind_words(names: str) -> str:
    return (names.replace("str", "text").replace("int", "a whole number").replace("bool", "true/false")
            .replace("list", "a list of [[step]] tables"))


def _parse_step(item: object, source: str, number: int) -> LessonStep:
    where = f"step {number}: "
    if not isinstance(item, dict):
        raise LessonError(f"{source}: step {number}: expected a [[step]] table")
    _check_keys(item, STEP_KEYS, source, where)
    if "trace" in item:
        for key, value in item.items():
            if isinstance(value, str):
                _check_plain(value, source, where, key)
        return LessonStep(**parse_trace_step(item, source, where))
    check_no_trace_keys(item, source, where)
    if "prompts" in item:
        return _parse_serving_step(item, source, where)
    for key in REQUIRED_STEP_KEYS:
        if key not in item:
            raise LessonError(f"{source}: {where}{key}: missing")
    for key, value in item.items():
        if isinstance(value, str):
            _check_plain(value, source, where, key)
    if "block_size" in item:
        raise LessonError(f"{source}: {where}block_size: goes with prompts or trace (a serving step's)")
    if item.get("focus") == "serving" or item.get("question") in BATCH_QUESTIONS:
        key = "focus" if item.get("focus") == "serving" else "question"
        raise LessonError(f"{source}: {where}{key}: {item[key]!r} belongs to a serving step: give prompts too")
    cache = item["cache"]
    if cache not in CACHE_MODES or (isinstance(cache, str) and cache != "compare"):
        raise LessonError(f"{source}: {where}cache: expected true, false or \"compare\", got {cache!r}")
    budget, advance = item["max_new_tokens"], item["advance_to"]
    if not 1 <= budget <= MAX_LESSON_TOKENS:
        raise LessonError(f"{source}: {where}max_new_tokens: {budget} is not from 1 to {MAX_LESSON_TOKENS}")
    if advance < 0:
        raise LessonError(f"{source}: {where}advance_to: {advance} is negative")
    if advance > budget:
        raise LessonError(f"{source}: {where}advance_to: {advance} is more than max_new_tokens ({budget})")
    question = item.get("question")
    if question is not None:
        if question not in QUESTIONS:
            raise LessonError(f"{source}: {where}question: unknown quantity {question!r}; "
                              f"known: {', '.join(QUESTIONS)}"[:400])
        if advance >= budget:
            raise LessonError(f"{source}: {where}question: the run has no next step to reveal it "
                              f"(advance_to {advance} = max_new_tokens)")
    window, sinks = item.get("window", 0), item.get("sinks", 0)
    for key, value in (("window", window), ("sinks", sinks)):
        if not 0 <= value <= MAX_LESSON_TOKENS:
            raise LessonError(f"{source}: {where}{key}: {value} is not from 0 to {MAX_LESSON_TOKENS}")
    if sinks and not window:
        raise LessonError(f"{source}: {where}sinks: attention sinks go with a window: give window too")
    if question in SINK_QUESTIONS and not sinks:
        raise LessonError(f"{source}: {where}question: {question} asks about the sinks: give sinks too")
    kv_dtype = item.get("kv_dtype", "")
    if kv_dtype and kv_dtype not in KV_DTYPES:
        raise LessonError(f"{source}: {where}kv_dtype: expected one of {', '.join(KV_DTYPES)}, got {kv_dtype!r}"[:300])
    if kv_dtype and window:
        raise LessonError(f"{source}: {where}kv_dtype: a quantized cache keeps every position: no window with it")
    drafter = parse_drafter(item, source, where)
    eviction = parse_eviction(item, source, where, MAX_LESSON_TOKENS)
    focus = item.get("focus", "all")
    if focus not in FOCUSES:
        raise LessonError(f"{source}: {where}focus: expected one of {', '.join(FOCUSES)}, got {focus!r}"[:300])
    for key in ("title", "text"):
        if not item[key].strip():
            raise LessonError(f"{source}: {where}{key}: is empty")
    for key in ("title", "notes"):
        if MEASURED_SPEED in item.get(key, ""):
            raise LessonError(f"{source}: {where}{key}: {MEASURED_SPEED} belongs in a step's text")
    return LessonStep(title=item["title"].strip(), text=" ".join(item["text"].split()), prompt=item["prompt"],
                      cache=cache, advance_to=advance, max_new_tokens=budget, notes=item.get("notes", "").strip(),
                      model=item.get("model"), focus=focus, question=question, window=window, sinks=sinks,
                      kv_dtype=kv_dtype, **drafter, **eviction)


def _parse_serving_step(item: dict, source: str, where: str) -> LessonStep:
    """A step with `prompts`: a batch of requests served from a paged cache (View > Serving)."""
    for key in REQUIRED_SERVING_KEYS:
        if key not in item:
            raise LessonError(f"{source}: {where}{key}: missing")
    for key in ("prompt", "cache", "window", "sinks", "kv_dtype", "draft_tokens", "prompt_lookup", "draft_model",
                "evict", "budget", "observe", "pool"):
        if key in item:
            raise LessonError(f"{source}: {where}{key}: a serving step has prompts, one cache for all, no window")
    prompts = item["prompts"]
    if not prompts or len(prompts) > MAX_LESSON_PROMPTS:
        raise LessonError(f"{source}: {where}prompts: give 1 to {MAX_LESSON_PROMPTS} prompts, got {len(prompts)}")
    for number, prompt in enumerate(prompts, start=1):
        if not isinstance(prompt, str) or not prompt.strip():
            raise LessonError(f"{source}: {where}prompts: prompt {number} is not text, or is empty")
        _check_plain(prompt, source, where, "prompts")
    for key, value in item.items():
        if isinstance(value, str):
            _check_plain(value, source, where, key)
    budget, advance, block_size = item["max_new_tokens"], item["advance_to"], item.get("block_size", 8)
    if not 1 <= budget <= MAX_LESSON_TOKENS:
        raise LessonError(f"{source}: {where}max_new_tokens: {budget} is not from 1 to {MAX_LESSON_TOKENS}")
    if not 1 <= block_size <= 256:
        raise LessonError(f"{source}: {where}block_size: {block_size} is not from 1 to 256")
    passes = len(prompts) + budget
    if not 0 <= advance <= passes:
        raise LessonError(f"{source}: {where}advance_to: {advance} is not from 0 to the batch's {passes} passes")
    question = item.get("question")
    if question is not None and question not in BATCH_QUESTIONS:
        raise LessonError(f"{source}: {where}question: a serving step asks {', '.join(BATCH_QUESTIONS)}, "
                          f"not {question!r}"[:300])
    if question is not None and advance >= passes:
        raise LessonError(f"{source}: {where}question: the batch has no pass left to reveal it")
    focus = item.get("focus", "serving")
    if focus not in SERVING_FOCUSES:
        raise LessonError(f"{source}: {where}focus: a serving step shows {', '.join(map(repr, SERVING_FOCUSES))}, "
                          f"not {focus!r}"[:300])
    for key in ("title", "text"):
        if not item[key].strip():
            raise LessonError(f"{source}: {where}{key}: is empty")
    return LessonStep(title=item["title"].strip(), text=" ".join(item["text"].split()), prompt="", cache=True,
                      advance_to=advance, max_new_tokens=budget, notes=item.get("notes", "").strip(),
                      model=item.get("model"), focus=focus, question=question, prompts=tuple(prompts),
                      block_size=block_size)
