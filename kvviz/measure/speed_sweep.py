"""The speed sweep: ms per token step against the sequence length, with and without the cache, both modes
interleaved and repeated, the median per length (`kvviz bench --sweep`, the app's speed view)."""

from __future__ import annotations

import statistics
from collections.abc import Callable

from kvviz.core.errors import KvvizError
from kvviz.core.records import RunRequest
from kvviz.engine.engine import Engine
from kvviz.engine.run import start_run
from kvviz.measure.bench import weight_bytes
from kvviz.measure.speed import (
    DEFAULT_MAX_LENGTH,
    MAX_SWEEP_REPEAT,
    MIN_SWEEP_LENGTH,
    SWEEP_POINTS,
    SWEEP_REPEAT,
    SweepCancelled,
    SweepResult,
)


def sweep_lengths(max_length: int, points: int = SWEEP_POINTS) -> tuple[int, ...]:
    """`points` lengths evenly spaced up to `max_length` (fewer where they would repeat)."""
    if max_length < MIN_SWEEP_LENGTH:
        raise KvvizError(f"a speed sweep needs a length of at least {MIN_SWEEP_LENGTH}, got {max_length}")
    lengths = sorted({max(MIN_SWEEP_LENGTH, round(max_length * k / points)) for k in range(1, points + 1)})
    return tuple(lengths)


def _filler_ids(engine: Engine, length: int, text: str) -> list[int]:
    """`length` token ids: the text's tokens, repeated."""
    ids = engine.encode_prompt(text) or [0]
    return (ids * (length // len(ids) + 1))[:length]


def _step_seconds(engine: Engine, ids: list[int], use_cache: bool) -> float:
    """The time of the token step at sequence length len(ids), as the engine runs it: with the cache, the step
    after a prefill of all but one position (its query attends to len(ids) positions); without, the pass over
    all of them."""
    fed = ids[:-1] if use_cache else ids
    run = start_run(engine, RunRequest(0, "", use_cache, 2 if use_cache else 1), prompt_ids=fed, top_candidates=1)
    records = run.passes()
    if use_cache:
        next(records)  # the prefill of len(ids) - 1 positions: not timed
    seconds = next(records).seconds  # with the cache one new position, attending to len(ids); without, all again
    run.close()
    return seconds


def run_sweep(
    engine: Engine,
    max_length: int | None = None,
    repeat: int = SWEEP_REPEAT,
    text: str = "Time flies fast, and the cache keeps what it has computed. ",
    model_name: str = "",
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
    points: int = SWEEP_POINTS,
    partial: Callable[[SweepResult], None] | None = None,
) -> SweepResult:
    """Time a token step with and without the cache at `points` lengths up to `max_length` (default: the
    context, at most DEFAULT_MAX_LENGTH): after a warm-up, `repeat` turns, each going through every length
    and, at each, both modes in alternating order. `progress(done, total)` follows the measurements;
    `cancelled()` True stops the sweep (SweepCancelled); `partial(result)`, after each length of the first turn,
    gets the lengths measured so far (a curve drawn as it fills)."""
    if not 1 <= repeat <= MAX_SWEEP_REPEAT:
        raise KvvizError(f"repeat must be a whole number from 1 to {MAX_SWEEP_REPEAT}, got {repeat}")
    longest = engine.n_ctx - 1  # a cached step at length L plans L - 1 prompt tokens and 2 new ones
    max_length = min(DEFAULT_MAX_LENGTH, longest) if max_length is None else max_length
    if max_length > longest:
        raise KvvizError(f"--max-length {max_length} is more than the model's context allows ({longest})")
    lengths = sweep_lengths(max_length, points)
    engine.warm_up()
    ids = _filler_ids(engine, max(lengths), text)
    turns = {True: [[] for _ in lengths], False: [[] for _ in lengths]}
    total, done = repeat * len(lengths) * 2, 0
    for turn in range(repeat):
        for index, length in enumerate(lengths):
            order = (True, False) if (turn + index) % 2 == 0 else (False, True)
            for use_cache in order:
                if cancelled is not None and cancelled():
                    raise SweepCancelled("the speed sweep was cancelled")
                turns[use_cache][index].append(_step_seconds(engine, ids[:length], use_cache) * 1000.0)
                done += 1
                if progress is not None:
                    progress(done, total)
            if partial is not None and turn == 0:
                partial(_result(engine, model_name, lengths[:index + 1], turns, turn + 1))
    return _result(engine, model_name, lengths, turns, repeat)


def _result(engine: Engine, model_name: str, lengths: tuple[int, ...], turns: dict, repeat: int) -> SweepResult:
    """The medians of the turns measured at `lengths` (the first len(lengths) of the sweep's)."""
    n = len(lengths)
    return SweepResult(
        model=model_name or engine.model.config.name,
        dtype=str(engine.dtype).removeprefix("torch."),
        lengths=tuple(lengths),
        cached_ms=tuple(statistics.median(t) for t in turns[True][:n]),
        uncached_ms=tuple(statistics.median(t) for t in turns[False][:n]),
        repeat=repeat,
        cached_turns_ms=tuple(tuple(t) for t in turns[True][:n]),
        uncached_turns_ms=tuple(tuple(t) for t in turns[False][:n]),
        weight_bytes=weight_bytes(engine.model),
    )

