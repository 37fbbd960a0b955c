"""The Gemma 4 family: its top layers read the keys and values of layers below them (cross-layer KV sharing), held
against transformers' Gemma4ForCausalLM on random weights the tests make; its cache measured against a hand count
(a shared layer keeps nothing), and what it refuses."""

from __future__ import annotations

import json

import pytest
import torch
from helpers_checkpoints import byte_level_tokenizer, peer_greedy, plan_ids, spread_peer

from kvviz.cache.kv_cache import build_cache
from kvviz.cache.layers import FullLayer
from kvviz.cache.probe import PassProbe
from kvviz.cache.shared import SharedLayer
from kvviz.core.errors import ModelLoadError
from kvviz.core.records import EXACT
from kvviz.engine.engine import Engine, SamplingSettings
from kvviz.models.gemma4 import GLOBAL, SLIDING
from kvviz.sources.weights import load_checkpoint

transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "Gemma4ForCausalLM"):
    pytest.skip("this transformers has no Gemma 4", allow_module_level=True)

PROMPT_IDS = [5, 17, 42, 8, 99, 3, 61]  # 7 positions: the sliding layers' window of 4 slides within the prompt
NEW = 24
POSITIONS = len(PROMPT_IDS) + NEW  # fed into a cached run's cache, its last token included
LAYER_TYPES = [SLIDING, SLIDING, GLOBAL, SLIDING, SLIDING, GLOBAL]


def tokens(records) -> list[int]:
    return [r.token_id for r in records if r.token_id is not None]


def gemma4_config(**overrides):
    """6 layers, the top 3 shared: layers 3 and 4 (sliding) read layer 1's keys and values, layer 5 (global) layer
    2's. Sliding heads of 16 with a window of 4, global heads of 32 turning a quarter of their pairs (proportional
    RoPE), 2 KV heads, per-layer embeddings of 8, the shared layers' MLPs twice as wide, logits capped at 30."""
    settings = dict(vocab_size=500, hidden_size=64, intermediate_size=96, num_hidden_layers=6, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, global_head_dim=32, sliding_window=4, layer_types=LAYER_TYPES,
                    num_kv_shared_layers=3, hidden_size_per_layer_input=8, vocab_size_per_layer_input=500,
                    use_double_wide_mlp=True, final_logit_softcapping=30.0, max_position_embeddings=64,
                    attn_implementation="eager")
    return transformers.Gemma4TextConfig(**{**settings, **overrides})


def saved_peer(config, folder, seed: int):
    """transformers' model of `config` with spread_peer's weights, its norms near 1 (Gemma 4 multiplies by a norm's
    weight itself: weights near 0 would silence every layer), saved with a tokenizer; the peer and kvviz's model."""
    peer = spread_peer(transformers.Gemma4ForCausalLM, config, seed)
    with torch.no_grad():
        for name, p in peer.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(1.0)
    peer.save_pretrained(folder)
    byte_level_tokenizer(500).save(str(folder / "tokenizer.json"))
    return peer, load_checkpoint(folder)


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gemma4") / "model"
    peer, model = saved_peer(gemma4_config(), folder, 2)
    return peer, folder, model


@pytest.fixture(scope="module")
def runs(gemma):
    """Greedy runs of NEW tokens, cached and uncached: their records and the logits of every pass that chose."""
    _, _, model = gemma
    engine = Engine(model)
    records, logits = {}, {}
    for use_cache in (True, False):
        seen = logits[use_cache] = []
        records[use_cache] = list(engine.run(plan_ids(engine, PROMPT_IDS, NEW, use_cache),
                                             watch_logits=lambda row, seen=seen: seen.append(row.clone())))
    return records, logits


