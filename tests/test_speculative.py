"""Greedy speculative decoding (kvviz.engine.speculative): whatever the drafter proposes, the tokens are the target's
plain greedy tokens, for k in {1, 3, 5}, with prompt lookup and with a draft model; rejected drafts are cropped from
the target's cache, which then holds exactly the positions of the text so far but the pending token."""

from __future__ import annotations

import pytest
import torch
from helpers_checkpoints import tiny_kvviz_model
from test_spread import _model

from kvviz.core.errors import GenerationError
from kvviz.core.records import RunRequest
from kvviz.engine.engine import Engine, generate_ids
from kvviz.engine.sampling import SamplingSettings
from kvviz.engine.speculative import prompt_lookup, verify
from kvviz.models.llama import Llama, LlamaConfig

PROMPT = [5, 17, 3, 42, 8, 5, 17, 3, 42, 8, 5, 17]  # a text that quotes itself: prompt lookup finds drafts


def _llama(seed: int, n_layer: int = 3, window: int = 0, vocab_size: int = 64) -> Llama:
    config = LlamaConfig(vocab_size=vocab_size, n_ctx=96, n_layer=n_layer, n_head=4, n_kv_head=2, n_embd=32,
                         intermediate_size=48, sliding_window=window, name="tiny-llama")
    model = Llama(config)
    model.init_weights(torch.Generator().manual_seed(seed))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(6.0 if p.dim() > 1 else 1.0)
    return model.eval()


def speculate(model, prompt, new_tokens, k, lookup=0, draft=None, sampling=None, **fields):
    """The records of a speculative run of `model` (one a target pass), drafting by prompt lookup or with `draft`."""
    engine, sampling = Engine(model), sampling or SamplingSettings()
    if draft is not None:
        engine.draft = Engine(draft)
    request = RunRequest(0, "", fields.pop("use_cache", True), new_tokens, sampling.temperature, sampling.top_k,
                         sampling.seed, draft_tokens=k, prompt_lookup=lookup,
                         draft_model="draft" if draft is not None else "", **fields)
    return engine.run(engine.plan(request, prompt), sampling)


def test_prompt_lookup_proposes_what_followed_the_last_ngram_earlier():
    assert prompt_lookup([1, 2, 3, 4, 1, 2], 2, 3) == [3, 4, 1]
    assert prompt_lookup([1, 2, 3, 4, 9, 2], 2, 3) == [3, 4, 9]  # no earlier (9, 2): the 1-gram 2 then
    assert prompt_lookup([1, 2, 3], 2, 3) == []


def _deepseek():
    from test_rollback import DEEPSEEK

    from kvviz.models.deepseek import Deepseek

    torch.manual_seed(3)
    model = Deepseek(DEEPSEEK)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.4) if p.dim() > 1 else p.fill_(1.0)  # matrices spread; norms at 1
    return model.eval()


TARGETS = {  # every family: GPT-2, Llama (and a Mistral window), DeepSeek's latent cache, Gemma 3's local and global
    # layers, Gemma 4's shared ones, gpt-oss's learned sinks, Qwen3.5's linear-attention state
    "llama": lambda: _llama(1), "llama-window": lambda: _llama(1, window=6),
    "gpt2": lambda: tiny_kvviz_model(n_layer=2, n_head=2, n_embd=32, std=0.3), "deepseek": _deepseek,
    **{family: lambda family=family: _model(family, torch.float32) for family in ("gemma3", "gemma4", "gpt-oss",
                                                                                   "qwen3.5")}}


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("target", list(TARGETS))
def test_speculative_tokens_are_the_targets_greedy_tokens(target, k):
    model = TARGETS[target]()
    prompt = [t % model.config.vocab_size for t in PROMPT]
    plain, _ = generate_ids(Engine(model), prompt, 20)
    draft = _llama(2, n_layer=1, vocab_size=model.config.vocab_size)
    drafters = [{"lookup": 3}, {"draft": draft}]
    for drafter in drafters:
        records = list(speculate(model, prompt, 20, k, **drafter))
        rounds = [r.speculation for r in records]
        tokens = [t for r in rounds for t in r.token_ids]
        assert tokens == plain, (target, k, drafter)
        for record, r in zip(records[1:], rounds[1:], strict=True):  # fed: the pending token and the drafts,
            assert (record.fed_start, record.fed_stop) == (r.start, r.start + 1 + len(r.drafted))  # rejected ones
            # rolled back
            assert r.rolled_back == (r.start + 1 + r.accepted, record.fed_stop)
            assert record.sequence_length == r.start + 2 + r.accepted  # the text: what the cache holds and one
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
    with pytest.raises(GenerationError, match="between 1 and 64, got 100"):
        next(speculate(model, PROMPT, 4, 100, lookup=2))
    with pytest.raises(GenerationError, match="n-gram of 1 to 8 tokens, got 9"):
        next(speculate(model, PROMPT, 4, 2, lookup=9))
    with pytest.raises(GenerationError, match="turn the cache on"):
        next(speculate(model, PROMPT, 4, 2, lookup=2, use_cache=False))


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
        ours = [t for r in speculate(target, PROMPT, 16, 4, **drafter) for t in r.speculation.token_ids]
        with torch.no_grad():
            theirs = peer.generate(ids, max_new_tokens=16, do_sample=False, pad_token_id=0, **options)
        assert ours == theirs[0, len(PROMPT):].tolist(), drafter


