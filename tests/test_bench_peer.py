"""`kvviz bench --peer` times transformers' own model of a checkpoint folder: AutoModelForCausalLM.from_pretrained
reads the folder's config itself (a Mistral window here), so the peer never inherits kvviz's reading of it."""

from __future__ import annotations

import pytest
from helpers_checkpoints import byte_level_tokenizer, spread_peer

transformers = pytest.importorskip("transformers")


def test_the_peer_of_a_folder_is_transformers_own_class_loaded_from_it(tmp_path):
    from kvviz.measure.bench import run_bench

    config = transformers.MistralConfig(vocab_size=400, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                        sliding_window=8)
    folder = tmp_path / "mistral"
    spread_peer(transformers.MistralForCausalLM, config, 3).save_pretrained(folder)
    byte_level_tokenizer().save(str(folder / "tokenizer.json"))
    result = run_bench(str(folder), "a b c", 4, peer=True, repeat=1)
    assert result["peer_class"] == "MistralForCausalLM"  # not a Llama built from kvviz's reading of the config
    assert result["peer_source"] == "transformers' from_pretrained(mistral)"


def test_the_peer_of_a_preset_is_built_from_its_config_and_says_so():
    import torch

    from kvviz.measure.bench import peer_of_source
    from kvviz.sources.weights import load_model

    peer, source = peer_of_source("random:kvviz-shakespeare-gqa", load_model("random:kvviz-shakespeare-gqa").model,
                                  torch.float32)
    assert type(peer).__name__ == "LlamaForCausalLM" and source.startswith("built from kvviz's reading")
