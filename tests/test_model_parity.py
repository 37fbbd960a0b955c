"""kvviz's GPT-2 against transformers' GPT2LMHeadModel on the same checkpoints, in every layout kvviz reads."""

from __future__ import annotations

import pytest
import torch
from helpers_checkpoints import HELLO_IDS, gpt2_config, save_transformers_folder, tiny_kvviz_model

from kvviz.cache.kv_cache import full_cache
from kvviz.cache.probe import PassProbe
from kvviz.engine.engine import Engine, generate_ids
from kvviz.models import gpt2_fast
from kvviz.sources.weights import load_model

pytest.importorskip("transformers")

TOLERANCE = 1e-4
NEW_TOKENS = 20
# A longer prompt than "Hello, I am" so attention mixes many positions.
PROMPT_IDS = HELLO_IDS + [257, 1310, 290, 314, 588, 340, 13, 383, 3290]

CONFIGS = {
    "2x2x32-full-vocab": dict(n_layer=2, n_head=2, n_embd=32),
    "3x4x64-full-vocab": dict(n_layer=3, n_head=4, n_embd=64),
    "2x4x48-small-vocab": dict(n_layer=2, n_head=4, n_embd=48, vocab_size=1000),
}


def _reference_logits(hf_model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(torch.tensor([ids])).logits.float()  # (1, T, V)


def _reference_greedy(hf_model, ids: list[int], n: int, use_cache: bool = True) -> list[int]:
    prompt = torch.tensor([ids])
    with torch.no_grad():
        out = hf_model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            use_cache=use_cache,
            pad_token_id=hf_model.config.pad_token_id,
        )
    return out[0, len(ids):].tolist()


def _assert_parity(hf_model, kv_model, ids: list[int] = PROMPT_IDS) -> None:
    expected = _reference_logits(hf_model, ids)
    with torch.no_grad():
        got = kv_model(torch.tensor([ids])).float()
    assert got.shape == expected.shape
    diff = (got - expected).abs().max().item()
    assert diff <= TOLERANCE, f"max abs logit difference {diff:.3g}"
    assert expected.abs().max().item() > 0.5, "random weights this weak would hide a mismatch"


@pytest.mark.parametrize("shape", list(CONFIGS), ids=list(CONFIGS))
def test_transformers_folder_logits_and_greedy_tokens(tmp_path, shape):
    hf_model = save_transformers_folder(tmp_path / "ckpt", gpt2_config(**CONFIGS[shape]), seed=3)
    loaded = load_model(str(tmp_path / "ckpt"))
    assert loaded.config.n_layer == hf_model.config.n_layer
    assert loaded.config.n_head == hf_model.config.n_head
    assert loaded.config.vocab_size == hf_model.config.vocab_size
    prompt = [i % hf_model.config.vocab_size for i in PROMPT_IDS]
    _assert_parity(hf_model, loaded.model, prompt)

    expected = _reference_greedy(hf_model, prompt, NEW_TOKENS)
    assert expected == _reference_greedy(hf_model, prompt, NEW_TOKENS, use_cache=False)
    engine = Engine(loaded.model)
    cached, _ = generate_ids(engine, prompt, NEW_TOKENS, use_cache=True)
    uncached, _ = generate_ids(engine, prompt, NEW_TOKENS, use_cache=False)
    assert cached == expected
    assert uncached == expected


def test_logits_through_the_kv_cache_match_transformers(tmp_path):
    """Prefill then one token at a time through kvviz's cache gives transformers' full-sequence logits."""
    hf_model = save_transformers_folder(tmp_path / "ckpt", gpt2_config(n_layer=3, n_head=4, n_embd=64), seed=5)
    model = load_model(str(tmp_path / "ckpt")).model
    cfg = model.config
    expected = _reference_logits(hf_model, PROMPT_IDS)  # (1, T, V)
    cache = full_cache(cfg.n_layer, cfg.n_head, cfg.head_dim, len(PROMPT_IDS))
    prefill = 5
    with torch.no_grad():
        rows = [model(torch.tensor([PROMPT_IDS[:prefill]]), torch.arange(prefill), cache)]
        for pos in range(prefill, len(PROMPT_IDS)):
            rows.append(model(torch.tensor([[PROMPT_IDS[pos]]]), torch.tensor([pos]), cache))
    got = torch.cat(rows, dim=1).float()
    assert (got - expected).abs().max().item() <= TOLERANCE
    assert cache.length == len(PROMPT_IDS)


