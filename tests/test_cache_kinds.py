"""Every kind of layer cache keeps one contract: what `update` returns reads back with its positions, `crop` rolls the
cache back so that the same steps again give the same tokens and logits, and the bytes held equal a hand count."""

from __future__ import annotations

import pytest
import torch

from kvviz.cache.kv_cache import build_cache, full_cache
from kvviz.cache.latent import LatentLayer
from kvviz.cache.layers import FullLayer, LateWriteLayer
from kvviz.cache.quantized import QuantizedLayer
from kvviz.cache.window import WindowLayer
from kvviz.core.records import CachePolicy
from kvviz.engine.compare import logit_tolerance
from kvviz.models.deepseek import Deepseek, DeepseekConfig
from kvviz.models.gemma3 import Gemma3, Gemma3Config
from kvviz.models.gemma4 import Gemma4, Gemma4Config
from kvviz.models.llama import Llama, LlamaConfig
from kvviz.models.qwen3_5 import Qwen35, Qwen35Config

LLAMA = LlamaConfig(vocab_size=64, n_ctx=64, n_layer=2, n_head=4, n_kv_head=2, n_embd=32, intermediate_size=48,
                    name="tiny-llama")  # head_dim 8
DEEPSEEK = DeepseekConfig(vocab_size=64, n_ctx=64, n_layer=2, n_head=2, n_embd=32, intermediate_size=48,
                          kv_lora_rank=8, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, name="tiny-mla")
GEMMA3 = Gemma3Config(vocab_size=64, n_ctx=64, n_layer=2, n_head=4, n_kv_head=2, n_embd=32, intermediate_size=48,
                      head_dim=8, layer_types=("sliding_attention", "full_attention"), sliding_window=4,
                      name="tiny-gemma3")  # a local layer (window 4) under a global one
GEMMA4 = Gemma4Config(vocab_size=64, n_ctx=64, n_layer=4, n_head=4, n_kv_head=2, n_embd=32, intermediate_size=48,
                      head_size=8, global_head_dim=8, sliding_window=4, num_kv_shared_layers=2,
                      layer_types=("sliding_attention", "full_attention") * 2,
                      name="tiny-gemma4")  # layers 2 and 3 read layer 0's (window 4) and layer 1's keys and values
QWEN35 = Qwen35Config(vocab_size=64, n_ctx=64, n_layer=2, n_head=4, n_kv_head=2, head_size=8, n_embd=32,
                      intermediate_size=48, layer_types=("linear_attention", "full_attention"), linear_num_key_heads=2,
                      linear_num_value_heads=4, linear_key_head_dim=4, linear_value_head_dim=4,
                      partial_rotary_factor=0.5, name="tiny-deltanet")  # a Gated DeltaNet layer under attention
PROMPT = [5, 17, 3, 42, 8, 29]  # P = 6
NEW = 6  # tokens decoded before the crop
CROP_TO = len(PROMPT) + 2  # back to two tokens after the prompt
# kind: (config, policy, fault, spare, bytes held at 12 positions, counted by hand)
KINDS = {
    # 2 layers x (K, V) x 2 KV heads x 8 numbers x 4 bytes = 256 bytes a position
    "full": (LLAMA, CachePolicy(), "", 0, 12 * 256),
    "late_write": (LLAMA, CachePolicy(), "late_write", 0, 12 * 256),
    # the first position and the last 4, plus 3 spare to roll back into: 8 positions of the 12
    "window": (LLAMA, CachePolicy(window=4, sinks=1), "", 3, 8 * 256),
    # int8: 2 layers x (K, V) x 2 heads x (8 one-byte numbers + a 4-byte float32 scale) = 96 bytes a position
    "quantized": (LLAMA, CachePolicy(kv_dtype="int8"), "", 0, 12 * 96),
    # KIVI, int8, groups of 8 keys: at 12 positions keys 0-7 in a group, 8-11 exact (and at 8, where the crop goes,
    # the same group); a layer: key codes 2 heads x 8 x 8 x 1 + their scales 2 x 1 group x 8 channels x 4 + exact
    # keys 2 x 4 x 8 x 4 + value codes 2 x 12 x 8 x 1 + value scales 2 x 12 x 4 = 128 + 64 + 256 + 192 + 96 = 736
    "kivi": (LLAMA, CachePolicy(kv_dtype="int8", kv_layout="kivi", kv_residual=8), "", 0, 2 * 736),
    # 2 layers x (latent 8 + RoPE key 4) x 4 bytes = 96 bytes a position
    "latent": (DEEPSEEK, CachePolicy(), "", 0, 12 * 96),
    # the local layer's last 4 and 3 spare (7 of the 12), the global layer's 12: x (K, V) x 2 x 8 x 4 bytes
    "gemma3": (GEMMA3, CachePolicy(), "", 3, (7 + 12) * 128),
    # the attention layer's 12 positions x (K, V) x 2 x 8 x 4 bytes; the DeltaNet layer's state, (32 channels x 3 +
    # 4 heads x 4 x 4) x 4 bytes, and the 4 snapshots it keeps to roll back 4 passes
    "state": (QWEN35, CachePolicy(), "", 4, 12 * 128 + (1 + 4) * (32 * 3 + 4 * 4 * 4) * 4),
    # the sliding layer's last 4 and 3 spare, the global layer's 12, x (K, V) x 2 x 8 x 4 bytes; the shared ones none
    "shared": (GEMMA4, CachePolicy(), "", 3, (7 + 12) * 128 + 0 + 0),
}


