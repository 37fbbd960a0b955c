"""The one path from a request to a run (kvviz.engine.run): what each kind of request runs, counted by hand."""

from __future__ import annotations

import pytest
from helpers_checkpoints import tiny_kvviz_model

from kvviz.core.records import RunRequest
from kvviz.engine.engine import Engine, GenerationError
from kvviz.engine.run import start_run

PROMPT_IDS = [464, 3290, 17]  # P = 3


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine(tiny_kvviz_model(n_layer=2, n_head=2, n_embd=32, n_ctx=64, seed=1, std=0.3))


def test_a_cached_run_has_one_token_step_per_token_and_the_filling_pass_in_the_last(engine):
    run = start_run(engine, RunRequest(0, "", True, 12), prompt_ids=PROMPT_IDS)
    steps = list(run.token_steps())
    assert [len(passes) for passes in steps] == [1] * 11 + [2]
    assert [passes[0].new_tokens for passes in steps] == list(range(1, 13))
    last = steps[-1][-1]
    assert last.token_id is None and last.final
    assert (last.with_cache_total, last.without_cache_total) == (15, 102)  # the lab's hand count for P=3, N=12


def test_an_uncached_run_feeds_every_position_again(engine):
    run = start_run(engine, RunRequest(0, "", False, 12), prompt_ids=PROMPT_IDS)
    steps = list(run.token_steps())
    assert [len(passes) for passes in steps] == [1] * 12
    assert [passes[0].fed_start for passes in steps] == [0] * 12
    assert steps[-1][-1].kv_computed_total == 102


def test_compare_runs_both_modes_and_breaks_only_the_cached_one(engine):
    request = RunRequest(7, "", False, 5, compare=True, break_cache=True)
    run = start_run(engine, request, model_name="tiny", prompt_ids=PROMPT_IDS)
    assert (run.plan.use_cache, run.plan.cache_fault, run.plan.run_id, run.plan.model_name) == (False, "", 7, "tiny")
    assert (run.plan.twin.use_cache, run.plan.twin.cache_fault) == (True, "late_write")
    steps = list(run.token_steps())
    assert len(steps) == 5
    cached, uncached = steps[-1][0].lockstep_passes()
    assert [r.token_id is None for r in cached] == [False, True]  # the token pass and the filling pass
    assert [r.fed_start for r in uncached] == [0]


def test_a_seedless_sampled_compare_run_gets_one_seed_for_both_runs(engine):
    run = start_run(engine, RunRequest(0, "", True, 4, temperature=1.0, compare=True), prompt_ids=PROMPT_IDS)
    assert run.sampling.seed is not None
    tokens = [(r.token_id, r.twin_token_id) for r in run.passes() if r.token_id is not None]
    assert all(own == twin for own, twin in tokens) and len(tokens) == 4


def test_a_bad_request_fails_before_any_pass(engine):
    with pytest.raises(GenerationError, match="positive"):
        start_run(engine, RunRequest(0, "Time flies", True, 0))
    with pytest.raises(GenerationError, match="vocabulary"):
        start_run(engine, RunRequest(0, "", True, 3), prompt_ids=[10**6])