def test_greedy_tokens_and_logits_equal_transformers_cached_and_uncached(gemma, runs):
    peer, _, model = gemma
    records, logits = runs
    reference = peer_greedy(peer, PROMPT_IDS, NEW)
    assert tokens(records[True]) == tokens(records[False]) == reference
    assert len(set(reference)) > 5, "weights this flat would not test much"
    assert len(logits[True]) == len(logits[False]) == NEW
    for cached, uncached in zip(logits[True], logits[False], strict=True):
        assert (cached - uncached).abs().max() <= 1e-4
    sequence = torch.tensor([PROMPT_IDS + reference])
    with torch.no_grad():
        assert torch.allclose(model(sequence)[0], peer(sequence).logits[0], atol=1e-4, rtol=0)


def test_seeded_sampling_is_the_same_with_and_without_the_cache(gemma):
    engine = Engine(gemma[2])
    sampling = SamplingSettings(temperature=1.0, top_k=50, seed=7)
    cached, uncached = (tokens(engine.run(plan_ids(engine, PROMPT_IDS, 12, use_cache, sampling), sampling))
                        for use_cache in (True, False))
    assert cached == uncached and len(cached) == 12 and len(set(cached)) > 3


def test_the_cache_holds_the_windows_and_the_global_layer_and_the_shared_layers_nothing(gemma, runs):
    """31 positions fed: layers 0 and 1 keep their window of 4, layer 2 (global) all 31, layers 3 to 5 nothing."""
    last = runs[0][True][-1]
    sliding = 4 * 2 * 2 * 16 * 4  # positions x (K, V) x 2 KV heads x 16 numbers x 4 bytes
    full = 31 * 2 * 2 * 32 * 4
    assert last.layer_positions_held == (4, 4, 31, 0, 0, 0)
    assert last.layer_bytes == (sliding, sliding, full, 0, 0, 0)
    assert last.cache_bytes == 2 * 4 * 2 * 2 * 16 * 4 + 31 * 2 * 2 * 32 * 4 == 17920
    assert last.positions_held == 31  # the top layer that keeps positions: layer 2
    assert gemma[2].config.cache_shape().cache_bytes(POSITIONS) == 17920


def test_the_shared_layers_compute_queries_only(gemma, runs):
    """The shared layers project no key or value row, cached or not, while the others project every position fed;
    they have no k_proj or v_proj, in transformers' checkpoint as in kvviz's model."""
    from safetensors import safe_open

    _, folder, model = gemma
    records = runs[0]
    assert [sum(r.kv_computed[layer] for r in records[True]) for layer in range(6)] == [POSITIONS] * 3 + [0] * 3
    assert all(r.kv_computed == (r.fed_stop,) * 3 + (0,) * 3 for r in records[False])
    with safe_open(str(folder / "model.safetensors"), "pt") as weights:
        keys = set(weights.keys())
    for layer in range(6):
        has_kv = {f"model.layers.{layer}.self_attn.{name}.weight" in keys for name in ("k_proj", "v_proj", "k_norm")}
        assert has_kv == {layer < 3} and hasattr(model.blocks[layer].self_attn, "k_proj") == (layer < 3)
    assert [model.config.kv_source(layer) for layer in range(6)] == [0, 1, 2, 1, 1, 2]


def test_a_shared_layers_attention_reads_its_source_layers_keys_as_transformers_does(gemma):
    """The newest query's weights, layer by layer, after a cached prefill and one step, and without the cache:
    transformers' own (layer 3 reads layer 1's window of 4, layer 5 layer 2's every position; scores unscaled)."""
    peer, _, model = gemma
    sequence = torch.tensor([PROMPT_IDS + [7]])
    cache = build_cache(model.config.cache_layers(EXACT), 8)
    cached, uncached = PassProbe(6, record_attention=True), PassProbe(6, record_attention=True)
    with torch.no_grad():
        model(sequence[:, :-1], kv_cache=cache)
        model(sequence[:, -1:], kv_cache=cache, probe=cached)
        model(sequence, probe=uncached, last_only=True)  # the shared layers carry the last position alone
        attentions = peer(sequence, output_attentions=True).attentions
    for layer in range(6):
        expected = attentions[layer][0, :, -1, :]  # (heads, 8 positions)
        assert torch.allclose(cached.attention[layer], expected, atol=1e-5, rtol=0)
        assert torch.allclose(uncached.attention[layer], expected, atol=1e-5, rtol=0)
    assert (cached.attention[3][:, :4] == 0).all() and (cached.attention[5] > 0).all()
    assert cached.kv_rows == [1, 1, 1, 0, 0, 0]


