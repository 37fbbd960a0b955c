"""Models whose layers keep different things, through the CLI: `kvviz generate --json` and `kvviz memory --model`
report each layer's bytes, and they equal a hand count for a 6-layer model of each family (a window's layers hold
their window, a shared layer nothing, a linear-attention layer its state whatever the length)."""

from __future__ import annotations

import json
import re

import pytest
import torch
from helpers_checkpoints import byte_level_tokenizer

from kvviz.models.gemma3 import Gemma3, Gemma3Config
from kvviz.models.gemma4 import Gemma4, Gemma4Config
from kvviz.models.gpt_oss import GptOss, GptOssConfig
from kvviz.models.qwen3_5 import Qwen35, Qwen35Config
from kvviz.sources.weights import save_checkpoint

SLIDING, FULL = "sliding_attention", "full_attention"
VOCAB = 300
PROMPT = "Time flies like an arrow."
NEW = 5
# Each family's 6 layers in float32, with the hand count of the bytes each layer holds after P + 5 positions (P: the
# prompt's tokens, a beginning-of-text token first) and at a context of 64 tokens, as functions of the positions.
FOUR = 4  # float32
STATE = (64 * 3 + 4 * 8 * 8) * FOUR  # Qwen3.5's layer below: its convolution window and its recurrent state
CASES = {
    # Gemma 3: local, local, global, local, local, global; 2 KV heads of 16; a window of 4
    "gemma3": (lambda: Gemma3(Gemma3Config(vocab_size=VOCAB, n_ctx=128, n_layer=6, n_head=4, n_kv_head=2, n_embd=32,
                                           intermediate_size=64, head_dim=16, sliding_window=4,
                                           layer_types=(SLIDING, SLIDING, FULL) * 2, query_pre_attn_scalar=16)),
               ["window", "window", "full"] * 2,
               lambda n: [4 * 2 * 2 * 16 * FOUR, 4 * 2 * 2 * 16 * FOUR, n * 2 * 2 * 16 * FOUR] * 2),
    # Gemma 4: sliding heads of 16 and global ones of 32 (1 KV head), the top two layers shared: they keep nothing
    "gemma4": (lambda: Gemma4(Gemma4Config(vocab_size=VOCAB, n_ctx=128, n_layer=6, n_head=4, n_kv_head=1, n_embd=32,
                                           intermediate_size=64, head_size=16, global_head_dim=32, sliding_window=4,
                                           layer_types=(SLIDING, FULL) * 3, num_kv_shared_layers=2)),
               ["window", "full", "window", "full", "shared", "shared"],
               lambda n: [4 * 2 * 1 * 16 * FOUR, n * 2 * 1 * 32 * FOUR] * 2 + [0, 0]),
    # gpt-oss: sliding (window 4) and full layers in turn, 2 KV heads of 16
    "gpt-oss": (lambda: GptOss(GptOssConfig(vocab_size=VOCAB, n_ctx=128, n_layer=6, n_head=4, n_kv_head=2,
                                            head_size=16, n_embd=32, n_expert=4, n_expert_used=2, expert_size=32,
                                            sliding_window=4, yarn=None)),
                ["window", "full"] * 3,
                lambda n: [4 * 2 * 2 * 16 * FOUR, n * 2 * 2 * 16 * FOUR] * 3),
    # Qwen3.5: Gated DeltaNet layers keep a state of a convolution window (2 * 2 key heads * 8 + 4 value heads * 8 =
    # 64 channels x 3 inputs) and a recurrent state (4 value heads x 8 x 8); the fourth layer is attention
    "qwen3.5": (lambda: Qwen35(Qwen35Config(vocab_size=VOCAB, n_ctx=128, n_layer=6, n_head=4, n_kv_head=2,
                                            head_size=16, n_embd=32, intermediate_size=64,
                                            layer_types=("linear_attention",) * 3 + ("full_attention",)
                                            + ("linear_attention",) * 2, linear_num_key_heads=2,
                                            linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
                                            partial_rotary_factor=0.5)),
                ["state"] * 3 + ["full"] + ["state"] * 2,
                lambda n: [STATE] * 3 + [n * 2 * 2 * 16 * FOUR] + [STATE] * 2),
}


@pytest.fixture(scope="module", params=list(CASES))
def checkpoint(request, tmp_path_factory):
    build, kinds, bytes_at = CASES[request.param]
    torch.manual_seed(7)
    model = build()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.normal_(0.0, 0.2 if parameter.dim() > 1 else 0.05)
            if "norm" in name:
                parameter.add_(1.0)
    folder = tmp_path_factory.mktemp(request.param)
    save_checkpoint(model, folder)
    byte_level_tokenizer(VOCAB).save(str(folder / "tokenizer.json"))
    return folder, kinds, bytes_at


def test_generate_json_reports_each_layers_bytes_as_counted_by_hand(checkpoint, kvviz_cli):
    folder, kinds, bytes_at = checkpoint
    result = kvviz_cli("generate", "--model", str(folder), "--prompt", PROMPT, "--max-new-tokens", str(NEW), "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    positions = len(out["prompt_ids"]) + NEW  # the cached run feeds its last token too
    assert out["layer_kinds"] == kinds
    assert out["cache_bytes_per_layer"] == bytes_at(positions)
    assert out["cache_bytes"] == sum(bytes_at(positions))


def test_memory_of_the_checkpoint_reports_each_layers_bytes_as_counted_by_hand(checkpoint, kvviz_cli):
    folder, kinds, bytes_at = checkpoint
    result = kvviz_cli("memory", "--model", str(folder), "--context", "64", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["layer_kinds"] == kinds
    assert out["bytes_per_layer"] == bytes_at(64) and out["bytes"] == sum(bytes_at(64))
    text = kvviz_cli("memory", "--model", str(folder), "--context", "64")
    assert text.returncode == 0 and f"{sum(bytes_at(64)):,} bytes" in text.stdout
    per_kind = {kind: {size for k, size in zip(kinds, bytes_at(64), strict=True) if k == kind} for kind in kinds}
    for kind, sizes in per_kind.items():  # a line for each kind, with its bytes (a shared layer's: none)
        line = next(line for line in text.stdout.splitlines() if re.match(rf"\s+\d+ {kind}\b", line))
        assert all(f"{size:,} bytes" in line for size in sizes if size), line
    if "shared" in kinds:  # each reads the last layer of its kind below the shared ones: sliding 2, global 3
        assert "1 shared layer: read layer 2's keys and values, keep 0 bytes (layer 4)" in text.stdout
        assert "1 shared layer: read layer 3's keys and values, keep 0 bytes (layer 5)" in text.stdout
