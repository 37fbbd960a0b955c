"""Speculative decoding's rollback: a pass of 1 + m tokens (the pending token and m drafts) goes into the cache, a
prefix of it is accepted, and `crop` takes every layer back to the end of that prefix. Every kind of layer cache
rolls back to any position inside a pass of up to `spare` positions; a paged cache rolls one request back; and
`rollback_refusal` refuses none of the kinds.

A note on bits: a float32 product on this CPU gives row 0 different bits in a pass of fewer than 4 rows than in one
of 4 or more, so a row computed in the speculative pass need not be bitwise the row a fresh cache computes in a
pass of the kept tokens alone. What the crop must leave untouched (every position held before the pass, and a state
compared with one from a pass of the same shape) is compared bit for bit; what a pass recomputed, with a tolerance.
"""

from __future__ import annotations

import pytest
import torch
from test_spread import _model

from kvviz.cache.kv_cache import KVCache, build_cache, rollback_refusal
from kvviz.cache.latent import LatentLayer
from kvviz.cache.layers import FullLayer, LayerKind
from kvviz.cache.paged import PagedCache
from kvviz.cache.quantized import QuantizedLayer
from kvviz.cache.state import StateLayer
from kvviz.cache.window import WindowLayer
from kvviz.core.records import CachePolicy
from kvviz.models.deepseek import Deepseek, DeepseekConfig
from kvviz.models.llama import Llama, LlamaConfig
from kvviz.models.qwen3_5 import gated_delta_rule

LLAMA = LlamaConfig(vocab_size=64, n_ctx=64, n_layer=2, n_head=4, n_kv_head=2, n_embd=32, intermediate_size=48,
                    name="tiny-llama")  # 2 KV heads of 8
DEEPSEEK = DeepseekConfig(vocab_size=64, n_ctx=64, n_layer=2, n_head=2, n_embd=32, intermediate_size=48,
                          kv_lora_rank=8, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, name="tiny-mla")
PROMPT = [5, 17, 3, 42, 8, 29, 11]  # positions 0..6, longer than the windows of 4
K = 4  # drafts a round at most: the loop builds its cache with spare = K + 1
ROUND = [23, 7, 51, 2, 36]  # the pending token and 4 drafts, at positions 7..11
CROP_TO = 9  # the pending token and the first draft accepted: positions 7 and 8 stay, 9..11 go
NEXT = [14, 60, 9]  # the next round's pass, at positions 9..11
STATE_BYTES = (64 * 3 + 4 * 8 * 8) * 4  # the tiny Qwen3.5's state: 64 channels x 3 columns, 4 heads x 8 x 8; float32
# Its states' rounding grows through its wide layers (windows of numbers up to 17 differ by up to 3e-5 from a pass
# of another length); the state after one position more or less differs by 0.3 to 20
STATE_ATOL = 1e-4

# kind: (model, policy, per layer after the crop to 9: positions held and bytes held, counted by hand, and whether
# a fresh cache fed the kept tokens holds the same)
KINDS = {
    # every position: 9 x (K, V) x 2 heads x 8 numbers x 4 bytes = 9 x 128 a layer
    "full": ("llama", CachePolicy(), (9, 9), (9 * 128,) * 2, True),
    # the sink 0, the window's 5..8, and 3, 4 of the spare rows it kept to roll back into (the round evicted 1 and 2;
    # a fresh cache never went past 8, so it still holds them: 0..8)
    "window": ("llama", CachePolicy(window=4, sinks=1), (7, 7), (7 * 128,) * 2, False),
    # int8: 9 x (K, V) x 2 heads x (8 one-byte numbers + a float32 scale) = 9 x 48 a layer
    "quantized": ("llama", CachePolicy(kv_dtype="int8"), (9, 9), (9 * 48,) * 2, True),
    # 9 x (latent 8 + RoPE key 4) x 4 bytes = 9 x 48 a layer
    "latent": ("deepseek", CachePolicy(), (9, 9), (9 * 48,) * 2, True),
    # three Gated DeltaNet layers: their state and the 2 states kept from the round (after 7 and after 8 positions;
    # a fresh cache keeps the states after the last 5 positions, 4..8); the attention layer: 9 x (K, V) x 2 x 16 x 4
    "state": ("qwen3.5", CachePolicy(), (0, 0, 0, 9), (3 * STATE_BYTES,) * 3 + (9 * 256,), False),
    # the sliding layer (window 4, 1 head of 16): 3..8 as above; the global one (1 head of 32): 9 x (K, V) x 32 x 4;
    # the two shared layers keep nothing
    "shared": ("gemma4", CachePolicy(), (6, 9, 0, 0), (6 * 128, 9 * 256, 0, 0), False),
}


