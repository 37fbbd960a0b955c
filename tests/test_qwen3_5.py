"""The Qwen3.5 family: Gated DeltaNet layers and gated attention against transformers' Qwen3_5ForCausalLM on random
weights the tests make, the DeltaNet state against transformers' cache, the cache's bytes (a constant state beside
the attention layers' keys and values) against hand counts, and what it refuses."""

from __future__ import annotations

import json

import pytest
import torch
from helpers_checkpoints import byte_level_tokenizer, peer_greedy, plan_ids, spread_peer

from kvviz.cache.kv_cache import build_cache
from kvviz.core.errors import ModelLoadError
from kvviz.core.records import EXACT
from kvviz.engine.engine import Engine
from kvviz.engine.sampling import SamplingSettings
from kvviz.models.qwen3_5 import PRESETS, Qwen35, Qwen35Config
from kvviz.sources.weights import load_checkpoint

transformers = pytest.importorskip("transformers")

PROMPT_IDS = [5, 17, 42, 8, 99, 3, 61]  # 7 tokens: past the convolution's window of 4
NEW = 24
# the test shape: 4 layers (3 Gated DeltaNet, then attention); DeltaNet with 2 key heads of 8 serving 4 value heads
# of 8 and a convolution of 4 positions; attention with 4 query heads on 2 KV heads of 16, RoPE on 4 of them
TEXT = dict(vocab_size=500, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
            linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel_dim=4, max_position_embeddings=64,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25})
# a linear layer's state, by hand: its convolution's window, (2 x 2 x 8 + 4 x 8) channels x 3 positions, and its
# recurrent state, 4 value heads x 8 x 8, in float32
STATE_BYTES = (64 * 3 + 4 * 8 * 8) * 4  # 1,792
KV_BYTES = 2 * 2 * 16 * 4  # an attention layer's position: (K, V) x 2 KV heads x 16 numbers x 4 bytes = 256


def tokens(records) -> list[int]:
    return [r.token_id for r in records if r.token_id is not None]


def spread(peer):
    """spread_peer's weights, with the gated norms' weights near 1 (spread_peer puts them near 0)."""
    with torch.no_grad():
        for name, p in peer.named_parameters():
            if name.endswith("linear_attn.norm.weight"):
                p.add_(1.0)
    return peer


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    config = transformers.Qwen3_5TextConfig(**TEXT, tie_word_embeddings=False)
    peer = spread(spread_peer(transformers.Qwen3_5ForCausalLM, config, 5))
    folder = tmp_path_factory.mktemp("qwen3_5") / "model"
    peer.save_pretrained(folder)
    byte_level_tokenizer(500).save(str(folder / "tokenizer.json"))
    return peer, folder, load_checkpoint(folder)


def test_matches_transformers_logits_and_greedy_tokens_cached_and_uncached(hybrid):
    peer, _, model = hybrid
    assert model.config.kinds == ("linear_attention",) * 3 + ("full_attention",)
    engine = Engine(model)
    cached = list(engine.run(plan_ids(engine, PROMPT_IDS, NEW, use_cache=True)))
    uncached = list(engine.run(plan_ids(engine, PROMPT_IDS, NEW, use_cache=False)))
    reference = peer_greedy(peer, PROMPT_IDS, NEW)
    assert tokens(cached) == tokens(uncached) == reference
    assert len(set(reference)) > 5, "weights this flat would not test much"
    sequence = torch.tensor([PROMPT_IDS + reference])
    cache = build_cache(model.config.cache_layers(EXACT), sequence.shape[1])
    with torch.no_grad():
        expected = peer(sequence).logits[0]  # (T, V)
        uncached_logits = model(sequence)[0]
        cached_logits = torch.cat([model(sequence[:, :7], kv_cache=cache)[0]] +  # the prompt, then a token a pass
                                  [model(sequence[:, t:t + 1], kv_cache=cache)[0] for t in range(7, sequence.shape[1])])
    assert torch.allclose(uncached_logits, expected, atol=1e-4, rtol=0)
    assert torch.allclose(cached_logits, expected, atol=1e-4, rtol=0)
    # the bytes: the attention layer's keys and values of 31 positions, and 3 states, whatever the length
    assert cached[-1].cache_bytes == 31 * 1 * KV_BYTES + 3 * STATE_BYTES == 13_312
    assert cached[-1].kv_computed == (1, 1, 1, 1)  # each layer computed the new position's key and value ...
    assert cached[-1].kv_reused == (0, 0, 0, 30)  # ... the attention layer re-read 30; a state layer re-reads none


