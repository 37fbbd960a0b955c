"""The DeepSeek family: multi-head latent attention (MLA) against transformers' DeepseekV2ForCausalLM on random
weights the tests make, its cache of latents measured against a hand count, and what it refuses."""

from __future__ import annotations

import json

import pytest
import torch
from helpers_checkpoints import byte_level_tokenizer, peer_greedy, plan_ids, spread_peer

from kvviz.cache.kv_cache import build_cache
from kvviz.core.records import EXACT
from kvviz.engine.engine import Engine
from kvviz.sources.weights import load_checkpoint

transformers = pytest.importorskip("transformers")

PROMPT_IDS = [5, 17, 42, 8, 99, 3, 61]


def tokens(records) -> list[int]:
    return [r.token_id for r in records if r.token_id is not None]


def deepseek_config(**overrides):
    """2 dense layers, kv_lora_rank 16, a RoPE key of 8: the issue's test shape."""
    settings = dict(vocab_size=500, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                    kv_lora_rank=16, q_lora_rank=None, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                    first_k_dense_replace=2, max_position_embeddings=64, tie_word_embeddings=False,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, attn_implementation="eager")
    return transformers.DeepseekV2Config(**{**settings, **overrides})


@pytest.fixture(scope="module")
def mla(tmp_path_factory):
    peer = spread_peer(transformers.DeepseekV2ForCausalLM, deepseek_config(), 11)
    folder = tmp_path_factory.mktemp("deepseek") / "model"
    peer.save_pretrained(folder)
    byte_level_tokenizer(500).save(str(folder / "tokenizer.json"))
    return peer, folder, load_checkpoint(folder)


def test_mla_matches_transformers_greedy_for_30_tokens_cached_and_uncached(mla):
    peer, _, model = mla
    engine = Engine(model)
    cached = list(engine.run(plan_ids(engine, PROMPT_IDS, 30, use_cache=True)))
    uncached = list(engine.run(plan_ids(engine, PROMPT_IDS, 30, use_cache=False)))
    with torch.no_grad():
        reference = peer_greedy(peer, PROMPT_IDS, 30)
        sequence = torch.tensor([PROMPT_IDS + reference])
        expected = peer(sequence).logits[0]  # (T, V)
        ours = model(sequence)[0]
    assert tokens(cached) == tokens(uncached) == reference
    assert len(set(reference)) > 5, "weights this flat would not test much"
    assert torch.allclose(ours, expected, atol=1e-4, rtol=0)
    # the cache keeps a latent and a RoPE key per position and layer: positions x 2 layers x (16 + 8) x 4 bytes
    positions = len(PROMPT_IDS) + 30
    assert cached[-1].cache_bytes == positions * 2 * (16 + 8) * 4
    assert cached[-1].kv_computed_total == positions  # one latent a position, computed once


def test_the_cached_latents_are_transformers_compressed_cache(mla):
    """What the cache holds is what transformers' cache holds for the same prompt: the normed latent and the
    turned RoPE key, layer by layer."""
    peer, _, model = mla
    cache = build_cache(model.config.cache_layers(EXACT), len(PROMPT_IDS))
    with torch.no_grad():
        model(torch.tensor([PROMPT_IDS]), kv_cache=cache)  # the prefill
    latents = torch.stack([layer.latents[0, : len(PROMPT_IDS)] for layer in cache.layers])  # (L, T, 16 + 8)
    with torch.no_grad():
        past = peer(torch.tensor([PROMPT_IDS]), use_cache=True).past_key_values
    for layer in range(2):
        keys, values = past.layers[layer].keys, past.layers[layer].values  # (1, 1, T, 16), (1, 1, T, 8)
        assert torch.allclose(latents[layer, :, :16], keys[0, 0], atol=1e-5)
        assert torch.allclose(latents[layer, :, 16:], values[0, 0], atol=1e-5)