def _model(config):
    model = (Llama if isinstance(config, LlamaConfig) else Gemma3 if isinstance(config, Gemma3Config) else
             Qwen35 if isinstance(config, Qwen35Config) else Gemma4 if isinstance(config, Gemma4Config) else
             Deepseek)(config)
    model.init_weights(torch.Generator().manual_seed(3))
    with torch.no_grad():  # wider weights than the initialisation's, so that the logits tell tokens apart
        for p in model.parameters():
            p.mul_(8.0 if p.dim() > 1 else 1.0)
    return model.eval()


def _cache(kind: str, capacity: int = 32):
    config, policy, fault, spare, _ = KINDS[kind]
    return build_cache(config.cache_layers(policy), capacity, fault=fault, spare=spare)


@torch.no_grad()
def _steps(model, cache, tokens: list[int], start: int) -> tuple[list[int], list[torch.Tensor]]:
    """Feed `tokens` one pass each from position `start`, choosing nothing: the logits of each pass and their
    greedy tokens."""
    logits = []
    for i, token in enumerate(tokens):
        out = model(torch.tensor([[token]]), torch.tensor([start + i]), cache, last_only=True)[0, -1]  # (V,)
        logits.append(out)
    return [int(x.argmax()) for x in logits], logits


@torch.no_grad()
def _greedy(model, cache, new: int) -> list[int]:
    """Prefill PROMPT, then decode `new` greedy tokens; the tokens."""
    out = model(torch.tensor([PROMPT]), torch.arange(len(PROMPT)), cache, last_only=True)[0, -1]
    tokens = [int(out.argmax())]
    while len(tokens) < new:
        chosen, _ = _steps(model, cache, tokens[-1:], len(PROMPT) + len(tokens) - 1)
        tokens.append(chosen[0])
    return tokens


@pytest.mark.parametrize("kind", list(KINDS))
def test_crop_then_the_same_steps_give_the_same_tokens_and_logits(kind):
    """Decode past a point, crop back to it, decode the same tokens again: the second pass over them gives what a
    run that never went past the point gives (a fresh cache fed only up to it)."""
    config = KINDS[kind][0]
    model = _model(config)
    upto = CROP_TO - len(PROMPT) + 1  # greedy tokens whose run has fed CROP_TO positions
    tokens = _greedy(model, _cache(kind), NEW + 1)
    replay = tokens[upto - 1:NEW]  # what the positions from CROP_TO on are fed

    went_past = _cache(kind)
    _greedy(model, went_past, upto)
    _steps(model, went_past, replay, CROP_TO)  # past the point ...
    assert went_past.length == CROP_TO + len(replay)
    went_past.crop(CROP_TO)  # ... and back
    assert went_past.length == CROP_TO
    again, again_logits = _steps(model, went_past, replay, CROP_TO)

    never = _cache(kind)
    _greedy(model, never, upto)
    expected, expected_logits = _steps(model, never, replay, CROP_TO)
    assert again == expected == tokens[upto:NEW + 1]
    for got, want in zip(again_logits, expected_logits, strict=True):
        assert (got - want).abs().max() <= logit_tolerance(torch.float32, float(want.abs().max()))


@pytest.mark.parametrize("kind", list(KINDS))
def test_bytes_held_equal_a_hand_count(kind):
    config = KINDS[kind][0]
    cache = _cache(kind)
    _greedy(_model(config), cache, 7)  # 6 prompt positions, then 6 decoded: 12 fed (the 7th token is not fed)
    assert cache.length == 12
    assert cache.bytes_used == KINDS[kind][4]