def test_values_from_the_key_projection_on_the_global_layers_match_transformers(tmp_path):
    """attention_k_eq_v: a global layer has no v_proj (its values are its keys before their norm and RoPE) and one
    KV head of its own; without per-layer embeddings, and an untied head."""
    config = gemma4_config(attention_k_eq_v=True, num_global_key_value_heads=1, hidden_size_per_layer_input=0,
                           tie_word_embeddings=False)
    peer, model = saved_peer(config, tmp_path / "k-eq-v", 5)
    assert model.config.kind_heads(GLOBAL) == (1, 32) and model.blocks[2].self_attn.v_proj is None
    sequence = torch.tensor([PROMPT_IDS * 2])
    cache = build_cache(model.config.cache_layers(EXACT), 14)
    with torch.no_grad():
        expected = peer(sequence).logits[0]
        stepped = [model(sequence[:, :7], kv_cache=cache)[0]] + [model(sequence[:, t:t + 1], kv_cache=cache)[0]
                                                                for t in range(7, 14)]
        assert torch.allclose(model(sequence)[0], expected, atol=1e-4, rtol=0)
    assert torch.allclose(torch.cat(stepped), expected, atol=1e-4, rtol=0)
    assert cache.bytes_used == 2 * 4 * 2 * 2 * 16 * 4 + 14 * 2 * 1 * 32 * 4  # the global layer: 1 KV head


def test_a_checkpoint_carrying_the_shared_layers_key_projections_loads_without_them(gemma, tmp_path):
    """Some checkpoints carry k_proj and v_proj on every layer; transformers ignores them on the shared layers, and
    so does kvviz."""
    from safetensors.torch import load_file, save_file

    _, folder, model = gemma
    state = load_file(str(folder / "model.safetensors"))
    state["model.layers.4.self_attn.k_proj.weight"] = torch.zeros(32, 64)
    state["model.layers.4.self_attn.v_proj.weight"] = torch.zeros(32, 64)
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    save_file(state, str(tmp_path / "model.safetensors"))
    loaded = load_checkpoint(tmp_path)
    with torch.no_grad():
        ids = torch.tensor([PROMPT_IDS])
        assert torch.equal(loaded(ids), model(ids))


def test_the_published_configs_global_head_dim_reads_as_transformers_5s_per_layer_config(gemma, tmp_path):
    """transformers 5 writes a global layer's head as per_layer_config; the published configs as global_head_dim
    (and num_global_key_value_heads with attention_k_eq_v): both read the same, and kvviz writes the second."""
    from kvviz.models.gemma4_format import config_from_json, config_to_json

    _, folder, model = gemma
    raw = json.loads((folder / "config.json").read_text())
    assert raw["per_layer_config"] == {"2": {"head_dim": 32}, "5": {"head_dim": 32}}
    published = {k: v for k, v in raw.items() if k != "per_layer_config"} | {"global_head_dim": 32}
    (tmp_path / "config.json").write_text(json.dumps(published))
    assert config_from_json(tmp_path / "config.json") == model.config
    written = config_to_json(model.config)
    assert written["global_head_dim"] == 32 and "per_layer_config" not in written
    assert transformers.Gemma4TextConfig(**written).per_layer_config[5].head_dim == 32


