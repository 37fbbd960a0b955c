"""Attention weights on request: each pass's newest query, checked against transformers' `output_attentions`,
and recording them changes no logit, no token, and no plan figure but the ones it adds."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from helpers_checkpoints import (
    HELLO_IDS,
    gpt2_config,
    lockstep_ids,
    plan_ids,
    save_kvviz_folder,
    save_transformers_folder,
    tiny_kvviz_model,
)

from kvviz.cache.kv_cache import full_cache
from kvviz.cache.probe import PassProbe
from kvviz.cli.commands import main
from kvviz.engine.compare import Lockstep
from kvviz.engine.engine import Engine, SamplingSettings
from kvviz.models import gpt2_fast
from kvviz.sources.weights import load_model

TOLERANCE = 1e-5
NEW_TOKENS = 6
PROMPT_IDS = HELLO_IDS + [257, 1310, 290, 314, 588]  # nine tokens, so attention spreads over many positions

CONFIGS = {
    "2x2x32": dict(n_layer=2, n_head=2, n_embd=32),
    "3x4x64": dict(n_layer=3, n_head=4, n_embd=64),
    "2x4x48-small-vocab": dict(n_layer=2, n_head=4, n_embd=48, vocab_size=1000),
}


def _weights(record) -> torch.Tensor:
    """A record's AttentionWeights as a (layers, heads, positions) tensor, read through its own accessor."""
    return torch.tensor(record.attention.as_lists(), dtype=torch.float64)


def _transformers_last_rows(hf_model, ids: list[int]) -> torch.Tensor:
    """transformers' attention weights of the last query of `ids`, (layers, heads, len(ids))."""
    with torch.no_grad():
        out = hf_model(torch.tensor([ids]), output_attentions=True)
    return torch.stack([layer[0, :, -1, :] for layer in out.attentions]).double()


def _run(engine: Engine, prompt_ids: list[int], n: int, use_cache: bool, attention: bool,
         sampling: SamplingSettings | None = None) -> tuple[list, list[torch.Tensor]]:
    """Every record of a run and the logits (V,) of its token passes."""
    logits: list[torch.Tensor] = []
    plan = plan_ids(engine, prompt_ids, n, use_cache, sampling, attention=attention)
    records = list(engine.run(plan, sampling, watch_logits=lambda x: logits.append(x.clone())))
    return records, logits


@pytest.mark.parametrize("use_cache", [True, False], ids=["cached", "uncached"])
@pytest.mark.parametrize("shape", list(CONFIGS), ids=list(CONFIGS))
def test_recorded_attention_equals_transformers_last_query_row(tmp_path, shape, use_cache):
    """Every pass's weights equal transformers' last query row over the sequence so far (eager attention)."""
    config = gpt2_config(**CONFIGS[shape])
    hf_model = save_transformers_folder(tmp_path / "ckpt", config, seed=11)
    hf_model.set_attn_implementation("eager")
    engine = Engine(load_model(str(tmp_path / "ckpt")).model)
    prompt = [i % config.vocab_size for i in PROMPT_IDS]
    records, _ = _run(engine, prompt, NEW_TOKENS, use_cache, attention=True)
    tokens = prompt + [r.token_id for r in records if r.token_id is not None]
    assert len(records) == NEW_TOKENS + (1 if use_cache else 0)  # the cached run's filling pass records too
    for record in records:
        weights = record.attention
        assert (weights.layers, weights.heads, weights.positions) == (config.n_layer, config.n_head, record.fed_stop)
        expected = _transformers_last_rows(hf_model, tokens[: record.fed_stop])
        got = _weights(record)
        assert got.shape == expected.shape
        diff = (got - expected).abs().max().item()
        assert diff <= TOLERANCE, f"pass {record.step}: max abs weight difference {diff:.3g}"
        spread = (expected - 1 / record.fed_stop).abs().max().item()
        assert spread > 1000 * TOLERANCE, "weights this close to uniform would hide a mismatch"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("use_cache", [True, False], ids=["cached", "uncached"])
def test_every_row_is_a_distribution_over_the_positions_so_far(use_cache, dtype):
    model = tiny_kvviz_model(n_layer=3, n_head=4, n_embd=64, std=0.3).to(dtype)
    records, _ = _run(Engine(model), PROMPT_IDS, 8, use_cache, attention=True)
    assert [r.attention.positions for r in records] == [r.fed_stop for r in records]
    assert [r.attention.positions for r in records][:3] == [9, 10, 11]  # the prompt's nine, then one more a pass
    for record in records:
        for layer in record.attention.as_lists():
            assert len(layer) == 4
            for row in layer:
                assert len(row) == record.fed_stop
                assert math.fsum(row) == pytest.approx(1.0, abs=TOLERANCE)
                assert all(w > 0 for w in row)  # every position so far is attended to, none past it exists


def test_records_carry_no_attention_unless_asked():
    engine = Engine(tiny_kvviz_model())
    for use_cache in (True, False):
        records, _ = _run(engine, HELLO_IDS, 3, use_cache, attention=False)
        assert all(r.attention is None for r in records)


@pytest.mark.parametrize("sampling", [None, SamplingSettings(temperature=0.9, top_k=50, seed=4)],
                         ids=["greedy", "sampled"])
@pytest.mark.parametrize("use_cache", [True, False], ids=["cached", "uncached"])
def test_recording_changes_no_logit_and_no_token(use_cache, sampling):
    engine = Engine(tiny_kvviz_model(n_layer=3, n_head=4, n_embd=64, std=0.3))
    plain, plain_logits = _run(engine, PROMPT_IDS, 10, use_cache, attention=False, sampling=sampling)
    recorded, recorded_logits = _run(engine, PROMPT_IDS, 10, use_cache, attention=True, sampling=sampling)
    assert [r.token_id for r in recorded] == [r.token_id for r in plain]
    assert len(recorded_logits) == len(plain_logits) == 10
    for got, expected in zip(recorded_logits, plain_logits, strict=True):
        assert torch.equal(got, expected)