@pytest.mark.parametrize("layer", [
    FullLayer(2, 4, 8),
    LateWriteLayer(2, 4, 8),
    WindowLayer(2, 4, window=3, sinks=1),
    QuantizedLayer(2, 4, 8, "int8"),
], ids=["full", "late_write", "window", "quantized"])
def test_update_reads_back_each_row_at_its_position(layer):
    """A prefill of 5 rows, then one row at a time: every row returned is the row fed at the position returned
    with it (a quantized layer's within half its step; the late write's newest row is where its bug left it)."""
    torch.manual_seed(0)
    fed = torch.randn(2, 1, 2, 8, 4)  # (K/V, B, heads, positions, d)
    held = layer.update(torch.arange(5), fed[0, :, :, :5], fed[1, :, :, :5])
    for p in range(5, 8):
        held = layer.update(torch.tensor([p]), fed[0, :, :, p:p + 1], fed[1, :, :, p:p + 1])
        at = list(range(held.keys.shape[2])) if held.positions is None else held.positions.tolist()
        assert at[-1] == p or isinstance(layer, WindowLayer)
        for slot, position in enumerate(at):
            if isinstance(layer, LateWriteLayer) and position >= 5:
                continue  # decoded rows go one slot late: checked below
            for i, rows in enumerate((held.keys, held.values)):
                error = (rows[:, :, slot] - fed[i, :, :, position]).abs().max()
                assert error <= (fed[i, :, :, position].abs().max() / 127 / 2 + 1e-6 if isinstance(
                    layer, QuantizedLayer) else 0.0)
    if isinstance(layer, WindowLayer):
        assert sorted(held.positions.tolist()) == [0, 5, 6, 7] and (held.window, held.sinks) == (3, 1)
    if isinstance(layer, LateWriteLayer):
        assert torch.equal(held.keys[:, :, 5], torch.zeros(1, 2, 4))  # position 5's slot: never written
        assert torch.equal(held.keys[:, :, 7], fed[0, :, :, 6])  # the newest query's own slot: the row before it
        assert layer.last_written == (8, 8)  # position 7's row went to the slot past the buffer: written nowhere


def test_a_latent_layer_reads_back_latent_and_rope_key_at_each_position():
    layer = LatentLayer(rank=6, rope_dim=2, capacity=8)
    c_kv, k_pe = torch.randn(1, 4, 6), torch.randn(1, 4, 2)
    held = layer.update(torch.arange(3), c_kv[:, :3], k_pe[:, :3])
    held = layer.update(torch.tensor([3]), c_kv[:, 3:], k_pe[:, 3:])
    assert held.positions is None and torch.equal(held.keys, c_kv) and torch.equal(held.values, k_pe)


def test_a_window_layer_refuses_to_crop_back_past_what_it_dropped():
    layer = WindowLayer(1, 2, window=3, sinks=1, spare=1)
    layer.update(torch.arange(8), torch.randn(1, 1, 8, 2), torch.randn(1, 1, 8, 2))
    assert layer.held == [0, 4, 5, 6, 7]  # the sink, the last 3 and one spare
    layer.crop(7)  # the query at 7 sees 0 and 5, 6: held
    with pytest.raises(ValueError, match="no longer holds position 3"):
        layer.crop(5)  # the query at 5 would see 3 and 4; 3 is gone
    assert layer.length == 7 and layer.held == [0, 4, 5, 6]


def test_a_layer_refuses_gaps_overflow_and_cropping_forward():
    cache = full_cache(1, 1, 2, capacity=4)
    row = torch.zeros(1, 1, 1, 2)
    with pytest.raises(ValueError, match="positions start at 2"):
        cache.update(0, torch.tensor([2]), row, row)
    cache.update(0, torch.arange(4), torch.zeros(1, 1, 4, 2), torch.zeros(1, 1, 4, 2))
    with pytest.raises(ValueError, match="full"):
        cache.update(0, torch.tensor([4]), row, row)
    with pytest.raises(ValueError, match="cannot crop to 5"):
        cache.crop(5)


def test_a_model_whose_layers_differ_is_a_stack_of_different_kinds():
    """Qwen2's window from `max_window_layers` up: full layers below it, window layers from it."""
    from dataclasses import replace

    qwen = replace(LLAMA, n_layer=4, sliding_window=4, window_first_layer=2)
    window, first_layer = qwen.own_window
    cache = build_cache(qwen.cache_layers(CachePolicy(window, 0, "", first_layer)), 16)
    assert [type(layer).__name__ for layer in cache.layers] == ["FullLayer", "FullLayer", "WindowLayer",
                                                               "WindowLayer"]
    _greedy(_model(qwen), cache, 5)  # 6 + 4 = 10 positions fed
    assert cache.layer_positions_held == (10, 10, 4, 4)
    assert cache.bytes_used == (10 + 10 + 4 + 4) * 2 * 2 * 8 * 4
