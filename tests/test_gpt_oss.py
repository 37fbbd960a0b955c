"""The gpt-oss family: learned attention sinks, its own sliding windows on alternate layers, YaRN and a mixture of
experts, against transformers' GptOssForCausalLM on random weights the tests make; its cache measured against a
hand count, the sinks' share of attention, and what it refuses."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from helpers_checkpoints import byte_level_tokenizer, peer_greedy, plan_ids, spread_peer

from kvviz.cache.kv_cache import build_cache
from kvviz.cache.probe import PassProbe
from kvviz.core.errors import GenerationError, ModelLoadError
from kvviz.core.records import EXACT
from kvviz.engine.engine import Engine, SamplingSettings
from kvviz.sources.weights import checkpoint_tokenizer, load_checkpoint

transformers = pytest.importorskip("transformers")

PROMPT_IDS = [5, 17, 42, 8, 99, 3, 61]  # 7 tokens: past the window of 4, and past YaRN's original context soon
NEW_TOKENS = 24
TOLERANCE = 1e-4


def tokens(records) -> list[int]:
    return [r.token_id for r in records if r.token_id is not None]


def gpt_oss_config(**overrides):
    """6 layers, sliding (window 4) and full alternating, 4 query heads on 2 KV heads of 16, 4 experts of 32 (top 2),
    YaRN 4 on an original context of 16: the positions of a run pass it, so every kind of pair turns."""
    settings = dict(vocab_size=300, hidden_size=64, intermediate_size=32, num_hidden_layers=6, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=4,
                    max_position_embeddings=64, tie_word_embeddings=False, attn_implementation="eager",
                    rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "beta_fast": 32.0,
                                     "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 16})
    return transformers.GptOssConfig(**{**settings, **overrides})


def gpt_oss_peer(config, seed: int):
    """transformers' model with spread random weights, its norms near 1 (spread_peer's norms near 0 would leave
    every logit near 0, and a test at 1e-4 would hold little)."""
    peer = spread_peer(transformers.GptOssForCausalLM, config, seed)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in peer.named_parameters():
            if name.endswith("norm.weight"):
                parameter.copy_(1.0 + 0.1 * torch.randn(parameter.shape, generator=generator))
    return peer


def saved(peer, folder):
    peer.save_pretrained(folder)
    byte_level_tokenizer(300).save(str(folder / "tokenizer.json"))
    return load_checkpoint(folder)


@pytest.fixture(scope="module")
def oss(tmp_path_factory):
    peer = gpt_oss_peer(gpt_oss_config(), 7)
    folder = tmp_path_factory.mktemp("gpt_oss") / "model"
    model = saved(peer, folder)
    with torch.no_grad():
        reference = peer_greedy(peer, PROMPT_IDS, NEW_TOKENS)
    return peer, folder, model, reference


def engine_of(model, folder) -> Engine:
    """An engine with the checkpoint's own tokenizer (GPT-2's would take a second to load, and is not the model's)."""
    return Engine(model, checkpoint_tokenizer(folder, model))


def cached_logits(model, ids: list[int], prefill: int) -> torch.Tensor:
    """Every position's logits (T, V): a prefill of `prefill` tokens, then one token a pass, through the cache the
    model's config asks for (windows of 4 on the sliding layers)."""
    cache = build_cache(model.config.cache_layers(EXACT), len(ids))
    with torch.no_grad():
        rows = [model(torch.tensor([ids[:prefill]]), torch.arange(prefill), cache)[0]]
        for position in range(prefill, len(ids)):
            rows.append(model(torch.tensor([[ids[position]]]), torch.tensor([position]), cache)[0])
    return torch.cat(rows)


def test_logits_equal_transformers_with_and_without_the_cache(oss):
    peer, _, model, reference = oss
    ids = PROMPT_IDS + reference
    with torch.no_grad():
        expected = peer(torch.tensor([ids])).logits[0]  # (T, V)
        uncached = model(torch.tensor([ids]))[0]
    assert expected.abs().max() > 1.0, "logits this flat would not test much"
    assert torch.allclose(uncached, expected, atol=TOLERANCE, rtol=0)
    assert torch.allclose(cached_logits(model, ids, 3), expected, atol=TOLERANCE, rtol=0)


