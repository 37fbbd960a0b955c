"""KV-cache memory by formula, checked against hand-computed literals from the published configs."""

from __future__ import annotations

import json

import pytest

from kvviz.cli.commands import main
from kvviz.core.memory import find_architecture, reference_architectures


def run_json(capsys, *argv: str) -> dict:
    assert main(["memory", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_gpt2_in_bfloat16_at_1024_tokens(capsys):
    # 2 (K, V) x 12 layers x 12 heads x 64 dims x 2 bytes = 36864; x 1024 tokens = 37748736
    result = run_json(capsys, "--model", "gpt2", "--context", "1024", "--dtype", "bfloat16")
    assert result["bytes_per_token"] == 36864
    assert result["bytes"] == 37748736


def test_llama_3_8b_grouped_query_in_bfloat16(capsys):
    result = run_json(capsys, "--arch", "Llama-3-8B", "--dtype", "bfloat16")
    assert result["bytes_per_token"] == 131072  # 2 x 32 layers x 8 KV heads x 128 x 2 bytes
    assert result["attention"] == "gqa"


@pytest.mark.parametrize(("name", "per_token_fp16"), [
    ("Llama-3-70B", 2 * 80 * 8 * 128 * 2),  # 327,680
    ("Falcon-7B", 2 * 32 * 1 * 64 * 2),  # multi-query: one K/V head, 8,192
    ("DeepSeek-V2", 60 * (512 + 64) * 2),  # the latent and the RoPE key, 69,120
    ("gpt2-xl", 2 * 48 * 25 * 64 * 2),  # 307,200
])
def test_reference_bytes_per_token(capsys, name, per_token_fp16):
    assert run_json(capsys, "--arch", name, "--dtype", "float16")["bytes_per_token"] == per_token_fp16


def test_the_sliding_window_stops_the_growth():
    mistral = find_architecture("mistral-7b")
    per_token = 2 * 32 * 8 * 128 * 2
    assert mistral.cache_bytes(1000, "bfloat16") == 1000 * per_token
    assert mistral.cache_bytes(4096, "bfloat16") == 4096 * per_token
    assert mistral.cache_bytes(131072, "bfloat16") == 4096 * per_token


def test_batch_and_float32_scale_the_bytes(capsys):
    result = run_json(capsys, "--arch", "gpt2", "--dtype", "float32", "--batch", "8", "--context", "10")
    assert result["bytes_per_token"] == 2 * 12 * 12 * 64 * 4 * 8
    assert result["bytes"] == 10 * 2 * 12 * 12 * 64 * 4 * 8


def test_a_checkpoint_folder_is_read_from_its_config(capsys, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"n_layer": 3, "n_head": 4, "n_embd": 64, "n_positions": 128,
                                                      "vocab_size": 50257, "model_type": "gpt2"}))
    result = run_json(capsys, "--model", str(tmp_path), "--context", "128")
    assert result["bytes_per_token"] == 2 * 3 * 4 * 16 * 4
    assert result["model_context"] == 128


def test_arch_list_names_every_reference_one_per_line(capsys):
    assert main(["memory", "--arch", "list"]) == 0
    names = capsys.readouterr().out.split("\n")[:-1]
    assert names == [a.name for a in reference_architectures()]
    assert {"Llama-3-8B", "Llama-3-70B", "Mistral-7B", "Falcon-7B", "DeepSeek-V2", "gpt2"} <= set(names)


def test_every_reference_names_its_source():
    for arch in reference_architectures():
        assert "config.json" in arch.source, arch.name


@pytest.mark.parametrize("argv", [["--arch", "nope"], ["--model", "random:nope"], ["--arch", "gpt2", "--model", "gpt2"],
                                  ["--context", "0"], ["--batch", "-1"], ["--dtype", "int8"]])
def test_bad_input_is_one_line_and_status_2(capsys, argv):
    try:
        status = main(["memory", *argv])
    except SystemExit as exc:  # argparse's usage errors
        status = exc.code
    err = capsys.readouterr().err.strip()
    assert status == 2 and len(err.splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize(("dtype", "per_token"), [("bfloat16", 2 * 6 * 6 * 32 * 2), ("float32", 2 * 6 * 6 * 32 * 4)])
def test_generate_measures_the_cache_in_its_dtype(capsys, dtype, per_token):
    # the embedded model: 6 layers, 6 heads of 32 dims; cache_bytes is read from the cache's tensors
    assert main(["generate", "--prompt", "Time flies", "--max-new-tokens", "9", "--dtype", dtype, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["dtype"] == dtype
    assert result["cache_bytes"] == (len(result["prompt_ids"]) + 9) * per_token
