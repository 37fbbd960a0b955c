"""`kvviz generate/compare/bench --draft M | --prompt-lookup N [--draft-tokens K]` on the embedded model: the same
tokens as plain decoding (a separate plain run says which), each round reported, bad input in one line, status 2."""

from __future__ import annotations

import json

import pytest
import torch
from helpers_checkpoints import byte_level_tokenizer, save_kvviz_folder

QUOTED = ("JULIET: O Romeo, Romeo! wherefore art thou Romeo?\nDeny thy father and refuse thy name;\n\n"
          "NURSE: Say it again.\nJULIET: O Romeo, Romeo! wherefore art thou Romeo?\nDeny thy father")


def _json(result) -> dict:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("drafter", [["--prompt-lookup", "3"], ["--draft", "DRAFT"]])
def test_generate_speculative_gives_plain_tokens_and_reports_each_round(kvviz_cli, tmp_path, drafter):
    if "DRAFT" in drafter:  # a draft of GPT-2's tokenizer, as the embedded model's, but random and 2 layers deep
        drafter = ["--draft", str(save_kvviz_folder(tmp_path / "draft", n_layer=1, n_ctx=256))]
    plain = _json(kvviz_cli("generate", "--prompt", QUOTED, "--max-new-tokens", "20", "--json"))
    fast = _json(kvviz_cli("generate", "--prompt", QUOTED, "--max-new-tokens", "20", "--draft-tokens", "3",
                           *drafter, "--json"))
    assert fast["output_ids"] == plain["output_ids"]
    rounds = fast["rounds"]
    assert [t for r in rounds for t in r["tokens"]] == plain["output_ids"]
    assert rounds[0]["drafted"] == [] and rounds[0]["tokens"] == plain["output_ids"][:1]
    prompt_tokens = len(plain["prompt_ids"])
    for r in rounds[1:]:
        assert len(r["drafted"]) <= 3
        assert r["accepted_tokens"] + r["rolled_back"] == r["drafted"]
        assert r["tokens"][:-1] == r["accepted_tokens"]
        kept = r["start"] + 1 + r["accepted"]  # the pending token's position, then the accepted drafts
        assert r["positions_held"] == kept
        assert r["rolled_back_positions"] == list(range(kept, r["start"] + 1 + len(r["drafted"])))
    assert rounds[-1]["positions_held"] == prompt_tokens + 20 - 1  # all but the last token, still pending
    assert fast["target_passes"] == len(rounds)
    assert fast["drafted"] == sum(len(r["drafted"]) for r in rounds)
    assert fast["accepted"] == sum(r["accepted"] for r in rounds)
    assert fast["tokens_per_target_pass"] == pytest.approx(20 / len(rounds), abs=1e-3)
    if drafter[0] == "--prompt-lookup":
        assert fast["draft_passes"] == 0 and fast["accepted"] > 0 and len(rounds) < 20  # a quote drafts well
    else:
        assert fast["draft_passes"] > 0


def test_compare_draft_puts_plain_and_speculative_side_by_side(kvviz_cli):
    result = kvviz_cli("compare", "--prompt", QUOTED, "--new-tokens", "12", "--prompt-lookup", "2", "--json")
    report = _json(result)
    assert report["tokens_identical"] is True
    assert [line["token"] for line in report["tokens"]] == list(range(1, 13))
    assert [line["plain_pass"] for line in report["tokens"]] == list(range(1, 13))  # one pass a token
    passes = [line["speculative_pass"] for line in report["tokens"]]
    assert passes == sorted(passes) and passes[-1] == report["target_passes"]
    assert {line["from"] for line in report["tokens"]} <= {"draft", "target"}
    assert sum(line["from"] == "draft" for line in report["tokens"]) == report["accepted"]


def test_bench_prompt_lookup_times_both_in_turns_with_the_same_tokens(kvviz_cli):
    report = _json(kvviz_cli("bench", "--prompt", QUOTED, "--new-tokens", "12", "--prompt-lookup", "3",
                             "--draft-tokens", "4", "--repeat", "1", "--json"))
    assert report["tokens_identical"] is True and report["new_tokens"] == 12
    assert report["plain_target_passes"] == 12 and report["target_passes"] <= 12
    assert report["speedup"] == pytest.approx(report["plain_seconds"] / report["speculative_seconds"], rel=0.01)
    assert 0 <= report["acceptance_rate"] <= 1


@pytest.mark.parametrize(("args", "message"), [
    (["--prompt-lookup", "2", "--draft-tokens", "0"], "--draft-tokens: must be a positive integer, got 0"),
    (["--prompt-lookup", "2", "--draft-tokens", "100"], "--draft-tokens: must be at most 64"),
    (["--draft-tokens", "3"], "give --draft or --prompt-lookup too"),
    (["--prompt-lookup", "2", "--draft", "kvviz-shakespeare"], "one drafter"),
    (["--prompt-lookup", "2", "--no-cache"], "leave out --no-cache"),
    (["--prompt-lookup", "2", "--break-cache"], "leave out --no-cache and --break-cache"),
    (["--prompt-lookup", "2", "--attention", "--json"], "a speculative pass has many"),
])
def test_bad_speculative_options_are_one_line_and_status_2(kvviz_cli, args, message):
    result = kvviz_cli("generate", "--max-new-tokens", "4", *args)
    assert result.returncode == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr


def test_a_draft_with_another_tokenizer_is_refused_in_one_line(kvviz_cli, tmp_path):
    from kvviz.models.llama import Llama, LlamaConfig
    from kvviz.sources.weights import save_checkpoint

    folder = tmp_path / "other-tokenizer"
    model = Llama(LlamaConfig(vocab_size=400, n_ctx=64, n_layer=1, n_head=2, n_kv_head=1, n_embd=32,
                              intermediate_size=48, name="other"))
    model.init_weights(torch.Generator().manual_seed(0))
    save_checkpoint(model, folder)
    byte_level_tokenizer().save(str(folder / "tokenizer.json"))
    result = kvviz_cli("generate", "--max-new-tokens", "4", "--draft", str(folder))
    assert result.returncode == 2
    assert "the draft model's tokenizer is not the target's" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