def test_greedy_tokens_equal_cached_uncached_and_transformers_and_the_bytes_a_hand_count(oss):
    _, folder, model, reference = oss
    engine = engine_of(model, folder)
    cached = list(engine.run(plan_ids(engine, PROMPT_IDS, NEW_TOKENS, use_cache=True)))
    uncached = list(engine.run(plan_ids(engine, PROMPT_IDS, NEW_TOKENS, use_cache=False)))
    assert tokens(cached) == tokens(uncached) == reference
    assert len(set(reference)) > 5, "weights this flat would not test much"
    # 31 positions: the 3 full layers keep all, the 3 sliding ones their window of 4; 2 KV heads x 16 x 4 bytes,
    # a key and a value
    hand_count = 3 * 31 * 2 * 2 * 16 * 4 + 3 * 4 * 2 * 2 * 16 * 4
    assert cached[-1].cache_bytes == hand_count == 26880
    assert cached[-1].layer_positions_held == (4, 31, 4, 31, 4, 31)
    assert model.config.cache_shape().cache_bytes(31) == hand_count  # the memory figures say the same
    assert cached[-1].kv_computed_total == 31  # a key and value a position and layer, computed once


def test_seeded_sampling_is_the_same_with_and_without_the_cache(oss):
    _, folder, model, _ = oss
    engine = engine_of(model, folder)
    sampling = SamplingSettings(temperature=1.0, top_k=20, seed=3)
    cached = tokens(engine.run(plan_ids(engine, PROMPT_IDS, NEW_TOKENS, True, sampling), sampling))
    uncached = tokens(engine.run(plan_ids(engine, PROMPT_IDS, NEW_TOKENS, False, sampling), sampling))
    assert cached == uncached and len(cached) == NEW_TOKENS


def test_the_sinks_share_and_the_positions_weights_sum_to_one_as_transformers_weighs_them(oss):
    """The newest query's weights over the positions are transformers' (its eager attention drops the sink's
    column too), and what they leave to 1 is the sink's recorded share, which is no rounding error."""
    peer, _, model, reference = oss
    ids = PROMPT_IDS + reference[:5]  # 12 positions
    probe = PassProbe(model.config.n_layer, record_attention=True)
    with torch.no_grad():
        model(torch.tensor([ids]), probe=probe)
        attentions = peer(torch.tensor([ids]), output_attentions=True).attentions
    assert len(probe.attention) == len(probe.sink_shares) == 6
    for layer, (weights, share) in enumerate(zip(probe.attention, probe.sink_shares, strict=True)):
        assert weights.shape == (4, 12) and share.shape == (4,) and share.dtype == torch.float32
        assert torch.allclose(weights, attentions[layer][0, :, -1, :], atol=1e-5, rtol=0)
        assert torch.allclose(weights.sum(dim=-1) + share, torch.ones(4), atol=1e-5, rtol=0)
        assert bool((share > 1e-3).all()), f"layer {layer}'s sinks take {share.tolist()}"
        if layer % 2 == 0:  # a sliding layer: the newest query sees its window of 4 only
            assert bool((weights[:, :8] == 0).all()) and bool((weights[:, 8:] > 0).all())


def test_without_the_sinks_the_logits_part_from_transformers(oss):
    """A sink logit of -inf takes no share: the plain softmax. The logits then differ, so the sinks are tested."""
    peer, _, model, reference = oss
    plain = copy.deepcopy(model)
    with torch.no_grad():
        for block in plain.blocks:
            block.self_attn.sinks.fill_(float("-inf"))
        ids = torch.tensor([PROMPT_IDS + reference])
        gap = (plain(ids)[0] - peer(ids).logits[0]).abs().max()
    assert gap > 100 * TOLERANCE


def test_the_bench_peer_is_transformers_on_the_same_weights(oss):
    from kvviz.measure.bench import to_transformers

    peer, _, model, _ = oss
    rebuilt = to_transformers(model)
    with torch.no_grad():
        ids = torch.tensor([PROMPT_IDS])
        assert type(rebuilt).__name__ == "GptOssForCausalLM"
        assert torch.allclose(rebuilt(ids).logits, peer(ids).logits, atol=1e-5, rtol=0)


