"""The thread count of a one-token step, chosen by timing (kvviz.engine.threads): on a busy machine, where one
thread runs a step faster than two spinning at barriers, the run goes to one thread; on a quiet one it stays; the
process's count is back after every step; and a run through the engine leaves it as it found it."""

from __future__ import annotations

import pytest
import torch

from kvviz.engine.threads import ThreadChooser


@pytest.fixture(autouse=True)
def two_threads():
    """Two threads to choose from (the suite's processes run on one each: tests/conftest.py), put back after."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def _run(chooser: ThreadChooser, seconds: dict[int, float], steps: int = 40) -> list[int]:
    start, seen = torch.get_num_threads(), []
    for _ in range(steps):
        taken = chooser.threads()
        assert torch.get_num_threads() == taken
        seen.append(taken)
        chooser.restore()
        assert torch.get_num_threads() == start
        chooser.took(seconds[1 if taken == 1 else start])
    return seen


def test_a_busy_machine_moves_the_steps_to_one_thread_and_keeps_probing():
    many = 2
    seen = _run(ThreadChooser(), {1: 0.010, many: 0.030})  # one thread three times as fast
    # 2 warm-up steps and 2 on the starting count, a probe of 2 steps on one thread, then one thread, with a probe
    # of the starting count every 32 steps (steps 36 and 37), which loses
    assert seen == [many] * 4 + [1] * 32 + [many] * 2 + [1] * 2


def test_a_quiet_machine_keeps_every_thread_but_for_the_probes():
    many = 2
    seen = _run(ThreadChooser(), {1: 0.030, many: 0.020})
    assert seen == [many] * 4 + [1] * 2 + [many] * 30 + [1] * 2 + [many] * 2


def test_a_margin_too_small_to_trust_changes_nothing():
    many = 2
    seen = _run(ThreadChooser(), {1: 0.019, many: 0.020})  # 5% faster: within the noise
    assert seen.count(1) == 4


def test_a_run_that_moved_to_one_thread_leaves_the_processs_count_as_it_found_it(monkeypatch):
    from helpers_checkpoints import tiny_kvviz_model

    from kvviz.engine import threads
    from kvviz.engine.engine import Engine, generate_ids

    monkeypatch.setattr(threads, "SWITCH_MARGIN", 100.0)  # every probe wins: the run moves to one thread
    counts = []
    real = torch.set_num_threads
    monkeypatch.setattr(torch, "set_num_threads", lambda n: (counts.append(n), real(n)))
    before = torch.get_num_threads()
    assert len(generate_ids(Engine(tiny_kvviz_model()), [1, 2, 3], 12, True)[0]) == 12
    assert 1 in counts, "some steps ran on one thread"
    assert torch.get_num_threads() == before
