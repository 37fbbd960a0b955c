"""Compare mode in the core: the cached and the uncached run in lockstep, the logit statistic, the
teaching switch that breaks the cache, and the summary."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from helpers_checkpoints import HELLO_IDS, embedded_or_tiny_folder, lockstep_ids, plan_ids, tiny_kvviz_model

from kvviz.engine.compare import Lockstep, summarize
from kvviz.engine.engine import Engine, SamplingSettings
from kvviz.sources.weights import load_model

SAMPLINGS = [SamplingSettings(), SamplingSettings(temperature=0.9, top_k=50, seed=5)]


def _lockstep(engine, prompt, n, use_cache=True, sampling=None, cache_fault=""):
    plan = lockstep_ids(engine, prompt, n, use_cache, sampling, cache_fault=cache_fault)
    return plan, list(Lockstep(engine, plan, sampling).records())


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine(tiny_kvviz_model(n_layer=2, n_head=4, n_embd=64, n_ctx=128, seed=3, std=0.3))


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["greedy", "seeded"])
def test_embedded_model_100_tokens_identical_in_lockstep(tmp_path, sampling):
    engine = Engine(load_model(str(embedded_or_tiny_folder(tmp_path))).model)
    prompt = engine.encode_prompt("Time flies")
    _, records = _lockstep(engine, prompt, 100, True, sampling)
    summary = summarize(records)
    assert summary.identical and summary.first_divergence is None
    assert 0 <= summary.max_abs_logit_diff < 1e-3
    tokens = [r.token_id for r in records if r.token_id is not None]
    assert tokens == [r.twin_token_id for r in records if r.token_id is not None]
    assert len(tokens) == 100 and len(set(tokens)) > 5


def test_each_run_in_lockstep_chooses_what_it_chooses_alone(engine):
    """Lockstep changes nothing: each run's tokens equal the same run made alone (seeded sampling)."""
    sampling = SamplingSettings(temperature=1.0, top_k=40, seed=123)
    _, records = _lockstep(engine, HELLO_IDS, 30, True, sampling)
    alone = [r.token_id for r in engine.generate(HELLO_IDS, 30, True, sampling) if r.token_id is not None]
    assert [r.token_id for r in records if r.token_id is not None] == alone
    assert [r.twin_token_id for r in records if r.token_id is not None] == alone


def test_unseeded_sampling_draws_one_stream_for_both_runs(engine):
    _, records = _lockstep(engine, HELLO_IDS, 40, True, SamplingSettings(temperature=1.5))
    assert summarize(records).identical


def test_the_logit_statistic_is_the_largest_difference_of_the_two_runs_logits(engine):
    """Checked against logits collected from two separate runs, outside the lockstep."""
    logits = {True: [], False: []}
    for use_cache in (True, False):
        run = engine.run(plan_ids(engine, HELLO_IDS, 6, use_cache),
                         watch_logits=lambda x, u=use_cache: logits[u].append(x.float().clone()))
        list(run)
    expected = [float((a - b).abs().max()) for a, b in zip(logits[True], logits[False], strict=True)]
    _, records = _lockstep(engine, HELLO_IDS, 6)
    found = [r.max_abs_logit_diff for r in records if r.max_abs_logit_diff is not None]
    assert found == pytest.approx(expected, abs=1e-6)
    assert len(found) == 6 and max(found) < 1e-4


@pytest.mark.parametrize("use_cache", [True, False])
def test_records_pair_the_two_runs_step_by_step(engine, use_cache):
    """P = 4, N = 4: the cached run computes 4, 1, 1, 1 (+1 filling) K/V per layer, the uncached 4, 5, 6, 7;
    the order alternates, the primary run's records come in its own order."""
    plan, records = _lockstep(engine, HELLO_IDS, 4, use_cache)
    assert plan.use_cache == use_cache and plan.twin.use_cache == (not use_cache)
    assert [r.use_cache for r in records] == [use_cache] * (5 if use_cache else 4)
    token_records = [r for r in records if r.token_id is not None]
    assert [r.twin_ran_first for r in token_records] == [False, True, False, True]
    steps = [[r] if r.token_id is not None else [] for r in records]
    if use_cache:  # the primary run's filling pass is a record of its own, in the last step
        assert records[-1].token_id is None and records[-1].twin == ()
        steps[-2].append(records[-1])
    cached = [[p.kv_computed[0] for q in step for p in q.lockstep_passes()[0]] for step in steps[:4]]
    uncached = [[p.kv_computed[0] for q in step for p in q.lockstep_passes()[1]] for step in steps[:4]]
    assert cached == [[4], [1], [1], [1, 1]]
    assert uncached == [[4], [5], [6], [7]]
    summary = summarize(records)
    assert (summary.kv_with_cache, summary.kv_without_cache) == (8, 22)
    assert summary.cached_seconds_total > 0 and summary.uncached_seconds_total > 0


@pytest.mark.parametrize("use_cache", [True, False])
def test_a_broken_cache_diverges_and_says_where(engine, use_cache):
    plan, records = _lockstep(engine, HELLO_IDS, 30, use_cache, cache_fault="late_write")
    assert plan.cache_broken and plan.cached_plan.cache_fault == "late_write"
    assert plan.uncached_plan.cache_fault == ""
    summary = summarize(records)
    assert not summary.identical
    token_records = [r for r in records if r.token_id is not None]
    first = next(r for r in token_records if r.token_id != r.twin_token_id)
    assert summary.first_divergence == first.new_tokens >= 2  # the prefill is right; the first decode is not
    assert token_records[0].max_abs_logit_diff < 1e-4
    assert summary.max_abs_logit_diff > 1e-2


def test_a_step_whose_logits_could_not_be_compared_keeps_the_summary_at_nan(engine):
    """NaN says a step's logits could not be compared; a later step that could does not undo it."""
    _, records = _lockstep(engine, HELLO_IDS, 3)
    token_passes = [i for i, r in enumerate(records) if r.max_abs_logit_diff is not None]
    records[token_passes[0]] = replace(records[token_passes[0]], max_abs_logit_diff=float("nan"))
    records[token_passes[1]] = replace(records[token_passes[1]], max_abs_logit_diff=0.5)
    assert math.isnan(summarize(records).max_abs_logit_diff)


def test_a_plan_without_a_twin_cannot_run_in_lockstep(engine):
    with pytest.raises(ValueError, match="twin"):
        Lockstep(engine, plan_ids(engine, HELLO_IDS, 3))
