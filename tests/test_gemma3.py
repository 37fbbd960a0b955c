"""The Gemma 3 family: local (sliding-window) and global layers against transformers' Gemma3ForCausalLM on random
weights the tests make, its cache (a window on each local layer, every position on each global one) measured
against hand counts, its presets' shapes, and what it refuses."""

from __future__ import annotations

import json

import pytest
import torch
from helpers_checkpoints import byte_level_tokenizer, peer_greedy, plan_ids, spread_peer

from kvviz.cache.kv_cache import build_cache
from kvviz.cache.probe import PassProbe
from kvviz.core.errors import ModelLoadError
from kvviz.core.records import EXACT
from kvviz.engine.engine import Engine, GenerationError
from kvviz.engine.sampling import SamplingSettings
from kvviz.sources.weights import load_checkpoint

transformers = pytest.importorskip("transformers")

LOCAL, GLOBAL = "sliding_attention", "full_attention"
PROMPT_IDS = [5, 17, 42, 8, 99, 3, 61]  # 7 tokens: the window of 4 slides from the fifth on
NEW = 24
TOLERANCE = 1e-4


def tokens(records) -> list[int]:
    return [r.token_id for r in records if r.token_id is not None]


def gemma3_config(**overrides):
    """6 layers, two local to one global, a window of 4, 4 query heads on 2 KV heads of 16; every Gemma 3 setting
    away from its default: the local and global RoPE bases, linear scaling on the global layers (as Gemma 3 4B and
    up), query_pre_attn_scalar 24 (not head_dim), the final logits softcapped at 0.5 (uncapped, about 1 at most)."""
    settings = dict(vocab_size=500, hidden_size=64, intermediate_size=96, num_hidden_layers=6, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, max_position_embeddings=64, sliding_window=4,
                    layer_types=[LOCAL, LOCAL, GLOBAL, LOCAL, LOCAL, GLOBAL], query_pre_attn_scalar=24,
                    final_logit_softcapping=0.5, rope_theta=10000.0, rope_local_base_freq=100.0,
                    rope_scaling={"rope_type": "linear", "factor": 8.0}, eos_token_id=None,
                    attn_implementation="eager")
    return transformers.Gemma3TextConfig(**{**settings, **overrides})


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    peer = spread_peer(transformers.Gemma3ForCausalLM, gemma3_config(), 3)
    with torch.no_grad():  # small embeddings: the layers, not the token's own (tied) embedding, choose the next
        peer.model.embed_tokens.weight.normal_(0.0, 0.03)
    folder = tmp_path_factory.mktemp("gemma3") / "model"
    peer.save_pretrained(folder)
    byte_level_tokenizer(500).save(str(folder / "tokenizer.json"))
    return peer, folder, load_checkpoint(folder)


@pytest.fixture(scope="module")
def runs(gemma):
    """The engine's greedy runs with and without the cache, and the logits each pass chose from."""
    _, _, model = gemma
    engine = Engine(model)
    out = {}
    for use_cache in (True, False):
        seen: list[torch.Tensor] = []
        records = list(engine.run(plan_ids(engine, PROMPT_IDS, NEW, use_cache), watch_logits=lambda x, s=seen:
                                  s.append(x.clone())))
        out[use_cache] = records, torch.stack(seen)  # (NEW, V)
    return out


def test_the_config_reads_as_transformers_reads_it(gemma):
    _, _, model = gemma
    cfg = model.config
    assert cfg.kinds == (LOCAL, LOCAL, GLOBAL, LOCAL, LOCAL, GLOBAL) and cfg.sliding_window == 4
    assert (cfg.rope_theta, cfg.rope_factor, cfg.rope_local_theta, cfg.rope_local_factor) == (10000.0, 8.0, 100.0, 1.0)
    assert (cfg.query_pre_attn_scalar, cfg.final_logit_softcapping, cfg.n_kv_head) == (24, 0.5, 2)


def test_a_saved_config_reads_back_as_it_was(gemma, tmp_path):
    from kvviz.models.gemma3_format import config_from_json, config_to_json

    _, _, model = gemma
    (tmp_path / "config.json").write_text(json.dumps(config_to_json(model.config)))
    assert config_from_json(tmp_path / "config.json") == model.config


