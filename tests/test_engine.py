"""The engine: cached == uncached, measured counts == the formula, frozen records, the context limit."""

from __future__ import annotations

import gc

import pytest
import torch
from helpers_checkpoints import EOT_ID, HELLO_IDS, embedded_or_tiny_folder, tiny_kvviz_model

from kvviz.cache.kv_cache import full_cache
from kvviz.core.counting import WorkCount, kv_with_cache, kv_without_cache
from kvviz.core.tokenizer import get_tokenizer
from kvviz.engine.engine import Engine, GenerationError, SamplingSettings, StepRecord, generate_ids
from kvviz.sources.weights import load_model

PROMPT = [15496, 11, 314, 716, 257, 3797, 286, 262, 1110, 13]  # "Hello, I am a student of the day."


def _ids(engine: Engine, prompt: list[int], n: int, use_cache: bool, sampling: SamplingSettings | None = None):
    ids, records = generate_ids(engine, prompt, n, use_cache=use_cache, sampling=sampling)
    return torch.tensor(ids, dtype=torch.long), records


def test_logits_that_are_not_finite_end_the_run_in_one_line():
    model = tiny_kvviz_model()
    with torch.no_grad():
        model.transformer.h[1].mlp.c_proj.weight[0, 0] = float("nan")
    engine = Engine(model)
    for sampling in (SamplingSettings(), SamplingSettings(temperature=1.0)):
        with pytest.raises(GenerationError, match="logits hold NaN or infinite values in float32"):
            generate_ids(engine, PROMPT, 3, use_cache=True, sampling=sampling)


# ----- cached == uncached -----


def test_200_tokens_cached_equal_uncached_greedy_and_sampled():
    """The book's benchmark length, "Hello, I am" and 200 tokens, greedy and seeded sampling, on a model
    small enough for the uncached run's 20,700 K/V rows per layer to take a second, not a minute."""
    engine = Engine(tiny_kvviz_model(n_layer=2, n_head=4, n_embd=64, n_ctx=256, seed=3, std=0.3))
    runs = {}
    for sampling in (SamplingSettings(), SamplingSettings(temperature=1.0, top_k=40, seed=123)):
        cached, cached_records = _ids(engine, HELLO_IDS, 200, True, sampling)
        uncached, uncached_records = _ids(engine, HELLO_IDS, 200, False, sampling)
        assert cached.shape == (200,)
        assert torch.equal(cached, uncached), sampling
        assert cached_records[-1].kv_computed_total == 204  # 4 prompt tokens + 200 new ones
        assert uncached_records[-1].kv_computed_total == 20_700  # 4 + 5 + ... + 203
        assert cached_records[-1].stop_reason == uncached_records[-1].stop_reason == "max_new_tokens"
        runs[sampling.greedy] = cached
    assert len(set(runs[True].tolist())) > 10, "weights this flat would not test much"
    assert len(set(runs[False].tolist())) > 10 and not torch.equal(runs[True], runs[False])


def test_random_gpt2_cached_equals_uncached():
    """The book's benchmark setup itself: untrained GPT-2 124M from a fixed seed, "Hello, I am"
    (fewer tokens than 200: without the cache, GPT-2 124M is the slow part of the suite)."""
    engine = Engine(load_model("random:gpt2").model)
    greedy, _ = _ids(engine, HELLO_IDS, 24, use_cache=True)
    assert torch.equal(greedy, _ids(engine, HELLO_IDS, 24, use_cache=False)[0])
    sampling = SamplingSettings(temperature=1.0, top_k=40, seed=123)
    sampled, _ = _ids(engine, HELLO_IDS, 16, True, sampling)
    assert torch.equal(sampled, _ids(engine, HELLO_IDS, 16, False, sampling)[0])
    assert len(set(sampled.tolist())) > 10, "sampling should wander off the greedy loop"


def test_embedded_model_cached_equals_uncached(tmp_path):
    """The trained default model (or its tiny stand-in before training), greedy and sampled."""
    engine = Engine(load_model(str(embedded_or_tiny_folder(tmp_path))).model)
    prompt = engine.encode_prompt("ROMEO:\nBut soft, what light")
    for sampling in (SamplingSettings(), SamplingSettings(temperature=0.9, top_k=50, seed=5)):
        cached, _ = _ids(engine, prompt, 100, True, sampling)
        uncached, _ = _ids(engine, prompt, 100, False, sampling)
        assert torch.equal(cached, uncached), sampling