def test_the_deltanet_state_after_the_prompt_is_transformers_cache_state(hybrid):
    """The convolution's window and the recurrent state each linear layer keeps after the prompt are what
    transformers' cache keeps (its window holds one more input, which its convolution never reads again)."""
    peer, _, model = hybrid
    cache = build_cache(model.config.cache_layers(EXACT), len(PROMPT_IDS))
    ids = torch.tensor([PROMPT_IDS])
    with torch.no_grad():
        model(ids, kv_cache=cache)  # the prefill
        theirs = peer(ids, use_cache=True).past_key_values
    for layer in range(3):
        conv, recurrent = cache.layers[layer].read()  # (1, 64, 3), (1, 4, 8, 8)
        assert conv.shape == (1, 64, 3) and recurrent.shape == (1, 4, 8, 8)
        assert torch.allclose(conv, theirs.layers[layer].conv_states[0][..., 1:], atol=1e-4, rtol=0)
        assert torch.allclose(recurrent, theirs.layers[layer].recurrent_states[0], atol=1e-4, rtol=0)
        assert recurrent.abs().max() > 0.05, "a state this small would not test much"
    keys, values = cache.layers[3].kv[:, 0, :, :7]  # the attention layer: every position's key and value
    assert torch.allclose(keys, theirs.layers[3].keys[0], atol=1e-4, rtol=0)
    assert torch.allclose(values, theirs.layers[3].values[0], atol=1e-4, rtol=0)


def test_seeded_sampling_is_the_same_with_and_without_the_cache(hybrid):
    _, _, model = hybrid
    engine = Engine(model)
    sampling = SamplingSettings(temperature=0.9, top_k=40, seed=11)
    cached = tokens(engine.run(plan_ids(engine, PROMPT_IDS, NEW, True, sampling)))
    uncached = tokens(engine.run(plan_ids(engine, PROMPT_IDS, NEW, False, sampling)))
    assert cached == uncached and len(cached) == NEW


def test_the_probe_counts_every_layers_rows_and_gives_a_linear_layer_no_attention_row(hybrid):
    """A DeltaNet layer computes a key and a value a position (it keeps none): counted. It has no attention weights
    over positions: its row of the attention record is NaN; the attention layer's sums to 1."""
    _, _, model = hybrid
    engine = Engine(model)
    records = list(engine.run(plan_ids(engine, PROMPT_IDS, 2, attention=True)))
    assert records[0].kv_computed == (7, 7, 7, 7)
    weights = records[-1].attention
    assert (weights.layers, weights.heads, weights.positions) == (4, 4, 9)
    for layer in range(3):
        assert all(w != w for w in weights.row(layer, 0))  # NaN: no weights over positions
    assert sum(weights.row(3, 2)) == pytest.approx(1.0)