def test_logits_equal_transformers_with_and_without_the_cache(gemma, runs):
    """The whole sequence's logits without a cache (each local layer within its window), and each pass's logits
    of the engine's cached and uncached runs, against transformers' on the same sequence."""
    peer, _, model = gemma
    sequence = torch.tensor([PROMPT_IDS + tokens(runs[True][0])])
    with torch.no_grad():
        expected = peer(sequence).logits[0]  # (T, V)
        ours = model(sequence)[0]
    assert expected.abs().max() > 0.4, "the softcap of 0.5 should bite: tanh is far from straight there"
    assert torch.allclose(ours, expected, atol=TOLERANCE, rtol=0)
    chosen_from = expected[len(PROMPT_IDS) - 1:-1]  # (NEW, V): the logits each new token was chosen from
    for use_cache in (True, False):
        assert torch.allclose(runs[use_cache][1], chosen_from, atol=TOLERANCE, rtol=0), use_cache


def test_greedy_tokens_equal_cached_uncached_and_transformers(gemma, runs):
    peer, _, _ = gemma
    reference = peer_greedy(peer, PROMPT_IDS, NEW)
    assert tokens(runs[True][0]) == tokens(runs[False][0]) == reference
    assert len(set(reference)) > 10, "weights this flat would not test much"


def test_seeded_sampling_is_the_same_with_and_without_the_cache(gemma):
    _, _, model = gemma
    engine = Engine(model)
    sampling = SamplingSettings(temperature=0.8, top_k=40, seed=7)
    cached = tokens(engine.run(plan_ids(engine, PROMPT_IDS, NEW, True, sampling), sampling))
    uncached = tokens(engine.run(plan_ids(engine, PROMPT_IDS, NEW, False, sampling), sampling))
    assert cached == uncached and len(cached) == NEW


def test_the_newest_querys_attention_equals_transformers(gemma):
    """Over the prompt: a local layer's newest query sees the last 4 positions only, a global layer's all 7."""
    peer, _, model = gemma
    probe = PassProbe(model.config.n_layer, record_attention=True)
    with torch.no_grad():
        model(torch.tensor([PROMPT_IDS]), probe=probe)
        attentions = peer(torch.tensor([PROMPT_IDS]), output_attentions=True).attentions
    for layer, weights in enumerate(probe.attention):
        assert weights.shape == (4, 7)
        assert torch.allclose(weights, attentions[layer][0, :, -1, :], atol=TOLERANCE, rtol=0)
        assert bool((weights[:, :3] == 0).all()) == (layer not in (2, 5))


def test_the_cache_holds_a_window_on_local_layers_and_every_position_on_global_ones(gemma, runs):
    _, _, model = gemma
    records = runs[True][0]
    assert records[-1].layer_positions_held == (4, 4, 31, 4, 4, 31)  # 7 + 24 positions fed
    assert records[-1].layer_capacity == (4, 4, 0, 4, 4, 0)
    # 4 local layers hold 4 positions, 2 global ones 31: x (K, V) x 2 KV heads x 16 numbers x 4 bytes
    assert records[-1].cache_bytes == 4 * 4 * 2 * 2 * 16 * 4 + 2 * 31 * 2 * 2 * 16 * 4
    assert model.config.cache_shape().cache_bytes(31) == 4 * 4 * 2 * 2 * 16 * 4 + 2 * 31 * 2 * 2 * 16 * 4
    assert records[-1].kv_computed_total == 31  # a key and value a position and layer, computed once
    engine = Engine(model)
    assert plan_ids(engine, PROMPT_IDS, 2).cache_bytes_per_position == 6 * 2 * 2 * 16 * 4  # every layer holds it


def test_what_the_family_does_not_run_is_refused_in_one_line(gemma, tmp_path, kvviz_cli):
    _, folder, model = gemma
    engine = Engine(model)
    for window, sinks, kv_dtype in ((8, 0, ""), (8, 2, ""), (0, 0, "int8")):
        with pytest.raises(GenerationError, match="keeps its own sliding windows") as info:
            engine.policy(window, sinks, kv_dtype)
        assert len(str(info.value).splitlines()) == 1
    with pytest.raises(GenerationError, match="Break the cache plants its bug"):
        plan_ids(engine, PROMPT_IDS, 2, cache_fault="late_write")
    done = kvviz_cli("generate", "--model", str(folder), "--prompt", "hi", "--max-new-tokens", "2", "--window", "8")
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert "keeps its own sliding windows" in done.stderr
    done = kvviz_cli("generate", "--model", str(folder), "--prompt", "Time flies", "--max-new-tokens", "5", "--json")
    report = json.loads(done.stdout)
    positions = len(report["prompt_ids"]) + 5
    assert report["cache_bytes"] == 4 * min(positions, 4) * 2 * 2 * 16 * 4 + 2 * positions * 2 * 2 * 16 * 4


