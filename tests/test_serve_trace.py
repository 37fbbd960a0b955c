"""Serving a trace: requests that arrive over time, chunked prefill, preemption by recompute and a prefix cache
across requests. Every request equals its run alone; the prefix cache's hits are the hand count's; the radix tree
matches the longest common token prefix; bad traces are one line and status 2 before anything runs."""

from __future__ import annotations

import json

import pytest
import torch

from kvviz.cache.paged import PagedCache
from kvviz.core.records import RunRequest
from kvviz.core.serve_records import PREEMPTED, PassRow, ServePlan, ServeRecord, ServeRequestPlan, measure
from kvviz.core.trace import TraceError, TraceRequest, parse_trace, read_trace
from kvviz.engine.engine import Engine, SamplingSettings
from kvviz.engine.scheduler import plan_trace, serve

SYSTEM = ("You are a helpful assistant who answers questions about the plays of William Shakespeare, briefly and "
          "kindly, quoting a line where one helps, naming the play and the act, and saying plainly when you do not "
          "know the answer to it.")


def _engine(name: str | None = None) -> Engine:
    from kvviz.sources.weights import load_model

    loaded = load_model(name)
    return Engine(loaded.model, loaded.tokenizer)


def _solo(engine: Engine, prompt_ids, budget: int, sampling: SamplingSettings) -> list[int]:
    """The request run alone by the engine's own cached decode (no pool, no scheduler)."""
    plan = engine.plan(RunRequest(0, "", True, budget, sampling.temperature, sampling.top_k, sampling.seed),
                       list(prompt_ids))
    return [s.token_id for s in engine.run(plan, sampling, top_candidates=1) if s.token_id is not None]


@pytest.mark.parametrize(("prefix_cache", "chunk", "blocks", "temperature"), [
    ("radix", 16, 64, 0.0),  # the defaults
    ("hash", 0, 64, 0.0),  # whole blocks, whole prompts
    ("off", 7, 64, 0.0),  # no sharing at all, odd chunks
    ("radix", 32, 15, 0.9),  # a pool too small for the document and the chats at once: preemption, seeded
])
def test_every_request_of_the_built_in_trace_equals_its_run_alone(prefix_cache, chunk, blocks, temperature):
    engine = _engine()
    sampling = SamplingSettings(temperature, None, 7 if temperature else None)
    plan = plan_trace(engine, read_trace(), 16, blocks, prefix_cache, chunk, 256, sampling)
    records = list(serve(engine, plan, sampling))
    last = records[-1]
    assert last.final and all(s == "finished" for s in last.states)
    for request, out in zip(plan.requests, last.outputs, strict=True):
        assert list(out) == _solo(engine, request.prompt_ids, request.budget, sampling), request.name
    preempted = [r for r in records if r.preempted]
    if blocks == 15:
        first = preempted[0]
        victim = first.preempted[0]
        assert first.states[victim] == PREEMPTED
        assert f"preempted {plan.requests[victim].name}, the youngest" in first.decision
        # the victim was the running request admitted last
        admitted_order = [i for r in records[:first.step] for i in r.admitted]
        running = [i for i in admitted_order if records[first.step - 1].states[i] in ("prefilling", "decoding")]
        assert victim == running[-1]
    else:
        assert not preempted


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_llama_family_trace_with_chunks_a_prefix_cache_and_a_preemption_equals_each_run_alone(temperature):
    engine = _engine("random:kvviz-shakespeare-gqa")
    trace = parse_trace("\n".join(json.dumps(r) for r in [
        {"arrive_at_pass": 0, "prompt": SYSTEM + " Question: Who is Hamlet?", "max_new_tokens": 6},
        {"arrive_at_pass": 2, "prompt": SYSTEM + " Question: Where is Verona?", "max_new_tokens": 9},
        {"arrive_at_pass": 20, "prompt": SYSTEM + " Question: Who is Hamlet? Answer: a prince.", "max_new_tokens": 5},
    ]))
    sampling = SamplingSettings(temperature, None, 3 if temperature else None)
    plan = plan_trace(engine, trace, 8, 12, "radix", 5, 64, sampling)
    records = list(serve(engine, plan, sampling))
    assert sum(hit for r in records for hit in r.cached_tokens) > 0
    assert any(r.preempted for r in records)
    for request, out in zip(plan.requests, records[-1].outputs, strict=True):
        assert list(out) == _solo(engine, request.prompt_ids, request.budget, sampling)


