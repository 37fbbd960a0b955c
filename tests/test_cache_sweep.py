"""The long sweep (`kvviz bench --sweep --variants`): a cached step of each kind of cache at lengths doubling to the
longest, the bytes each step read counted by hand, the bandwidth model's prediction from those bytes and the weights'
(counted by hand from GPT-2's shapes), where the cache passes the weights, its progress lines, and its one-line
refusals. (A benchmark prints figures; nothing here asserts a speed.)"""

from __future__ import annotations

import json

import pytest
import torch
from helpers_checkpoints import save_kvviz_folder

from kvviz.cli.commands import main
from kvviz.measure.cache_speed import CacheSweepResult

LAYERS, EMBD, HEADS, CONTEXT, VOCAB = 2, 32, 2, 256, 50257


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return str(save_kvviz_folder(tmp_path_factory.mktemp("long") / "tiny", n_layer=LAYERS, n_head=HEADS,
                                 n_embd=EMBD, n_ctx=CONTEXT, seed=5))


def gpt2_weight_bytes_a_step() -> int:
    """GPT-2's parameters by hand, float32, less the position embeddings (a step looks up one row); the token
    embeddings are the tied head's, read whole."""
    C = EMBD
    block = 2 * C + (C * 3 * C + 3 * C) + (C * C + C) + 2 * C + (C * 4 * C + 4 * C) + (4 * C * C + C)
    return 4 * (VOCAB * C + LAYERS * block + 2 * C)


def test_each_variant_reads_the_bytes_counted_by_hand_beside_the_bandwidth_model(tiny, capsys):
    assert main(["bench", "--sweep", "--model", tiny, "--variants", "exact,int8,window:32", "--max-length", "256",
                 "--repeat", "3", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["kind"] == "cache sweep" and result["lengths"] == [64, 128, 256]
    weights = gpt2_weight_bytes_a_step()
    assert result["weight_bytes"] == weights
    exact, int8, window = result["variants"]
    assert [v["name"] for v in result["variants"]] == ["exact", "int8", "window:32"]
    # a step at length L attends to L positions: K and V, 2 layers, 32 numbers a head row in all
    assert exact["cache_bytes"] == [LAYERS * 2 * EMBD * 4 * L for L in (64, 128, 256)]
    # int8: a byte a number and a float32 scale a row (K and V, 2 heads, 2 layers)
    assert int8["cache_bytes"] == [LAYERS * 2 * (EMBD + HEADS * 4) * L for L in (64, 128, 256)]
    # the window keeps its 32 positions at every length
    assert window["cache_bytes"] == [LAYERS * 2 * EMBD * 4 * 32] * 3
    rate = result["read_bytes_per_second"]
    for curve in result["variants"]:
        assert [len(t) for t in curve["turns_ms"]] == [3, 3, 3]
        assert curve["ms"] == [sorted(t)[1] for t in curve["turns_ms"]], "the median of three turns"
        for predicted, held in zip(curve["predicted_ms"], curve["cache_bytes"], strict=True):
            assert predicted == pytest.approx((weights + held) / rate * 1000, rel=1e-3)
    # the exact cache holds the weights' bytes at weights / (512 bytes a position); the window never does
    assert exact["crossover_length"] == pytest.approx(weights / (LAYERS * 2 * EMBD * 4), abs=1)
    assert window["crossover_length"] is None
    assert set(result["speedup_at_longest"]) == {"int8", "window:32"}
    assert CacheSweepResult.from_dict(result).variant("int8").cache_bytes == tuple(int8["cache_bytes"])


def test_kv_dtype_with_sweep_times_that_format_against_the_exact_cache_with_progress(tiny, capfd):
    assert main(["bench", "--sweep", "--model", tiny, "--kv-dtype", "int4", "--max-length", "128", "--repeat", "1",
                 "--json", "--background"]) == 0
    out, err = capfd.readouterr()
    assert [v["name"] for v in json.loads(out)["variants"]] == ["exact", "int4"]
    lines = err.splitlines()
    assert [line for line in lines if line.startswith("progress ")] == [f"progress {n}/4" for n in range(1, 5)]
    partials = [CacheSweepResult.from_dict(json.loads(line.removeprefix("partial ")))
                for line in lines if line.startswith("partial ")]
    assert [p.lengths for p in partials] == [(64,), (64, 128)]


@pytest.mark.parametrize("args, message", [
    (["--variants", "exact"], "kvviz: --variants and --window time the steps of a speed sweep: add --sweep"),
    (["--window", "8"], "kvviz: --variants and --window time the steps of a speed sweep: add --sweep"),
    (["--sweep", "--variants", "exact,int9"], "kvviz: no cache variant 'int9'; known: exact, int8, int4, fp8, "
                                              "kivi-int8, kivi-int4, window:N, mla-naive, mla-absorbed, or all"),
    (["--sweep", "--variants", "exact,mla-naive"], "kvviz: mla-naive is a step of latent attention (MLA, DeepSeek); "
                                                   "this model caches keys and values per head"),
    (["--sweep", "--variants", "exact,exact"], "kvviz: --variants names a variant twice: exact,exact"),
    (["--sweep", "--variants", "window:x"], "kvviz: a window variant is window:N with N positions, got 'window:x'"),
    (["--sweep", "--variants", "exact", "--kv-dtype", "int8"],
     "kvviz: --variants lists every variant: name the format or the window there (e.g. --variants "
     "exact,int8,window:1024)"),
    (["--sweep", "--variants", "exact", "--max-length", "257"],
     "kvviz: --max-length 257 is more than the model's context allows (256)"),
    (["--sweep", "--variants", "exact", "--peer"], "kvviz: --peer does not apply to --sweep"),
])
def test_the_long_sweep_refuses_what_cannot_apply_in_one_line(tiny, capsys, args, message):
    assert main(["bench", "--model", tiny, *args]) == 2
    assert capsys.readouterr().err.strip() == message


def test_mla_variants_are_the_naive_step_that_rebuilds_and_the_absorbed_one_that_does_not():
    """On a latent cache `all` is MLA's two steps; the naive one calls the up-projection kv_b_proj in every layer,
    the absorbed one never (it scores the latents)."""
    from kvviz.engine.engine import Engine
    from kvviz.measure.cache_sweep import all_variants, run_cache_sweep
    from kvviz.models.deepseek import Deepseek, DeepseekConfig

    config = DeepseekConfig(vocab_size=50257, n_ctx=128, n_layer=2, n_head=4, n_embd=48, intermediate_size=64,
                            kv_lora_rank=24, qk_nope_head_dim=12, qk_rope_head_dim=8, v_head_dim=10, name="tiny-mla")
    model = Deepseek(config)
    model.init_weights(torch.Generator().manual_seed(1))
    engine = Engine(model.eval())
    assert all_variants(engine) == ("mla-naive", "mla-absorbed")
    calls = []
    for layer in model.blocks:
        layer.self_attn.kv_b_proj.register_forward_hook(lambda *_: calls.append(1))
    for name, rebuilds in (("mla-naive", True), ("mla-absorbed", False)):
        calls.clear()
        result = run_cache_sweep(engine, name, 64, repeat=2)
        # the latent and the RoPE key, float32, 2 layers, at 64 positions
        assert result.variants[0].cache_bytes == (2 * (24 + 8) * 4 * 64,)
        assert bool(calls) is rebuilds, name