TINY_SHAPES = [  # (n_layer, n_head, n_embd, n_ctx)
    (1, 1, 16, 64),
    (2, 2, 32, 64),
    (3, 4, 64, 128),
    (4, 8, 64, 96),
]
SAMPLINGS = [
    SamplingSettings(),
    SamplingSettings(temperature=0.8, top_k=20, seed=7),
    SamplingSettings(temperature=1.3, seed=11),
    SamplingSettings(temperature=0.5, top_k=3, seed=0),
]


@pytest.mark.parametrize("shape", TINY_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_tiny_models_cached_equals_uncached(shape):
    n_layer, n_head, n_embd, n_ctx = shape
    engine = Engine(tiny_kvviz_model(n_layer, n_head, n_embd, n_ctx, seed=n_layer, std=0.3))
    greedy = None
    for sampling in SAMPLINGS:
        cached, _ = _ids(engine, PROMPT, 40, True, sampling)
        uncached, _ = _ids(engine, PROMPT, 40, False, sampling)
        assert torch.equal(cached, uncached), sampling
        if sampling.greedy:
            greedy = cached
            assert len(set(greedy.tolist())) > 3, "weights this flat would not test much"
        else:
            again, _ = _ids(engine, PROMPT, 40, True, sampling)
            assert torch.equal(cached, again), "the same seed gives the same tokens"
            assert not torch.equal(cached, greedy), "sampling at this temperature should leave the greedy path"


def test_different_seeds_give_different_samples():
    engine = Engine(tiny_kvviz_model(2, 2, 32, 64, std=0.3))
    runs = {tuple(_ids(engine, PROMPT, 30, True, SamplingSettings(temperature=1.0, seed=s))[0].tolist())
            for s in range(4)}
    assert len(runs) == 4


def test_top_k_one_is_greedy():
    engine = Engine(tiny_kvviz_model(2, 2, 32, 64, std=0.3))
    greedy, _ = _ids(engine, PROMPT, 30, True)
    top1, _ = _ids(engine, PROMPT, 30, True, SamplingSettings(temperature=2.0, top_k=1, seed=3))
    assert torch.equal(greedy, top1)


def test_top_k_restricts_the_choice():
    engine = Engine(tiny_kvviz_model(2, 2, 32, 64, std=0.3))
    sampling = SamplingSettings(temperature=5.0, top_k=2, seed=1)
    records = list(engine.generate(PROMPT, 25, use_cache=True, sampling=sampling, top_candidates=5))
    for record in records[:-1]:
        assert record.token_id in {c.token_id for c in record.candidates[:2]}
        assert all(c.probability == 0.0 for c in record.candidates[2:])


def test_unseeded_sampling_leaves_the_global_generator_alone():
    engine = Engine(tiny_kvviz_model(2, 2, 32, 64, std=0.3))
    torch.manual_seed(1234)
    state = torch.get_rng_state()
    _ids(engine, PROMPT, 5, True, SamplingSettings(temperature=1.0))
    assert torch.equal(torch.get_rng_state(), state)


# ----- measured counts -----

COUNT_CASES = [(3, 12), (1, 1), (5, 1), (1, 7), (10, 30), (7, 20), (32, 16)]


@pytest.mark.parametrize("P,N", COUNT_CASES)
def test_measured_counts_equal_the_formula(P, N):
    n_layer = 3
    model = tiny_kvviz_model(n_layer, 2, 32, 64, std=0.3)
    engine = Engine(model)
    prompt = (PROMPT * 4)[:P]

    cached = list(engine.generate(prompt, N, use_cache=True))
    uncached = list(engine.generate(prompt, N, use_cache=False))

    # Cached: a prefill pass, N - 1 one-token passes, and the pass that stores the last token.
    assert len(cached) == N + 1
    assert [r.fed_stop - r.fed_start for r in cached] == [P] + [1] * N
    assert sum(r.kv_computed[0] for r in cached) == P + N
    for layer in range(n_layer):
        assert sum(r.kv_computed[layer] for r in cached) == kv_with_cache(P, N)
    # Uncached: N passes over lengths P .. P+N-1.
    assert len(uncached) == N
    assert [r.fed_stop - r.fed_start for r in uncached] == list(range(P, P + N))
    for layer in range(n_layer):
        assert sum(r.kv_computed[layer] for r in uncached) == kv_without_cache(P, N)

    work = WorkCount(P, N, n_layer)
    for final in (cached[-1], uncached[-1]):
        assert final.final and final.new_tokens == N and final.sequence_length == P + N
        assert final.with_cache_total == work.with_cache
        assert final.without_cache_total == work.without_cache
        assert final.avoided_total == work.avoided
    assert cached[-1].kv_computed_total == work.with_cache
    assert uncached[-1].kv_computed_total == work.without_cache
    assert cached[-1].kv_reused_total == sum(range(P, P + N))
    assert uncached[-1].kv_reused_total == 0


def test_running_totals_record_by_record():
    """P=3, N=4, counted by hand. Cached: passes feed 3, 1, 1, 1, 1 positions; an uncached run would have fed
    3, 4, 5, 6 for the four passes that chose a token. Uncached: passes feed 3, 4, 5, 6; a cached run would
    have computed one row per token so far, but the newest, and all 7 once finished."""
    engine = Engine(tiny_kvviz_model(2, 2, 32, 64, std=0.3))
    cached = list(engine.generate(HELLO_IDS[:3], 4, use_cache=True))
    uncached = list(engine.generate(HELLO_IDS[:3], 4, use_cache=False))
    assert [r.kv_computed_total for r in cached] == [3, 4, 5, 6, 7]
    assert [r.kv_reused_total for r in cached] == [0, 3, 7, 12, 18]
    assert [r.with_cache_total for r in cached] == [3, 4, 5, 6, 7]
    assert [r.without_cache_total for r in cached] == [3, 7, 12, 18, 18]
    assert [r.kv_computed_total for r in uncached] == [3, 7, 12, 18]
    assert [r.without_cache_total for r in uncached] == [3, 7, 12, 18]
    assert [r.with_cache_total for r in uncached] == [3, 4, 5, 7]
    assert [r.avoided_total for r in (cached[-1], uncached[-1])] == [11, 11]


def test_the_lesson_numbers():
    """P=3, N=12: 15 K/V computations per layer with the cache, 102 without, 87 avoided, 6.8x."""
    engine = Engine(tiny_kvviz_model(2, 2, 32, 64))
    prompt = HELLO_IDS[:3]
    cached = list(engine.generate(prompt, 12, use_cache=True))[-1]
    uncached = list(engine.generate(prompt, 12, use_cache=False))[-1]
    assert cached.kv_computed_total == 15
    assert uncached.kv_computed_total == 102
    assert uncached.kv_computed_total - cached.kv_computed_total == 87 == cached.avoided_total
    assert uncached.kv_computed_total / cached.kv_computed_total == pytest.approx(6.8)
    assert kv_with_cache(3, 12) == 15 and kv_without_cache(3, 12) == 102


# ----- records -----


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine(tiny_kvviz_model(3, 2, 32, 64, std=0.3))


def test_records_hold_only_immutable_values(engine):
    record = next(iter(engine.generate(PROMPT, 3)))
    assert isinstance(record, StepRecord)
    for name in ("fed_token_ids", "kv_computed", "kv_reused", "candidates"):
        assert isinstance(getattr(record, name), tuple), name
    hash(record)  # frozen records are hashable: nothing mutable inside


def test_record_fields_follow_the_run(engine):
    tok = get_tokenizer()
    records = list(engine.generate(PROMPT, 6, use_cache=True, top_candidates=4))
    P = len(PROMPT)
    assert [r.step for r in records] == list(range(7))
    assert [r.final for r in records] == [False] * 6 + [True]
    assert [r.stop_reason for r in records] == [""] * 6 + ["max_new_tokens"]
    generated = [r.token_id for r in records[:-1]]
    assert records[-1].token_id is None and records[-1].candidates == () and records[-1].token_text == ""
    assert records[0].fed_token_ids == tuple(PROMPT)
    for i, record in enumerate(records):
        assert record.use_cache and record.prompt_tokens == P and record.n_layer == 3
        assert record.seconds > 0
        if i > 0:
            assert record.fed_token_ids == (generated[i - 1],)
            assert (record.fed_start, record.fed_stop) == (P + i - 1, P + i)
        if record.token_id is not None:
            assert record.token_text == tok.token_label(record.token_id)
            assert len(record.candidates) == 4
            probabilities = [c.probability for c in record.candidates]
            assert probabilities == sorted(probabilities, reverse=True)
            assert 0 < sum(probabilities) <= 1 + 1e-6
            assert record.candidates[0].token_id == record.token_id  # greedy picks the top candidate
            assert all(c.text == tok.token_label(c.token_id) for c in record.candidates)


def test_computed_and_reused_positions(engine):
    P = len(PROMPT)  # 10
    cached = list(engine.generate(PROMPT, 5, use_cache=True))
    assert [r.computed_positions() for r in cached] == [slice(0, 10)] + [slice(p, p + 1) for p in range(10, 15)]
    assert [r.reused_positions() for r in cached] == [slice(0, 0)] + [slice(0, p) for p in range(10, 15)]
    for record in cached:
        computed, reused = record.computed_positions(), record.reused_positions()
        assert (computed.stop - computed.start,) * 3 == record.kv_computed
        assert (reused.stop - reused.start,) * 3 == record.kv_reused
    assert cached[3].computed_positions(P + 5) == slice(12, 13)
    assert cached[3].computed_positions(12) == slice(12, 12)  # past the width: nothing shown
    assert cached[3].reused_positions(2) == slice(0, 2)

    uncached = list(engine.generate(PROMPT, 5, use_cache=False))
    assert [r.computed_positions() for r in uncached] == [slice(0, p) for p in range(10, 15)]
    for record in uncached:
        assert record.reused_positions() == slice(0, 0)
        assert record.kv_reused == (0, 0, 0)
        assert record.cache_bytes == 0


def test_cache_bytes_in_records(engine):
    """3 layers, 2 heads of 16 dimensions, float32: a position's key and value take 2 * 3 * 2 * 16 * 4 = 768
    bytes. The 10-token prompt fills 7,680; each pass after it adds one position."""
    records = list(engine.generate(PROMPT, 5, use_cache=True))
    assert [r.cache_bytes for r in records] == [7_680, 8_448, 9_216, 9_984, 10_752, 11_520]
    assert [r.positions_held for r in records] == [10, 11, 12, 13, 14, 15]


def test_a_run_goes_on_after_an_older_run_is_collected(engine):
    expected = [r.token_id for r in engine.generate(PROMPT, 5)]
    with torch.inference_mode(False):  # as a fresh thread starts, whatever runs earlier tests left suspended
        old = engine.generate(PROMPT, 5)
        next(old)
        new = engine.generate(PROMPT, 5)
        first = next(new)
        assert not torch.is_inference_mode_enabled()  # between records the caller is in its own mode
        del old
        gc.collect()
        assert [first.token_id] + [r.token_id for r in new] == expected


# ----- limits and bad requests -----


def test_context_full_stops_cleanly():
    n_ctx = 16
    engine = Engine(tiny_kvviz_model(2, 2, 32, n_ctx, std=0.3))
    for use_cache in (True, False):
        records = list(engine.generate(HELLO_IDS, 50, use_cache=use_cache))
        final = records[-1]
        assert final.final and final.stop_reason == "context_full"
        assert final.new_tokens == n_ctx - len(HELLO_IDS)
        assert final.sequence_length == n_ctx
        # The cached run feeds the last token too (position n_ctx - 1); the uncached run never feeds it.
        assert max(r.fed_stop for r in records) == (n_ctx if use_cache else n_ctx - 1)
    cached, _ = _ids(engine, HELLO_IDS, 50, True)
    uncached, _ = _ids(engine, HELLO_IDS, 50, False)
    assert torch.equal(cached, uncached) and len(cached) == n_ctx - len(HELLO_IDS)


def test_exactly_filling_the_context_is_not_cut_short():
    engine = Engine(tiny_kvviz_model(2, 2, 32, 16))
    final = list(engine.generate(HELLO_IDS, 12))[-1]
    assert final.stop_reason == "max_new_tokens" and final.sequence_length == 16


def test_prompt_too_long():
    engine = Engine(tiny_kvviz_model(2, 2, 32, 16))
    long_text = "word " * 40
    with pytest.raises(GenerationError, match="16"):
        engine.encode_prompt(long_text)
    with pytest.raises(GenerationError):
        engine.encode_prompt("a" + " b" * 15)  # exactly 16 tokens fills the context: nothing left to generate
    with pytest.raises(GenerationError, match="context"):
        list(engine.generate(list(range(17)), 5))
    with pytest.raises(GenerationError):
        list(engine.generate(list(range(16)), 5))


def test_empty_prompt_starts_from_endoftext(engine):
    assert engine.encode_prompt("") == [EOT_ID]
    records = list(engine.generate(engine.encode_prompt(""), 4))
    assert records[0].fed_token_ids == (EOT_ID,)
    assert records[-1].new_tokens == 4
    with pytest.raises(GenerationError):
        list(engine.generate([], 4))


@pytest.mark.parametrize(("prompt", "new_tokens", "fragment"), [
    (PROMPT, 0, "positive"),
    (list(range(64)), 3, "context"),  # 64 tokens in a 64-position context
    ([15496, 50257], 3, "50257"),
])
def test_a_bad_request_fails_at_the_call_not_at_the_first_record(engine, prompt, new_tokens, fragment):
    with pytest.raises(GenerationError, match=fragment):
        engine.generate(prompt, new_tokens)  # never iterated


@pytest.mark.parametrize("bad", [0, -3])
def test_new_tokens_must_be_positive(engine, bad):
    with pytest.raises(GenerationError, match="positive"):
        list(engine.generate(PROMPT, bad))


def test_bad_sampling_settings():
    with pytest.raises(GenerationError, match="temperature"):
        SamplingSettings(temperature=-0.1)
    with pytest.raises(GenerationError, match="top-k"):
        SamplingSettings(temperature=1.0, top_k=0)


def test_token_outside_the_vocabulary_is_refused():
    engine = Engine(tiny_kvviz_model(2, 2, 32, 64, vocab_size=1000))
    with pytest.raises(GenerationError, match="15496"):
        list(engine.generate([15496, 11], 3))
    with pytest.raises(GenerationError):
        list(engine.generate([-1], 3))


def test_padded_vocabulary_never_yields_unknown_tokens():
    """Checkpoints trained with the vocabulary padded to 50304 (as nanoGPT does) must not emit ids the
    tokenizer cannot show."""
    model = tiny_kvviz_model(2, 2, 32, 64, vocab_size=50304, std=0.3)
    with torch.no_grad():
        model.transformer.wte.weight[50257:] = model.transformer.wte.weight[:47] * 50  # tempting logits
    engine = Engine(model)
    for use_cache in (True, False):
        ids, records = _ids(engine, PROMPT, 20, use_cache, SamplingSettings(temperature=1.0, seed=2))
        assert int(ids.max()) < 50257
        assert all(c.token_id < 50257 for r in records for c in r.candidates)


def test_abandoned_run_does_not_spoil_the_next():
    engine = Engine(tiny_kvviz_model(2, 2, 32, 64, std=0.3))
    first, _ = _ids(engine, PROMPT, 10, True)
    run = engine.generate(PROMPT, 10)
    next(run)
    next(run)
    run.close()  # the GUI cancels between steps
    again, _ = _ids(engine, PROMPT, 10, True)
    assert torch.equal(first, again)


@pytest.mark.parametrize("use_cache", [True, False])
def test_before_block_stops_a_pass_midway(use_cache):
    """An abort flag set during the fourth pass (a decode step with the cache, a full pass without), at its
    layer 2, stops that pass there: layers 0 and 1 ran, layers 2 and 3 never do."""
    model = tiny_kvviz_model(4, 2, 32, 64, std=0.3)
    engine = Engine(model)
    entered: list[list[int]] = []
    abort = False

    class Stop(Exception):
        pass

    def before_block(layer: int) -> None:
        nonlocal abort
        if layer == 0:
            entered.append([])
        entered[-1].append(layer)
        if len(entered) == 4 and layer == 2:
            abort = True  # as closing the window does, from another thread
        if abort:
            raise Stop()

    engine.before_block = before_block
    run = engine.generate(PROMPT, 10, use_cache)
    for _ in range(3):
        next(run)
    with pytest.raises(Stop):
        next(run)
    assert entered == [[0, 1, 2, 3]] * 3 + [[0, 1, 2]]
    engine.before_block = None
    again, _ = _ids(engine, PROMPT, 10, use_cache)  # a new run after the interrupted one is whole
    assert torch.equal(again, _ids(Engine(tiny_kvviz_model(4, 2, 32, 64, std=0.3)), PROMPT, 10, use_cache)[0])


# ----- the cache object -----


def test_kv_cache_half_precision_bytes():
    cache = full_cache(2, 2, 4, 8, dtype=torch.float16)
    for layer in range(2):
        cache.update(layer, torch.arange(3), torch.zeros(1, 2, 3, 4, dtype=torch.float16),
                     torch.zeros(1, 2, 3, 4, dtype=torch.float16))
    assert cache.bytes_used == 2 * 2 * 2 * 3 * 4 * 2
    assert cache.bytes_allocated == 2 * 2 * 2 * 8 * 4 * 2


def test_the_cache_reports_the_rows_it_gave_back_without_writing_them():
    cache = full_cache(2, 1, 2, 6)
    for layer in range(2):
        cache.update(layer, torch.arange(0, 3), torch.ones(1, 1, 3, 2), torch.ones(1, 1, 3, 2))  # a 3-token prefill
    assert cache.reused == (0, 0)
    for layer in range(2):
        cache.update(layer, 3, torch.ones(1, 1, 1, 2), torch.ones(1, 1, 1, 2))
    assert cache.reused == (3, 3)  # a decode step at position 3 reads positions 0..2 back
    for layer in range(2):
        cache.update(layer, torch.arange(4, 6), torch.ones(1, 1, 2, 2), torch.ones(1, 1, 2, 2))
    assert cache.reused == (4, 4)