def _tiny(family: str) -> torch.nn.Module:
    if family in ("qwen3.5", "gemma4"):
        return _model(family, torch.float32)
    model = Llama(LLAMA) if family == "llama" else Deepseek(DEEPSEEK)
    model.init_weights(torch.Generator().manual_seed(3))
    with torch.no_grad():  # wider weights than the initialisation's, so that the logits tell tokens apart
        for p in model.parameters():
            p.mul_(8.0 if p.dim() > 1 else 1.0)
    return model.eval()


@torch.no_grad()
def _feed(model, cache: KVCache, tokens: list[int]) -> torch.Tensor:
    """One pass of `tokens` from the cache's length: the logits (T, V)."""
    start = cache.length
    return model(torch.tensor([tokens]), torch.arange(start, start + len(tokens)), cache)[0]


def _rows(layer) -> dict[int, tuple[torch.Tensor, ...]]:
    """Each position a layer holds -> copies of what it stores for it."""
    if isinstance(layer, WindowLayer):
        return {p: (layer.kv[:, :, :, slot].clone(),) for slot, p in enumerate(layer.held)}
    if isinstance(layer, FullLayer):
        return {p: (layer.kv[:, :, :, p].clone(),) for p in range(layer.length)}
    if isinstance(layer, QuantizedLayer):
        return {p: (layer.codes[:, :, :, p].clone(), layer.scales[:, :, :, p].clone()) for p in range(layer.length)}
    if isinstance(layer, LatentLayer):
        return {p: (layer.latents[:, p].clone(),) for p in range(layer.length)}
    return {}  # a shared layer keeps nothing, a state layer no position


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_crop_inside_the_round_leaves_what_a_fresh_cache_fed_the_kept_tokens_has(kind):
    family, policy, positions_held, layer_bytes, like_fresh = KINDS[kind]
    model = _tiny(family)
    kinds = model.config.cache_layers(policy)
    cache = build_cache(kinds, 32, spare=K + 1)
    _feed(model, cache, PROMPT)
    before = [_rows(layer) for layer in cache.layers]
    _feed(model, cache, ROUND)
    cache.crop(CROP_TO)

    fresh = build_cache(kinds, 32, spare=K + 1)  # fed exactly the kept tokens: the prompt, then the 2 accepted
    _feed(model, fresh, PROMPT)
    _feed(model, fresh, ROUND[:CROP_TO - len(PROMPT)])

    assert cache.length == fresh.length == CROP_TO
    for layer, rows in zip(cache.layers, before, strict=True):  # (a) what the prompt's pass stored, bit for bit
        after = _rows(layer)
        assert all(p < CROP_TO for p in after)
        for p in set(rows) & set(after):
            assert all(torch.equal(x, y) for x, y in zip(rows[p], after[p], strict=True)), (kind, p)
        if isinstance(layer, WindowLayer):
            # a window of 4 at 9: 5..8, and the sink 0; and 3, 4 of the spare rows it kept (see KINDS)
            assert layer.held == ([0, 3, 4, 5, 6, 7, 8] if layer.sinks else [3, 4, 5, 6, 7, 8])
        else:
            assert set(rows) <= set(after)  # nothing held before the round was lost
    assert cache.layer_positions_held == positions_held  # (b)
    assert cache.layer_bytes == layer_bytes
    if like_fresh:
        assert (cache.layer_positions_held, cache.layer_bytes) == (fresh.layer_positions_held, fresh.layer_bytes)
    for mine, theirs in zip(cache.layers, fresh.layers, strict=True):  # a state: the fresh one's, within rounding
        if isinstance(mine, StateLayer):
            pairs = zip(mine.read(), theirs.read(), strict=True)
            assert all(torch.allclose(a, b, atol=STATE_ATOL) for a, b in pairs)
    assert torch.allclose(_feed(model, cache, NEXT), _feed(model, fresh, NEXT), atol=1e-5)  # (c)


