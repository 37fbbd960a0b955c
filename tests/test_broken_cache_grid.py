"""Break the cache, as the grid shows it: the engine records the cache slots each pass wrote, and the grid's
cells (Qt-free GridState) put the amber cell where the broken cache wrote it, one slot late, with the fed
token's own slot, read but never written, marked stale."""

from __future__ import annotations

import pytest
from helpers_checkpoints import HELLO_IDS, plan_ids, tiny_kvviz_model

from kvviz.app.views.grid.cell_states import COMPUTED, EMPTY, PENDING, REUSED, STALE
from kvviz.app.views.grid.grid_state import GridState
from kvviz.engine.engine import Engine

P, N = len(HELLO_IDS), 4  # 4 prompt tokens, 4 new ones: 5 cached passes, 8 positions


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine(tiny_kvviz_model(n_layer=2, n_head=2, n_embd=32, n_ctx=64, seed=1))


def _run(engine: Engine, use_cache: bool = True, fault: str = ""):
    plan = plan_ids(engine, HELLO_IDS, N, use_cache, cache_fault=fault)
    return plan, list(engine.run(plan))


def test_records_say_which_slots_each_pass_wrote(engine):
    _plan, exact = _run(engine)
    assert [r.kv_written for r in exact] == [(0, 4), (4, 5), (5, 6), (6, 7), (7, 8)]  # the fed positions
    _plan, broken = _run(engine, fault="late_write")
    assert [(r.fed_start, r.fed_stop) for r in broken] == [(0, 4), (4, 5), (5, 6), (6, 7), (7, 8)]
    # the prefill writes where it should; each decode pass one slot later; the last one past the end: nowhere
    assert [r.kv_written for r in broken] == [(0, 4), (5, 6), (6, 7), (7, 8), (8, 8)]
    _plan, uncached = _run(engine, use_cache=False)
    assert {r.kv_written for r in uncached} == {None}


def test_the_broken_grid_shows_the_slot_written_one_position_late(engine):
    plan, records = _run(engine, fault="late_write")
    cells = GridState(plan)
    cells.apply(records[0])  # the prefill: as in an exact run
    assert (cells.states[:, :4] == COMPUTED).all() and (cells.states[:, 4] == PENDING).all()
    cells.apply(records[1])  # feeds position 4 and writes its K/V into slot 5
    assert (cells.states[:, :4] == REUSED).all()
    assert (cells.states[:, 4] == STALE).all()  # the query's own slot: read, never written
    assert (cells.states[:, 5] == COMPUTED).all()  # the amber cell, one column right
    assert (cells.states[:, 6:] == EMPTY).all()
    assert (cells.holds[:, 5] == 4).all() and (cells.holds[:, 4] == -1).all()
    assert "written one slot late" in cells.cell_info(0, 4) and "never written" in cells.cell_info(0, 4)
    assert "holds position 4's K/V" in cells.cell_info(1, 5)
    for record in records[2:]:
        cells.apply(record)
    assert (cells.states[:, 7] == STALE).all() and (cells.states[:, :7] == REUSED).all()  # written off the end


def test_an_exact_grid_has_no_stale_slot(engine):
    plan, records = _run(engine)
    cells = GridState(plan)
    cells.apply(records[0])
    cells.apply(records[1])
    assert (cells.states[:, :4] == REUSED).all() and (cells.states[:, 4] == COMPUTED).all()
    assert (cells.states[:, 5] == PENDING).all() and not (cells.states == STALE).any()
    assert "slot late" not in cells.cell_info(0, 4)
