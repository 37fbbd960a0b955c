"""The families without a fast file of their own (Gemma 3, Gemma 4, gpt-oss, Qwen3.5) run their passes through
kvviz.models.spread: the teaching forward with each projection's product split into column blocks. Checked against
the teaching forward: the logits of every pass of a seeded run within float rounding, cached and uncached, in float32
and bfloat16; and every projection of the model is one the spread takes."""

from __future__ import annotations

import pytest
import torch
from helpers_checkpoints import plan_ids
from torch import nn

from kvviz.cache.kv_cache import build_cache, pass_cache
from kvviz.engine.compare import logit_tolerance
from kvviz.engine.engine import Engine
from kvviz.engine.sampling import SamplingSettings
from kvviz.models import spread
from kvviz.models.families import family_of
from kvviz.models.gemma3 import Gemma3, Gemma3Config
from kvviz.models.gemma4 import Gemma4, Gemma4Config
from kvviz.models.gpt_oss import GptOss, GptOssConfig
from kvviz.models.qwen3_5 import Qwen35, Qwen35Config

PROMPT = [5, 17, 3, 42, 8, 29, 11]  # longer than the windows of 4: they slide
MODELS = {  # tiny shapes with the layer kinds of each family; products of 64 columns split into 8 blocks
    "gemma3": lambda: Gemma3(Gemma3Config(vocab_size=64, n_ctx=64, n_layer=3, n_head=4, n_kv_head=2, n_embd=32,
                                          intermediate_size=64, head_dim=16, sliding_window=4,
                                          layer_types=("sliding_attention", "sliding_attention", "full_attention"),
                                          query_pre_attn_scalar=16, final_logit_softcapping=30.0)),
    "gemma4": lambda: Gemma4(Gemma4Config(vocab_size=64, n_ctx=64, n_layer=4, n_head=4, n_kv_head=1, n_embd=32,
                                          intermediate_size=64, head_size=16, global_head_dim=32, sliding_window=4,
                                          layer_types=("sliding_attention", "full_attention", "sliding_attention",
                                                       "full_attention"), num_kv_shared_layers=2)),
    "gpt-oss": lambda: GptOss(GptOssConfig(vocab_size=64, n_ctx=64, n_layer=2, n_head=4, n_kv_head=2, head_size=16,
                                           n_embd=32, n_expert=4, n_expert_used=2, expert_size=32, sliding_window=4,
                                           yarn=None)),
    "qwen3.5": lambda: Qwen35(Qwen35Config(vocab_size=64, n_ctx=64, n_layer=4, n_head=4, n_kv_head=2, head_size=16,
                                           n_embd=32, intermediate_size=64, linear_num_key_heads=2,
                                           linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
                                           partial_rotary_factor=0.5)),
}


def _model(family: str, dtype: torch.dtype) -> nn.Module:
    torch.manual_seed(5)
    model = MODELS[family]()
    with torch.no_grad():
        for name, parameter in model.named_parameters():  # spread weights: tokens that change from step to step
            parameter.normal_(0.0, 0.3 if parameter.dim() > 1 and "embed" not in name else 0.05)  # a tied head
            # reads the embedding back: a small one leaves the layers' output to choose the token
            if "norm" in name:  # Gemma 4 scales by its norms' weights as they are: near 1, not near 0
                parameter.add_(1.0)
    return model.to(dtype).eval()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("family", list(MODELS))
@pytest.mark.parametrize("use_cache", [True, False], ids=["cached", "uncached"])
def test_the_engine_on_the_spread_products_equals_the_teaching_model(family, dtype, use_cache):
    model = _model(family, dtype)
    engine = Engine(model)
    assert engine.fast is spread and family_of(model).fast is spread
    plan = plan_ids(engine, PROMPT, 10, use_cache, SamplingSettings(temperature=1.0, seed=3))  # varied tokens
    logits: list[torch.Tensor] = []
    records = list(engine.run(plan, watch_logits=lambda x: logits.append(x.float().clone())))
    kinds = model.config.cache_layers(plan.policy)
    cache = build_cache(kinds, plan.width, dtype=dtype) if use_cache else pass_cache(kinds)
    chosen = [r for r in records if r.token_id is not None]
    with torch.inference_mode():
        for record, got in zip(chosen, logits, strict=True):
            fed = torch.tensor([record.fed_token_ids])
            positions = torch.arange(record.fed_start, record.fed_stop)
            expected = model(fed, positions, cache, last_only=True)[0, -1].float()  # the teaching forward
            scale = float(expected.abs().max())
            # a product summed in another order rounds otherwise; a linear-attention state carries that rounding
            # from position to position, so float32 is held to 1e-4 of the logits' size, as against transformers
            tolerance = max(logit_tolerance(dtype, scale), 1e-4 * max(1.0, scale))
            assert (got - expected).abs().max() <= tolerance, (family, record.step)
    assert len({r.token_id for r in chosen}) > 2, "weights this flat would not test much"


@pytest.mark.parametrize("family", list(MODELS))
def test_every_projection_is_spread_and_the_model_is_as_it_was_after_a_pass(family):
    """The spread takes every nn.Linear of the model, and a pass leaves the modules as the teaching file made them
    (the next teaching forward runs its own products)."""
    model = _model(family, torch.float32)
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    weights = spread.decode_weights(model)
    assert {id(w.module) for w in weights} == {id(m) for m in linears} and linears
    with torch.inference_mode():
        spread.forward(model, torch.tensor([PROMPT]), torch.arange(len(PROMPT)), None, weights)
    assert all("forward" not in vars(m) for m in linears)
