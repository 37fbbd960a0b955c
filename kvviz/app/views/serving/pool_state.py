"""What the serving view shows of a pool at one pass, worked out from its record without Qt (tested without a
window): each block's owners, references and tokens (a served trace's cached blocks too), and the words its tooltip
says."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvviz.core.batch_records import BatchPlan, BatchRecord
from kvviz.core.counting import plural


@dataclass(frozen=True)
class BlockCell:
    """One block of the pool: free, held by `owners` (request indices), or `cached` (a served trace's: no request
    holds it, its tokens are kept for a later prefix and it is evicted when the pool needs it); its tokens' labels
    for the tooltip."""

    block: int
    owners: tuple[int, ...] = ()
    positions: tuple[int, int] = (0, 0)  # [first, last + 1) of the positions it holds
    filled: int = 0
    token_labels: tuple[str, ...] = ()
    cached: bool = False

    @property
    def free(self) -> bool:
        return not self.owners and not self.cached

    @property
    def shared(self) -> bool:
        return len(self.owners) > 1


def pool_cells(record: BatchRecord) -> list[BlockCell]:
    """Every block of the pool in order, as the record leaves it."""
    cells = [BlockCell(b) for b in range(record.num_blocks)]
    for state in record.blocks:
        first = state.first_position
        cells[state.block] = BlockCell(state.block, state.owners, (first, first + len(state.token_ids)),
                                       len(state.token_ids), state.token_labels)
    return cells


def request_name(index: int) -> str:
    return f"R{index + 1}"


def block_tooltip(cell: BlockCell, block_size: int, names: Sequence[str] | None = None) -> str:
    """A block's tooltip: its number, what it holds, whose it is (`names`: the requests', else R1, R2, ...)."""
    if cell.free:
        return f"Block {cell.block}: free (on the free list, {block_size} positions)"
    owners = ", ".join(names[i] if names is not None else request_name(i) for i in cell.owners)
    if cell.cached:
        owners = "no request: cached for a later prompt with this prefix, evicted when the pool runs out"
    whose = (f"shared by {owners} ({plural(len(cell.owners), 'reference')}; stored once)" if cell.shared
             else f"held by {owners}")
    text = "".join(cell.token_labels)
    if len(text) > 160:
        text = text[:157] + "\u2026"
    first, stop = cell.positions
    return (f"Block {cell.block}: positions {first}\u2013{stop - 1}, {cell.filled} of {block_size} slots filled, "
            f"{whose}\nTokens: \u201c{text}\u201d")


def summary(plan: BatchPlan, record: BatchRecord | None) -> str:
    """One line under the title: passes, blocks in use and shared, what sharing saved."""
    requests = plural(len(plan.requests), "request")
    if record is None:
        return (f"{requests}, blocks of {plan.block_size} positions, a pool of {plan.num_blocks}: press Space "
                "to prefill the first request")
    kind = f"prefill of {request_name(record.rows[0])}" if record.prefill else \
        f"decode step of {plural(len(record.rows), 'request')} in one pass"
    saved = plan.blocks_unshared - record.blocks_used
    done = " \u2014 done" if record.final else ""
    reused = f", {plural(record.reused_positions, 'prompt position')} found cached" if record.prefill else ""
    return (f"Pass {record.step + 1} of {plan.passes}: {kind}{reused}{done}. {record.blocks_used} blocks in use, "
            f"{record.blocks_shared} shared, {len(record.free_blocks)} free; {record.copies} copied on write"
            + (f"; at the end {plan.blocks_unshared} without sharing ({saved} fewer)" if record.final else ""))