def test_decode_one_equals_forward_and_transformers(tmp_path):
    """The decode step's plain tensor calls give forward's logits exactly, and transformers' within tolerance."""
    hf_model = save_transformers_folder(tmp_path / "ckpt", gpt2_config(n_layer=3, n_head=4, n_embd=64), seed=6)
    model = load_model(str(tmp_path / "ckpt")).model
    cfg = model.config
    expected = _reference_logits(hf_model, PROMPT_IDS)  # (1, T, V)
    through_forward = full_cache(cfg.n_layer, cfg.n_head, cfg.head_dim, len(PROMPT_IDS))
    through_decode = full_cache(cfg.n_layer, cfg.n_head, cfg.head_dim, len(PROMPT_IDS))
    prefill = 4
    with torch.inference_mode():
        for cache in (through_forward, through_decode):
            model(torch.tensor([PROMPT_IDS[:prefill]]), torch.arange(prefill), cache)
        forward_probe, decode_probe = PassProbe(cfg.n_layer), PassProbe(cfg.n_layer)
        for pos in range(prefill, len(PROMPT_IDS)):
            reference = model(torch.tensor([[PROMPT_IDS[pos]]]), torch.tensor([pos]), through_forward,
                              probe=forward_probe)[0]  # (1, V)
            got = gpt2_fast.decode_one(model, PROMPT_IDS[pos], pos, through_decode, probe=decode_probe)  # (1, V)
            # the layers are the forward's bit for bit (the caches below); the tied head takes one row in column
            # blocks over the threads, summing in another order than the forward's one product
            assert (got - reference).abs().max().item() <= 1e-5 and int(got.argmax()) == int(reference.argmax())
            assert (got - expected[:, pos]).abs().max().item() <= TOLERANCE
    assert torch.equal(*(torch.stack([layer.kv for layer in c.layers]) for c in (through_decode, through_forward)))
    assert through_decode.length == len(PROMPT_IDS)
    # Each decode step projected one K/V row per layer; so did each forward step.
    assert decode_probe.kv_rows == forward_probe.kv_rows == [len(PROMPT_IDS) - prefill] * cfg.n_layer