def test_the_state_stays_the_same_size_from_1000_to_2000_positions():
    """bytes_used less the attention layer's keys and values, counted by hand, is the same constant after 1,000
    positions and after 2,000: one layer's state, (16 channels x 3 + 2 heads x 4 x 4) x 4 bytes."""
    config = Qwen35Config(vocab_size=64, n_ctx=2048, n_layer=2, n_head=2, n_kv_head=1, head_size=8, n_embd=16,
                          intermediate_size=16, layer_types=("linear_attention", "full_attention"),
                          linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=4,
                          linear_value_head_dim=4, partial_rotary_factor=0.5)
    model = Qwen35(config)
    model.init_weights(torch.Generator().manual_seed(0))
    cache = build_cache(config.cache_layers(EXACT), 2048)
    ids = torch.randint(0, 64, (1, 2000), generator=torch.Generator().manual_seed(1))
    beside_the_keys = []
    with torch.inference_mode():
        for start in range(0, 2000, 500):  # four passes of 500
            model(ids[:, start:start + 500], torch.arange(start, start + 500), cache, last_only=True)
            if cache.length in (1000, 2000):
                beside_the_keys.append(cache.bytes_used - cache.length * 2 * 1 * 8 * 4)
    assert beside_the_keys == [(16 * 3 + 2 * 4 * 4) * 4] * 2 == [320, 320]
    assert cache.layers[0].positions_held == 0 and cache.layers[0].length == 2000
    assert config.cache_shape().cache_bytes(2000) == 2000 * 64 + 320


def test_a_six_layer_cache_measures_its_hand_count():
    """Layers L L L A L L (every fourth is attention): 5 states and one layer of keys and values."""
    config = Qwen35Config(vocab_size=500, n_ctx=64, n_layer=6, n_head=4, n_kv_head=2, head_size=16, n_embd=32,
                          intermediate_size=64, linear_num_key_heads=2, linear_num_value_heads=4,
                          linear_key_head_dim=8, linear_value_head_dim=8)
    assert config.kinds == ("linear_attention",) * 3 + ("full_attention",) + ("linear_attention",) * 2
    model = Qwen35(config)
    model.init_weights(torch.Generator().manual_seed(2))
    engine = Engine(model)
    plan = plan_ids(engine, [1, 2, 3, 4, 5], 3)
    records = list(engine.run(plan))
    assert records[-1].cache_bytes == 8 * 2 * 2 * 16 * 4 + 5 * (64 * 3 + 4 * 8 * 8) * 4 == 11_008
    assert plan.cache_bytes_per_position == 2 * 2 * 16 * 4  # only the attention layer's grow
    assert config.cache_shape().cache_bytes(8) == 11_008
    assert records[-1].layer_positions_held == (0, 0, 0, 8, 0, 0)


def test_the_preset_is_qwen3_5_0_8b_text_shape_counted_by_hand():
    """Qwen3.5-0.8B: 24 layers, 18 DeltaNet (16 key and 16 value heads of 128, a window of 4) and 6 attention (8
    query heads on 2 KV heads of 256); GPT-2's vocabulary. Built on the meta device: 2.2 GB of float32."""
    config = PRESETS["qwen3.5-0.8b"]
    shape = config.cache_shape()
    assert shape.bytes_per_token() == 6 * 2 * 2 * 256 * 4 == 24_576
    assert shape.fixed_bytes() == 18 * ((2 * 16 * 128 + 16 * 128) * 3 + 16 * 128 * 128) * 4 == 20_201_472
    assert shape.cache_bytes(1000) == 1000 * 24_576 + 20_201_472
    with torch.device("meta"):
        model = Qwen35(config)
    mlp, norms = 3 * 1024 * 3584, 2 * 1024
    deltanet = 1024 * 6144 + 1024 * 2048 + 2 * 1024 * 16 + 6144 * 4 + 16 + 16 + 128 + 2048 * 1024
    attention = 1024 * 4096 + 2 * 1024 * 512 + 2048 * 1024 + 2 * 256
    assert model.num_parameters() == 50257 * 1024 + 18 * (deltanet + mlp + norms) + 6 * (attention + mlp + norms) \
        + 1024 == 549_576_512


