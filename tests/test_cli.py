"""The `kvviz` command line: output, JSON keys, and one-line errors with exit status 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kvviz.cli import main
from kvviz.counting import kv_with_cache, kv_without_cache
from kvviz.model import GPT, GPTConfig
from kvviz.weights import save_checkpoint


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("cli-model")
    model = GPT(GPTConfig(n_ctx=48, n_layer=3, n_head=2, n_embd=32, name="cli-tiny"))
    model.init_weights(torch.Generator().manual_seed(7))
    save_checkpoint(model, folder)
    return folder


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONIOENCODING": "utf-8", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "kvviz", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=120)


def test_count_reproduces_the_lab_example(capsys):
    assert main(["count", "--prompt-tokens", "3", "--new-tokens", "12", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["with_cache"], result["without_cache"], result["avoided"]) == (15, 102, 87)
    assert result["ratio"] == pytest.approx(6.8)


def test_count_multiplies_by_layers(capsys):
    assert main(["count", "--prompt-tokens", "4", "--new-tokens", "10", "--layers", "12", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["without_cache_all_layers"] == 12 * kv_without_cache(4, 10)
    assert result["with_cache_all_layers"] == 12 * kv_with_cache(4, 10)
    assert main(["count", "--prompt-tokens", "3", "--new-tokens", "12"]) == 0
    text = capsys.readouterr().out
    assert "102" in text and "15" in text and "6.8x" in text


@pytest.mark.parametrize("no_cache", [False, True])
def test_generate_json_reports_measured_counts(tiny_checkpoint, capsys, no_cache):
    args = ["generate", "--model", str(tiny_checkpoint), "--prompt", "Time flies fast", "--max-new-tokens", "12",
            "--json"] + (["--no-cache"] if no_cache else [])
    assert main(args) == 0
    result = json.loads(capsys.readouterr().out)
    for key in ("model", "prompt_ids", "output_ids", "text", "cache", "kv_computed_per_layer", "layers", "seconds",
                "tokens_per_second"):
        assert key in result
    P, N = len(result["prompt_ids"]), len(result["output_ids"])
    assert N == 12 and result["layers"] == 3 and result["cache"] is (not no_cache)
    expected = kv_without_cache(P, N) if no_cache else kv_with_cache(P, N)
    assert result["kv_computed_per_layer"] == expected


def test_generate_cached_and_uncached_print_the_same_text(tiny_checkpoint, capsys):
    outputs = []
    for extra in ([], ["--no-cache"]):
        assert main(["generate", "--model", str(tiny_checkpoint), "--prompt", "To be", "--max-new-tokens", "20",
                     "--temperature", "0.8", "--top-k", "40", "--seed", "3", *extra]) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] and outputs[0].startswith("To be")


def test_generate_stops_at_the_context_length(tiny_checkpoint, capsys):
    assert main(["generate", "--model", str(tiny_checkpoint), "--prompt", "Hello", "--max-new-tokens", "500",
                 "--json"]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert len(result["prompt_ids"]) + len(result["output_ids"]) == 48
    assert result["stop_reason"] == "context_full"
    assert "context holds 48 tokens" in captured.err


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["generate", "--model", "gpt5", "--prompt", "x"], "unknown model 'gpt5'"),
        (["generate", "--model", "/no/such/dir", "--prompt", "x"], "no such file"),
        (["generate", "--model", "random:gpt9", "--prompt", "x"], "unknown preset"),
        (["generate", "--prompt", "x", "--max-new-tokens", "0"], "must be a positive integer"),
        (["generate", "--prompt", "x", "--device", "tpu"], "invalid choice"),
        (["generate", "--prompt", "x", "--temperature", "-1"], "0 or a positive number"),
        (["count", "--prompt-tokens", "0", "--new-tokens", "3"], "must be a positive integer"),
        (["count", "--prompt-tokens", "3", "--new-tokens", "-2"], "must be a positive integer"),
        (["count", "--prompt-tokens", "x", "--new-tokens", "2"], "not a whole number"),
        (["export", "--prompt", "x", "--out", "o", "--format", "gif"], "--format takes png, svg"),
    ],
)
def test_bad_input_gives_one_line_and_status_2(args, fragment):
    result = run_cli(*args)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert fragment in lines[0]
    assert "Traceback" not in result.stderr


def test_corrupt_checkpoint_and_long_prompt_are_refused(tiny_checkpoint, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((tiny_checkpoint / "config.json").read_text())
    data = (tiny_checkpoint / "model.safetensors").read_bytes()
    (broken / "model.safetensors").write_bytes(data[: len(data) // 2])
    result = run_cli("generate", "--model", str(broken), "--prompt", "x")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "model.safetensors" in result.stderr

    result = run_cli("generate", "--model", str(tiny_checkpoint), "--prompt", "word " * 60)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "context" in result.stderr


def test_unavailable_device_is_refused(tiny_checkpoint):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    result = run_cli("generate", "--model", str(tiny_checkpoint), "--prompt", "x", "--device", "cuda")
    assert result.returncode == 2 and "not available" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_help_explains_every_command():
    top = run_cli("--help")
    assert top.returncode == 0
    for command in ("generate", "count", "bench", "export", "train"):
        assert command in top.stdout
        sub = run_cli(command, "--help")
        assert sub.returncode == 0 and "usage: kvviz " + command in sub.stdout
    assert "<|endoftext|>" in run_cli("generate", "--help").stdout


def test_bench_reports_speed_and_identity(tiny_checkpoint, capsys):
    assert main(["bench", "--model", str(tiny_checkpoint), "--new-tokens", "10", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    for key in ("cached_tokens_per_second", "uncached_tokens_per_second", "speedup", "identical", "cache_bytes"):
        assert key in result
    assert result["identical"] is True
    assert result["cache_bytes"] == 2 * 3 * 32 * (result["prompt_tokens"] + 10) * 4
    assert (result["cached_runs"], result["uncached_runs"]) == (3, 1)  # short runs take turns by default
    assert main(["bench", "--model", str(tiny_checkpoint), "--new-tokens", "5", "--repeat", "2", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["cached_runs"], result["uncached_runs"]) == (2, 2)


def test_bench_peer_matches_transformers(tiny_checkpoint, capsys):
    pytest.importorskip("transformers")
    assert main(["bench", "--model", str(tiny_checkpoint), "--new-tokens", "10", "--peer", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["peer_identical"] is True
    assert result["peer_cached_tokens_per_second"] > 0


def test_default_model_runs_from_any_directory(tmp_path):
    from kvviz.resources import default_model_dir

    assert (default_model_dir() / "model.safetensors").is_file(), "the embedded model is not installed"
    result = run_cli("generate", "--prompt", "Time flies", "--max-new-tokens", "5", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["model"] == "kvviz-shakespeare" and len(out["output_ids"]) == 5
    assert out["kv_computed_per_layer"] == len(out["prompt_ids"]) + 5