def test_the_acceptance_rule_draws_from_the_targets_distribution():
    """Leviathan et al.'s rule: whatever the draft's q, the first token kept is distributed as the target's p. Drawn
    6,000 times from a seeded generator, its frequencies stay within 0.03 of p (about 5 standard deviations; keeping
    every draft instead would give q), for a draft model's q and
    for prompt lookup's (all on the draft)."""
    p_logits = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.0, 0.0, 0.0, 0.0]]).log_softmax(-1)  # p at the first draft
    p = p_logits[0].softmax(-1)  # [0.64, 0.24, 0.09, 0.03]
    q = torch.tensor([[0.1, 0.2, 0.6, 0.1]])
    sampling = SamplingSettings(temperature=1.0, seed=3)
    generator = torch.Generator().manual_seed(3)
    for draft_q in (q, None):
        counts = torch.zeros(4)
        for _ in range(6_000):
            draft = int(torch.multinomial(q[0], 1, generator=generator)) if draft_q is not None else 2
            accepted, own, _ = verify(lambda i: p_logits[i], [draft], draft_q, sampling, generator)
            counts[draft if accepted else own] += 1
        assert torch.allclose(counts / counts.sum(), p, atol=0.03), (counts / counts.sum(), p)


@pytest.mark.parametrize("drafter", ["lookup", "draft"])
def test_seeded_sampling_is_reproducible_and_the_seed_matters(drafter):
    model = _llama(1)
    options = {"lookup": 3} if drafter == "lookup" else {"draft": _llama(2, n_layer=1)}

    def tokens(seed):
        sampling = SamplingSettings(temperature=1.0, top_k=20, seed=seed)
        records = speculate(model, PROMPT, 24, 4, sampling=sampling, **options)
        return [t for r in records for t in r.speculation.token_ids]

    assert tokens(7) == tokens(7)
    assert tokens(7) != tokens(8)
    assert all(0 <= t < 64 for t in tokens(9))


def test_a_round_with_two_of_four_drafts_accepted_holds_what_a_hand_count_says():
    """A target whose logits are all zero always picks token 0 (the first maximum). After the prompt's pass the text
    is [7, 0, 0, 0, 3, 9, 7] and 0; prompt lookup of the 1-gram [0] proposes what followed its first occurrence,
    [0, 0, 3, 9]. The target accepts two, rejects 3 (it wants 0) and adds its own 0: the round fed positions 7..11,
    keeps 7 + 1 + 2 = 10 of them in every layer, and rolls back 10 and 11."""
    model = _llama(1)
    with torch.no_grad():
        model.model.embed_tokens.weight.zero_()  # tied: the head is zero too
    records = list(speculate(model, [7, 0, 0, 0, 3, 9, 7], 6, 4, lookup=1))
    assert records[0].speculation.token_ids == (0,)
    record, round_ = records[1], records[1].speculation
    assert round_.drafted == (0, 0, 3, 9)
    assert (round_.accepted, round_.token_ids, round_.rolled_back) == (2, (0, 0, 0), (10, 12))
    assert (record.fed_start, record.fed_stop, record.kv_written) == (7, 12, (7, 12))
    assert record.kv_computed == (5, 5, 5)
    assert record.layer_positions_held == (10, 10, 10)
    assert record.new_tokens == 4 and not record.final and records[-1].final
    assert (round_.drafted_total, round_.accepted_total, round_.target_passes_total) == (4, 2, 2)
    assert round_.tokens_per_target_pass == 2.0 and round_.acceptance_rate == 0.5


@pytest.mark.parametrize("target", ["gpt2", "llama"])
def test_the_verifying_pass_on_the_fast_file_equals_the_teaching_model(target):
    """The verifying pass reads every row's logits through the fast file's blocks and its head on all rows at once
    (a row-major copy of GPT-2's column-major embedding): within float rounding of the teaching forward's logits at
    every position, after a prefill, on a cache of its own."""
    from kvviz.cache.kv_cache import build_cache
    from kvviz.cache.probe import PassProbe
    from kvviz.core.records import EXACT
    from kvviz.engine.speculative import verifying_pass

    model = TARGETS[target]()
    engine = Engine(model)
    assert engine.fast is not None
    prompt = [t % model.config.vocab_size for t in PROMPT]
    caches = [build_cache(model.config.cache_layers(EXACT), 40, spare=6) for _ in range(2)]
    fed = torch.tensor([[9, 4, 33, 2, 7]])
    positions = torch.arange(len(prompt), len(prompt) + 5)
    with torch.inference_mode():
        for cache in caches:
            model(torch.tensor([prompt]), torch.arange(len(prompt)), cache)
        rows = verifying_pass(engine, fed, positions, caches[0], PassProbe(model.config.n_layer),
                              engine.fast.decode_weights(model), first=1)
        expected = model(fed, positions, caches[1])[0]  # (5, V): the teaching forward's every position
    for i in range(4):
        assert torch.allclose(rows(i), expected[1 + i], atol=1e-4, rtol=1e-4), i