def test_what_it_cannot_run_is_refused_in_one_line(hybrid, kvviz_cli, tmp_path):
    _, folder, _ = hybrid
    for extra in (("--window", "4"), ("--kv-dtype", "int8"), ("--window", "4", "--sinks", "1")):
        done = kvviz_cli("generate", "--model", str(folder), "--prompt", "hi", "--max-new-tokens", "2", *extra)
        assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
        assert "keeps a Gated DeltaNet state in 3 of its 4 layers" in done.stderr
    from kvviz.models.qwen3_5_format import config_from_json

    raw = json.loads((folder / "config.json").read_text())
    for change, message in (({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, "rope_type \"yarn\""),
                            ({"attention_bias": True}, "attention_bias"), ({"hidden_act": "gelu"}, "hidden_act"),
                            ({"layer_types": ["linear_attention"] * 4 + ["sliding"]}, "layer_types")):
        (tmp_path / "config.json").write_text(json.dumps({**raw, **change}))
        with pytest.raises(ModelLoadError, match=message) as caught:
            config_from_json(tmp_path / "config.json")
        assert str(caught.value).startswith(str(tmp_path / "config.json")) and "\n" not in str(caught.value)


def test_a_multimodal_checkpoint_runs_its_text_model_as_transformers_does(tmp_path):
    """Qwen3_5ForConditionalGeneration's checkpoint (the published one's layout: the text model under
    model.language_model, a vision tower beside it): kvviz loads the text model and, on text, where every RoPE
    section takes the token's position, gives transformers' logits."""
    vision = dict(depth=1, hidden_size=16, num_heads=2, intermediate_size=32, out_hidden_size=32, patch_size=2,
                  temporal_patch_size=1, spatial_merge_size=1, num_position_embeddings=16)
    config = transformers.Qwen3_5Config(text_config={**TEXT, "tie_word_embeddings": True}, vision_config=vision,
                                        tie_word_embeddings=True)
    peer = spread(spread_peer(transformers.Qwen3_5ForConditionalGeneration, config, 6))
    peer.save_pretrained(tmp_path)
    model = load_checkpoint(tmp_path)
    assert model.config.tie_word_embeddings and not any("visual" in key for key in model.state_dict())
    ids = torch.tensor([PROMPT_IDS])
    with torch.no_grad():
        assert torch.allclose(model(ids), peer(input_ids=ids).logits, atol=1e-4, rtol=0)


def test_a_state_layer_refuses_to_roll_back_past_what_it_kept():
    from kvviz.cache.state import StateLayer

    layer = StateLayer((2, 3), (1, 2, 2), spare=2)
    for start, count in ((0, 4), (4, 1), (5, 1), (6, 1)):  # passes ending at 4, 5, 6 and 7
        layer.write(torch.arange(start, start + count), torch.full((1, 2, 3), float(start)), torch.zeros(1, 1, 2, 2))
    assert layer.bytes_held == 3 * (2 * 3 + 1 * 2 * 2) * 4  # the state and its 2 snapshots
    with pytest.raises(ValueError, match="cannot roll back to position 4: .* kept the state at 5, 6 only"):
        layer.crop(4)
    layer.crop(5)  # kept: the state before the pass that fed 5
    assert layer.length == 5 and torch.equal(layer.read()[0], torch.full((1, 2, 3), 4.0))
    layer.crop(0)  # the zero state, always
    assert layer.length == 0 and not layer.read()[0].any() and layer.bytes_held == (2 * 3 + 4) * 4
    with pytest.raises(TypeError, match="read\\(\\) its state"):
        layer.update(0, torch.zeros(1), torch.zeros(1))


def test_the_bench_peer_is_transformers_on_the_same_weights(hybrid):
    from kvviz.measure.bench import to_transformers

    peer, _, model = hybrid
    rebuilt = to_transformers(model)
    ids = torch.tensor([PROMPT_IDS])
    with torch.no_grad():
        assert type(rebuilt).__name__ == "Qwen3_5ForCausalLM"
        assert torch.allclose(rebuilt(ids).logits, peer(ids).logits, atol=1e-5, rtol=0)
