"""Quantized KV caches (int8, int4, fp8): the bytes they store, hand-counted; their rounding, bounded; and the drift
they cause against an exact cache, measured and worded as a trade-off."""

from __future__ import annotations

import json

import pytest
import torch

from kvviz.cache.quantized import QuantizedLayer


def _cache(kv_dtype: str, head_dim: int = 8) -> QuantizedLayer:
    return QuantizedLayer(1, head_dim, 4, kv_dtype)


def test_each_format_rounds_a_vector_within_its_step_and_int4_packs_two_a_byte():
    x = torch.tensor([[[[0.5, -1.1, 0.25, 2.0, -2.0, 1.5, 0.0, -0.75]]]])  # (1, 1, 1, 8): its largest is 2
    int8 = _cache("int8")
    codes, scale = int8.quantize(x)
    assert codes.dtype == torch.int8 and float(scale) == pytest.approx(2 / 127)
    assert (int8.dequantize(codes, scale) - x).abs().max() <= 2 / 127 / 2 + 1e-7  # half a step at most
    int4 = _cache("int4")
    codes, scale = int4.quantize(x)
    assert codes.shape[-1] == 4 and codes.dtype == torch.uint8  # 8 numbers in 4 bytes
    steps = [2, -4, 1, 7, -7, 5, 0, -3]  # x / (2/7) rounded: 1.75, -3.85, 0.875, 7, -7, 5.25, 0, -2.625
    assert int4.dequantize(codes, scale).flatten().tolist() == pytest.approx([q * 2 / 7 for q in steps], abs=1e-6)
    fp8 = _cache("fp8")
    codes, scale = fp8.quantize(x)
    assert codes.dtype == torch.float8_e4m3fn
    relative = ((fp8.dequantize(codes, scale) - x).abs() / x.abs().clamp_min(1e-9))[x != 0]
    assert relative.max() <= 1 / 16  # e4m3: three bits of mantissa


def test_generate_stores_a_quarter_of_float32_plus_scales(kvviz_cli):
    """The embedded GPT-2: 6 layers x 6 heads x 32 numbers, K and V: 9,216 bytes a position in float32; in int8
    32 bytes and a 4-byte scale per head: 2,592; int4 16 + 4: 1,440."""
    positions = None
    for kv_dtype, per_position in ((None, 9216), ("int8", 2592), ("int4", 1440), ("fp8", 2592)):
        done = kvviz_cli("generate", "--prompt", "ROMEO:", "--max-new-tokens", "6", "--json",
                         *(["--kv-dtype", kv_dtype] if kv_dtype else []))
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        positions = len(report["prompt_ids"]) + 6
        assert (report["cache_bytes"], report["kv_dtype"]) == (positions * per_position, kv_dtype)
    assert positions == 9


