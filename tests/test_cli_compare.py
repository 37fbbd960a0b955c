"""`kvviz compare` (the cached and the uncached run in lockstep) and `--break-cache`: the JSON's keys, the
measured counts against hand counts, the table, and one-line errors with status 2."""

from __future__ import annotations

import json
import statistics

import pytest
from helpers_checkpoints import save_kvviz_folder

from kvviz.cli.commands import main
from kvviz.core.records import CACHE_FAULTS

PROMPT = "Time flies fast"  # 3 GPT-2 tokens: "Time", " flies", " fast"
TOP_KEYS = {"model", "prompt_ids", "dtype", "break_cache", "window", "sinks", "steps", "summary"}
STEP_KEYS = {"step", "cached_token_id", "uncached_token_id", "same", "max_abs_logit_diff", "logit_tolerance",
             "logits_agree", "cached_seconds", "uncached_seconds", "cached_kv_computed", "uncached_kv_computed"}
SUMMARY_KEYS = {"identical", "first_divergence", "first_logit_divergence", "max_abs_logit_diff", "logit_tolerance",
                "cached_seconds_total", "uncached_seconds_total", "time_ratio", "time_ratio_interval",
                "time_ratio_clear", "time_verdict", "kv_with_cache", "kv_without_cache"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    """A random 3-layer model with 48 positions."""
    return str(save_kvviz_folder(tmp_path_factory.mktemp("compare") / "tiny", n_layer=3, n_head=2, n_embd=32,
                                 n_ctx=48, seed=7))


def compare(capsys, *args: str) -> tuple[int, str, str]:
    status = main(["compare", *args])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def compare_json(capsys, *args: str) -> dict:
    status, out, err = compare(capsys, *args, "--json")
    assert (status, err) == (0, ""), err
    return json.loads(out)


def test_json_has_exactly_the_documented_keys_and_the_hand_counts(tiny, capsys):
    result = compare_json(capsys, "--model", tiny, "--prompt", PROMPT, "--new-tokens", "12")
    assert set(result) == TOP_KEYS
    assert all(set(step) == STEP_KEYS for step in result["steps"])
    assert set(result["summary"]) == SUMMARY_KEYS
    assert len(result["prompt_ids"]) == 3 and result["model"] == "tiny"
    assert (result["dtype"], result["break_cache"]) == ("float32", False)
    assert [step["step"] for step in result["steps"]] == list(range(1, 13))
    summary = result["summary"]
    assert summary["identical"] is True and summary["first_divergence"] is None
    assert all(step["same"] and step["cached_token_id"] == step["uncached_token_id"] for step in result["steps"])
    # P=3, N=12: with the cache 3 + 12 = 15; without, passes over 3, 4, ..., 14 tokens = 102.
    assert (summary["kv_with_cache"], summary["kv_without_cache"]) == (15, 102)
    assert summary["max_abs_logit_diff"] < 1e-3
    assert summary["cached_seconds_total"] > 0 and summary["uncached_seconds_total"] > 0
    # the median of the steps' own ratios, not the ratio of the totals (one slow step would swing that)
    step_ratios = [step["uncached_seconds"] / step["cached_seconds"] for step in result["steps"]]
    assert summary["time_ratio"] == pytest.approx(statistics.median(step_ratios), rel=1e-2)
    assert summary["first_logit_divergence"] is None
    assert all(step["logits_agree"] is True for step in result["steps"])


def test_a_broken_cache_is_caught_by_its_logits_while_the_tokens_agree(tiny, capsys):
    """On this checkpoint the broken cache's greedy tokens happen to agree for 12 steps; its logits part at
    step 2, the first step that reads what the prefill wrote one slot late, far beyond float noise."""
    result = compare_json(capsys, "--model", tiny, "--prompt", PROMPT, "--new-tokens", "12", "--break-cache")
    summary = result["summary"]
    assert summary["first_divergence"] is None, "the situation: the same tokens all along"
    assert summary["first_logit_divergence"] == 2 and summary["identical"] is False
    assert [step["logits_agree"] for step in result["steps"]] == [True] + [False] * 11
    assert result["steps"][1]["max_abs_logit_diff"] > 100 * result["steps"][1]["logit_tolerance"]
    status, out, _ = compare(capsys, "--model", tiny, "--prompt", PROMPT, "--new-tokens", "12", "--break-cache")
    assert "identical: no, the logits part at step 2" in out and "though the 12 tokens still agree" in out
    assert [row.split()[-6] for row in out.splitlines()[3:15]] == ["✓"] + ["≠"] * 11


def test_per_step_counts_and_times_are_the_passes_of_that_step(tiny, capsys):
    result = compare_json(capsys, "--model", tiny, "--prompt", PROMPT, "--new-tokens", "4")
    steps = result["steps"]
    # With the cache: the prompt's 3, then one per token, and the last step also feeds its token (1 + 1).
    assert [step["cached_kv_computed"] for step in steps] == [3, 1, 1, 2]
    # Without: every step re-runs the whole sequence, 3, 4, 5, 6 tokens.
    assert [step["uncached_kv_computed"] for step in steps] == [3, 4, 5, 6]
    assert (result["summary"]["kv_with_cache"], result["summary"]["kv_without_cache"]) == (7, 18)
    for mode in ("cached", "uncached"):
        total = sum(step[f"{mode}_seconds"] for step in steps)
        assert total == pytest.approx(result["summary"][f"{mode}_seconds_total"], abs=1e-5)
    assert steps[0]["max_abs_logit_diff"] == 0.0  # the prefill: the same pass over the same tokens


@pytest.mark.parametrize("sampling", [(), ("--temperature", "0.8", "--top-k", "40", "--seed", "1")],
                         ids=["greedy", "seeded-sampling"])
def test_the_embedded_model_gives_the_same_100_tokens_with_and_without_the_cache(capsys, sampling):
    result = compare_json(capsys, "--prompt", PROMPT, "--new-tokens", "100", *sampling)
    assert result["model"] == "kvviz-shakespeare" and len(result["steps"]) == 100
    summary = result["summary"]
    assert summary["identical"] is True and summary["first_divergence"] is None
    assert all(step["same"] for step in result["steps"])
    assert (summary["kv_with_cache"], summary["kv_without_cache"]) == (3 + 100, 100 * 3 + 100 * 99 // 2)


def test_a_broken_cache_makes_the_runs_part(capsys):
    result = compare_json(capsys, "--prompt", PROMPT, "--new-tokens", "12", "--break-cache")
    summary = result["summary"]
    assert result["break_cache"] is True
    assert summary["identical"] is False
    assert isinstance(summary["first_divergence"], int) and 2 <= summary["first_divergence"] <= 12
    assert summary["max_abs_logit_diff"] > 1e-2
    assert not result["steps"][summary["first_divergence"] - 1]["same"]
    assert all(step["same"] for step in result["steps"][: summary["first_divergence"] - 1])
    # Broken or not, each run computes what it computes: the counts stay measured and equal.
    assert (summary["kv_with_cache"], summary["kv_without_cache"]) == (15, 102)


def test_the_table_has_a_row_per_step_and_the_summary(tiny, capsys):
    status, out, err = compare(capsys, "--model", tiny, "--prompt", PROMPT, "--new-tokens", "5")
    assert (status, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == "kvviz compare: tiny, 3 prompt tokens, 5 new tokens, greedy, float32"
    assert lines[1].split()[:4] == ["step", "cached", "token", "uncached"]
    rows, summary = lines[2:7], lines[7:]
    assert [int(row.split()[0]) for row in rows] == [1, 2, 3, 4, 5]
    assert all("✓" in row for row in rows)
    assert [row.split()[-2:] for row in rows] == [["3", "3"], ["1", "4"], ["1", "5"], ["1", "6"], ["2", "7"]]
    assert summary[0] == ("identical: yes, the same 5 tokens with and without the cache, the logits within float "
                          "noise at every step")
    assert summary[1].startswith("max |Δlogit|: ") and "(float noise for float32: up to " in summary[1]
    assert summary[2].startswith("time: ") and " s with cache, " in summary[2]
    # five steps are too few for an interval around the median at 95%: no ratio is claimed
    assert "too few steps to tell the two apart (5 so far)" in summary[2]
    assert summary[3] == "K/V per layer, measured: 8 with cache, 25 without (17 avoided)"
    assert len(summary) == 4


def test_the_table_of_a_broken_cache_says_so_at_the_top_and_where_the_runs_part(capsys):
    status, out, err = compare(capsys, "--prompt", PROMPT, "--new-tokens", "8", "--break-cache")
    assert (status, err) == (0, "")
    lines = out.splitlines()
    assert lines[1] == f"The KV cache is broken on purpose (late_write): {CACHE_FAULTS['late_write']}."
    rows = lines[3:11]
    assert any("✗" in row for row in rows)
    assert lines[11].startswith("identical: no, the runs part at step ")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_other_number_types_run(tiny, capsys, dtype):
    result = compare_json(capsys, "--model", tiny, "--prompt", PROMPT, "--new-tokens", "6", "--dtype", dtype)
    assert result["dtype"] == dtype and len(result["steps"]) == 6  # identical is not promised out of float32
    assert (result["summary"]["kv_with_cache"], result["summary"]["kv_without_cache"]) == (9, 33)


def test_a_number_type_the_machine_cannot_run_is_one_line(tiny, capsys, monkeypatch):
    from kvviz.engine.engine import Engine

    def unsupported(self, *args, **kwargs):
        raise RuntimeError("\"addmm_impl_cpu_\" not implemented for 'Half'")

    monkeypatch.setattr(Engine, "run", unsupported)
    status, out, err = compare(capsys, "--model", tiny, "--prompt", PROMPT, "--new-tokens", "3", "--dtype", "float16")
    assert (status, out) == (2, "")
    assert err == "kvviz: --dtype float16: cannot run on cpu here (\"addmm_impl_cpu_\" not implemented for 'Half')\n"


def test_compare_stops_at_the_context_length(tiny, capsys):
    status, out, err = compare(capsys, "--model", tiny, "--prompt", "Hello", "--new-tokens", "500", "--json")
    assert status == 0
    result = json.loads(out)
    assert len(result["steps"]) == 47 and result["summary"]["identical"] is True
    assert err == "kvviz: stopped after 47 new tokens: the model's context holds 48 tokens\n"


def test_generate_with_a_broken_cache_says_so_on_stdout_first(tiny, capsys):
    assert main(["generate", "--model", tiny, "--prompt", PROMPT, "--max-new-tokens", "4", "--break-cache"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    note, text = captured.out.split("\n", 1)
    assert note == f"The KV cache is broken on purpose (late_write): {CACHE_FAULTS['late_write']}."
    assert text.startswith(PROMPT)
    assert main(["generate", "--model", tiny, "--prompt", PROMPT, "--max-new-tokens", "4", "--break-cache",
                 "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["break_cache"] is True and result["kv_computed_per_layer"] == 7


def test_generate_with_a_broken_cache_gives_other_tokens(capsys):
    outputs = []
    for extra in ([], ["--break-cache"]):
        assert main(["generate", "--prompt", PROMPT, "--max-new-tokens", "8", "--json", *extra]) == 0
        outputs.append(json.loads(capsys.readouterr().out)["output_ids"])
    assert outputs[0] != outputs[1]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["compare", "--prompt", "x", "--new-tokens", "0"], "--new-tokens: must be a positive integer, got 0"),
        (["compare", "--prompt", "x", "--dtype", "float64"], "--dtype: invalid choice: 'float64'"),
        (["compare", "--prompt", "x", "--temperature", "-1"], "0 or a positive number"),
        (["generate", "--prompt", "x", "--no-cache", "--break-cache"],
         "kvviz: --break-cache breaks the KV cache, so it needs one: leave out --no-cache"),
    ],
    ids=["new-tokens-0", "unknown-dtype", "negative-temperature", "generate-break-cache-without-cache"],
)
def test_bad_input_gives_one_line_and_status_2(args, fragment, kvviz_cli):
    result = kvviz_cli(*args)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and fragment in lines[0], result.stderr


def test_help_explains_compare(kvviz_cli):
    result = kvviz_cli("compare", "--help")
    assert result.returncode == 0 and "usage: kvviz compare" in result.stdout
    for option in ("--new-tokens", "--dtype", "--break-cache", "--seed", "--json"):
        assert option in result.stdout
    assert "compare" in kvviz_cli("--help").stdout