def test_plain_rope_tied_mqa_without_biases_and_windows_where_layer_types_say(tmp_path):
    """Another shape: plain RoPE, a tied head, one KV head, no biases, the windows on layers 1 and 2 only."""
    config = gpt_oss_config(num_hidden_layers=4, num_key_value_heads=1, tie_word_embeddings=True,
                            attention_bias=False, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                            layer_types=["full_attention", "sliding_attention", "sliding_attention",
                                         "full_attention"])
    peer = gpt_oss_peer(config, 3)
    model = saved(peer, tmp_path / "model")
    assert model.config.yarn is None and model.config.sliding == (False, True, True, False)
    ids = PROMPT_IDS + [11, 250, 7, 140, 33]
    with torch.no_grad():
        expected = peer(torch.tensor([ids])).logits[0]
        assert torch.allclose(model(torch.tensor([ids]))[0], expected, atol=TOLERANCE, rtol=0)
    assert torch.allclose(cached_logits(model, ids, 5), expected, atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize(("changes", "message"), [
    ({"quantization_config": {"quant_method": "mxfp4"}},
     'quantization_config "mxfp4": kvviz runs unquantized gpt-oss weights only'),
    ({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 150000.0}},
     'rope_type "linear" is not supported; kvviz runs gpt-oss with YaRN (yarn) or plain RoPE'),
    ({"layer_types": ["sliding_attention"] * 5}, "layer_types must list 6 layers, each sliding_attention or "
                                                 "full_attention"),
    ({"num_local_experts": 8}, "num_local_experts=8 is more than the weights in model.safetensors have"),
], ids=["mxfp4", "linear-rope", "layer-types", "more-experts"])
def test_what_kvviz_does_not_run_is_named_in_one_line(oss, tmp_path, changes, message):
    _, folder, _, _ = oss
    raw = json.loads((folder / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**raw, **changes}))
    (tmp_path / "model.safetensors").symlink_to(folder / "model.safetensors")
    with pytest.raises(ModelLoadError) as caught:
        load_checkpoint(tmp_path)
    text = str(caught.value)
    assert text.startswith(f"{tmp_path / 'config.json'}: {message}") and "\n" not in text, text


def test_a_quantized_checkpoint_and_a_user_window_are_refused_in_one_line(oss, tmp_path, kvviz_cli):
    _, folder, model, _ = oss
    raw = json.loads((folder / "config.json").read_text())
    quantized = tmp_path / "quantized"
    quantized.mkdir()
    (quantized / "config.json").write_text(json.dumps({**raw, "quantization_config": {"quant_method": "mxfp4"}}))
    (quantized / "model.safetensors").symlink_to(folder / "model.safetensors")
    done = kvviz_cli("generate", "--model", str(quantized), "--prompt", "x")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith(f"kvviz: {quantized / 'config.json'}: quantization_config \"mxfp4\"")
    assert len(done.stderr.splitlines()) == 1
    engine = engine_of(model, folder)
    for options in ({"window": 8}, {"window": 8, "sinks": 2}, {"kv_dtype": "int8"}):
        with pytest.raises(GenerationError, match="keeps its own sliding windows .4 positions on its sliding "
                                                  "layers.: kvviz runs it without --window, --sinks, --evict or "
                                                  "--kv-dtype"):
            engine.policy(**options)


def test_the_20b_attention_preset_caches_what_gpt_oss_20b_caches_a_position():
    """gpt-oss-20b: 24 layers of 8 KV heads of 64, every other one a window of 128. Its YaRN frequencies and
    attention factor are transformers' for the published config (factor 32 on 4096 positions, theta 150000)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from kvviz.models.families import PRESETS
    from kvviz.models.gpt_oss import GptOss, yarn_frequencies

    family, config = PRESETS["gpt-oss-20b-attention"]
    shape = config.cache_shape()
    assert shape.bytes_per_token() == 24 * 2 * 8 * 64 * 4  # while the windows fill: 98,304 bytes
    assert shape.cache_bytes(1000) == 12 * 1000 * 2 * 8 * 64 * 4 + 12 * 128 * 2 * 8 * 64 * 4
    assert shape.bytes_per_token("bfloat16") == 24 * 2 * 8 * 64 * 2  # the published model's cache: 49,152 bytes
    assert [kind.kind for kind in config.cache_layers(EXACT)] == ["window", "full"] * 12
    with torch.device("meta"):
        model = family.model(config)
    assert isinstance(model, GptOss) and model.num_parameters() < 300_000_000  # 1.2 GB in float32
    attention = model.blocks[0].self_attn
    assert (attention.q_proj.out_features, attention.k_proj.out_features, attention.sinks.shape) == (
        64 * 64, 8 * 64, (64,))
    published = transformers.GptOssConfig()  # gpt-oss's defaults: the published YaRN
    frequencies, scale = yarn_frequencies(64, config.rope_theta, config.yarn)
    expected, expected_scale = ROPE_INIT_FUNCTIONS["yarn"](published, "cpu")
    assert torch.allclose(frequencies, expected, rtol=1e-6, atol=0) and scale == pytest.approx(expected_scale)
