"""Greedy speculative decoding (kvviz.engine.speculative): whatever the drafter proposes, the tokens are the target's
plain greedy tokens, for k in {1, 3, 5}, with prompt lookup and with a draft model; rejected drafts are cropped from
the target's cache, which then holds exactly the positions of the text so far but the pending token."""

from __future__ import annotations

import pytest
import torch
from helpers_checkpoints import tiny_kvviz_model
from test_spread import _model

from kvviz.core.errors import GenerationError
from kvviz.engine.engine import Engine, generate_ids
from kvviz.engine.speculative import prompt_lookup, speculate
from kvviz.models.llama import Llama, LlamaConfig

PROMPT = [5, 17, 3, 42, 8, 5, 17, 3, 42, 8, 5, 17]  # a text that quotes itself: prompt lookup finds drafts


def _llama(seed: int, n_layer: int = 3, window: int = 0) -> Llama:
    config = LlamaConfig(vocab_size=64, n_ctx=96, n_layer=n_layer, n_head=4, n_kv_head=2, n_embd=32,
                         intermediate_size=48, sliding_window=window, name="tiny-llama")
    model = Llama(config)
    model.init_weights(torch.Generator().manual_seed(seed))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(6.0 if p.dim() > 1 else 1.0)
    return model.eval()


def test_prompt_lookup_proposes_what_followed_the_last_ngram_earlier():
    assert prompt_lookup([1, 2, 3, 4, 1, 2], 2, 3) == [3, 4, 1]
    assert prompt_lookup([1, 2, 3, 4, 9, 2], 2, 3) == [3, 4, 9]  # no earlier (9, 2): the 1-gram 2 then
    assert prompt_lookup([1, 2, 3], 2, 3) == []


TARGETS = {"llama": lambda: _llama(1), "llama-window": lambda: _llama(1, window=6),
           "gpt2": lambda: tiny_kvviz_model(n_layer=2, n_head=2, n_embd=32, std=0.3), "gemma4": lambda: _model(
               "gemma4", torch.float32)}


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("target", list(TARGETS))
def test_speculative_tokens_are_the_targets_greedy_tokens(target, k):
    model = TARGETS[target]()
    prompt = [t % model.config.vocab_size for t in PROMPT]
    plain, _ = generate_ids(Engine(model), prompt, 20)
    draft = _llama(2, n_layer=1) if model.config.vocab_size == 64 else None
    drafters = [{"lookup": 3}] + ([{"draft": draft}] if draft is not None else [])
    for drafter in drafters:
        rounds = list(speculate(model, prompt, 20, k, **drafter))
        tokens = [t for r in rounds for t in r.token_ids]
        assert tokens == plain, (target, k, drafter)
        for r in rounds:  # the cache holds every position but the pending token's, rejected drafts cropped
            assert r.cache_positions == r.start + 1 + r.accepted
            assert 0 <= r.accepted <= len(r.drafted) <= k
        if "lookup" in drafter:
            assert any(r.drafted for r in rounds)


def test_bad_requests_are_one_line():
    model = _llama(1)
    with pytest.raises(GenerationError, match="between 1 and 64"):
        next(speculate(model, PROMPT, 4, 0, lookup=2))
    with pytest.raises(GenerationError, match="one drafter"):
        next(speculate(model, PROMPT, 4, 2))
    other = tiny_kvviz_model(n_layer=1, n_head=2, n_embd=32)  # GPT-2's vocabulary
    with pytest.raises(GenerationError, match="vocabulary"):
        next(speculate(model, PROMPT, 4, 2, draft=other))
    with pytest.raises(GenerationError, match="linear-attention"):
        next(speculate(_model("qwen3.5", torch.float32), PROMPT, 4, 2, lookup=2))


def test_speculative_tokens_equal_transformers_assisted_generation():
    """The same target in transformers, with prompt lookup (`prompt_lookup_num_tokens`) and with the draft model as
    its assistant (`assistant_model`): the same greedy tokens as kvviz's speculative decoding."""
    pytest.importorskip("transformers")
    from kvviz.measure.bench import to_transformers

    target, draft = _llama(1), _llama(2, n_layer=1)
    peer, assistant = to_transformers(target), to_transformers(draft)
    ids = torch.tensor([PROMPT])
    for drafter, options in (({"lookup": 3}, {"prompt_lookup_num_tokens": 4}),
                             ({"draft": draft}, {"assistant_model": assistant})):
        ours = [t for r in speculate(target, PROMPT, 16, 4, **drafter) for t in r.token_ids]
        with torch.no_grad():
            theirs = peer.generate(ids, max_new_tokens=16, do_sample=False, pad_token_id=0, **options)
        assert ours == theirs[0, len(PROMPT):].tolist(), drafter
