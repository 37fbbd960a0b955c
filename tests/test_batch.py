"""Serving several requests from a paged KV cache: batched tokens equal each request's run alone, blocks are
shared, copied on write and freed as a hand count says, and bad batches are refused before anything runs."""

from __future__ import annotations

import json

import pytest
import torch
from helpers_checkpoints import plan_ids

from kvviz.cache.paged import PagedCache
from kvviz.engine.engine import Engine, SamplingSettings

SYSTEM = ("You are a helpful assistant who answers questions about the plays of William Shakespeare, briefly "
          "and kindly, quoting a line where one helps, and saying so plainly when you do not know.\n")
QUESTIONS = ("Who is Hamlet?", "Where is Verona?", "What is a sonnet?", "Why does Lear rage?")


def test_four_requests_sharing_a_system_prompt_equal_their_runs_alone_in_fewer_blocks(kvviz_cli):
    done = kvviz_cli("batch", *[a for q in QUESTIONS for a in ("--prompt", SYSTEM + q)], "--block-size", "8",
                     "--new-tokens", "16", "--repeat", "1", "--json")
    assert (done.returncode, done.stderr) == (0, "")
    report = json.loads(done.stdout)
    requests = report["requests"]
    for question, request in zip(QUESTIONS, requests, strict=True):
        alone = kvviz_cli("generate", "--prompt", SYSTEM + question, "--max-new-tokens", "16", "--json")
        assert alone.returncode == 0, alone.stderr
        assert request["output_ids"] == json.loads(alone.stdout)["output_ids"]
        assert request["max_abs_logit_diff_vs_solo"] < 1e-4
    ids = [r["prompt_ids"] for r in requests]
    common = next(n for n in range(min(map(len, ids)) + 1) if n == min(map(len, ids)) or len({i[n] for i in ids}) > 1)
    assert common >= 32, "the system prompt is a long shared prefix"
    full_shared = common // 8
    unshared = sum(-(-(len(i) + 16) // 8) for i in ids)  # ceil((P + N) / B) blocks a request, alone
    assert report["blocks_unshared"] == unshared
    assert report["blocks_shared"] >= full_shared
    assert report["blocks_used"] <= unshared - 3 * full_shared  # the three later requests store none of them
    assert report["copy_on_write_copies"] == (3 if common % 8 else 0)  # each diverges inside the shared block
    assert report["paged_bytes"] == report["blocks_used"] * 8 * report["bytes_per_position"]
    lengths = [len(i) + 16 for i in ids]
    assert report["used_bytes"] == sum(lengths) * report["bytes_per_position"]
    assert report["contiguous_reserved_bytes"] == 4 * max(lengths) * report["bytes_per_position"]

    alone = kvviz_cli("batch", *[a for q in QUESTIONS for a in ("--prompt", SYSTEM + q)], "--block-size", "8",
                      "--new-tokens", "16", "--no-prefix-sharing", "--repeat", "1", "--json")
    unshared_report = json.loads(alone.stdout)
    assert (unshared_report["blocks_used"], unshared_report["blocks_shared"]) == (unshared, 0)
    assert [r["output_ids"] for r in unshared_report["requests"]] == [r["output_ids"] for r in requests]


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_a_llama_batch_of_different_lengths_and_budgets_equals_each_run_alone(temperature):
    """Rows at different positions (RoPE per row), requests that finish at different steps and free their
    blocks, greedy and seeded: each request's tokens and logits are its own run's."""
    from kvviz.engine.serving import plan_batch, run_batch
    from kvviz.sources.weights import load_model

    loaded = load_model("random:kvviz-shakespeare-gqa")
    engine = Engine(loaded.model, loaded.tokenizer)
    sampling = SamplingSettings(temperature, None, 7 if temperature else None)
    prompts = [[5, 6, 7, 8, 9, 10, 11], [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16], [400, 401]]
    budgets = [9, 4, 12]
    alone_logits: dict[int, list[torch.Tensor]] = {i: [] for i in range(3)}
    alone_ids = []
    for i, (ids, budget) in enumerate(zip(prompts, budgets, strict=True)):
        plan = plan_ids(engine, ids, budget, sampling=sampling)
        records = engine.run(plan, sampling, 1, watch_logits=lambda lg, i=i: alone_logits[i].append(lg.clone()))
        alone_ids.append([r.token_id for r in records if r.token_id is not None])
    batch_logits: dict[int, list[torch.Tensor]] = {i: [] for i in range(3)}
    records = list(run_batch(engine, plan_batch(engine, prompts, budgets, 4, sampling=sampling), sampling,
                             lambda i, lg: batch_logits[i].append(lg.clone())))
    assert [list(o) for o in records[-1].outputs] == alone_ids
    gap = max(float((a - b).abs().max()) for i in range(3) for a, b in zip(alone_logits[i], batch_logits[i],
                                                                           strict=True))
    assert gap < 1e-4
    decode_rows = [r.rows for r in records if not r.prefill]
    assert decode_rows[0] == (0, 1, 2) and decode_rows[-1] == (2,)  # request 1 (4 tokens) leaves first
    after_1_left = next(r for r in records if not r.prefill and 1 not in r.rows)
    assert after_1_left.tables[1] == () and 1 not in {o for b in after_1_left.blocks for o in b.owners}
    assert set(after_1_left.free_blocks) & set(records[3].tables[1])  # its blocks are back on the free list


def test_identical_prompts_share_whole_blocks_and_copy_the_partial_one_on_write():
    cache = PagedCache(n_layer=1, n_kv_head=1, head_dim=2, num_blocks=8, block_size=4)
    prompt = list(range(100, 110))  # 10 tokens: blocks [0..3], [4..7], and 2 of a third
    assert cache.admit(0, prompt) == 0
    cache.prepare([0], [prompt])
    cache.update(0, torch.arange(10), torch.full((1, 1, 10, 2), 1.0), torch.full((1, 1, 10, 2), 2.0))
    first = list(cache.tables[0])
    assert cache.admit(1, prompt) == 9  # all but the last token, whose logits request 1 needs
    assert cache.tables[1] == first and [cache.refs[b] for b in first] == [2, 2, 2]
    cache.prepare([1], [prompt[9:]])  # position 9 lies in the third block, whose slot 1 request 0 filled
    assert cache.tables[1][:2] == first[:2] and cache.tables[1][2] != first[2]
    assert (cache.copies, cache.refs[first[2]], cache.refs[cache.tables[1][2]]) == (1, 1, 1)
    copied = cache.kv[0, 0, cache.tables[1][2] * 4: cache.tables[1][2] * 4 + 1]
    assert torch.equal(copied, torch.full((1, 1, 2), 1.0))  # the agreed position came along
    cache.release(0)
    assert [cache.refs[b] for b in first] == [1, 1, 0] and first[2] in cache.free


BAD_BATCHES = [
    (("--new-tokens", "4"), "no prompt: give --prompt TEXT (once per request) or --prompts-file FILE"),
    (("--prompts-file", "{empty}"), "{empty}: holds no prompt (one prompt per line)"),
    (("--prompt", "Hi", "--block-size", "0"), "argument --block-size: must be"),
    (("--prompts-file", "{fifo}"), "{fifo}: not a regular file"),  # would wait for a writer forever
    (("--prompt", "Hi", "--prompt", ("word " * 250).strip(), "--new-tokens", "16"),
     "request 2: 250 prompt tokens and 16 new do not fit the model's context of 256"),
]


@pytest.mark.parametrize(("args", "message"), BAD_BATCHES)
def test_a_bad_batch_is_one_line_and_status_2(kvviz_cli, tmp_path, args, message):
    import os

    empty, fifo = tmp_path / "prompts.txt", tmp_path / "fifo"
    empty.write_text("\n  \n")
    os.mkfifo(fifo)
    done = kvviz_cli("batch", *[a.format(empty=empty, fifo=fifo) for a in args])
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.splitlines()) == 1 and message.format(empty=empty, fifo=fifo) in done.stderr


def test_the_paging_lesson_answers_the_blocks_four_requests_hold_by_hand_count(kvviz_cli, tmp_path):
    """kv-paging: four prompts of 53, 53, 54 and 53 tokens sharing a 48-token system prompt, 16 new tokens each,
    blocks of 8: 9 blocks each alone (36), and the 6 blocks of the system prompt stored once: 36 - 3 x 6 = 18."""
    import re

    from kvviz.lessons.lesson import LessonError, parse_lesson

    done = kvviz_cli("lesson", "--file", "kv-paging", "--export", str(tmp_path / "slides"), "--format", "png",
                     "--width", "640")
    assert done.returncode == 0, done.stderr
    assert re.findall(r"answer: (.*) \(measured\)", done.stdout) == ["18 blocks"]
    assert len(list((tmp_path / "slides").glob("kvviz-lesson-*.png"))) == 5
    bad = ('title = "x"\n[[step]]\ntitle = "s"\ntext = "t"\nprompts = ["a", "b"]\nprompt = "p"\nadvance_to = 0\n'
           'max_new_tokens = 4\n')
    with pytest.raises(LessonError, match="step 1: prompt: a serving step has prompts, one cache for all, no window"):
        parse_lesson(bad, "bad.toml")