@pytest.mark.parametrize("raw, message", [
    (lambda: gemma4_config(enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=16).to_dict(),
     "enable_moe_block: mixture-of-experts blocks are not modelled"),
    (lambda: gemma4_config(hidden_activation="silu").to_dict(), "hidden_activation \"silu\" is not Gemma's"),
    (lambda: transformers.Gemma4Config(text_config=gemma4_config().to_dict()).to_dict(),
     "a multimodal Gemma 4 checkpoint"),
], ids=["moe", "activation", "multimodal"])
def test_what_kvviz_does_not_run_is_refused_in_one_line(raw, message, tmp_path):
    from kvviz.models.families import read_family_config

    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw()))
    with pytest.raises(ModelLoadError) as refused:
        read_family_config(path)
    assert message in str(refused.value) and str(path) in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize("extra", [("--window", "4"), ("--kv-dtype", "int8"), ("--sinks", "1", "--window", "4")])
def test_a_window_sinks_or_a_quantized_cache_are_refused_in_one_line(gemma, extra, kvviz_cli):
    done = kvviz_cli("generate", "--model", str(gemma[1]), "--prompt", "hi", "--max-new-tokens", "2", *extra)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert "keeps its own windows and shares keys and values across layers" in done.stderr


def test_the_e2b_preset_keeps_keys_and_values_in_its_15_lower_layers_only():
    """Gemma 4 E2B's attention: 12 sliding layers of 1 KV head x 256 (window 512) and 3 global layers of 1 KV head
    x 512 keep keys and values; the 20 above read layer 13's (sliding) or 14's (global). Bytes counted by hand,
    and measured from a cache of its kinds fed 3 positions; its weights (built on the meta device) under 1.5 GB."""
    from kvviz.models.families import PRESETS
    from kvviz.models.gemma4 import Gemma4

    _, config = PRESETS["gemma-4-e2b-attention"]
    per_token = (12 * 2 * 1 * 256 + 3 * 2 * 1 * 512) * 4
    assert per_token == 36864 and config.cache_shape().bytes_per_token() == per_token
    assert config.cache_shape().cache_bytes(1000) == (12 * 512 * 2 * 256 + 3 * 1000 * 2 * 512) * 4
    sources = [config.kv_source(layer) for layer in range(15, 35)]
    assert sources == [13, 13, 13, 13, 14] * 4
    cache = build_cache(config.cache_layers(EXACT), 3)
    shared = {}
    for layer, kind in enumerate(config.layer_types):
        heads, head_dim = config.kind_heads(kind)
        if layer < 15:
            shared[layer] = cache.update(layer, torch.arange(3), torch.ones(1, heads, 3, head_dim),
                                         torch.ones(1, heads, 3, head_dim))
        else:
            cache.layers[layer].read(torch.arange(3), shared[config.kv_source(layer)])
    assert cache.bytes_used == 3 * per_token and cache.length == 3 and cache.positions_held == 3
    with torch.device("meta"):
        weights = Gemma4(config).num_parameters() * 4
    assert weights < 1.5e9


def test_a_shared_layer_keeps_nothing_counts_its_positions_and_crops():
    layer = SharedLayer(source=1)
    held = FullLayer(1, 2, 8).update(torch.arange(5), torch.ones(1, 1, 5, 2), torch.ones(1, 1, 5, 2))
    assert layer.read(torch.arange(5), held) is held
    assert (layer.length, layer.positions_held, layer.bytes_held, layer.reused) == (5, 0, 0, 0)
    layer.crop(3)
    assert layer.length == 3
    with pytest.raises(TypeError, match="reads layer 1's"):
        layer.update(3, torch.ones(1, 1, 1, 2), torch.ones(1, 1, 1, 2))


def test_the_bench_peer_is_transformers_on_the_same_weights(gemma):
    from kvviz.measure.bench import to_transformers

    peer, _, model = gemma
    rebuilt = to_transformers(model)
    with torch.no_grad():
        ids = torch.tensor([PROMPT_IDS])
        assert type(rebuilt).__name__ == "Gemma4ForCausalLM"
        assert torch.allclose(rebuilt(ids).logits, peer(ids).logits, atol=1e-5, rtol=0)
