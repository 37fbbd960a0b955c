"""Eviction by importance (H2O, TOVA, SnapKV, PyramidKV): what each keeps after a prompt equals the method's published
rule applied by hand to transformers' own attention weights; cached equals uncached for every method on every family
that keeps keys and values per head; the memory stops at the budget; bad input is one line."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from helpers_checkpoints import plan_ids, spread_peer

from kvviz.engine.engine import Engine, GenerationError
from kvviz.engine.sampling import SamplingSettings
from kvviz.sources.weights import load_checkpoint

transformers = pytest.importorskip("transformers")

PROMPT_IDS = [17, 402, 93, 5, 711, 28, 640, 3, 88, 250, 19, 7, 311, 64, 905, 12, 45, 270, 9, 133]  # P = 20
BUDGET = 8
METHODS = ("h2o", "tova", "snapkv", "pyramidkv")


@pytest.fixture(scope="module")
def peers(tmp_path_factory):
    """Two-layer transformers models with random weights, saved and loaded by kvviz: GPT-2 (4 heads, each its own
    keys) and Llama (4 query heads over 2 KV heads), eager attention so that `output_attentions` is exact."""
    gpt2 = transformers.GPT2Config(vocab_size=1000, n_positions=64, n_embd=32, n_layer=2, n_head=4, resid_pdrop=0,
                                   embd_pdrop=0, attn_pdrop=0, attn_implementation="eager")
    llama = transformers.LlamaConfig(vocab_size=1000, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                     attn_implementation="eager")
    models = {}
    for name, cls, config, seed in (("gpt2", transformers.GPT2LMHeadModel, gpt2, 3),
                                    ("llama", transformers.LlamaForCausalLM, llama, 4)):
        peer = spread_peer(cls, config, seed)
        folder = tmp_path_factory.mktemp(name) / "model"
        peer.save_pretrained(folder)
        models[name] = (peer, Engine(load_checkpoint(folder)))
    return models


def reference_kept(attention: torch.Tensor, method: str, budget: int, kv_heads: int, observe: int = 0,
                   pool: int = 0) -> list[int]:
    """Heads of each of the T positions' KV heads that keep it after a prompt, by the method's published rule
    applied to `attention` (nh, T, T), the prompt's softmax weights as transformers returns them; a KV head's score
    is the mean of its query heads'. Equal scores never occur with these weights."""
    nh, T, _ = attention.shape
    per_kv = attention.view(kv_heads, nh // kv_heads, T, T).mean(1)  # (kv_heads, T, T)
    kept = torch.zeros(kv_heads, T, dtype=torch.bool)
    if method == "tova":  # the last query's weights, averaged over every head: one choice for the layer
        kept[:, attention[:, -1].mean(0).topk(budget).indices] = True
    elif method == "h2o":  # accumulated attention (column sums) for the heavy hitters, and the recent half
        recent = budget // 2
        kept[:, T - recent:] = True
        heavy = per_kv.sum(1)[:, :T - recent]  # (kv_heads, T - recent)
        kept.scatter_(1, heavy.topk(budget - recent, dim=1).indices, True)
    else:  # SnapKV: the observation window's weights over the earlier positions, summed, average-pooled
        window = per_kv[:, T - observe:, :T - observe].sum(1)  # (kv_heads, T - observe)
        pooled = F.avg_pool1d(window[:, None], pool, stride=1, padding=pool // 2)[:, 0]
        kept[:, T - observe:] = True
        kept.scatter_(1, pooled.topk(budget - observe, dim=1).indices, True)
    return kept.sum(0).tolist()


def pyramid_budgets(budget: int, observe: int, layers: int) -> list[int]:
    """PyramidKV's layer budgets as its paper steps them (β = 20): from 2C - C/β at the bottom to C/β at the top,
    C the budget past the observation window, which every layer keeps too."""
    past = budget - observe
    least, most = past / 20, 2 * past - past / 20
    return [observe + round(most - layer * (most - least) / (layers - 1)) for layer in range(layers)]


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("method", METHODS)
def test_what_each_method_keeps_after_a_prompt_equals_its_rule_on_transformers_attention(peers, family, method):
    peer, engine = peers[family]
    plan = plan_ids(engine, PROMPT_IDS, 1, evict=method, budget=BUDGET)
    first = next(iter(engine.run(plan)))  # the prompt's pass: it evicts once, after attending to every position
    with torch.no_grad():
        attentions = peer(torch.tensor([PROMPT_IDS]), output_attentions=True).attentions  # (1, nh, T, T) a layer
    observe, pool = (2, 5) if method in ("snapkv", "pyramidkv") else (0, 0)  # the defaults: budget // 4, 5
    budgets = pyramid_budgets(BUDGET, observe, 2) if method == "pyramidkv" else [BUDGET, BUDGET]
    assert budgets != [BUDGET, BUDGET] or method != "pyramidkv"
    kv_heads = first.eviction.kv_heads
    for layer, weights in enumerate(attentions):
        expected = reference_kept(weights[0], method, min(budgets[layer], len(PROMPT_IDS)), kv_heads, observe, pool)
        assert list(first.eviction.layers[layer].heads) == expected, (family, method, layer)
        assert first.layer_positions_held[layer] == min(budgets[layer], len(PROMPT_IDS))


@pytest.mark.parametrize("sampling", [SamplingSettings(), SamplingSettings(0.9, None, 7)], ids=["greedy", "seeded"])
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_cached_equals_uncached_for_every_method(peers, family, sampling):
    """The uncached run feeds the whole text each pass and replays the method's choices query by query; the cached
    one keeps the rows. Same tokens, and the same positions kept in every layer after every pass."""
    _, engine = peers[family]
    for method in METHODS:
        runs = [list(engine.run(plan_ids(engine, PROMPT_IDS, 10, use_cache, sampling, evict=method, budget=BUDGET),
                                sampling)) for use_cache in (True, False)]
        cached = [r for r in runs[0] if r.token_id is not None]
        uncached = runs[1]
        assert [r.token_id for r in cached] == [r.token_id for r in uncached], method
        for a, b in zip(cached, uncached, strict=True):
            assert [layer.heads for layer in a.eviction.layers] == [layer.heads for layer in b.eviction.layers]
        assert any(layer.evicted() for layer in cached[-1].eviction.layers), "nothing was evicted: no test"


def test_the_memory_stops_at_the_budget_measured(peers):
    _, engine = peers["llama"]
    records = list(engine.run(plan_ids(engine, PROMPT_IDS[:4], 20, evict="h2o", budget=BUDGET)))
    # 2 layers x (K, V) x 2 KV heads x 8 numbers a head x 4 bytes = 256 bytes a position
    assert [r.cache_bytes for r in records[:6]] == [4 * 256, 5 * 256, 6 * 256, 7 * 256, 8 * 256, 8 * 256]
    assert {r.cache_bytes for r in records[4:]} == {8 * 256} and records[-1].layer_positions_held == (8, 8)
    last = records[-1].eviction.layers[0]
    assert sum(last.heads) == 2 * BUDGET and len(last.heads) == 24
    gone = last.evicted()[0]
    assert "evicted at step" in records[-1].eviction.tooltip(0, gone)


def test_every_query_heads_weights_are_recorded_over_what_its_kv_head_keeps(peers):
    """GQA: 4 query heads read 2 KV heads; each query head's recorded weights sum to 1 over the positions its KV
    head holds, and are 0 where that head evicted."""
    _, engine = peers["llama"]
    *_, last = (r for r in engine.run(plan_ids(engine, PROMPT_IDS, 3, evict="h2o", budget=BUDGET, attention=True))
                if r.token_id is not None)
    for layer in range(2):
        rows = [last.attention.row(layer, head) for head in range(4)]
        assert [round(sum(row), 5) for row in rows] == [1.0] * 4
        assert [sum(w > 0 for w in row) for row in rows] == [BUDGET + 1] * 4  # the budget and the newest


@pytest.mark.parametrize("kwargs, message", [
    (dict(evict="h2o", budget=0), "a budget is the positions a layer keeps: 1 to the context's 64, got 0"),
    (dict(evict="h2o", budget=65), "a budget is the positions a layer keeps: 1 to the context's 64, got 65"),
    (dict(evict="snapkv", budget=4, observe=4), "the observation window watches 1 to 3 queries"),
    (dict(evict="snapkv", budget=8, pool=4), "pooling averages an odd number"),
    (dict(evict="tova", budget=8, observe=2), "an observation window and pooling are SnapKV's and PyramidKV's"),
    (dict(evict="h2o", budget=8, window=4), "leave it out (one at a time)"),
    (dict(evict="h2o", budget=8, kv_dtype="int8"), "a quantized cache is another trade-off"),
    (dict(evict="tova", budget=8, draft_tokens=2, prompt_lookup=2), "TOVA forgets positions for good"),
])
def test_what_no_method_can_take_is_one_line(peers, kwargs, message):
    _, engine = peers["gpt2"]
    with pytest.raises(GenerationError, match=message.replace("(", r"\(").replace(")", r"\)")) as error:
        plan_ids(engine, PROMPT_IDS, 4, **kwargs)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("preset", ["deepseek-v2-lite-attention", "kvviz-gemma3-mini", "kvviz-qwen3.5-mini",
                                    "kvviz-gemma4-mini"])
def test_families_whose_cache_is_not_one_of_heads_refuse_in_one_line(preset):
    from kvviz.core.policy import CachePolicy
    from kvviz.models.families import PRESETS

    _, config = PRESETS[preset]
    refusal = config.cache_refusal(CachePolicy(evict="h2o", budget=8))
    assert refusal and "\n" not in refusal and ("latents" in refusal or "eviction by importance" in refusal)


def test_the_cli_runs_a_method_and_says_bad_input_in_one_line(kvviz_cli):
    result = kvviz_cli("generate", "--model", "random:kvviz-shakespeare", "--prompt", "Time flies like an arrow",
                       "--max-new-tokens", "6", "--evict", "tova", "--budget", "4", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["positions_held_per_layer"] == [4] * 6 and all(len(k) == 4 for k in out["kept_per_layer"])
    assert out["cache_bytes"] == 6 * 4 * 2 * 192 * 4  # 6 layers x 4 positions x (K, V) x 192 numbers x 4 bytes
    every_layer_keeps = set.intersection(*map(set, out["kept_per_layer"]))
    assert set().union(*map(set, out["evicted_per_pass"])) == set(range(5 + 6)) - every_layer_keeps
    for args, message in ((("--evict", "h2o", "--budget", "0"), "got 0"),
                          (("--evict", "h2o", "--budget", "300"), "got 300"),
                          (("--evict", "h2o"), "give --budget B"),
                          (("--budget", "8"), "--budget goes with --evict"),
                          (("--evict", "h2o", "--budget", "8", "--window", "4"), "one trade-off at a time"),
                          (("--evict", "h2o", "--budget", "8", "--model", "random:deepseek-v2-lite-attention"),
                           "caches latents (MLA)")):
        result = kvviz_cli("generate", "--model", "random:kvviz-shakespeare", "--prompt", "x", *args)
        assert result.returncode == 2 and message in result.stderr, (args, result.stderr)
        assert result.stderr.count("\n") == 1, result.stderr


def test_compare_puts_the_full_cache_beside_a_method_and_calls_the_parting_a_trade_off(kvviz_cli):
    result = kvviz_cli("compare", "--prompt", "Time flies like an arrow and", "--new-tokens", "8", "--evict", "h2o",
                       "--budget", "4")  # the embedded model: it parts from the full cache at step 6
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "the runs part at step 6" in text and "with H2O (a budget of 4)" in text and "a trade-off, not a bug" in text
    held = [line.split()[-1] for line in text.splitlines() if line.split() and line.split()[0].isdigit()]
    assert held == ["6/4", "7/4", "8/4", "9/4", "10/4", "11/4", "12/4", "14/4"]  # the full cache's, then the budget


def test_an_importance_layer_keeps_the_layer_contract_and_refuses_to_roll_back():
    """The contract every layer kind keeps (update returns what the pass reads, with each key's position; bytes held
    measured), and crop refused in words: an evicted position cannot come back."""
    from kvviz.cache.kv_cache import build_cache
    from kvviz.cache.layers import LayerKind

    cache = build_cache([LayerKind("importance", 2, 4, evict="h2o", budget=3)], 16)
    k = torch.randn(1, 2, 5, 4)
    held = cache.update(0, torch.arange(5), k, k)
    assert held.positions.tolist() == [[0, 1, 2, 3, 4]] * 2 and torch.equal(held.keys, k)
    held.keeper.attend(torch.zeros(2, 5, 5), held.positions, torch.arange(5))  # equal scores: causal softmax rows
    assert cache.layer_positions_held == (3,) and cache.bytes_used == 3 * 2 * 2 * 4 * 4  # 3 x (K, V) x 2 x 4 x 4 B
    # accumulated attention by hand: position p gets 1/(t + 1) from each query t >= p: 2.28, 1.28, 0.78, 0.45, 0.2;
    # H2O keeps the most recent 1 (3 // 2), position 4, and the 2 best of the rest, 0 and 1
    assert cache.layers[0].keeper.held.tolist() == [[0, 1, 4]] * 2
    with pytest.raises(ValueError, match="cannot roll back"):
        cache.crop(4)