def test_compare_reports_the_drift_of_an_int8_cache_against_the_exact_one(kvviz_cli):
    done = kvviz_cli("compare", "--model", "random:gpt2", "--kv-dtype", "int8", "--prompt", "Hello, I am",
                     "--new-tokens", "40", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    summary, steps = report["summary"], report["steps"]
    assert len(steps) == 40 and report["kv_dtype"] == "int8"
    assert 0 < summary["max_abs_logit_diff"] < 1  # rounding: never exactly the exact cache's, never wild
    assert summary["identical"] == all(s["same"] for s in steps)
    assert summary["first_divergence"] == next((s["step"] for s in steps if not s["same"]), None)
    per_position = 2 * 12 * 12 * (64 + 4)  # GPT-2 124M: 12 layers, 12 heads of 64, int8 and a scale each
    assert summary["quantized_cache_bytes"] == steps[-1]["quantized_positions_held"] * per_position
    assert summary["full_cache_bytes"] == steps[-1]["full_positions_held"] * 2 * 12 * 12 * 64 * 4


@pytest.mark.parametrize(("args", "message"), [
    (("--kv-dtype", "int3"), "argument --kv-dtype: invalid choice: 'int3'"),
    (("--kv-dtype", "int8", "--window", "8"), "a quantized cache keeps every position: leave out the window"),
    (("--kv-dtype", "int8", "--break-cache"), "Break the cache plants its bug in an exact cache"),
])
def test_a_quantized_cache_refuses_what_it_cannot_do_in_one_line(kvviz_cli, args, message):
    done = kvviz_cli("generate", "--prompt", "hi", "--max-new-tokens", "2", *args)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1 and message in done.stderr


def test_the_quantized_lesson_measures_the_bytes_of_int8_and_names_its_kv_dtypes_as_the_core_does(kvviz_cli,
                                                                                                   tmp_path):
    import re

    from kvviz.cli.parser import KV_DTYPE_NAMES
    from kvviz.core.formats import KV_DTYPES

    assert KV_DTYPE_NAMES == tuple(KV_DTYPES)
    done = kvviz_cli("lesson", "--file", "kv-quantized", "--export", str(tmp_path), "--format", "png",
                     "--width", "640")
    assert done.returncode == 0, done.stderr
    assert re.findall(r"answer: (.*) \(measured\)", done.stdout) == ["2,592 bytes in int8"]  # 6 x 2 x 6 x (32 + 4)


def test_the_app_compares_the_exact_cache_with_an_int8_one_from_the_run_menu(qtbot, window):
    from PySide6.QtCore import Qt

    window.actions["kv_int8"].trigger()
    qtbot.waitUntil(lambda: window.session.plan is not None and window.session.plan.policy.kv_dtype == "int8",
                    timeout=30_000)
    qtbot.keyClick(window, Qt.Key.Key_T)  # compare mode: the exact cache beside the int8 one
    qtbot.waitUntil(lambda: window.session.plan is not None and window.session.plan.twin is not None,
                    timeout=30_000)
    plan = window.session.plan
    assert plan.lockstep_names == ("exact cache", "int8 cache")
    for _ in range(3):
        count = len(window.session.records)
        qtbot.keyClick(window, Qt.Key.Key_Space)
        qtbot.waitUntil(lambda count=count: len(window.session.records) > count, timeout=30_000)
    window.redraw()
    record = window.session.records[-1]
    assert record.max_abs_logit_diff > record.logit_tolerance  # the rounding shows, measured
    banner = window.workspace.compare_view.banner.label.text()
    assert "An int8 cache rounds every key and value: a trade-off for memory, not a bug." in banner
    assert "float noise" not in banner  # the rounding parts the logits by design, not by noise
    assert "comparing the exact cache and an int8 cache" in window.status.text()
    counts = window.workspace.compare_view.counts
    positions = record.positions_held
    shown = [(name.text(), value.text()) for name, value in counts.bytes_labels.values()]
    assert shown == [("exact cache", f"{positions * 9216:,} bytes".replace(",", "\u2009")),  # the lead: the bytes
                     ("int8 cache", f"{positions * 2592:,} bytes".replace(",", "\u2009")),
                     ("int8 cache holds", "3.6\u00d7 fewer")]
    assert counts.bytes_box.isVisible() and not counts.work_box.isVisible()  # no big "avoided 0, ratio 1.00×"
    assert "dequantizes every stored row" in window.workspace.compare_view.time_plot.ratio.text()


def test_the_quantized_lesson_says_what_kvviz_scales_and_what_the_engines_do():
    """kvviz keeps a float32 scale per token and head vector; vLLM's fp8 cache scales per tensor (a layer's keys, its
    values), transformers' QuantizedCache quantizes groups and keeps a full-precision residual window: the lesson
    must not give the engines kvviz's per-vector scale."""
    from kvviz.lessons.lesson import builtin_lesson_path, load_lesson

    lesson = load_lesson(builtin_lesson_path("kv-quantized"))
    first = " ".join(lesson.steps[0].text.split())
    assert "each key and value vector (one token, one head)" in first and "float32 scale" in first
    assert "vLLM's fp8 cache has one scale for a layer's keys and one for its values" in first
    assert "vLLM's fp8, Hugging Face's int8" not in first
    assert "keeps the newest 128 tokens unquantized" in lesson.steps[0].notes  # QuantizedCache's residual window
    assert "dequantizes every stored row" in lesson.steps[1].notes
