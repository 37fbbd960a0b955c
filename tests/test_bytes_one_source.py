"""Bytes have one source: `kvviz memory`, the memory view and the lessons' byte answers agree with the bytes a
generate run measures in the cache's tensors, for every family and cache kind, at the precision they name; each
figure is also checked against a hand count (never against the formula that computes it)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers_checkpoints import byte_level_tokenizer, plan_ids

from kvviz.engine.engine import Engine
from kvviz.lessons.lesson import measured_answer
from kvviz.sources.weights import save_checkpoint

PROMPT_IDS = [464, 290, 17, 818, 262, 329, 11]  # 7 tokens
NEW_TOKENS = 13  # the cache holds 20 positions at the end
POSITIONS = len(PROMPT_IDS) + NEW_TOKENS

# family -> (model, its config.json's model_type, bytes one layer caches a position, by hand)
# GPT-2: 2 heads x 16 dims; the Llama family: 2 KV heads of 4 query heads x 8 dims; DeepSeek: latent 16 + RoPE 8
LAYER_POSITION_BYTES = {
    "gpt2": 2 * 2 * 16 * 4,  # K and V x heads x head dim x 4 bytes = 256
    "llama": 2 * 2 * 8 * 4,  # 128
    "mistral": 2 * 2 * 8 * 4,
    "qwen2": 2 * 2 * 8 * 4,
    "deepseek_v2": (16 + 8) * 4,  # 96: the latent and the RoPE key, shared by every head
}
WINDOW = 8


def build(family: str) -> tuple[torch.nn.Module, str]:
    torch.manual_seed(0)
    if family == "gpt2":
        from kvviz.models.gpt2 import GPT, GPTConfig

        return GPT(GPTConfig(vocab_size=1000, n_ctx=64, n_layer=2, n_head=2, n_embd=32)), "gpt2"
    if family == "deepseek_v2":
        from kvviz.models.deepseek import Deepseek, DeepseekConfig

        config = DeepseekConfig(vocab_size=1000, n_ctx=64, n_layer=2, n_head=2, n_embd=32, intermediate_size=64,
                                kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8)
        return Deepseek(config), "deepseek_v2"
    from kvviz.models.llama import Llama, LlamaConfig

    window = {"mistral": WINDOW, "qwen2": WINDOW}.get(family, 0)
    config = LlamaConfig(vocab_size=1000, n_ctx=64, n_layer=2, n_head=4, n_kv_head=2, n_embd=32,
                         intermediate_size=64, sliding_window=window, window_first_layer=1 if family == "qwen2" else 0,
                         qkv_bias=family == "qwen2")  # Qwen2 has q, k and v biases
    return Llama(config), family


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Each family's tiny model saved as a checkpoint folder whose config.json names its model_type (Mistral's
    window on every layer; Qwen2's on layer 1 only, max_window_layers 1)."""
    from kvviz.models.families import family_of

    out = {}
    for family in LAYER_POSITION_BYTES:
        model, model_type = build(family)
        with torch.no_grad():  # the models are built uninitialised: small random weights, norms at one
            for name, p in model.named_parameters():
                p.copy_(torch.ones_like(p) if "norm" in name or ".ln_" in name else 0.02 * torch.randn_like(p))
        folder = tmp_path_factory.mktemp(family) / "model"
        save_checkpoint(model.eval(), folder)
        checkpoint = family_of(model).checkpoint
        config = checkpoint.config_to_json(model.config, model_type) if family in ("mistral", "qwen2") else None
        if config is not None:
            (folder / "config.json").write_text(json.dumps(config))
        byte_level_tokenizer().save(str(folder / "tokenizer.json"))  # 400 tokens, within the 1,000 embedded
        out[family] = folder
    return out


def memory_json(kvviz_cli, folder, *args: str) -> dict:
    result = kvviz_cli("memory", "--model", str(folder), "--context", str(POSITIONS), "--json", *args)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def measured(folder, kv_dtype: str = "") -> tuple[object, list]:
    """A generate run's plan and records on `folder`'s model, loaded as generate loads it."""
    from kvviz.sources.weights import load_checkpoint

    engine = Engine(load_checkpoint(folder))
    plan = plan_ids(engine, PROMPT_IDS, NEW_TOKENS, kv_dtype=kv_dtype)
    return plan, list(engine.run(plan))