# The built-in trace, counted by hand from its token counts (GPT-2's tokenizer): the system prompt is 46 tokens and
# " Question:" 2 more, so the chats share 48; chat 1's prompt is 53 (its question " Who is Hamlet?" 5 more);
# follow-up 1 is chat 1's prompt and an answer and a question (79), follow-up 2 follow-up 1's and more (104).
# chat 2 and 3 arrive after chat 1 has prefilled (4 chunks of 16 from pass 0), the follow-ups after chat 1 and
# follow-up 1 have finished: their prefixes are cached blocks that no request holds any more.
RADIX_HITS = {"chat 1": 0, "chat 2": 48, "chat 3": 48, "document": 0, "follow-up 1": 53, "follow-up 2": 79,
              "chat 4": 48}
# By block hash, only whole blocks of 16 within the prompt but its last token: 48 -> 48, 53 -> 48, 79 -> 64.
HASH_HITS = {"chat 1": 0, "chat 2": 48, "chat 3": 48, "document": 0, "follow-up 1": 48, "follow-up 2": 64,
             "chat 4": 48}


@pytest.mark.parametrize(("prefix_cache", "hits"), [("radix", RADIX_HITS), ("hash", HASH_HITS)])
def test_the_prefix_cache_hits_of_the_built_in_trace_are_the_hand_counts(prefix_cache, hits):
    engine = _engine()
    tokens = engine.tokenizer.encode
    counted = (SYSTEM, SYSTEM + " Question:", SYSTEM + " Question: Who is Hamlet?")
    assert [len(tokens(text)) for text in counted] == [46, 48, 53]
    plan = plan_trace(engine, read_trace(), 16, 64, prefix_cache, 16, 256)
    records = list(serve(engine, plan))
    found = {plan.requests[i].name: hit for r in records for i, hit in zip(r.admitted, r.cached_tokens, strict=True)}
    assert found == hits
    m = measure(plan, records)
    assert m.prompt_tokens == 53 + 53 + 54 + 222 + 79 + 104 + 53
    assert m.prefill_tokens == m.prompt_tokens - sum(hits.values())
    assert m.cached_tokens == sum(hits.values())


def test_the_radix_cache_matches_the_longest_common_prefix_and_evicts_leaves_first():
    cache = PagedCache(1, 1, 2, num_blocks=6, block_size=4, prefix_cache="radix")

    def run(request: int, tokens: list[int]) -> int:
        matched = cache.admit(request, tokens)
        cache.prepare([request], [tokens[matched:]])
        cache.update(0, None, *([torch.zeros(1, 1, len(tokens) - matched, 2)] * 2))
        cache.release(request)
        return matched

    a = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert run(0, a) == 0
    assert run(1, [1, 2, 3, 4, 5, 6, 70, 80]) == 6  # the longest common prefix, into the second block
    assert run(2, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]) == 9  # a's whole sequence
    assert run(3, [1, 2, 99]) == 2
    hashed = PagedCache(1, 1, 2, num_blocks=6, block_size=4, prefix_cache="hash")
    assert hashed.admit(0, a) == 0
    hashed.prepare([0], [a])
    hashed.release(0)
    assert hashed.admit(1, [1, 2, 3, 4, 5, 6, 70, 80]) == 4  # whole blocks only


