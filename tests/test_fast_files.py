"""The fast files run every pass the engine takes; the teaching files are the lesson. Checked against each other: a
run the engine makes (through the fast file) and the same passes through the teaching model give the same greedy
tokens and logits within compare mode's float tolerance, cached and uncached, with exact and lossy caches."""

from __future__ import annotations

import pytest
import torch
from helpers_checkpoints import plan_ids, tiny_kvviz_model

from kvviz.cache.kv_cache import build_cache, pass_cache
from kvviz.engine.compare import logit_tolerance
from kvviz.engine.engine import Engine
from kvviz.models.llama import Llama, LlamaConfig

PROMPT = [5, 17, 3, 42, 8, 29, 11]


def _llama(dtype: torch.dtype) -> Llama:
    config = LlamaConfig(vocab_size=64, n_ctx=64, n_layer=3, n_head=4, n_kv_head=2, n_embd=32, intermediate_size=48,
                         qkv_bias=True, name="tiny-llama")
    model = Llama(config)
    model.init_weights(torch.Generator().manual_seed(4))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(6.0 if p.dim() > 1 else 1.0)  # logits that tell tokens apart
    return model.to(dtype).eval()


MODELS = {"gpt2": lambda dtype: tiny_kvviz_model(n_layer=3, n_head=4, n_embd=64, std=0.3).to(dtype), "llama": _llama}
REQUESTS = {"exact": {}, "window and sinks": {"window": 4, "sinks": 2}, "int8": {"kv_dtype": "int8"}}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("request_name", list(REQUESTS))
@pytest.mark.parametrize("family", list(MODELS))
@pytest.mark.parametrize("use_cache", [True, False], ids=["cached", "uncached"])
def test_the_engine_on_the_fast_file_equals_the_teaching_model(family, request_name, dtype, use_cache):
    model = MODELS[family](dtype)
    engine = Engine(model)
    assert engine.fast is not None
    fields = REQUESTS[request_name]
    if fields.get("kv_dtype") and not use_cache:
        pytest.skip("an uncached run has no cache to quantize")
    plan = plan_ids(engine, PROMPT, 10, use_cache, **fields)
    logits: list[torch.Tensor] = []
    records = list(engine.run(plan, watch_logits=lambda x: logits.append(x.float().clone())))

    kinds = model.config.cache_layers(plan.policy)
    cache = build_cache(kinds, plan.width, dtype=dtype) if use_cache else pass_cache(kinds)
    compared = 0
    with torch.inference_mode():
        for record in records:
            if record.token_id is None:
                continue  # the pass that fills the cache chooses nothing
            fed = torch.tensor([record.fed_token_ids])
            positions = torch.arange(record.fed_start, record.fed_stop)
            expected = model(fed, positions, cache, last_only=True)[0, -1].float()  # the teaching forward
            got = logits[compared]
            assert int(expected.argmax()) == record.token_id, (family, request_name, record.step)
            scale = float(expected.abs().max())
            # A quantized cache rounds each key and value to a code: two products a last bit apart can land on two
            # codes, a step of 1/127 of a vector's largest number, so there the tolerance is that step's, not noise.
            tolerance = 0.01 * scale if fields.get("kv_dtype") else logit_tolerance(dtype, scale)
            assert (got - expected).abs().max() <= tolerance
            compared += 1
    assert compared == 10
