"""The measured answers of a lesson's questions: each computed from the records of the step's run (what the engine
measured), never written in a lesson file, and written out as the app and the slides show them. Torch-free and
Qt-free, as kvviz.lessons.lesson, which asks the questions."""

from __future__ import annotations

import math

from kvviz.core.batch_records import BatchRecord
from kvviz.core.counting import plural
from kvviz.core.memory import format_bytes
from kvviz.core.records import StepRecord
from kvviz.lessons.perplexity import Perplexities

Answer = float | tuple[int, ...] | Perplexities  # a number; the positions a layer keeps; perplexities measured
LONG_CONTEXT = 8192  # the tokens of cache_bytes_at_8k
SHORT_CONTEXT = 1000  # the tokens of cache_bytes_at_1k
TRACE_UNITS = {"prefix_hits_at_admission": "token", "blocks_freed_by_preemption": "block"}  # what a trace answer counts


def measured_batch_answer(question: str, record: BatchRecord) -> float:
    """The answer to a serving step's question, from its batch's last pass."""
    if question == "blocks_at_end":
        return record.blocks_used
    raise ValueError(f"unknown question {question!r}")


def sink_attention_share(record: StepRecord, sinks: int) -> float:
    """The percentage of the newest query's attention on the first `sinks` positions, the mean over layers and
    heads of each row's weights there (each row sums to 1): what the record's attention weights measured."""
    weights = record.attention
    if weights is None:
        raise ValueError("the record carries no attention weights: run it with attention")
    rows = [weights.row(layer, head) for layer in range(weights.layers) for head in range(weights.heads)]
    return 100.0 * sum(sum(row[:sinks]) for row in rows) / len(rows)


def acceptance_percent(record: StepRecord) -> float:
    """The drafts the model accepted, out of all it was offered up to `record`'s round, in % (0 before any draft, and
    for a record of plain decoding)."""
    rate = record.speculation.acceptance_rate if record.speculation is not None else None
    return 100.0 * rate if rate is not None else 0.0


def kept_positions(record: StepRecord, layer: int = 0) -> tuple[int, ...]:
    """The positions some KV head of `layer` holds after `record`'s pass, as its importance method left them."""
    if record.eviction is None:
        raise ValueError("the record carries no eviction state: its run evicts by no importance method")
    return record.eviction.layers[layer].kept()


def measured_answer(question: str, previous: StepRecord | None, record: StepRecord, sinks: int = 0) -> Answer:
    """The answer to `question`, from the last record of the next generation step (`record`: its token pass,
    or the cache-filling pass that follows the last token, as the counter shows it; a speculative run's next round)
    and the last record
    before that step (None when it is the first): what the engine measured, per layer."""
    if question == "next_kv_with_cache":
        return record.with_cache_total - (previous.with_cache_total if previous else 0)
    if question == "next_kv_without_cache":
        return record.without_cache_total - (previous.without_cache_total if previous else 0)
    if question == "avoided_after_next":
        return record.avoided_total
    if question == "ratio_after_next":
        return record.without_cache_total / record.with_cache_total if record.with_cache_total else 0.0
    if question == "cache_bytes_after_next":
        return record.cache_bytes
    if question == "sink_attention_share":
        return sink_attention_share(record, sinks)
    if question == "shared_layer_kv":
        return record.kv_computed[-1]
    if question == "positions_held_after_next":  # after a speculative round: its kept tokens, the rest cropped away
        return record.positions_held
    if question == "acceptance_rate_after_next":
        return acceptance_percent(record)
    if question == "kept_positions_after_next":
        return kept_positions(record)
    # each layer's bytes a position and its bytes that do not grow, from what each layer holds and measured (a
    # window's layers hold fewer positions than the others; a linear-attention layer holds a state, no position)
    held = record.layer_positions_held or (record.positions_held,) * record.n_layer
    sizes = record.layer_bytes or tuple(record.cache_bytes * n // sum(held) if sum(held) else 0 for n in held)
    per_position = [size // n if n else 0 for size, n in zip(sizes, held, strict=True)]
    fixed = sum(size for size, n in zip(sizes, held, strict=True) if not n)
    if question == "cache_bytes_per_token":
        return sum(per_position)
    if question in ("cache_bytes_at_8k", "cache_bytes_at_1k"):
        context = LONG_CONTEXT if question == "cache_bytes_at_8k" else SHORT_CONTEXT
        capacity = record.layer_capacity or (0,) * len(held)
        return fixed + sum(size * (min(context, cap) if cap else context)
                           for size, cap in zip(per_position, capacity, strict=True))
    raise ValueError(f"unknown question {question!r}")


def format_positions(positions: tuple[int, ...]) -> str:
    """Positions as runs: (0, 1, 2, 3, 14, 15, 16, 17) -> '0\u20133, 14\u201317'; (0, 2) -> '0, 2'."""
    runs: list[list[int]] = []
    for position in positions:
        if runs and position == runs[-1][1] + 1:
            runs[-1][1] = position
        else:
            runs.append([position, position])
    return ", ".join(f"{first}" if first == last else f"{first}, {last}" if last == first + 1 else
                     f"{first}\u2013{last}" for first, last in runs)


def format_answer(question: str, value: Answer, precision: str = "") -> str:
    """The answer as the app and the slides show it: 87, 6.8x, 36,864 bytes, 0\u20133, 14\u201317; a byte answer
    names the `precision` its cache was measured in, when given (a record's `cache_precision`): 36,864 bytes in
    float32. A perplexity question's: the ratio asked for, then each perplexity measured."""
    if isinstance(value, Perplexities):
        return value.describe()
    if isinstance(value, float) and math.isnan(value):
        return "not measured"
    if isinstance(value, tuple):
        return format_positions(value)
    if question == "ratio_after_next":
        return f"{value:.1f}x"
    stored = f" in {precision}" if precision else ""
    if question in ("cache_bytes_after_next", "cache_bytes_per_token"):
        return f"{int(value):,} bytes{stored}"
    if question in ("cache_bytes_at_8k", "cache_bytes_at_1k"):
        return f"{int(value):,} bytes ({format_bytes(value)}){stored}"
    if question == "blocks_at_end":
        return f"{int(value):,} blocks"
    if question in TRACE_UNITS:
        return plural(int(value), TRACE_UNITS[question])
    if question in ("sink_attention_share", "acceptance_rate_after_next"):
        return f"{value:.1f} %"
    if question == "positions_held_after_next":
        return f"{int(value):,} positions"
    return f"{int(value):,}"