def test_a_bad_trace_is_one_line_and_status_2_before_anything_runs(kvviz_cli, tmp_path, monkeypatch):
    import kvviz.sources.weights as weights

    loads = []
    real = weights.load_model
    monkeypatch.setattr(weights, "load_model", lambda *a, **k: loads.append(a) or real(*a, **k))
    bad = tmp_path / "bad.jsonl"
    cases = {
        "not json": ("{arrive_at_pass: 0}\n", "line 1: not JSON"),
        "out of order": ('{"arrive_at_pass": 3, "prompt": "a", "max_new_tokens": 2}\n'
                         '{"arrive_at_pass": 1, "prompt": "b", "max_new_tokens": 2}\n',
                         "line 2: arrives at pass 1, before the request above it"),
        "missing": ('{"arrive_at_pass": 0, "prompt": "a"}\n', "no max_new_tokens"),
    }
    for text, says in cases.values():
        bad.write_text(text)
        done = kvviz_cli("serve-trace", "--trace", str(bad))
        assert done.returncode == 2 and done.stdout == ""
        assert says in done.stderr and done.stderr.count("\n") == 1
    assert not loads  # refused before the model loaded
    bad.write_text(json.dumps({"arrive_at_pass": 0, "prompt": SYSTEM, "max_new_tokens": 40}) + "\n")
    done = kvviz_cli("serve-trace", "--trace", str(bad), "--blocks", "5")
    assert done.returncode == 2 and done.stdout == "" and done.stderr.count("\n") == 1
    assert "can never fit the pool: 86 positions take 6 blocks of 16, and the pool has 5" in done.stderr
    with pytest.raises(TraceError, match="no such file"):
        read_trace(tmp_path / "missing.jsonl")


def test_serve_trace_json_reports_each_request_against_its_solo_run_and_the_comparison(kvviz_cli):
    done = kvviz_cli("serve-trace", "--repeat", "1", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["all_identical_to_solo"] and len(report["requests"]) == 7
    assert set(report["comparison"]) == {"as configured", "no prefix cache", "no chunking", "all at once"}
    assert report["comparison"]["no prefix cache"]["prefill_tokens"] == report["prompt_tokens"] == 618
    assert report["prefill_tokens"] == 618 - sum(RADIX_HITS.values())
    assert report["prefill_tokens_cut"] == round(1 - report["prefill_tokens"] / 618, 4)
    document = next(r for r in report["requests"] if r["name"] == "document")
    assert document["prompt_tokens"] == 222 and document["first_token_passes"] == -(-222 // 16)


def test_the_measures_are_counted_from_the_records():
    """Two requests, three passes, by hand: r0 prefills at pass 0 (its first token), decodes at 1 and 2; r1 arrives
    at pass 1 and prefills at 1 and 2 (chosen at 2)."""
    plan = ServePlan((ServeRequestPlan(0, "a", 0, "a", (1, 2), ("a", "b"), 3),
                      ServeRequestPlan(1, "b", 1, "b", (1, 2, 3, 4), ("a",) * 4, 1)),
                     "m", 1, 64, 4, 8, "radix", 2, 8, 8, "greedy")

    def record(step, rows, seconds, admitted=(), hits=()):
        return ServeRecord(step, tuple(rows), ("decoding", "decoding"), ((), ()), ((), ()), (0, 0), ((), ()), (), (),
                           (), 8, 4, tuple(admitted), tuple(hits), (), (), 0, "", (), seconds, False)

    records = [record(0, [PassRow(0, True, 0, 2, 5)], 0.010, [0], [0]),
               record(1, [PassRow(0, False, 2, 1, 6), PassRow(1, True, 1, 2, None)], 0.020, [1], [1]),
               record(2, [PassRow(0, False, 3, 1, 7), PassRow(1, True, 3, 1, 8)], 0.030)]
    m = measure(plan, records)
    a, b = m.requests
    assert (a.first_token_passes, a.first_token_ms, a.max_gap_passes, a.max_gap_ms) == (1, 10.0, 1, 30.0)
    assert (b.first_token_passes, b.first_token_ms, b.cached_tokens, b.prefill_tokens) == (2, 50.0, 1, 3)
    assert (m.tokens, m.prefill_tokens, m.cached_tokens) == (4, 5, 1)
    assert m.long_prefill_gap_ms == 30.0  # b has the longest prompt; a's gap from pass 1 to 2 spans its prefill
    assert m.hit_rate == pytest.approx(1 / 6)


def test_trace_requests_parse_with_names_and_comments():
    trace = parse_trace('# a comment\n\n{"arrive_at_pass": 0, "prompt": "x", "max_new_tokens": 1, "name": "q"}\n'
                        '{"arrive_at_pass": 0, "prompt": "y", "max_new_tokens": 2}\n')
    assert trace == (TraceRequest(0, "x", 1, "q"), TraceRequest(0, "y", 2, "r2"))
