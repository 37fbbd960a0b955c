"""The `kvviz` command line: output, JSON keys, and one-line errors with exit status 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers_checkpoints import save_kvviz_folder

from kvviz.cli.commands import main
from kvviz.models.gpt2 import GPT, GPTConfig
from kvviz.sources.weights import save_checkpoint


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """A random 3-layer model with 48 positions."""
    return save_kvviz_folder(tmp_path_factory.mktemp("cli-model") / "tiny", n_layer=3, n_head=2, n_embd=32, n_ctx=48,
                             seed=7)


def test_count_reproduces_the_lab_example(capsys):
    assert main(["count", "--prompt-tokens", "3", "--new-tokens", "12", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["with_cache"], result["without_cache"], result["avoided"]) == (15, 102, 87)
    assert result["ratio"] == pytest.approx(6.8)


def test_count_multiplies_by_layers(capsys):
    assert main(["count", "--prompt-tokens", "4", "--new-tokens", "10", "--layers", "12", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["without_cache_all_layers"] == 12 * (4 + 5 + 6 + 7 + 8 + 9 + 10 + 11 + 12 + 13) == 1_020
    assert result["with_cache_all_layers"] == 12 * (4 + 10) == 168
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
    assert len(result["prompt_ids"]) == 3 and len(result["output_ids"]) == 12  # "Time", " flies", " fast"
    assert result["layers"] == 3 and result["cache"] is (not no_cache)
    # With the cache: 3 prompt rows + 12 new ones. Without: passes over 3, 4, ..., 14 tokens.
    assert result["kv_computed_per_layer"] == (102 if no_cache else 15)


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
        (["generate", "--model", "gpt5", "--prompt", "x"], "kvviz: gpt5: unknown model"),
        (["generate", "--model", "/no/such/dir", "--prompt", "x"], "no such file"),
        (["generate", "--model", "random:gpt9", "--prompt", "x"], "unknown preset"),
        (["generate", "--prompt", "x", "--max-new-tokens", "0"], "must be a positive integer"),
        (["generate", "--prompt", "x", "--device", "tpu"], "invalid choice"),
        (["generate", "--prompt", "x", "--temperature", "-1"], "0 or a positive number"),
        (["count", "--prompt-tokens", "0", "--new-tokens", "3"], "must be a positive integer"),
        (["count", "--prompt-tokens", "3", "--new-tokens", "-2"], "must be a positive integer"),
        (["count", "--prompt-tokens", "x", "--new-tokens", "2"], "not a whole number"),
        (["export", "--prompt", "x", "--out", "o", "--format", "bmp"], "unknown format 'bmp'; choose from png"),
        (["export", "--prompt", "x", "--out", "o", "--format", "gif"], "--format gif: an animation; add --animate"),
    ],
)
def test_bad_input_gives_one_line_and_status_2(args, fragment, kvviz_cli):
    result = kvviz_cli(*args)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert fragment in lines[0]
    assert "Traceback" not in result.stderr


def test_any_kvviz_error_is_one_line_and_status_2(capsys, monkeypatch):
    """The CLI reports every KvvizError by its base class: a new error type, defined here and raised by a
    command, needs no registration (the CLI once scanned sys.modules for the error types it knew)."""
    from kvviz.cli import commands as cli
    from kvviz.core.errors import KvvizError

    class BrandNewError(KvvizError):
        pass

    def command(_args):
        raise BrandNewError("the frobnicator is out of range\nsecond line never shown")

    monkeypatch.setitem(cli.COMMANDS, "count", command)
    assert cli.main(["count", "--prompt-tokens", "3", "--new-tokens", "12"]) == 2
    captured = capsys.readouterr()
    assert captured.err == "kvviz: the frobnicator is out of range\n" and captured.out == ""


def test_corrupt_checkpoint_and_long_prompt_are_refused(tiny_checkpoint, tmp_path, kvviz_cli):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((tiny_checkpoint / "config.json").read_text())
    data = (tiny_checkpoint / "model.safetensors").read_bytes()
    (broken / "model.safetensors").write_bytes(data[: len(data) // 2])
    result = kvviz_cli("generate", "--model", str(broken), "--prompt", "x")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "model.safetensors" in result.stderr

    result = kvviz_cli("generate", "--model", str(tiny_checkpoint), "--prompt", "word " * 60)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "context" in result.stderr


def test_unavailable_device_is_refused(tiny_checkpoint, kvviz_cli):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    result = kvviz_cli("generate", "--model", str(tiny_checkpoint), "--prompt", "x", "--device", "cuda")
    assert result.returncode == 2 and "not available" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_help_explains_every_command(kvviz_cli):
    top = kvviz_cli("--help")
    assert top.returncode == 0
    for command in ("generate", "count", "bench", "export", "train"):
        assert command in top.stdout
        sub = kvviz_cli(command, "--help")
        assert sub.returncode == 0 and "usage: kvviz " + command in sub.stdout
    assert "<|endoftext|>" in kvviz_cli("generate", "--help").stdout


def test_bench_reports_speed_and_identity(tiny_checkpoint, capsys):
    assert main(["bench", "--model", str(tiny_checkpoint), "--new-tokens", "10", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    for key in ("cached_tokens_per_second", "uncached_tokens_per_second", "speedup", "identical", "cache_bytes"):
        assert key in result
    assert result["identical"] is True
    # "Hello, I am" is 4 tokens; 14 positions of K and V, 3 layers of width 32, float32: 14 * 2 * 3 * 32 * 4 bytes
    assert result["prompt_tokens"] == 4 and result["cache_bytes"] == 10_752
    assert (result["cached_runs"], result["uncached_runs"]) == (3, 1)  # short runs take turns by default
    assert main(["bench", "--model", str(tiny_checkpoint), "--new-tokens", "5", "--repeat", "2", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["cached_runs"], result["uncached_runs"]) == (2, 2)


def test_bench_dtype_reports_the_bound_it_measured(tiny_checkpoint, capsys):
    assert main(["bench", "--model", str(tiny_checkpoint), "--new-tokens", "6", "--repeat", "1",
                 "--dtype", "bfloat16", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["dtype"] == "bfloat16" and result["identical"] is True
    # 10 positions x 2 (K, V) x 3 layers x 32 dims x 2 bytes; the weights' bytes halve against float32
    assert result["cache_bytes"] == 10 * 2 * 3 * 32 * 2
    assert main(["bench", "--model", str(tiny_checkpoint), "--new-tokens", "6", "--repeat", "1", "--json"]) == 0
    fp32 = json.loads(capsys.readouterr().out)
    assert fp32["dtype"] == "float32" and fp32["weight_bytes"] == 2 * result["weight_bytes"]
    for run in (result, fp32):
        bound = run["memory_read_bytes_per_second"] / run["weight_bytes"]
        assert run["bandwidth_bound_tokens_per_second"] == pytest.approx(bound)
        assert run["fraction_of_bound"] == pytest.approx(run["cached_tokens_per_second"] / bound)
        assert run["memory_read_bytes_per_second"] > 1e8  # any machine reads 100 MB/s


def test_bench_half_precision_times_float32_in_turns_in_the_same_run(tiny_checkpoint, capsys, monkeypatch):
    """`--dtype bfloat16` also times kvviz in float32, alternating run by run, and reports the ratio of the fastest."""
    from kvviz.measure import bench

    calls: list[tuple[str, bool]] = []
    seconds = {("bfloat16", True): iter([3.0, 1.0]), ("float32", True): iter([2.0, 1.6]),
               ("bfloat16", False): iter([9.0, 8.0])}
    real_timed = bench._timed

    def scripted(engine, prompt_ids, new_tokens, use_cache):
        ids, _, cache_bytes = real_timed(engine, prompt_ids, new_tokens, use_cache)
        key = (str(engine.model.transformer.wte.weight.dtype).removeprefix("torch."), use_cache)
        calls.append(key)
        return ids, next(seconds[key]), cache_bytes

    monkeypatch.setattr(bench, "_timed", scripted)
    assert main(["bench", "--model", str(tiny_checkpoint), "--new-tokens", "6", "--repeat", "2",
                 "--dtype", "bfloat16", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert calls == [("bfloat16", True), ("float32", True)] * 2 + [("bfloat16", False)] * 2
    assert result["cached_tokens_per_second"] == 6 / 1.0
    assert result["float32_cached_tokens_per_second"] == 6 / 1.6
    assert result["cached_vs_float32"] == pytest.approx(1.6)
    assert isinstance(result["float32_identical"], bool)


def test_bench_gui_refuses_a_dtype_it_does_not_run(capsys):
    assert main(["bench", "--gui", "--dtype", "float16"]) == 2
    assert "float32" in capsys.readouterr().err


def test_bench_keeps_the_fastest_run_of_each_configuration(tiny_checkpoint, capsys, monkeypatch):
    from kvviz.measure import bench

    seconds = iter([4.0, 1.0, 2.0, 8.0, 5.0])  # three cached runs, then two uncached ones (--repeat 3 for both)
    real_timed = bench._timed

    def scripted(engine, prompt_ids, new_tokens, use_cache):
        ids, _, cache_bytes = real_timed(engine, prompt_ids, new_tokens, use_cache)
        return ids, next(seconds), cache_bytes

    monkeypatch.setattr(bench, "_timed", scripted)
    monkeypatch.setattr(bench, "UNCACHED_REPEAT", 2)
    assert main(["bench", "--model", str(tiny_checkpoint), "--new-tokens", "10", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["cached_tokens_per_second"] == 10 / 1.0
    assert result["uncached_tokens_per_second"] == 10 / 5.0
    assert result["speedup"] == 5.0


def test_bench_peer_without_transformers_says_so_in_one_line(tiny_checkpoint, capsys, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` raises ImportError, as uninstalled
    assert main(["bench", "--model", str(tiny_checkpoint), "--new-tokens", "2", "--peer"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvviz: --peer needs transformers") and len(err.strip().splitlines()) == 1


def test_out_of_memory_is_one_line_and_status_1(tiny_checkpoint, capsys, monkeypatch):
    from kvviz.engine.engine import Engine

    def exhausted(self, *args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: "
                           "you tried to allocate 1000000000000 bytes. Error code 12 (Cannot allocate memory)")

    monkeypatch.setattr(Engine, "run", exhausted)
    assert main(["generate", "--model", str(tiny_checkpoint), "--prompt", "x", "--json"]) == 1
    assert capsys.readouterr().err == "kvviz: out of memory: try a smaller model\n"


def test_bench_peer_matches_transformers(tiny_checkpoint, capsys):
    pytest.importorskip("transformers")
    assert main(["bench", "--model", str(tiny_checkpoint), "--new-tokens", "10", "--peer", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["peer_identical"] is True
    assert result["peer_cached_tokens_per_second"] > 0


def test_default_model_runs_from_any_directory(tmp_path, kvviz_cli):
    from kvviz.core.resources import default_model_dir

    assert (default_model_dir() / "model.safetensors").is_file(), "the embedded model is not installed"
    result = kvviz_cli("generate", "--prompt", "Time flies", "--max-new-tokens", "5", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["model"] == "kvviz-shakespeare" and len(out["output_ids"]) == 5
    assert out["kv_computed_per_layer"] == len(out["prompt_ids"]) + 5



def test_count_with_one_new_token_says_the_cache_costs_one_more(capsys):
    assert main(["count", "--prompt-tokens", "3", "--new-tokens", "1"]) == 0
    text = capsys.readouterr().out
    assert "N=1 new token\n" in text and "avoided" not in text and "x less" not in text
    assert "the cache does one more K/V computation than no cache" in text
    assert "The cache pays off from the second new token on." in text
    for new_tokens, with_cache, without_cache in ((1, 4, 3), (2, 5, 7)):
        assert main(["count", "--prompt-tokens", "3", "--new-tokens", str(new_tokens), "--json"]) == 0
        result = json.loads(capsys.readouterr().out)
        assert (result["with_cache"], result["without_cache"]) == (with_cache, without_cache)


def test_generate_checks_the_request_before_echoing_the_prompt(tmp_path, capsys):
    small_vocabulary = tmp_path / "small-vocabulary"
    model = GPT(GPTConfig(vocab_size=300, n_ctx=48, n_layer=1, n_head=2, n_embd=32, name="small"))
    model.init_weights(torch.Generator().manual_seed(0))
    save_checkpoint(model, small_vocabulary)
    # "Hello" is token 15496: outside a 300-token vocabulary, found by the engine's plan.
    assert main(["generate", "--model", str(small_vocabulary), "--prompt", "Hello"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "kvviz: prompt token 15496 is outside the model's vocabulary of 300 tokens\n"


def test_a_failed_export_keeps_none_of_its_images(tiny_checkpoint, tmp_path, kvviz_cli):
    pytest.importorskip("PySide6")
    out = tmp_path / "slides"
    (out / "kvviz-grid-step3.png").mkdir(parents=True)  # the chart is written first, then this fails
    result = kvviz_cli("export", "--model", str(tiny_checkpoint), "--prompt", "hi", "--new-tokens", "2",
                     "--out", str(out), "--format", "png,svg")
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "kvviz-grid-step3.png: is a folder" in result.stderr
    assert [p.name for p in out.iterdir()] == ["kvviz-grid-step3.png"]


def test_an_export_that_fails_half_way_removes_the_folders_it_made(tmp_path, monkeypatch):
    pytest.importorskip("PySide6")
    from kvviz.app.export import ExportError, headless, render

    written = []

    def export_widget(widget, path, width, caption, files):
        if len(written) == 3:
            raise ExportError(f"{path}: could not be written (No space left on device)")
        written.append(files.write(path, b"image"))
        return path

    monkeypatch.setattr(render, "export_widget", export_widget)
    targets = {name: (None, None) for name in ("chart", "grid", "view")}
    with pytest.raises(ExportError, match="No space left on device"):
        headless._write_all(targets, ["png", "svg"], tmp_path / "new" / "slides", 3, 800, "caption")
    assert len(written) == 3 and list(tmp_path.iterdir()) == []


def test_a_sentence_ending_in_a_full_stop_gets_no_second_one(tiny_checkpoint, capsys, monkeypatch):
    pytest.importorskip("PySide6")
    import kvviz.sources.weights

    def broken(*args, **kwargs):
        raise RuntimeError("the weights are broken.")

    monkeypatch.setattr(kvviz.sources.weights, "load_model", broken)
    assert main(["bench", "--gui", "--model", str(tiny_checkpoint), "--new-tokens", "2", "--repeat", "1"]) == 2
    err = capsys.readouterr().err
    assert err.endswith(": the weights are broken.\n") and len(err.splitlines()) == 1, err


def test_bench_refuses_a_repeat_beyond_its_bound():
    from kvviz.core.errors import KvvizError
    from kvviz.measure import bench

    with pytest.raises(KvvizError, match="repeat must be a whole number from 1 to 100, got 101"):
        bench.best_of(101, None, None, [1], 1, True)  # refused before anything runs


def test_export_takes_a_dtype_for_stills_and_animations(tiny_checkpoint, tmp_path, monkeypatch):
    """`kvviz export --dtype` reaches the run: its plan's bytes per cached position halve in bfloat16."""
    from kvviz.app.export import headless

    plans = []
    real_planned_run = headless.planned_run

    def spy(*args, **kwargs):
        plan, run = real_planned_run(*args, **kwargs)
        plans.append(plan)
        return plan, run

    monkeypatch.setattr(headless, "planned_run", spy)
    import kvviz.app.export.animation as animation

    monkeypatch.setattr(animation, "planned_run", spy)
    common = ["--model", str(tiny_checkpoint), "--prompt", "Time flies", "--new-tokens", "2"]
    assert main(["export", *common, "--out", str(tmp_path / "a"), "--format", "svg"]) == 0
    assert main(["export", *common, "--out", str(tmp_path / "b"), "--format", "svg", "--dtype", "bfloat16"]) == 0
    assert main(["export", *common, "--out", str(tmp_path / "c"), "--animate", "--format", "gif", "--width", "320",
                 "--dtype", "float16"]) == 0
    assert [p.cache_bytes_per_position for p in plans] == [2 * 3 * 32 * 4, 2 * 3 * 32 * 2, 2 * 3 * 32 * 2]


def test_bench_attention_needs_the_window(capsys):
    assert main(["bench", "--attention"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--attention times the attention view in the window: add --gui" in err
