"""A trace step's place in its served trace and its question's measured answer, read from the records of the
scheduler's passes (kvviz.engine.scheduler) as they come: the app's lesson mode and the slides take them alike.
Torch-free and Qt-free."""

from __future__ import annotations

import math
from collections.abc import Sequence

from kvviz.core.serve_records import ServePlan, ServeRecord


def reached(plan: ServePlan, records: Sequence[ServeRecord], advance_to: int) -> int | None:
    """How many of `records` a step at `advance_to` passes shows: up to the first whose pass makes `advance_to` done
    (a pass where nothing runs has no record: the step then shows the next pass that runs), or all of them once the
    trace is over; None while the trace has not got that far."""
    if advance_to <= 0:
        return 0
    for count, record in enumerate(records, 1):
        if plan.steps_done(record) >= advance_to:
            return count
    return len(records) if records and records[-1].final else None


def trace_answer(question: str, plan: ServePlan, record: ServeRecord, request: str = "") -> int | None:
    """The answer to a trace step's question if `record`'s pass holds it, else None. prefix_hits_at_admission: the
    prompt positions the admission of the request named `request` found cached in the pass (what the prefix cache
    held of its prompt); blocks_freed_by_preemption: the blocks the pass's first preemption freed (those only its
    victim held, now free or cached)."""
    if question == "prefix_hits_at_admission":
        index = next(r.index for r in plan.requests if r.name == request)
        return next((hit for i, hit in zip(record.admitted, record.cached_tokens, strict=True) if i == index), None)
    if question == "blocks_freed_by_preemption":
        return record.freed_blocks[0] if record.preempted else None
    raise ValueError(f"unknown question {question!r}")


def find_trace_answer(question: str, plan: ServePlan, records: Sequence[ServeRecord], shown: int,
                      request: str = "") -> tuple[int, float] | None:
    """(how many records up to the one that answers, the answer) for a step that shows `shown` of `records`: the
    first record after them that holds it; (all of them, NaN) when the trace ended without it; None while it may
    still come."""
    for count in range(shown + 1, len(records) + 1):
        answer = trace_answer(question, plan, records[count - 1], request)
        if answer is not None:
            return count, float(answer)
    if records and records[-1].final:
        return len(records), math.nan
    return None


def missing_answer(question: str, request: str, advance_to: int) -> str:
    """Why a trace ended without the answer to a step's question, in words for a one-line error."""
    if question == "prefix_hits_at_admission":
        return f"{request} is not admitted after pass {advance_to}: ask before it arrives (a smaller advance_to)"
    return (f"no request is preempted after pass {advance_to}: a smaller pool (num_blocks) or larger chunks make "
            "the scheduler preempt")
