"""The speed figures: a ratio only beyond the noise (the median of paired step ratios and a sign-test interval),
and the sweep of ms per token step against the length (`kvviz bench --sweep`): what it times, its progress,
its cancellation and its one-line errors."""

from __future__ import annotations

import json

import pytest
from helpers_checkpoints import save_kvviz_folder

from kvviz.cli.commands import main
from kvviz.core.ratios import RatioEstimate, paired_ratio
from kvviz.measure.speed import SweepCancelled
from kvviz.measure.speed_sweep import sweep_lengths


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return str(save_kvviz_folder(tmp_path_factory.mktemp("speed") / "tiny", n_layer=2, n_head=2, n_embd=32,
                                 n_ctx=40, seed=3))


def test_the_interval_is_the_sign_tests_order_statistics():
    # Binomial(n, 1/2): P(X <= 0) = 1/64 <= 0.025 for n = 6, so [x(1), x(6)]; 1/32 > 0.025 for n = 5: none.
    # For n = 9, P(X <= 1) = 10/512 <= 0.025 < P(X <= 2) = 46/512, so [x(2), x(8)].
    six = paired_ratio([1.0] * 6, [2.0, 3.0, 1.5, 4.0, 2.5, 5.0])
    assert (six.median, six.low, six.high, six.steps) == (2.75, 1.5, 5.0, 6)
    five = paired_ratio([1.0] * 5, [2.0, 3.0, 1.5, 4.0, 2.5])
    assert (five.median, five.low, five.high) == (2.5, None, None)
    nine = paired_ratio([1.0] * 9, [float(v) for v in range(1, 10)])
    assert (nine.median, nine.low, nine.high) == (5.0, 2.0, 8.0)


def test_a_ratio_is_said_only_beyond_the_noise():
    assert RatioEstimate(1.94, 1.5, 2.5, 12).sentence() == "without the cache this run took 1.9\u00d7 as long"
    assert RatioEstimate(0.5, 0.4, 0.8, 12).sentence() == "with the cache this run took 2.0\u00d7 as long"
    # 0.52 as a median whose interval holds 1 (a slow first step): no ratio, words
    assert RatioEstimate(0.52, 0.3, 1.4, 12).sentence() == "too close to tell apart at this length"
    assert RatioEstimate(1.05, 1.01, 1.09, 40).sentence() == "too close to tell apart at this length"
    assert RatioEstimate(2.0, None, None, 4).sentence() == "too few steps to tell the two apart (4 so far)"


def test_eleven_turns_give_an_interval_past_one_outlier_on_each_side():
    # P(Binomial(11, 1/2) <= 1) = 12/2048 <= 0.025 < P(X <= 2) = 67/2048: the interval is [x(2), x(10)]
    ratios = [0.5, 4.0, 4.1, 4.2, 4.3, 4.4, 4.5, 4.6, 4.7, 4.8, 30.0]  # one pair disturbed each way
    estimate = paired_ratio([1.0] * 11, ratios)
    assert (estimate.low, estimate.high) == (4.0, 4.8) and estimate.clear


def test_one_slow_step_does_not_swing_the_ratio():
    cached = [0.010] * 12
    uncached = [0.020] * 12
    cached[0] = 0.400  # a first step that paid a one-time cost
    estimate = paired_ratio(cached, uncached)
    assert estimate.median == pytest.approx(2.0) and estimate.clear
    assert sum(uncached) / sum(cached) < 1.0, "the totals would say the cache made things slower"


def test_sweep_lengths_are_evenly_spaced_up_to_the_longest():
    assert sweep_lengths(256) == (32, 64, 96, 128, 160, 192, 224, 256)
    assert sweep_lengths(16) == (2, 4, 6, 8, 10, 12, 14, 16)
    assert sweep_lengths(3) == (2, 3)


def test_the_sweep_times_one_new_position_cached_and_every_position_uncached(tiny):
    """The timed passes are the ones the lesson compares: at length L, a cached step feeds one position and
    reads L - 1 from the cache; an uncached step feeds all L."""
    from kvviz.engine.engine import Engine
    from kvviz.measure.speed_sweep import run_sweep
    from kvviz.sources.weights import load_model

    engine = Engine(load_model(tiny).model)
    engine.warm_up()
    seen = []
    real_run = engine.run

    def spying_run(plan, *args, **kwargs):
        for record in real_run(plan, *args, **kwargs):
            seen.append(record)
            yield record

    engine.run = spying_run
    progress = []
    result = run_sweep(engine, 16, repeat=1, points=4, progress=lambda done, total: progress.append((done, total)))
    assert result.lengths == (4, 8, 12, 16)
    assert progress == [(i, 8) for i in range(1, 9)]
    cached_steps = [r for r in seen if r.use_cache and r.fed_stop - r.fed_start == 1]
    uncached = [r for r in seen if not r.use_cache]
    assert sorted((r.fed_start, r.kv_reused[0], r.fed_stop) for r in cached_steps) == \
        [(3, 3, 4), (7, 7, 8), (11, 11, 12), (15, 15, 16)]
    assert sorted((r.fed_start, r.fed_stop) for r in uncached) == [(0, 4), (0, 8), (0, 12), (0, 16)]
    assert len(result.cached_ms) == len(result.uncached_ms) == 4
    assert all(ms > 0 for ms in (*result.cached_ms, *result.uncached_ms))


def test_a_cancelled_sweep_stops_at_once(tiny):
    from kvviz.engine.engine import Engine
    from kvviz.measure.speed_sweep import run_sweep
    from kvviz.sources.weights import load_model

    done = []
    with pytest.raises(SweepCancelled):
        run_sweep(Engine(load_model(tiny).model), 16, repeat=3, progress=lambda d, t: done.append(d),
                  cancelled=lambda: len(done) >= 3)
    assert len(done) == 3


def test_bench_sweep_prints_the_medians_per_length_as_json(tiny, capsys):
    assert main(["bench", "--sweep", "--model", tiny, "--max-length", "16", "--repeat", "3", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["lengths"] == [2, 4, 6, 8, 10, 12, 14, 16]
    assert len(result["cached_ms"]) == len(result["uncached_ms"]) == 8
    for medians, turns in ((result["cached_ms"], result["cached_turns_ms"]),
                           (result["uncached_ms"], result["uncached_turns_ms"])):
        assert [len(t) for t in turns] == [3] * 8
        assert medians == [sorted(t)[1] for t in turns], "the median of the three turns"
    assert result["repeat"] == 3 and "weights" in result["why"]


@pytest.mark.parametrize("args, message", [
    (["--max-length", "16"], "kvviz: --max-length is the longest length of a speed sweep: add --sweep"),
    (["--sweep", "--gui"], "kvviz: --gui does not apply to --sweep"),
    (["--sweep", "--max-length", "40"], "kvviz: --max-length 40 is more than the model's context allows (39)"),
])
def test_bench_sweep_refuses_what_cannot_apply_in_one_line(tiny, capsys, args, message):
    assert main(["bench", "--model", tiny, *args]) == 2
    assert capsys.readouterr().err.strip() == message