def _qwen():
    model = _tiny("qwen3.5")
    return model, model.config.cache_layers(CachePolicy())


def test_a_state_rolls_back_inside_a_pass_to_the_state_a_fresh_cache_reaches():
    """A pass of 6 from an empty cache, cropped to 2: the state after 2 positions."""
    model, kinds = _qwen()
    tokens, other_tail = [5, 17, 3, 42, 8, 29], [60, 1, 33, 12]
    cache = build_cache(kinds, 32, spare=6)
    _feed(model, cache, tokens)
    cache.crop(2)
    fresh = build_cache(kinds, 32, spare=6)
    _feed(model, fresh, tokens[:2])
    same_shape = build_cache(kinds, 32, spare=6)  # a pass of 6 again, whose last 4 tokens differ
    _feed(model, same_shape, tokens[:2] + other_tail)
    same_shape.crop(2)
    states = [i for i, layer in enumerate(cache.layers) if isinstance(layer, StateLayer)]
    assert states == [0, 1, 2]
    for i in states:
        mine, theirs, same = cache.layers[i].read(), fresh.layers[i].read(), same_shape.layers[i].read()
        assert all(torch.allclose(a, b, atol=STATE_ATOL) for a, b in zip(mine, theirs, strict=True))
        assert all(torch.equal(a, b) for a, b in zip(mine, same, strict=True))  # what came after 2 left no trace
    # the bottom layer's window after 2 positions, from its definition: the last 3 inputs of its convolution up to
    # and including position 1: a zero column (nothing before 0), then the q, k, v projections of tokens 0 and 1,
    # projected in a pass of 6 rows as the cropped cache's were
    with torch.no_grad():
        bottom = model.model.layers[0]
        qkv = bottom.linear_attn.in_proj_qkv(bottom.input_layernorm(model.model.embed_tokens(torch.tensor([tokens]))))
    expected = torch.cat((torch.zeros(1, 64, 1), qkv[:, :2].transpose(1, 2)), dim=2)  # (1, 64, 3)
    assert torch.equal(cache.layers[0].read()[0], expected)
    # bytes: each state layer's state and the 2 it kept (after 0 and 1 positions), as the fresh cache's; the
    # attention layer's 2 positions x (K, V) x 2 heads x 16 x 4 bytes
    assert cache.layer_bytes == fresh.layer_bytes == (3 * STATE_BYTES,) * 3 + (2 * 256,)
    assert cache.layer_positions_held == fresh.layer_positions_held == (0, 0, 0, 2)
    assert torch.allclose(_feed(model, cache, [9, 14]), _feed(model, fresh, [9, 14]), atol=1e-5)


def test_a_state_keeps_only_its_last_spare_states_and_refuses_older_in_one_line():
    model, kinds = _qwen()
    cache = build_cache(kinds, 32, spare=3)
    _feed(model, cache, [5, 17, 3, 42, 8, 29])  # a prefill of 6: it keeps the states after 3, 4 and 5 only
    layer = cache.layers[0]
    assert layer.snapshots == 3 and layer.bytes_held == 4 * STATE_BYTES
    with pytest.raises(ValueError) as refused:
        layer.crop(2)
    message = str(refused.value)
    assert "\n" not in message and "cannot roll back to position 2" in message and "3, 4, 5" in message
    assert layer.length == 6  # a refused crop changes nothing
    layer.crop(3)
    assert layer.length == 3 and layer.snapshots == 0  # the kept states after 4 and 5 were past it
    layer.crop(0)  # the zero state, always
    assert not layer.read()[0].any() and not layer.read()[1].any()


