"""What the serving view shows of a served trace, worked out from its ServeRecords without Qt (tested without a
window): the timeline's columns, the pool's blocks (held, cached, free), the radix tree laid out in rows, the
per-request figures and the words around them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvviz.app.views.serving.pool_state import BlockCell
from kvviz.core.counting import plural
from kvviz.core.serve_records import (
    DECODING,
    FINISHED,
    NOT_ARRIVED,
    PREEMPTED,
    PREFILLING,
    WAITING,
    RadixNode,
    ServeMeasure,
    ServePlan,
    ServeRecord,
)

# the timeline's legend, in the order a request goes through them (not arrived: a blank cell)
STATE_LABELS = {WAITING: "waiting", PREFILLING: "prefilling a chunk", DECODING: "decoding", PREEMPTED: "preempted",
                FINISHED: "finished", NOT_ARRIVED: "not arrived"}
CACHE_NAMES = {"radix": "radix-tree prefix cache", "hash": "block-hash prefix cache", "off": "no prefix cache"}
RUN_LABELS = 4  # token labels a radix node shows of its run (the rest elided)


@dataclass(frozen=True)
class TimelineColumn:
    """One pass of the timeline: every request's state after it; `ran` False for a pass the scheduler skipped
    (nothing ran until the next arrival: the states of the idle pass before it)."""

    step: int
    states: tuple[str, ...]
    ran: bool = True


def timeline_columns(records: Sequence[ServeRecord], before: TimelineColumn | None = None) -> list[TimelineColumn]:
    """A column per pass from the first record's to the last's, the records' own states; the passes the scheduler
    skipped between two records keep the states of the one before (`before`: the column before `records`)."""
    columns: list[TimelineColumn] = []
    last = before
    for record in records:
        if last is not None:
            columns.extend(TimelineColumn(step, last.states, ran=False) for step in range(last.step + 1, record.step))
        last = TimelineColumn(record.step, record.states)
        columns.append(last)
    return columns


def trace_pool_cells(record: ServeRecord) -> list[BlockCell]:
    """Every block of the pool as the record leaves it: held (by its requests), cached (by none) or free."""
    cells = [BlockCell(b) for b in range(record.num_blocks)]
    for state in (*record.blocks, *record.cached_blocks):
        first = state.first_position
        cells[state.block] = BlockCell(state.block, state.owners, (first, first + len(state.token_ids)),
                                       len(state.token_ids), state.token_labels, cached=not state.owners)
    return cells


def pool_counts(record: ServeRecord | None, num_blocks: int) -> tuple[int, int, int]:
    """Blocks held by requests, cached (held by none), free."""
    if record is None:
        return 0, 0, num_blocks
    return len(record.blocks), len(record.cached_blocks), len(record.free_blocks)


def tree_rows(tree: Sequence[RadixNode]) -> list[tuple[int, int]]:
    """Each node's (depth, row) for a tree drawn left to right: a node on its first child's row, each later child
    on the next row free below everything drawn so far. The nodes come depth-first, parent before child."""
    placed: list[tuple[int, int]] = []
    children: dict[int, int] = {}  # by parent (-1: the root): children placed so far
    bottom = -1
    for node in tree:
        depth = placed[node.parent][0] + 1 if node.parent >= 0 else 0
        first = children.get(node.parent, 0) == 0
        row = placed[node.parent][1] if first and node.parent >= 0 else bottom + 1
        children[node.parent] = children.get(node.parent, 0) + 1
        placed.append((depth, row))
        bottom = max(bottom, row)
    return placed


def run_text(node: RadixNode, labels: int = RUN_LABELS) -> str:
    """A node's first token labels, as text on one line (the view elides it to its box)."""
    text = "".join(node.token_labels[:labels]).replace("\n", "\u21b5").strip()
    return text + ("\u2026" if len(node.token_labels) > labels else "")


def node_tooltip(node: RadixNode) -> str:
    text = "".join(node.token_labels).replace("\n", "\u21b5")
    if len(text) > 160:
        text = text[:157] + "\u2026"
    held = ("live: a running request holds it" if node.live
            else "cached: no request holds it; a leaf is evicted first, least recently used")
    return (f"{plural(len(node.token_ids), 'token')}, {plural(node.hits, 'hit')} (admissions that matched into it), "
            f"{held}\nBlocks {', '.join(map(str, node.blocks))}\nTokens: \u201c{text}\u201d")


def trace_summary(plan: ServePlan) -> str:
    """The server the trace runs on, in one line."""
    chunk = f"prefill chunks of {plan.chunk} tokens" if plan.chunk else "whole prompts (no chunking)"
    return (f"{plural(len(plan.requests), 'request')} arriving over time \u00b7 {CACHE_NAMES[plan.prefix_cache]} "
            f"\u00b7 {chunk} \u00b7 {plan.max_batched_tokens} tokens a pass \u00b7 a pool of "
            f"{plural(plan.num_blocks, 'block')} of {plan.block_size} positions")


def first_decision(plan: ServePlan) -> str:
    """What the decision line says before the first pass."""
    first = plan.requests[0]
    return (f"Before pass 0: {plural(len(plan.requests), 'request')} will arrive, {first.name} first (at pass "
            f"{first.arrive_at_pass}). Press Space for the scheduler's first pass.")


def no_tree_note(prefix_cache: str) -> str:
    """The one line in place of the radix tree in the other modes."""
    if prefix_cache == "hash":
        return ("Hash mode: a full block is found by the hash of its tokens and every block before it (vLLM); "
                "no tree to draw: the pool shows the cached blocks.")
    return "No prefix cache: a finished request's blocks go back to the free list; nothing is shared across requests."


# the timeline's columns after its passes: each request's figures, counted after the last pass
def passes(count: int) -> str:
    return f"{count:,} pass{'' if count == 1 else 'es'}"


FIGURE_HEADERS = ("first token", "longest gap", "cached", "hit rate", "preempted")
FIGURE_WIDEST = ("99 passes, 999 ms", "99 passes, 999 ms", "999 of 999", "100%", "9")  # room kept for them


def figure_rows(measured: ServeMeasure) -> list[tuple[str, ...]]:
    """Each request's figures, in FIGURE_HEADERS' order: passes and ms from its arrival to its first token, its
    longest gap between two tokens, the prompt tokens its admissions found cached, its hit rate, its preemptions."""
    rows = []
    for r in measured.requests:
        asked = r.cached_tokens + r.prefill_tokens
        rows.append((f"{passes(r.first_token_passes)}, {r.first_token_ms:.0f} ms",
                     f"{passes(r.max_gap_passes)}, {r.max_gap_ms:.0f} ms",
                     f"{r.cached_tokens} of {r.prompt_tokens}", f"{r.cached_tokens / asked:.0%}" if asked else "-",
                     str(r.preemptions) if r.preemptions else "-"))
    return rows


def figures_total(measured: ServeMeasure) -> str:
    """The whole trace's figures in one line, under the table."""
    return (f"The trace: {passes(measured.passes)}, {measured.seconds * 1000:.0f} ms, "
            f"{measured.tokens_per_second:.0f} tok/s; {measured.cached_tokens} of "
            f"{measured.cached_tokens + measured.prefill_tokens} prompt tokens found cached "
            f"({measured.hit_rate:.0%}), {plural(measured.preemptions, 'preemption')}, "
            f"{plural(measured.evicted_blocks, 'block')} evicted.")