@pytest.mark.parametrize("family", list(LAYER_POSITION_BYTES))
def test_kvviz_memory_and_the_memory_view_agree_with_the_measured_bytes(family, folders, kvviz_cli):
    from kvviz.app.views.memory_state import MemoryState

    per_layer = LAYER_POSITION_BYTES[family]
    held = {"mistral": (WINDOW, WINDOW), "qwen2": (POSITIONS, WINDOW)}.get(family, (POSITIONS, POSITIONS))
    plan, records = measured(folders[family])
    assert records[-1].cache_bytes == per_layer * sum(held)  # the cache's tensors, by hand
    assert records[-1].layer_positions_held == held
    memory = memory_json(kvviz_cli, folders[family])
    assert memory["bytes_per_token"] == 2 * per_layer
    assert memory["bytes"] == records[-1].cache_bytes
    assert memory["tokens_held_per_layer"] == list(held)
    state = MemoryState(plan)
    for record in records:
        state.apply(record)
    x, y = state.model_line("float32")
    px, py = state.measured()
    assert list(py) == [r.cache_bytes for r in records if r.cache_bytes]
    assert np.interp(px, x, y) == pytest.approx(py)  # every measured point lies on the model's line


def test_deepseek_v2_lite_preset_is_counted_once(kvviz_cli):
    """27 layers x (512 latent + 64 RoPE key) x 4 bytes: 62,208 a token, not twice that."""
    result = kvviz_cli("memory", "--model", "random:deepseek-v2-lite-attention", "--json")
    assert json.loads(result.stdout)["bytes_per_token"] == 27 * (512 + 64) * 4 == 62208


@pytest.mark.parametrize(("kv_dtype", "vector_bytes"), [("int8", 8 + 4), ("int4", 4 + 4), ("fp8", 8 + 4)])
def test_quantized_caches_measure_what_kvviz_memory_says(kv_dtype, vector_bytes, folders, kvviz_cli):
    """Each of 2 KV heads' key and value: 8 numbers at the format's bits and a 4-byte scale, 2 layers."""
    _, records = measured(folders["llama"], kv_dtype)
    per_position = 2 * 2 * 2 * vector_bytes
    assert records[-1].cache_bytes == POSITIONS * per_position
    memory = memory_json(kvviz_cli, folders["llama"], "--kv-dtype", kv_dtype)
    assert (memory["bytes_per_token"], memory["bytes"]) == (per_position, records[-1].cache_bytes)
    assert memory["precision"] == kv_dtype


def test_generate_reports_the_positions_each_layer_holds(folders, kvviz_cli):
    """Qwen2's window on layer 1 only: layer 0 holds every position."""
    result = kvviz_cli("generate", "--model", str(folders["qwen2"]), "--prompt", "Time flies like an arrow",
                       "--max-new-tokens", "12", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    layer0, layer1 = out["positions_held_per_layer"]
    assert layer1 == WINDOW and layer0 > WINDOW
    assert out["cache_bytes"] == 128 * (layer0 + layer1)
    assert out["cache_precision"] == "float32"


@pytest.mark.parametrize(("family", "per_token", "at_8k"), [
    ("qwen2", 256, 128 * (8192 + 8)),  # layer 0 holds all 8,192, layer 1 its window: 1,049,600
    ("mistral", 256, 256 * 8),  # every layer holds the window: 2,048
    ("llama", 256, 256 * 8192),
    ("deepseek_v2", 192, 192 * 8192),
])
def test_the_lessons_byte_answers_count_what_each_layer_holds(family, per_token, at_8k, folders):
    _, records = measured(folders[family])
    assert measured_answer("cache_bytes_per_token", None, records[-1]) == per_token
    assert measured_answer("cache_bytes_at_8k", None, records[-1]) == at_8k


def test_a_byte_answer_names_the_precision_it_was_measured_in(folders):
    from kvviz.lessons.lesson import format_answer

    _, records = measured(folders["llama"])
    value = measured_answer("cache_bytes_at_8k", None, records[-1])
    assert format_answer("cache_bytes_at_8k", value, records[-1].cache_precision) == (
        "2,097,152 bytes (2 MiB) in float32")  # 256 bytes a token x 8,192, by hand


def test_kvviz_memory_prints_a_folder_name_without_its_control_bytes(folders, kvviz_cli, tmp_path):
    import shutil

    hostile = tmp_path / "evil\x1b]0;owned\x07name"
    shutil.copytree(folders["gpt2"], hostile)
    result = kvviz_cli("memory", "--model", str(hostile))
    assert result.returncode == 0, result.stderr
    assert "\x1b" not in result.stdout and "\x07" not in result.stdout and "\\x1b" in result.stdout


@pytest.mark.parametrize(("args", "message"), [
    (("--model", "random:deepseek-v2-lite-attention", "--kv-dtype", "int8"), "caches latents (MLA)"),
    (("--arch", "DeepSeek-V2", "--kv-dtype", "fp8"), "caches latents (MLA)"),
])
def test_kvviz_memory_refuses_a_cache_kvviz_cannot_store_as_generate_does(kvviz_cli, args, message):
    result = kvviz_cli("memory", *args)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("family", ["mistral", "qwen2", "llama"])
def test_a_plans_final_bytes_are_what_its_last_pass_measures(family, folders):
    """The chart's memory axis is sized from it: a window's layers hold their window, not the run's width."""
    plan, records = measured(folders[family])
    assert plan.final_cache_bytes == records[-1].cache_bytes