def test_the_delta_rule_hands_back_the_last_states_it_is_asked_for():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 6, 4, generator=g) for _ in range(3))
    decay, beta = -torch.rand(1, 2, 6, generator=g), torch.rand(1, 2, 6, generator=g)
    reads, last = gated_delta_rule(q, k, v, decay, beta, torch.zeros(1, 2, 4, 4))
    _, states = gated_delta_rule(q, k, v, decay, beta, torch.zeros(1, 2, 4, 4), keep=3)
    assert last.shape == (1, 1, 2, 4, 4) and states.shape == (3, 1, 2, 4, 4)  # a prefill keeps no more than asked
    assert torch.equal(states[-1], last[0])
    _, first_three = gated_delta_rule(q[:, :, :4], k[:, :, :4], v[:, :, :4], decay[:, :, :4], beta[:, :, :4],
                                      torch.zeros(1, 2, 4, 4), keep=1)  # the state after position 3, alone
    assert torch.equal(states[0], first_three[0])  # one position at a time: the same operations, the same bits
    assert reads.shape == (1, 2, 6, 4)


def test_no_kind_of_layer_is_refused_a_rollback():
    for family, policy in (("llama", CachePolicy()), ("llama", CachePolicy(window=4, sinks=1)),
                           ("llama", CachePolicy(kv_dtype="int8")), ("deepseek", CachePolicy()),
                           ("qwen3.5", CachePolicy()), ("gemma4", CachePolicy())):
        config = LLAMA if family == "llama" else DEEPSEEK if family == "deepseek" else _tiny(family).config
        assert rollback_refusal(config.cache_layers(policy)) == "", family
    refusal = rollback_refusal([LayerKind("full", 2, 8), LayerKind("ring", 2, 8)])
    assert "'ring'" in refusal and "\n" not in refusal


def _paged(num_blocks: int = 8) -> PagedCache:
    return PagedCache(n_layer=1, n_kv_head=1, head_dim=2, num_blocks=num_blocks, block_size=4)


def _write(cache: PagedCache, request: int, tokens: list[int]) -> torch.Tensor:
    """Feed `tokens` to `request`, each position's key and value (token, position); return what the request reads:
    its keys (S, 2)."""
    positions = cache.prepare([request], [tokens])
    rows = torch.stack((torch.tensor(tokens, dtype=torch.float32), positions.float()), dim=-1)  # (T, 2)
    held = cache.update(0, positions, rows.view(1, 1, -1, 2), rows.view(1, 1, -1, 2))
    return held.keys[0, 0]


def test_a_paged_crop_gives_the_blocks_past_it_back_to_the_pool():
    cache = _paged()
    cache.admit(0, list(range(10)))
    _write(cache, 0, list(range(10)))  # 10 positions: 3 blocks of 4
    assert len(cache.free) == 5
    cache.crop(0, 5)  # 5 positions: 2 blocks; the third goes back
    assert len(cache.free) == 6 and cache.lengths[0] == 5
    keys = _write(cache, 0, [40, 41, 42])  # position 5 on, in its own second block, in place: no copy
    assert cache.copies == 0 and len(cache.free) == 6
    assert keys.tolist() == [[0, 0], [1, 1], [2, 2], [3, 3], [4, 4], [40, 5], [41, 6], [42, 7]]
    cache.crop(0, 0)
    assert len(cache.free) == 8 and cache.tables[0] == []
    with pytest.raises(ValueError, match="^request 0 holds 0 positions: it cannot crop to 1$"):
        cache.crop(0, 1)
    with pytest.raises(ValueError, match="^request 3 is not in the cache$"):
        cache.crop(3, 0)


def test_a_prefix_shared_block_survives_a_crop_of_one_of_its_holders():
    cache = _paged()
    prompt = [7, 3, 9, 1, 4, 4, 2, 8, 6]
    cache.admit(0, prompt)
    _write(cache, 0, prompt)  # 9 positions: blocks of 4, 4 and 1
    assert cache.admit(1, prompt + [5]) == 9  # request 1 shares all three
    assert len(cache.free) == 5
    cache.crop(0, 3)  # request 0 lets go of the second and third; request 1 still holds them
    assert len(cache.free) == 5
    mine = _write(cache, 0, [50])  # position 3, inside the first block, which request 1 shares: copied first
    assert cache.copies == 1 and len(cache.free) == 4
    assert mine.tolist() == [[7, 0], [3, 1], [9, 2], [50, 3]]
    theirs = _write(cache, 1, [5])  # request 1 reads the prompt it shares as it was, and its own token
    assert theirs.tolist() == [[t, p] for p, t in enumerate(prompt + [5])]
    cache.release(1)
    assert len(cache.free) == 7  # request 1's three blocks went back; request 0 holds its copy of the first


