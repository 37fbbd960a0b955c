"""DeepSeek's absorbed decode step (kvviz/models/deepseek_fast.py) against the naive teaching file (deepseek.py):
the same logits within float rounding at several positions after a prefill, the same greedy tokens through the
engine, the same attention weights in the probe, in float32 and bfloat16; and no head's key or value rebuilt.
(The engine's run against transformers' DeepseekV2ForCausalLM is tests/test_deepseek.py's.)"""

from __future__ import annotations

import pytest
import torch
from helpers_checkpoints import plan_ids

from kvviz.cache.kv_cache import build_cache
from kvviz.cache.probe import PassProbe
from kvviz.core.records import EXACT
from kvviz.engine.engine import Engine
from kvviz.models import deepseek_fast
from kvviz.models.deepseek import Deepseek, DeepseekConfig

PROMPT = [5, 17, 42, 8, 99, 3, 61, 23]
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 5e-2}  # of the largest logit: float32 rounding, bfloat16's


def _model(dtype: torch.dtype, q_lora_rank: int = 0) -> Deepseek:
    config = DeepseekConfig(vocab_size=128, n_ctx=64, n_layer=2, n_head=4, n_embd=48, intermediate_size=64,
                            kv_lora_rank=24, q_lora_rank=q_lora_rank, qk_nope_head_dim=12, qk_rope_head_dim=8,
                            v_head_dim=10, name="tiny-mla")
    model = Deepseek(config)
    model.init_weights(torch.Generator().manual_seed(7))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(8.0 if p.dim() > 1 else 1.0)  # logits that tell tokens apart
    return model.to(dtype).eval()


def _prefilled(model: Deepseek):
    cache = build_cache(model.config.cache_layers(EXACT), 32, dtype=next(model.parameters()).dtype)
    model(torch.tensor([PROMPT]), kv_cache=cache)
    return cache


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("q_lora_rank", [0, 16], ids=["one query projection", "query bottleneck"])
def test_the_absorbed_step_gives_the_naive_steps_logits_and_attention_weights(dtype, q_lora_rank):
    """Two caches after the same prefill, one fed by the teaching forward, one by `decode_one`, step by step on
    the teaching model's own tokens: logits and each layer's newest-query weights (nh, S) agree."""
    model = _model(dtype, q_lora_rank)
    with torch.inference_mode():
        naive_cache, absorbed_cache = _prefilled(model), _prefilled(model)
        weights = deepseek_fast.decode_weights(model)
        token = PROMPT[-1]
        for position in range(len(PROMPT), len(PROMPT) + 6):
            naive_probe, absorbed_probe = PassProbe(2, record_attention=True), PassProbe(2, record_attention=True)
            expected = model(torch.tensor([[token]]), torch.tensor([position]), naive_cache,
                             probe=naive_probe)[:, -1].float()  # (1, V)
            got = deepseek_fast.decode_one(model, token, position, absorbed_cache, weights, absorbed_probe).float()
            assert got.shape == expected.shape == (1, 128)
            scale = float(expected.abs().max())
            assert (got - expected).abs().max() <= TOLERANCE[dtype] * max(1.0, scale), position
            assert absorbed_probe.kv_rows == naive_probe.kv_rows == [1, 1]
            for naive, absorbed in zip(naive_probe.attention, absorbed_probe.attention, strict=True):
                assert absorbed.shape == naive.shape == (4, position + 1)  # (nh, S): every held position
                assert absorbed.dtype == torch.float32
                assert torch.allclose(absorbed, naive, atol=1e-5 if dtype == torch.float32 else 2e-2, rtol=0)
            token = int(expected.argmax())


def test_the_absorbed_step_rebuilds_no_heads_key_or_value():
    """The lesson of deepseek_fast.py: a decode step never runs the up-projection `kv_b_proj` over the latents
    (the teaching step runs it once a layer, over every held position)."""
    model = _model(torch.float32)
    calls = []
    for layer in model.blocks:
        layer.self_attn.kv_b_proj.register_forward_hook(lambda module, args, out: calls.append(args[0].shape))
    with torch.inference_mode():
        cache = _prefilled(model)
        assert calls == [(1, len(PROMPT), 24)] * 2  # the prefill is naive: every position's latent, each layer
        calls.clear()
        deepseek_fast.decode_one(model, 3, len(PROMPT), cache)
        assert calls == []
        model(torch.tensor([[3]]), torch.tensor([len(PROMPT) + 1]), cache)
        assert calls == [(1, len(PROMPT) + 2, 24)] * 2  # the naive step: all 10 held latents, each layer


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_the_engine_decodes_absorbed_and_generates_the_teaching_models_tokens(dtype):
    """A cached run through the engine (prefill naive, each step after it absorbed) chooses the tokens the teaching
    model alone chooses greedily, step by step through its own cache, for 12 steps."""
    model = _model(dtype)
    engine = Engine(model)
    assert engine.fast is deepseek_fast
    records = list(engine.run(plan_ids(engine, PROMPT, 12, use_cache=True)))
    ours = [r.token_id for r in records if r.token_id is not None]
    reference = []
    with torch.inference_mode():
        cache = build_cache(model.config.cache_layers(EXACT), len(PROMPT) + 12, dtype=dtype)
        logits = model(torch.tensor([PROMPT]), kv_cache=cache)[0, -1]
        for position in range(len(PROMPT), len(PROMPT) + 12):
            reference.append(int(logits.argmax()))
            logits = model(torch.tensor([[reference[-1]]]), torch.tensor([position]), cache)[0, -1]
    assert ours == reference
    assert len(set(reference)) > 4, "weights this flat would not test much"