def test_generate_reports_the_latent_bytes_and_refuses_what_mla_cannot_take(mla, kvviz_cli):
    _, folder, _ = mla
    done = kvviz_cli("generate", "--model", str(folder), "--prompt", "Time flies", "--max-new-tokens", "5", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["cache_bytes"] == (len(report["prompt_ids"]) + 5) * 2 * 24 * 4
    for extra, message in ((("--kv-dtype", "int8"), "caches latents (MLA)"), (("--window", "4"), "caches latents"),
                           (("--break-cache",), "not a latent one (MLA)")):
        done = kvviz_cli("generate", "--model", str(folder), "--prompt", "hi", "--max-new-tokens", "2", *extra)
        assert done.returncode == 2 and len(done.stderr.splitlines()) == 1 and message in done.stderr, done.stderr
    done = kvviz_cli("batch", "--model", str(folder), "--prompt", "hi", "--prompt", "ho", "--new-tokens", "2")
    assert (done.returncode, done.stderr.splitlines()[-1:]) == (2, [
        "kvviz: model caches latents (MLA); kvviz batch pages per-head caches only"])


def test_a_mixture_of_experts_checkpoint_is_refused_in_one_line(tmp_path):
    from kvviz.core.errors import ModelLoadError
    from kvviz.models.deepseek_format import config_from_json

    raw = deepseek_config(first_k_dense_replace=1, n_routed_experts=4).to_dict()
    (tmp_path / "config.json").write_text(json.dumps({**raw, "model_type": "deepseek_v2"}))
    with pytest.raises(ModelLoadError, match="layers 1 to 1 are mixture-of-experts .*dense layers only"):
        config_from_json(tmp_path / "config.json")


def test_the_v2_lite_preset_measures_the_bytes_of_deepseek_v2_lite_on_its_reference_line():
    """27 layers x (512 + 64) x 4 bytes a position: the cache's tensors after a run, and the memory view's
    DeepSeek-V2-Lite line (its published config) at the same length."""
    import numpy as np

    from kvviz.app.views.memory_state import reference_bytes
    from kvviz.sources.weights import load_model

    engine = Engine(load_model("random:deepseek-v2-lite-attention").model)
    records = list(engine.run(plan_ids(engine, [464, 290, 17], 2)))
    assert records[-1].cache_bytes == 5 * 27 * 576 * 4
    contexts, line = reference_bytes("DeepSeek-V2-Lite", "float32", 1)
    assert np.interp(5, contexts, line) == pytest.approx(records[-1].cache_bytes)


def test_the_grid_opens_a_layer_into_its_latent_and_rope_key(mla, qtbot):
    from PySide6.QtCore import Qt

    from kvviz.app.assembly import open_window
    from kvviz.app.settings import app_settings

    _, folder, _ = mla
    win = open_window(str(folder), "Time flies", settings=app_settings())
    qtbot.addWidget(win)
    win.show()
    try:
        qtbot.waitUntil(lambda: win.session.plan is not None, timeout=60_000)
        qtbot.keyClick(win, Qt.Key.Key_Space)
        qtbot.waitUntil(lambda: len(win.session.records) >= 1, timeout=30_000)
        qtbot.keyClick(win, Qt.Key.Key_H)  # View > Heads: layer 0 opens
        win.redraw()
        labels = [text for _, text in win.grid._rows.labels()]
        assert labels[:3] == ["L0", "L0 latent c_kv (16)", "L0 RoPE key k_pe (8)"]  # 2 rows and 1: in proportion
        info = win.grid.cell_info(0, 0, 0)
        assert "its latent c_kv (16 numbers, shared by every head)" in info and "16 × 4 bytes = 64 bytes" in info
        assert "(16 + 8) × 4 bytes = 96 bytes" in win.grid.cell_info(0, 0)
        qtbot.keyClick(win, Qt.Key.Key_M)  # View > Memory: the latent's formula, and the measured bytes on its line
        win.redraw()
        memory = win.workspace.memory_view
        assert "layers × (16 latent + 8 RoPE) × bytes per element" in memory.formula.text()
        positions, measured = memory.points()
        assert list(measured) == [p * 2 * 24 * 4 for p in positions] and len(positions) >= 1
    finally:
        win.close()


def test_the_bench_peer_of_an_mla_model_is_transformers_on_the_same_weights(mla):
    """kvviz bench --peer builds DeepseekV2ForCausalLM from the model it times (it raised on this family)."""
    from kvviz.measure.bench import to_transformers

    peer, _, model = mla
    rebuilt = to_transformers(model)
    with torch.no_grad():
        ids = torch.tensor([PROMPT_IDS])
        assert type(rebuilt).__name__ == "DeepseekV2ForCausalLM"
        assert torch.allclose(rebuilt(ids).logits, peer(ids).logits, atol=1e-5, rtol=0)