def test_decode_one_and_forward_logits_are_bit_equal_with_recording_on_and_off():
    model = tiny_kvviz_model(n_layer=3, n_head=4, n_embd=64, std=0.3)
    cfg = model.config
    caches = [full_cache(cfg.n_layer, cfg.n_head, cfg.head_dim, len(PROMPT_IDS)) for _ in range(2)]
    prefill = 4
    with torch.inference_mode():
        for cache, record in zip(caches, (False, True), strict=True):
            probe = PassProbe(cfg.n_layer, record_attention=record)
            logits = model(torch.tensor([PROMPT_IDS[:prefill]]), torch.arange(prefill), cache, probe=probe)
            if not record:
                expected_prefill = logits
            else:
                assert torch.equal(logits, expected_prefill)
                assert [tuple(r.shape) for r in probe.attention] == [(4, prefill)] * 3
        for pos in range(prefill, len(PROMPT_IDS)):
            expected = gpt2_fast.decode_one(model, PROMPT_IDS[pos], pos, caches[0], probe=PassProbe(cfg.n_layer))
            probe = PassProbe(cfg.n_layer, record_attention=True)
            got = gpt2_fast.decode_one(model, PROMPT_IDS[pos], pos, caches[1], probe=probe)
            assert torch.equal(got, expected)
            assert [tuple(r.shape) for r in probe.attention] == [(4, pos + 1)] * 3
            assert all(r.dtype == torch.float32 for r in probe.attention)
        ids = torch.tensor([PROMPT_IDS])
        expected = model(ids)  # uncached, every position
        probe = PassProbe(cfg.n_layer, record_attention=True)
        assert torch.equal(model(ids, probe=probe), expected)
        assert [tuple(r.shape) for r in probe.attention] == [(4, len(PROMPT_IDS))] * 3
    assert torch.equal(*(torch.stack([layer.kv for layer in c.layers]) for c in caches))


def test_the_plan_fills_the_head_shape_and_the_element_size():
    engine = Engine(load_model("random:kvviz-shakespeare").model)  # 6 layers, 6 heads, 192 wide
    plan = plan_ids(engine, HELLO_IDS, 3)
    assert (plan.n_head, plan.head_dim, plan.dtype_bytes, plan.attention) == (6, 32, 4, False)
    assert plan_ids(engine, HELLO_IDS, 3, use_cache=False, attention=True).attention is True
    bf16 = plan_ids(Engine(load_model("random:kvviz-shakespeare", dtype=torch.bfloat16).model), HELLO_IDS, 3)
    assert (bf16.n_head, bf16.head_dim, bf16.dtype_bytes) == (6, 32, 2)


# ----- compare mode -----


def test_both_runs_in_lockstep_record_the_same_weights():
    engine = Engine(tiny_kvviz_model(n_layer=3, n_head=4, n_embd=64, std=0.3))
    plan = lockstep_ids(engine, PROMPT_IDS, 8, True, attention=True)
    assert plan.attention and plan.twin is not None and plan.twin.attention
    steps = 0
    for record in Lockstep(engine, plan).records():
        assert record.attention is not None and all(r.attention is not None for r in record.twin)
        if record.token_id is None:
            continue  # the cached run's filling pass: no twin to compare with
        cached, uncached = record.lockstep_passes()
        assert cached[0].fed_stop == uncached[0].fed_stop == cached[0].attention.positions
        diff = (_weights(cached[0]) - _weights(uncached[0])).abs().max().item()
        assert diff <= TOLERANCE, f"step {record.new_tokens}: cached and uncached weights differ by {diff:.3g}"
        steps += 1
    assert steps == 8
    plain = lockstep_ids(engine, PROMPT_IDS, 8, True)
    assert not plain.attention and not plain.twin.attention


# ----- kvviz generate --attention --json -----


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """A random 3-layer model with 48 positions."""
    folder = tmp_path_factory.mktemp("attention-model") / "tiny"
    return save_kvviz_folder(folder, n_layer=3, n_head=2, n_embd=32, n_ctx=48, seed=7)


@pytest.mark.parametrize("no_cache", [False, True], ids=["cached", "uncached"])
def test_generate_json_gives_each_token_its_attention(tiny_checkpoint, capsys, no_cache):
    args = ["generate", "--model", str(tiny_checkpoint), "--prompt", "Time flies fast", "--max-new-tokens", "4",
            "--attention", "--json"] + (["--no-cache"] if no_cache else [])
    assert main(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert len(result["prompt_ids"]) == 3 and len(result["output_ids"]) == 4  # "Time", " flies", " fast"
    attention = result["attention"]
    assert len(attention) == 4  # one per generated token, none for the cache-filling pass
    for token, layers in enumerate(attention):
        assert len(layers) == 3
        for heads in layers:
            assert len(heads) == 2
            for row in heads:
                assert len(row) == 3 + token  # the prompt, then one more position per token
                assert math.fsum(row) == pytest.approx(1.0, abs=TOLERANCE)


def test_generate_json_has_no_attention_unless_asked(tiny_checkpoint, capsys):
    assert main(["generate", "--model", str(tiny_checkpoint), "--prompt", "Hi", "--max-new-tokens", "2",
                 "--json"]) == 0
    assert "attention" not in json.loads(capsys.readouterr().out)


def test_generate_attention_without_json_is_refused(tiny_checkpoint, capsys):
    assert main(["generate", "--model", str(tiny_checkpoint), "--prompt", "Hi", "--attention"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "kvviz: --attention goes with --json\n"
