"""The Llama family (kvviz.models.llama) against transformers on the same random-weight checkpoints: Llama,
Qwen2 and Mistral, with grouped-query, multi-query and multi-head attention, biases, tied and untied heads."""

from __future__ import annotations

import pytest
import torch
from helpers_checkpoints import byte_level_tokenizer, peer_greedy, plan_ids, spread_peer

from kvviz.cache.kv_cache import full_cache
from kvviz.cache.probe import PassProbe
from kvviz.engine.engine import Engine, generate_ids
from kvviz.sources.weights import load_checkpoint, load_model

transformers = pytest.importorskip("transformers")

PROMPT_IDS = [464, 290, 17, 818, 262, 329, 11]
TOLERANCE = 1e-4

# (class, n_head, n_kv_head, tied, extra config): three per class
CASES = [
    ("llama", 4, 2, False, {}),
    ("llama", 4, 1, True, {"rope_theta": 500000.0}),
    ("llama", 4, 4, False, {"attention_bias": True}),
    # Llama 3.1's RoPE scaling, its original context inside the test's positions: every kind of pair turns
    ("llama", 4, 2, True, {"rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                               "original_max_position_embeddings": 16}}),
    ("qwen2", 4, 2, True, {}),
    ("qwen2", 4, 1, False, {"rope_theta": 1000000.0}),
    ("qwen2", 8, 2, True, {}),
    ("mistral", 4, 2, False, {"sliding_window": None}),
    ("mistral", 4, 1, True, {"sliding_window": None}),
    ("mistral", 8, 2, False, {"sliding_window": None, "head_dim": 16}),
    ("qwen3", 4, 2, True, {"head_dim": 16}),  # QK-norm: each head's query and key RMS-normed before RoPE
    ("qwen3", 4, 1, False, {"head_dim": 32, "attention_bias": True}),
]
CLASSES = {"llama": ("LlamaConfig", "LlamaForCausalLM"), "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
           "mistral": ("MistralConfig", "MistralForCausalLM"), "qwen3": ("Qwen3Config", "Qwen3ForCausalLM")}


def case_id(case) -> str:
    kind, heads, kv_heads, tied, extra = case
    attention = "mqa" if kv_heads == 1 else "mha" if kv_heads == heads else "gqa"
    scaled = "-llama3" if extra.get("rope_parameters", {}).get("rope_type") == "llama3" else ""
    return f"{kind}-{attention}-{'tied' if tied else 'untied'}{'-bias' if extra.get('attention_bias') else ''}{scaled}"


@pytest.fixture(scope="module", params=CASES, ids=case_id)
def checkpoint(request, tmp_path_factory):
    """A transformers model with random weights, saved as a Hugging Face folder, and kvviz's load of its weights."""
    kind, heads, kv_heads, tied, extra = request.param
    config_class, model_class = (getattr(transformers, name) for name in CLASSES[kind])
    config = config_class(vocab_size=1000, hidden_size=64, intermediate_size=112, num_hidden_layers=3,
                          num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=64,
                          tie_word_embeddings=tied, attn_implementation="eager", **extra)
    peer = spread_peer(model_class, config, len(request.node.name))
    folder = tmp_path_factory.mktemp(kind) / "model"
    peer.save_pretrained(folder)
    return peer, load_checkpoint(folder)  # the weights alone: these tests feed ids, and need no tokenizer.json


def peer_logits(peer, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return peer(torch.tensor([ids])).logits[0]  # (T, V)


def test_logits_equal_transformers_without_the_cache(checkpoint):
    peer, model = checkpoint
    with torch.no_grad():
        ours = model(torch.tensor([PROMPT_IDS]))[0]  # (T, V)
    assert torch.allclose(ours, peer_logits(peer, PROMPT_IDS), atol=TOLERANCE, rtol=0)


def test_logits_equal_transformers_through_the_cache(checkpoint):
    """A prefill of three tokens, then one token a pass: every position's logits as transformers gives them."""
    peer, model = checkpoint
    cfg = model.config
    cache = full_cache(cfg.n_layer, cfg.n_kv_head, cfg.head_dim, len(PROMPT_IDS))
    expected = peer_logits(peer, PROMPT_IDS)
    with torch.no_grad():
        ours = [model(torch.tensor([PROMPT_IDS[:3]]), torch.arange(3), cache)[0]]
        for position in range(3, len(PROMPT_IDS)):
            ours.append(model(torch.tensor([[PROMPT_IDS[position]]]), torch.tensor([position]), cache)[0])
    assert torch.allclose(torch.cat(ours), expected, atol=TOLERANCE, rtol=0)


def test_the_cache_holds_transformers_past_key_values(checkpoint):
    """One key and value per KV head, rotated to their positions, as transformers caches them."""
    peer, model = checkpoint
    cfg = model.config
    cache = full_cache(cfg.n_layer, cfg.n_kv_head, cfg.head_dim, len(PROMPT_IDS))
    with torch.no_grad():
        model(torch.tensor([PROMPT_IDS]), torch.arange(len(PROMPT_IDS)), cache)
        past = peer(torch.tensor([PROMPT_IDS]), use_cache=True).past_key_values
    assert cache.layers[0].kv.shape == (2, 1, cfg.n_kv_head, len(PROMPT_IDS), cfg.head_dim)
    for layer in range(cfg.n_layer):
        keys, values = past_layer(past, layer)  # (1, nkv, T, hd) each
        assert torch.allclose(cache.layers[layer].kv[0], keys, atol=TOLERANCE, rtol=0)
        assert torch.allclose(cache.layers[layer].kv[1], values, atol=TOLERANCE, rtol=0)


def past_layer(past, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A layer's keys and values from transformers' cache, whichever its version's layout."""
    if hasattr(past, "layers"):
        return past.layers[layer].keys, past.layers[layer].values
    if hasattr(past, "key_cache"):
        return past.key_cache[layer], past.value_cache[layer]
    return past[layer][0], past[layer][1]


def test_the_newest_querys_attention_equals_transformers(checkpoint):
    peer, model = checkpoint
    probe = PassProbe(model.config.n_layer, record_attention=True)
    with torch.no_grad():
        model(torch.tensor([PROMPT_IDS]), probe=probe)
        attentions = peer(torch.tensor([PROMPT_IDS]), output_attentions=True).attentions
    for layer, weights in enumerate(probe.attention):
        assert weights.shape == (model.config.n_head, len(PROMPT_IDS))  # every query head, over every position
        assert torch.allclose(weights, attentions[layer][0, :, -1, :], atol=TOLERANCE, rtol=0)


def test_greedy_tokens_are_the_same_with_and_without_the_cache_and_in_transformers(checkpoint):
    peer, model = checkpoint
    engine = Engine(model)
    cached, records = generate_ids(engine, PROMPT_IDS, 20, use_cache=True)
    uncached, _ = generate_ids(engine, PROMPT_IDS, 20, use_cache=False)
    with torch.no_grad():
        reference = peer_greedy(peer, PROMPT_IDS, 20)
    assert cached == uncached == reference
    assert len(set(cached)) > 1, "weights this flat would not test much"
    cfg = model.config  # the cache keeps the KV heads only: 2 * L * nkv * hd * 4 bytes a position
    assert records[-1].cache_bytes == 2 * cfg.n_layer * cfg.n_kv_head * cfg.head_dim * 4 * (len(PROMPT_IDS) + 20)


@pytest.mark.parametrize(("changes", "message"), [
    ({"rope_parameters": {"rope_type": "yarn", "factor": 8.0, "rope_theta": 500000.0}},
     'rope_type "yarn" is not supported; kvviz runs plain RoPE (rope_theta) and Llama 3\'s scaling (llama3)'),
    ({"hidden_act": "gelu"}, 'hidden_act "gelu" is not SwiGLU\'s silu'),
    ({"num_key_value_heads": 3}, "config n_head=4 is not a multiple of n_kv_head=3"),
    ({"num_hidden_layers": 10**9}, "num_hidden_layers=1000000000 is more than the weights in model.safetensors have"),
    ({"num_key_value_heads": 4}, "num_key_value_heads=4 is more than the weights in model.safetensors have"),
    ({"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 16, "rope_theta": 500000.0}},
     "high_freq_factor 4 is not above low_freq_factor 4"),  # its blend would divide by zero
], ids=["rope-scaling", "activation", "heads", "a-billion-layers", "more-kv-heads", "llama3-bands-crossed"])
def test_what_kvviz_cannot_run_is_named_in_one_line(tmp_path, changes, message, kvviz_cli):
    import json

    config = transformers.LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16)
    folder = tmp_path / "model"
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    raw = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**raw, **changes}))
    done = kvviz_cli("generate", "--model", str(folder), "--prompt", "x")  # a hang fails (a billion layers built)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == f"kvviz: {folder / 'config.json'}: {message}\n"


# ----- a Hugging Face folder as a user has it: weights, config.json, tokenizer.json -----


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    config = transformers.LlamaConfig(vocab_size=400, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      tie_word_embeddings=True)
    peer = spread_peer(transformers.LlamaForCausalLM, config, 5)
    folder = tmp_path_factory.mktemp("hub") / "tiny-llama"
    peer.save_pretrained(folder)
    byte_level_tokenizer().save(str(folder / "tokenizer.json"))
    return folder, peer


def test_a_llama_folder_generates_with_its_own_tokenizer(llama_folder, kvviz_cli):
    import json

    folder, peer = llama_folder
    done = kvviz_cli("generate", "--model", str(folder), "--prompt", "Time flies", "--max-new-tokens", "8", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    own = transformers.PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    assert result["prompt_ids"] == own("Time flies")["input_ids"] and result["prompt_ids"][0] == 0  # <s> first
    with torch.no_grad():
        reference = peer.generate(torch.tensor([result["prompt_ids"]]), max_new_tokens=8, do_sample=False,
                                  pad_token_id=1)[0, len(result["prompt_ids"]):].tolist()
    assert result["output_ids"] == reference
    assert result["text"] == own.decode(reference)
    # 2 layers x 2 KV heads x 16 numbers, keys and values, 4 bytes: 512 bytes a position
    assert result["cache_bytes"] == 512 * (len(result["prompt_ids"]) + 8)


def test_a_llama_folder_without_its_tokenizer_is_one_line(llama_folder, tmp_path, kvviz_cli):
    import shutil

    folder = tmp_path / "no-tokenizer"
    shutil.copytree(llama_folder[0], folder)
    (folder / "tokenizer.json").unlink()
    done = kvviz_cli("generate", "--model", str(folder), "--prompt", "x")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (f"kvviz: {folder}: no tokenizer.json beside the weights; kvviz tokenizes a prompt with "
                           "the model's own tokenizer\n")


def test_memory_sizes_a_llama_folders_cache_by_its_kv_heads(llama_folder, kvviz_cli):
    import json

    done = kvviz_cli("memory", "--model", str(llama_folder[0]), "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["bytes_per_token"] == 2 * 2 * 2 * 16 * 4  # keys and values x 2 layers x 2 KV heads x 16 x 4 bytes


def test_a_checkpoint_in_shards_loads_and_a_missing_shard_is_one_line(llama_folder, tmp_path, kvviz_cli):
    import json
    import shutil

    folder, peer = llama_folder
    sharded = tmp_path / "sharded"
    peer.save_pretrained(sharded, max_shard_size="100KB")
    shutil.copy(folder / "tokenizer.json", sharded)
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and not (sharded / "model.safetensors").exists()
    model = load_model(str(sharded)).model
    with torch.no_grad():
        ids = [4, 29, 17, 81, 26]  # within the 400-token vocabulary
        assert torch.allclose(model(torch.tensor([ids]))[0], peer_logits(peer, ids), atol=TOLERANCE, rtol=0)
    (sharded / shards[-1]).unlink()
    done = kvviz_cli("generate", "--model", str(sharded), "--prompt", "x")
    assert done.returncode == 2
    assert done.stderr == f"kvviz: {sharded / shards[-1]}: shard missing (named in model.safetensors.index.json)\n"


def test_the_grid_opens_a_layer_into_its_kv_heads_named_by_the_query_heads_that_read_them(qtbot):
    """6 query heads, 2 KV heads: a layer opens into two rows, "L0 kv0 ← q0 q1 q2" and "L0 kv1 ← q3 q4 q5",
    and a cell's bytes are the KV heads' (2 x 2 x 8 numbers x 4 bytes)."""
    from helpers_qt import drawn_left_labels, settle_layouts

    from kvviz.app.views.grid.kv_grid import KVGridView
    from kvviz.models.llama import Llama, LlamaConfig

    model = Llama(LlamaConfig(vocab_size=1000, n_ctx=32, n_layer=2, n_head=6, n_kv_head=2, n_embd=48,
                              intermediate_size=64))
    model.init_weights(torch.Generator().manual_seed(0))
    engine = Engine(model)
    plan = plan_ids(engine, PROMPT_IDS[:3], 2)
    assert (plan.n_head, plan.cache_heads, plan.query_group) == (6, 2, 3)
    grid = KVGridView()
    qtbot.addWidget(grid)
    grid.resize(900, 500)
    grid.show()
    grid.reset(plan)
    grid.apply(list(engine.run(plan)))
    grid.expand_layer(0)
    grid.refresh()
    qtbot.waitExposed(grid)
    settle_layouts()
    assert grid.display_rows() == [(0, None), (0, 0), (0, 1), (1, None)]

    drawn = [text for text, *_ in drawn_left_labels(grid.plot_widget)]  # the left axis's text, top to bottom
    assert drawn == ["L0", "L0 kv0 \u2190 q0 q1 q2", "L0 kv1 \u2190 q3 q4 q5", "L1"]
    info = grid.cell_info(0, 1)
    assert "K and V: 2 \u00d7 2 KV heads \u00d7 8 \u00d7 4 bytes = 128 bytes" in info, info
    assert "KV head 1 (read by query heads 3, 4, 5)" in grid.cell_info(0, 1, head=1)


def test_a_byte_level_tokenizer_gives_each_tokens_own_bytes(llama_folder):
    """A character the vocabulary splits into bytes shows them as <0xNN>; the tokens' bytes make the text."""
    from tokenizers import pre_tokenizers

    from kvviz.core.tokenizer import JsonTokenizer, byte_level_alphabet

    assert set(byte_level_alphabet()) == set(pre_tokenizers.ByteLevel.alphabet())
    tokenizer = JsonTokenizer(llama_folder[0] / "tokenizer.json")
    ids = tokenizer.encode("Time flies \u2713")
    assert tokenizer.token_label(ids[0]) == "<s>"
    assert b"".join(tokenizer.token_bytes(i) for i in ids[1:]) == "Time flies \u2713".encode()
    assert [tokenizer.token_label(i) for i in ids[-3:]] == ["<0xE2>", "<0x9C>", "<0x93>"]


def test_bench_times_a_llama_model_against_transformers_on_the_same_weights(llama_folder, kvviz_cli):
    import json

    done = kvviz_cli("bench", "--model", str(llama_folder[0]), "--new-tokens", "6", "--peer", "--repeat", "1",
                     "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["peer_identical"] is True and result["identical"] is True
    assert result["peer_cached_tokens_per_second"] > 0


def test_smollm2_135m_caches_46080_bytes_a_token(kvviz_cli):
    """2 x 30 layers x 3 KV heads x 64 x 4 bytes, read from the preset's published shape (no weights made)."""
    import json

    done = kvviz_cli("memory", "--model", "random:smollm2-135m", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["bytes_per_token"] == 46_080


def test_the_attention_strip_sets_each_kv_heads_query_heads_apart():
    """6 query heads reading 2 KV heads: rows labelled "3 kv1", and a double line under each group of three."""
    import numpy as np

    from kvviz.app.views.strip_image import head_ticks, strip_image

    assert head_ticks(6, 20.0, 10.0, group=3) == [[(0.5, "0 kv0"), (1.5, "1 kv0"), (2.5, "2 kv0"),
                                                   (3.5, "3 kv1"), (4.5, "4 kv1"), (5.5, "5 kv1")]]
    table = np.array([[200, 200, 200, 255]] * 8, dtype=np.uint8)
    gap = np.array([0, 0, 0, 255], dtype=np.uint8)
    image = strip_image(np.full((6, 4), 0.5, dtype=np.float32), 1.0, table, gap, gap, group=3)
    size = image.shape[0] // 6
    lines = [row for row in range(image.shape[0]) if (image[row, 0] == gap).all()]
    assert lines == sorted({*range(size - 1, 6 * size, size), 3 * size - 2, 6 * size - 2})


def test_the_attention_views_head_list_names_each_query_heads_kv_head(qtbot):
    from kvviz.app.views.attention_view import AttentionView
    from kvviz.models.llama import Llama, LlamaConfig

    model = Llama(LlamaConfig(vocab_size=1000, n_ctx=32, n_layer=1, n_head=4, n_kv_head=2, n_embd=32,
                              intermediate_size=64))
    model.init_weights(torch.Generator().manual_seed(0))
    plan = plan_ids(Engine(model), PROMPT_IDS[:3], 2, attention=True)
    view = AttentionView()
    qtbot.addWidget(view)
    view.reset(plan)
    names = [view.head_box.itemText(i) for i in range(view.head_box.count())]
    assert names == ["all heads", "head 0 (kv0)", "head 1 (kv0)", "head 2 (kv1)", "head 3 (kv1)"]


def test_break_the_cache_breaks_a_llama_models_cache_too(llama_folder):
    """The teaching bug reaches the teaching forward's one-position writes, not only a fast path's: the cached
    run's logits part from the uncached run's after the prefill."""
    from kvviz.core.records import RunRequest
    from kvviz.engine.compare import summarize
    from kvviz.engine.run import start_run

    loaded = load_model(str(llama_folder[0]))
    run = start_run(Engine(loaded.model, loaded.tokenizer), RunRequest(0, "Time flies", True, 6, compare=True,
                                                                       break_cache=True))
    records = list(run.passes())
    summary = summarize(records)
    assert not summary.identical and summary.first_logit_divergence == 2  # step 1 is the prefill's, unbroken
    assert records[1].kv_written == (records[1].fed_start + 1, records[1].fed_start + 2)  # one slot late


@pytest.mark.parametrize(("damage", "message"), [
    (lambda folder: (folder / "tokenizer.json").write_bytes(b"\xff\xfe"),
     "tokenizer.json: not a tokenizer.json the tokenizers library reads (stream did not contain valid UTF-8)"),
    (lambda folder: ((folder / "model.safetensors").unlink(), (folder / "model.safetensors.index.json").write_text(
        '{"weight_map": {"lm_head.weight": "../model.safetensors"}}')),
     "model.safetensors.index.json: shard '../model.safetensors' is not a .safetensors file in the folder"),
], ids=["tokenizer-not-utf8", "shard-outside-the-folder"])
def test_a_damaged_llama_folder_is_one_line(llama_folder, tmp_path, kvviz_cli, damage, message):
    import shutil

    folder = tmp_path / "damaged"
    shutil.copytree(llama_folder[0], folder)
    damage(folder)
    done = kvviz_cli("generate", "--model", str(folder), "--prompt", "x")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == f"kvviz: {folder}/{message}\n"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_fast_file_equals_the_teaching_forward(dtype):
    """llama_fast.decode_one and llama_fast.forward against Llama.forward on one token: the same greedy token,
    logits, cache and attention weights within float rounding (the fast file multiplies on other products), with
    grouped-query, multi-query (and biases) and multi-head attention (and an untied head)."""
    from kvviz.engine.compare import logit_tolerance
    from kvviz.models import llama_fast
    from kvviz.models.llama import Llama, LlamaConfig

    for shape in ({"n_kv_head": 2}, {"n_kv_head": 1, "qkv_bias": True},
                  {"n_kv_head": 6, "qkv_bias": True, "o_bias": True, "tie_word_embeddings": False}):
        cfg = LlamaConfig(vocab_size=300, n_ctx=64, n_layer=3, n_head=6, n_embd=96, intermediate_size=160, **shape)
        model = Llama(cfg)
        model.init_weights(torch.Generator().manual_seed(1))
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if name.endswith("bias"):
                    parameter.normal_(0.0, 0.1, generator=torch.Generator().manual_seed(2))
        model = model.to(dtype).eval()
        ids = [i % cfg.vocab_size for i in PROMPT_IDS]
        caches = [full_cache(cfg.n_layer, cfg.n_kv_head, cfg.head_dim, len(ids), dtype=dtype) for _ in range(2)]
        with torch.inference_mode():
            for cache in caches:
                model(torch.tensor([ids[:2]]), torch.arange(2), cache)
            for position in range(2, len(ids)):
                probes = [PassProbe(cfg.n_layer, record_attention=True) for _ in range(2)]
                token = ids[position]
                expected = model(torch.tensor([[token]]), torch.tensor([position]), caches[0], probe=probes[0])[0]
                if position % 2:
                    got = llama_fast.decode_one(model, token, position, caches[1], probe=probes[1])  # (1, V)
                else:
                    got = llama_fast.forward(model, torch.tensor([[token]]), torch.tensor([position]), caches[1],
                                             probe=probes[1])  # (1, V)
                tolerance = logit_tolerance(dtype, float(expected.abs().max()))
                assert got.dtype == dtype and (got.float() - expected.float()).abs().max() <= tolerance, shape
                assert got.argmax() == expected.argmax(), shape
                for a, b in zip(*(p.attention for p in probes), strict=True):
                    assert (a - b).abs().max() <= (1e-2 if dtype != torch.float32 else 1e-5)
        kv = [torch.stack([layer.kv for layer in c.layers]).float() for c in caches]
        assert (kv[0] - kv[1]).abs().max() <= (2e-2 if dtype != torch.float32 else 1e-5) * kv[0].abs().max()


def test_the_bench_peer_is_transformers_as_from_pretrained_makes_it_in_bfloat16(llama_folder):
    """The peer holds RoPE's frequencies in float32 as from_pretrained does; rounded to bfloat16 with the weights,
    it turned other angles, and its tokens parted from kvviz's for that reason alone."""
    from kvviz.measure.bench import to_transformers

    folder, _ = llama_folder
    reference = transformers.LlamaForCausalLM.from_pretrained(str(folder), dtype=torch.bfloat16).eval()
    peer = to_transformers(load_model(str(folder), dtype=torch.bfloat16).model)
    ids = torch.tensor([list(range(3, 40))])
    with torch.no_grad():
        assert torch.equal(peer(ids).logits, reference(ids).logits)


def test_compare_break_the_cache_precision_and_animation_run_on_the_embedded_gqa_model(tmp_path, kvviz_cli):
    """The rest of kvviz on a Llama-family model: compare mode identical in float32, broken on purpose in bfloat16
    (the logits part at the first step that reads a late-written key, step 2), and a GIF of the compare view."""
    import json

    done = kvviz_cli("compare", "--model", "kvviz-shakespeare-gqa", "--prompt", "ROMEO:", "--new-tokens", "6", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["summary"]["identical"] is True
    done = kvviz_cli("compare", "--model", "kvviz-shakespeare-gqa", "--prompt", "ROMEO:", "--new-tokens", "6",
                     "--break-cache", "--dtype", "bfloat16", "--json")
    summary = json.loads(done.stdout)["summary"]
    assert (json.loads(done.stdout)["dtype"], summary["identical"], summary["first_logit_divergence"]) == (
        "bfloat16", False, 2)
    done = kvviz_cli("export", "--model", "kvviz-shakespeare-gqa", "--prompt", "ROMEO:", "--new-tokens", "3",
                     "--compare", "--dtype", "bfloat16", "--animate", "--format", "gif", "--width", "480",
                     "--out", str(tmp_path / "gif"))
    assert done.returncode == 0, done.stderr
    assert [p.suffix for p in (tmp_path / "gif").iterdir()] == [".gif"]