@pytest.mark.parametrize(("changes", "message"), [
    ({"model_type": "gemma3", "vision_config": {}}, "vision tower; kvviz runs Gemma 3's text models only"),
    ({"rope_parameters": {GLOBAL: {"rope_type": "yarn", "factor": 8.0}}}, 'rope_type "yarn" of the full_attention'),
    ({"rope_parameters": None, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, 'rope_type "dynamic"'),
    ({"hidden_activation": "gelu"}, 'hidden_activation "gelu" is not'),
    ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping 50.0 is not supported"),
    ({"use_bidirectional_attention": True}, "use_bidirectional_attention is not supported"),
    ({"tie_word_embeddings": False}, "tie_word_embeddings false is not supported"),
    ({"sliding_window": None}, "sliding_window is null"),
], ids=["vision", "yarn", "dynamic", "gelu", "attention-softcap", "bidirectional", "untied", "no-window"])
def test_a_config_kvviz_does_not_run_is_named_in_one_line(tmp_path, changes, message):
    from kvviz.models.gemma3_format import config_from_json

    raw = {**json.loads(gemma3_config().to_json_string()), **changes}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ModelLoadError, match=message) as info:
        config_from_json(path)
    assert str(info.value).startswith(f"{path}: ") and len(str(info.value).splitlines()) == 1


def test_a_hub_style_config_reads_its_layers_and_bases_as_transformers_does(tmp_path):
    """The hub's Gemma 3 configs predate rope_parameters: rope_theta, rope_local_base_freq, rope_scaling (the global
    layers'), and sliding_window_pattern instead of layer_types."""
    from kvviz.models.gemma3_format import config_from_json

    raw = dict(model_type="gemma3_text", num_hidden_layers=8, hidden_size=64, intermediate_size=96,
               num_attention_heads=4, num_key_value_heads=1, head_dim=16, sliding_window=512, sliding_window_pattern=3,
               rope_theta=1_000_000.0, rope_local_base_freq=10_000.0, rope_scaling={"rope_type": "linear",
                                                                                    "factor": 8.0})
    (tmp_path / "config.json").write_text(json.dumps(raw))
    ours, theirs = config_from_json(tmp_path / "config.json"), transformers.Gemma3TextConfig(**raw)
    assert list(ours.kinds) == theirs.layer_types
    assert {GLOBAL: {"rope_type": "linear", "rope_theta": ours.rope_theta, "factor": ours.rope_factor},
            LOCAL: {"rope_type": "default", "rope_theta": ours.rope_local_theta}} == theirs.rope_parameters


def test_the_presets_have_gemma_3s_published_shapes_and_cache():
    """Gemma 3 270M whole (its published 268,098,176 parameters), built on the meta device, and its all-global
    twin; Gemma 3 1B's cache measured in the cache's tensors for its real shape after 600 positions: 22 local layers
    hold 512, 4 global ones 600, x (K, V) x 1 KV head x 256 numbers x 4 bytes."""
    from kvviz.models.families import PRESETS
    from kvviz.models.gemma3 import Gemma3

    _, small = PRESETS["gemma-3-270m"]
    with torch.device("meta"):
        assert Gemma3(small).num_parameters() == 268_098_176
    # at 8,192 positions: 15 local layers hold 512 and 3 global ones 8,192; its all-global twin, 18 x 8,192
    assert small.cache_shape().cache_bytes(8192) == (15 * 512 + 3 * 8192) * 2 * 1 * 256 * 4
    assert PRESETS["gemma-3-270m-global"][1].cache_shape().cache_bytes(8192) == 18 * 8192 * 2 * 1 * 256 * 4
    _, config = PRESETS["gemma-3-1b"]
    assert [i for i, kind in enumerate(config.kinds) if kind == GLOBAL] == [5, 11, 17, 23]
    cache = build_cache(config.cache_layers(EXACT), 600)
    rows = torch.zeros(1, 1, 600, 256)  # (B, KV heads, positions, head_dim)
    for layer in range(26):
        cache.update(layer, torch.arange(600), rows, rows)
    assert cache.bytes_used == 22 * 512 * 2 * 1 * 256 * 4 + 4 * 600 * 2 * 1 * 256 * 4
    assert config.cache_shape().cache_bytes(600) == 22 * 512 * 2 * 1 * 256 * 4 + 4 * 600 * 2 * 1 * 256 * 4
    assert config.cache_shape().bytes_per_token() == 26 * 2 * 1 * 256 * 4  # while every layer still holds it


def test_the_bench_peer_is_transformers_on_the_same_weights(gemma):
    from kvviz.measure.bench import to_transformers

    peer, _, model = gemma
    rebuilt = to_transformers(model)
    with torch.no_grad():
        ids = torch.tensor([PROMPT_IDS])
        assert type(rebuilt).__name__ == "Gemma3ForCausalLM"
        assert torch.allclose(rebuilt(ids).logits, peer(ids).logits, atol=1e-5, rtol=0)
