"""The fast quantized decode (#41): a quantized layer's one-token step reads its codes block by block, and KIVI's
layout (keys per channel over groups of tokens, values per token). Checked against the teaching path (the model's
forward through a cache that dequantizes every row), against attention over the dequantized rows in float64, and
against quantization worked out by hand."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from helpers_checkpoints import plan_ids, tiny_kvviz_model

from kvviz.cache import kivi, quantized_attention
from kvviz.cache.kivi import KiviLayer
from kvviz.cache.kv_cache import build_cache
from kvviz.cache.quantized import QuantizedLayer
from kvviz.engine.engine import Engine
from kvviz.models.llama import Llama, LlamaConfig

PROMPT = [5, 17, 3, 42, 8, 29, 11]
POLICIES = {"int8": {"kv_dtype": "int8"}, "int4": {"kv_dtype": "int4"}, "fp8": {"kv_dtype": "fp8"},
            "kivi-int8": {"kv_dtype": "int8", "kv_layout": "kivi", "kv_residual": 4},
            "kivi-int4": {"kv_dtype": "int4", "kv_layout": "kivi", "kv_residual": 4}}


def _llama() -> Llama:
    """Grouped-query attention: 4 query heads over 2 KV heads of 8 numbers."""
    config = LlamaConfig(vocab_size=64, n_ctx=64, n_layer=2, n_head=4, n_kv_head=2, n_embd=32, intermediate_size=48,
                         name="tiny-llama")
    model = Llama(config)
    model.init_weights(torch.Generator().manual_seed(4))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(6.0 if p.dim() > 1 else 1.0)  # logits that tell tokens apart
    return model.eval()


MODELS = {"gpt2": lambda: tiny_kvviz_model(n_layer=2, n_head=4, n_embd=64, vocab_size=512, std=0.3), "llama": _llama}


def _refuse_one_token_updates(monkeypatch) -> None:
    """A one-token pass through `update` would dequantize the whole cache: the fast decode never takes it (here from
    the first position: the caches of these tests are shorter than where it pays, CODES_FROM)."""
    monkeypatch.setattr(quantized_attention, "CODES_FROM", dict.fromkeys(quantized_attention.CODES_FROM, 0))
    for layer in (QuantizedLayer, KiviLayer):
        def update(self, positions, k, v, original=layer.update):
            assert k.shape[2] > 1, "a one-token step dequantized every held row"
            return original(self, positions, k, v)
        monkeypatch.setattr(layer, "update", update)


@pytest.mark.parametrize("name", list(POLICIES))
@pytest.mark.parametrize("family", list(MODELS))
def test_the_engines_quantized_decode_chooses_the_teaching_paths_tokens(family, name, monkeypatch):
    model = MODELS[family]()
    engine = Engine(model)
    plan = plan_ids(engine, PROMPT, 12, **POLICIES[name])
    assert plan.policy.kv_layout == POLICIES[name].get("kv_layout", "")
    logits: list[torch.Tensor] = []
    _refuse_one_token_updates(monkeypatch)
    records = list(engine.run(plan, watch_logits=lambda x: logits.append(x.clone())))
    monkeypatch.undo()

    cache = build_cache(model.config.cache_layers(plan.policy), plan.width)  # the teaching path: `update`
    chosen = [r for r in records if r.token_id is not None]
    assert len(chosen) == 12
    with torch.inference_mode():
        for record, got in zip(chosen, logits, strict=True):
            fed = torch.tensor([record.fed_token_ids])
            positions = torch.arange(record.fed_start, record.fed_stop)
            expected = model(fed, positions, cache, last_only=True)[0, -1]  # the teaching forward
            assert int(expected.argmax()) == record.token_id, (family, name, record.step)
            # the fast file's products and the teaching file's differ in the last bit, so a number may land on the
            # next code (a step of 1/127 of its vector's largest): test_fast_files' tolerance for a quantized cache
            assert (got - expected).abs().max() <= 0.01 * float(expected.abs().max()), (family, name, record.step)


def _filled(kind: str, heads: int, head_dim: int, length: int) -> tuple[object, object]:
    """Two layers of `kind`, fed the same `length` rows (keys with larger channels, as keys have)."""
    def layer():
        if kind.startswith("kivi-"):
            return KiviLayer(heads, head_dim, 64, kind[5:], 4)
        return QuantizedLayer(heads, head_dim, 64, kind)
    g = torch.Generator().manual_seed(2)
    k = torch.randn(1, heads, length, head_dim, generator=g) * torch.linspace(0.2, 4.0, head_dim)
    v = torch.randn(1, heads, length, head_dim, generator=g)
    fast, teaching = layer(), layer()
    fast.update(0, k, v)
    teaching.update(0, k, v)
    return fast, teaching


@pytest.mark.parametrize("integers", [True, False], ids=["integer products", "float blocks"])
@pytest.mark.parametrize("kind", ["int8", "int4", "fp8", "kivi-int8", "kivi-int4"])
def test_decode_block_by_block_is_attention_over_the_dequantized_rows(kind, integers, monkeypatch):
    """Blocks of 8 positions (4 where widened to float32) over 21 to 23 held positions: several blocks, the last
    one partial, an odd count (int4 pairs tokens); 6 query heads over 2 KV heads."""
    if integers and kind == "fp8":
        pytest.skip("fp8 has no integer products")
    monkeypatch.setattr(quantized_attention, "CODES_FROM", dict.fromkeys(quantized_attention.CODES_FROM, 0))
    monkeypatch.setattr(quantized_attention, "BLOCK", 8)
    monkeypatch.setattr(quantized_attention, "FLOAT_BLOCK", 4)
    monkeypatch.setattr(kivi, "FLOAT_BLOCK", 4)
    if not integers:
        monkeypatch.setattr(quantized_attention, "integer_codes", lambda codes: False)
    fast, teaching = _filled(kind, 2, 8, 20)
    fast.update = lambda *args: pytest.fail("decode dequantized every held row")  # the codes are read in place
    g = torch.Generator().manual_seed(3)
    for position in (20, 21, 22):
        q, k, v = torch.randn(1, 6, 1, 8, generator=g) * 3, torch.randn(1, 2, 1, 8, generator=g), \
            torch.randn(1, 2, 1, 8, generator=g)
        got = fast.decode(position, q, k, v)
        held = teaching.update(position, k, v)  # the dequantized rows
        expected = F.scaled_dot_product_attention(q.double(), held.keys.double(), held.values.double(),
                                                  enable_gqa=True)
        assert got.shape == (1, 6, 1, 8) and got.dtype == torch.float32
        # three int8 levels carry the query and the weights to float32's precision: the integer products are exact
        assert (got.double() - expected).abs().max() <= 1e-5 * float(expected.abs().max()), (kind, position)
        assert fast.length == teaching.length == position + 1
        assert fast.bytes_held == teaching.bytes_held


def test_kivi_scales_each_key_channel_over_its_group_and_each_value_over_its_token():
    """One head of 2 numbers, groups of 2 tokens, int8: the first two keys go into a group, scaled per channel
    (the channel's largest magnitude over the two tokens, over 127), the third waits exact; values are scaled per
    token (the vector's largest over 127)."""
    layer = KiviLayer(1, 2, 8, "int8", 2)
    keys = torch.tensor([[[[100.0, 0.5], [-20.0, -0.25], [3.0, 4.0]]]])  # (1, 1, 3, 2): channel 0 large
    values = torch.tensor([[[[1.0, -0.5], [0.3, 0.1], [2.0, 2.0]]]])
    held = layer.update(0, keys, values)
    s0, s1 = 100.0 / 127, 0.5 / 127  # channel 0's scale, channel 1's: the largest over tokens 0 and 1, over 127
    expected_keys = [[127 * s0, 127 * s1],
                     [-25 * s0, -64 * s1],  # -20 / s0 = -25.4 steps; -0.25 / s1 = -63.5, rounded to even
                     [3.0, 4.0]]  # held exact: no group yet
    for got, expected in zip(held.keys[0, 0].tolist(), expected_keys, strict=True):
        assert got == pytest.approx(expected, rel=1e-6)
    t0, t1, t2 = 1.0 / 127, 0.3 / 127, 2.0 / 127  # each value's scale: its largest magnitude over 127
    expected_values = [[127 * t0, -64 * t0], [127 * t1, 42 * t1], [127 * t2, 127 * t2]]  # -63.5 -> -64; 42.33 -> 42
    for got, expected in zip(held.values[0, 0].tolist(), expected_values, strict=True):
        assert got == pytest.approx(expected, rel=1e-6)
    # a scale a token would have rounded channel 1's -0.25 in steps of 20/127 (token 1's largest): to 0.31 or 0
    assert abs(held.keys[0, 0, 1, 1] - -0.25) < 0.002


def test_kivi_counts_codes_scales_and_the_exact_keys_and_rolls_back_only_within_them():
    """2 heads of 8 numbers, int4, groups of 4, 10 positions fed: 8 keys in 2 groups, 2 held exact."""
    layer = KiviLayer(2, 8, 16, "int4", 4)
    layer.update(0, torch.randn(1, 2, 10, 8), torch.randn(1, 2, 10, 8))
    key_codes = 8 * 2 * 4  # positions x heads x bytes (8 numbers, two a byte)
    key_scales = 2 * 2 * 8 * 4  # groups x heads x channels x float32
    exact_keys = 2 * 2 * 8 * 4  # positions x heads x numbers x float32
    values = 10 * 2 * 4 + 10 * 2 * 4  # codes, and a float32 scale a token and head
    assert layer.bytes_held == key_codes + key_scales + exact_keys + values == 480
    layer.crop(9)
    layer.crop(8)  # back to the first exact key: a layer fed 8 positions has the same 2 groups
    assert layer.length == 8 and layer.bytes_held == key_codes + key_scales + 8 * 2 * 4 * 2
    with pytest.raises(ValueError, match="fed only 7 positions it would have quantized 4: it cannot roll back to 7"
                       ) as refused:
        layer.crop(7)
    assert "\n" not in str(refused.value)
    spared = KiviLayer(2, 8, 16, "int4", 4, spare=3)  # at least 3 keys held exact
    spared.update(0, torch.randn(1, 2, 10, 8), torch.randn(1, 2, 10, 8))
    assert spared.grouped == 4  # 6 keys exact, at least 3 of them
    spared.update(10, torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8))
    assert spared.grouped == 8  # keys 4-7 quantized by this pass: a layer fed 10 would hold them exact
    with pytest.raises(ValueError, match="it cannot roll back to 10"):
        spared.crop(10)
    spared.crop(12)  # no group quantized since 12: allowed


@pytest.mark.parametrize(("args", "message"), [
    (("--kv-layout", "kivi"), "--kv-layout kivi quantizes keys per channel and values per token in int8 or int4"),
    (("--kv-layout", "kivi", "--kv-dtype", "fp8"), "give --kv-dtype int8 or int4"),
    (("--kv-residual", "8", "--kv-dtype", "int8"), "--kv-residual is KIVI's group of keys: give --kv-layout kivi"),
    (("--kv-layout", "kivi", "--kv-dtype", "int8", "--kv-residual", "0"), "argument --kv-residual: must be a "
                                                                          "positive integer"),
    (("--kv-layout", "ring", "--kv-dtype", "int8"), "argument --kv-layout: invalid choice: 'ring'"),
    (("--kv-layout", "kivi", "--kv-dtype", "int8", "--prompt-lookup", "2"),
     "cannot decode speculatively: no layer cache of kind 'kivi' rolls back"),
])
def test_generate_refuses_a_kivi_layout_it_cannot_run_in_one_line(kvviz_cli, args, message):
    done = kvviz_cli("generate", "--prompt", "hi", "--max-new-tokens", "2", *args)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1 and message in done.stderr, done.stderr


def test_generate_with_kivi_holds_the_bytes_counted_by_hand(kvviz_cli):
    """The embedded GPT-2 (6 layers of 6 heads of 32 numbers), "ROMEO:" and 6 new tokens: 9 positions, groups of 4:
    a head holds 8 keys in 2 groups (16 bytes each in int4, 32 float32 scales a group) and 1 exact key (32 float32),
    and 9 values (16 bytes and a float32 scale each)."""
    done = kvviz_cli("generate", "--prompt", "ROMEO:", "--max-new-tokens", "6", "--json", "--kv-dtype", "int4",
                     "--kv-layout", "kivi", "--kv-residual", "4")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert len(report["prompt_ids"]) + 6 == 9
    per_head = 8 * 16 + 2 * 32 * 4 + 1 * 32 * 4 + 9 * (16 + 4)
    assert (report["kv_layout"], report["kv_residual"], report["kv_dtype"]) == ("kivi", 4, "int4")
    assert report["cache_bytes"] == 6 * 6 * per_head == 24_912


@pytest.mark.parametrize("kv_dtype", ["int8", "int4", "fp8"])
def test_a_cache_shorter_than_where_the_codes_pay_attends_as_the_teaching_path_does(kv_dtype, monkeypatch):
    """Below CODES_FROM positions the one-token step dequantizes the (small) cache and attends as `update` does;
    from there on it reads the codes and never calls `update` for one token."""
    length = quantized_attention.CODES_FROM[kv_dtype]
    calls = []
    original = QuantizedLayer.update

    def update(self, positions, k, v):
        calls.append(k.shape[2])
        return original(self, positions, k, v)

    monkeypatch.setattr(QuantizedLayer, "update", update)
    generator = torch.Generator().manual_seed(4)
    layer = QuantizedLayer(2, 8, length + 1, kv_dtype)
    layer.update(torch.arange(length - 2), *torch.randn(2, 1, 2, length - 2, 8, generator=generator))
    with torch.inference_mode():
        for position in (length - 2, length - 1):  # holding length - 1 positions, then length
            layer.decode(position, *torch.randn(3, 1, 2, 1, 8, generator=generator))
    assert calls == [length - 2, 1], "the short cache's step went through update, the next one read the codes"