def test_a_cropped_full_block_is_not_shared_for_the_tokens_it_no_longer_holds():
    cache = _paged()
    cache.admit(0, [1, 2, 3, 4, 5, 6, 7, 8, 9])
    _write(cache, 0, [1, 2, 3, 4, 5, 6, 7, 8])  # two full blocks, each shareable by its tokens
    cache.crop(0, 6)
    _write(cache, 0, [70, 80])  # positions 6, 7 rewritten: the second block holds 5, 6, 70, 80 now
    assert cache.admit(2, [1, 2, 3, 4, 5, 6, 7, 8, 9]) == 6  # the first block whole, and 5, 6 of the second


def test_after_rejected_rounds_the_cache_is_bit_for_bit_a_run_that_never_drafted(monkeypatch):
    """Speculative decoding with prompt lookup (k = 4) against plain decoding, one token a pass, of the same tiny
    Llama: after every round that rolled drafts back, the target's cache holds, bit for bit, what the plain run's
    holds at the same length. Both run with each row's products computed alone (a linear layer a row at a time,
    attention a query at a time over the keys it sees): on this CPU a float32 product gives a row other bits when
    it multiplies fewer than 4 rows than 4 or more, so without this the two differ in the last bits whatever the
    rollback does; with it, any difference is the rollback's."""
    import torch.nn.functional as F

    from kvviz.core.records import RunRequest
    from kvviz.engine import engine as engine_module
    from kvviz.engine import speculative
    from kvviz.engine.engine import Engine
    from kvviz.models import llama

    linear = F.linear

    def row_by_row(x, weight, bias=None):
        rows = x.reshape(-1, x.shape[-1])
        return torch.cat([linear(rows[i:i + 1], weight, bias) for i in range(rows.shape[0])]).view(
            *x.shape[:-1], weight.shape[0])

    def query_by_query(q, k, v, held, positions, probe=None, q_for_sinks=None, scale=None, sink_logits=None):
        return torch.cat([F.scaled_dot_product_attention(q[:, :, i:i + 1], k[:, :, :p + 1], v[:, :, :p + 1],
                                                         scale=scale)
                          for i, p in enumerate(positions.tolist())], dim=2)

    monkeypatch.setattr(F, "linear", row_by_row)
    monkeypatch.setattr(llama, "attend", query_by_query)
    caches = {}

    def capturing(module, name):
        build = module.build_cache

        def capture(*args, **kwargs):
            cache = build(*args, **kwargs)
            caches.setdefault(name, cache)
            return cache
        monkeypatch.setattr(module, "build_cache", capture)

    capturing(speculative, "speculative")
    capturing(engine_module, "plain")
    model = Llama(LLAMA)
    model.init_weights(torch.Generator().manual_seed(4))
    with torch.no_grad():  # weights spread out: tokens that vary, drafts rejected now and then
        for p in model.parameters():
            p.mul_(6.0 if p.dim() > 1 else 1.0)
    prompt = [5, 17, 3, 42, 8, 5, 17, 3, 42, 8, 5, 17]  # a text that quotes itself: lookup drafts
    engine = Engine(model)
    engine.fast = None  # the teaching forward: its products are the ones patched
    fast = engine.plan(RunRequest(0, "", True, 24, draft_tokens=4, prompt_lookup=2), prompt)
    held_after_rollback = {}
    for record in engine.run(fast):
        kept, written = record.speculation.rolled_back
        if kept < written:
            layers = caches["speculative"].layers
            held_after_rollback[kept] = [layer.kv[..., :kept, :].clone() for layer in layers]
    assert len(held_after_rollback) >= 2, "the run rolled back too rarely to test"
    compared = 0
    for _record in engine.run(engine.plan(RunRequest(0, "", True, 24), prompt)):
        length = caches["plain"].length
        if length in held_after_rollback:
            for mine, plain in zip(held_after_rollback[length], caches["plain"].layers, strict=True):
                assert torch.equal(mine, plain.kv[..., :length, :]), length
            compared += 1
    assert compared == len(held_after_rollback)