def _transformers_keys_values(hf_model, ids: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """transformers' cached keys and values, (1, nh, T, hs) each, per layer, after a pass over `ids`."""
    with torch.no_grad():
        out = hf_model(torch.tensor([ids]), use_cache=True)
    cache = out["cache"] if "cache" in out else out["past_key_values"]  # renamed in transformers 5
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return [(cache[i][0], cache[i][1]) for i in range(hf_model.config.n_layer)]


def test_engine_cache_holds_transformers_keys_and_values(tmp_path):
    """After every pass of a run, the engine's KV cache holds the keys and values transformers caches
    for the same tokens: the prompt's after the prefill, then one more position per decode step."""
    hf_model = save_transformers_folder(tmp_path / "ckpt", gpt2_config(n_layer=3, n_head=4, n_embd=64), seed=10)
    engine = Engine(load_model(str(tmp_path / "ckpt")).model)
    sequence: list[int] = []
    checked = 0
    cfg = engine.model.config
    cache = full_cache(cfg.n_layer, cfg.n_head, cfg.head_dim, len(PROMPT_IDS) + 7)
    for record in engine.generate(PROMPT_IDS, 6):  # the engine's passes, fed again through a cache we can read
        if record.final:
            break
        sequence += record.fed_token_ids
        with torch.no_grad():
            engine.model(torch.tensor([record.fed_token_ids]), torch.arange(record.fed_start, record.fed_stop), cache)
        assert cache.length == len(sequence) == record.fed_stop
        for layer, (keys, values) in enumerate(_transformers_keys_values(hf_model, sequence)):
            assert keys.shape == (1, 4, len(sequence), 16)
            held = cache.layers[layer].kv[:, :, :, : len(sequence)]  # (K/V, 1, nh, S, hs)
            assert (held[0] - keys).abs().max().item() <= TOLERANCE
            assert (held[1] - values).abs().max().item() <= TOLERANCE
            assert keys.abs().max().item() > 0.5, "weights this weak would hide a mismatch"
        checked += 1
    assert checked == 6


def test_output_head_shares_the_embeddings_memory(tmp_path):
    """The tied head multiplies by `wte` itself, laid out for a fast product: its transpose is contiguous, so
    no transposed copy is needed (320 MB for gpt2-xl)."""
    hf_model = save_transformers_folder(tmp_path / "ckpt", gpt2_config(n_layer=2, n_head=2, n_embd=32), seed=2)
    for model in (load_model(str(tmp_path / "ckpt")).model, load_model("random:kvviz-shakespeare").model):
        wte = model.transformer.wte.weight
        assert wte.t().is_contiguous() and wte.t().data_ptr() == wte.data_ptr()
    _assert_parity(hf_model, load_model(str(tmp_path / "ckpt")).model)


def test_a_row_major_embedding_gives_the_same_logits():
    """A `wte` assigned row-major (not as kvviz loads it) still gives the logits of the column-major one."""
    model = tiny_kvviz_model(2, 2, 32, 64, std=0.3)
    ids = torch.tensor([HELLO_IDS])
    with torch.inference_mode():
        expected = model(ids)
    model.transformer.wte.weight = torch.nn.Parameter(model.transformer.wte.weight.detach().contiguous())
    with torch.inference_mode():
        assert torch.allclose(model(ids), expected, rtol=1e-5, atol=1e-5)


def _conv1d_weights(model) -> list[torch.Tensor]:
    return [m.weight for m in model.modules() if type(m).__name__ == "Conv1D"]


def test_random_weights_do_not_depend_on_the_layout():
    """The seed gives the same weights as when Conv1D weights were row-major: values read off that build."""
    model = load_model("random:kvviz-shakespeare").model
    c_attn, mlp_proj = model.blocks[0].attn.c_attn.weight, model.blocks[5].mlp.c_proj.weight
    assert c_attn[0, :3].tolist() == [0.026394175365567207, -0.001092166523449123, -0.026642579585313797]
    assert c_attn[191, -2:].tolist() == [-0.01832885853946209, 0.02336999401450157]
    assert mlp_proj[700, :2].tolist() == [-0.0007703075534664094, -0.005639144219458103]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_decode_one_equals_forward_in_every_dtype(dtype):
    """In each dtype the decode step and forward take the same products (chunked float32, packed bfloat16), so
    their caches are equal bit for bit, and their logits too but for float32's head (the decode step's one row in
    column blocks over the threads, the forward's one product: within 1e-5)."""
    model = load_model("random:kvviz-shakespeare", dtype=dtype).model
    cfg = model.config
    ids = HELLO_IDS + [257, 1310, 290, 314]
    caches = [full_cache(cfg.n_layer, cfg.n_head, cfg.head_dim, len(ids), dtype=dtype) for _ in range(2)]
    with torch.inference_mode():
        for cache in caches:
            model(torch.tensor([ids[:2]]), torch.arange(2), cache)
        for pos in range(2, len(ids)):
            reference = model(torch.tensor([[ids[pos]]]), torch.tensor([pos]), caches[0])[0]  # (1, V)
            got = gpt2_fast.decode_one(model, ids[pos], pos, caches[1])  # (1, V)
            assert got.dtype == dtype
            if dtype == torch.float32:
                assert (got - reference).abs().max().item() <= 1e-5 and int(got.argmax()) == int(reference.argmax())
            else:
                assert torch.equal(got, reference)
    assert torch.equal(*(torch.stack([layer.kv for layer in c.layers]) for c in caches))


def _packs_bfloat16() -> bool:
    from kvviz.models.products import pack_for_cpu

    return pack_for_cpu(torch.zeros(16, 16, dtype=torch.bfloat16)) is not None
