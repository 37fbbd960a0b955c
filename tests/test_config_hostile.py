"""Hostile checkpoint folders of every family (issue #36, section 8): a config value kvviz cannot run, weights it
cannot read, a config.json that is missing or no file. Each is one line naming the file and the key, status 2,
never a traceback or a run on wrong numbers."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from helpers_checkpoints import byte_level_tokenizer

transformers = pytest.importorskip("transformers")

SMALL = dict(vocab_size=400, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64)
DEEPSEEK = dict(vocab_size=400, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
                kv_lora_rank=8, q_lora_rank=None, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8,
                first_k_dense_replace=1, max_position_embeddings=64)


def _save(folder: Path, config_class: str, model_class: str, **settings) -> Path:
    getattr(transformers, model_class)(getattr(transformers, config_class)(**settings)).save_pretrained(folder)
    byte_level_tokenizer().save(str(folder / "tokenizer.json"))
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hostile-configs")
    return {
        "llama": _save(root / "llama", "LlamaConfig", "LlamaForCausalLM", **SMALL),
        "mistral": _save(root / "mistral", "MistralConfig", "MistralForCausalLM", **SMALL, sliding_window=8),
        # heads of 14 numbers as saved; the config below makes them 7 (q and k keep their shapes)
        "llama-28": _save(root / "llama-28", "LlamaConfig", "LlamaForCausalLM",
                          **{**SMALL, "hidden_size": 28, "num_attention_heads": 2, "num_key_value_heads": 2}),
        "deepseek": _save(root / "deepseek", "DeepseekV2Config", "DeepseekV2ForCausalLM", **DEEPSEEK),
    }


def _edited(folders, tmp_path: Path, base: str, change) -> Path:
    folder = tmp_path / f"{base}-hostile"
    shutil.copytree(folders[base], folder)
    raw = json.loads((folder / "config.json").read_text())
    change(raw)
    (folder / "config.json").write_text(json.dumps(raw))
    return folder


def _rope_theta(value):
    def change(raw):
        raw["rope_theta"] = value
        if isinstance(raw.get("rope_parameters"), dict):
            raw["rope_parameters"]["rope_theta"] = value
    return change


CONFIGS = [
    ("llama-28", lambda r: r.update(num_attention_heads=4, num_key_value_heads=4, head_dim=7),
     "a head of 7 numbers is odd", "odd-head-dimension"),
    ("mistral", lambda r: r.update(max_position_embeddings=None), "max_position_embeddings=null is not a whole number",
     "window-and-null-context"),
    ("mistral", lambda r: r.update(max_position_embeddings="64"), 'max_position_embeddings="64" is not a whole number',
     "window-and-string-context"),
    ("llama", _rope_theta(-10000.0), "rope_theta=-10000.0 is not a positive number", "negative-rope-theta"),
    ("llama", lambda r: r.update(rms_norm_eps=-1e-6), "rms_norm_eps=-1e-06 is not a positive number",
     "negative-rms-eps"),
    ("deepseek", lambda r: r.update(kv_lora_rank=10**20), "kv_lora_rank=100000000000000000000 is not a whole number",
     "deepseek-absurd-latent"),
    ("deepseek", lambda r: r.update(hidden_size=10**20), "hidden_size=100000000000000000000 is not a whole number",
     "deepseek-absurd-width"),
    ("deepseek", _rope_theta(-1.0), "rope_theta=-1.0 is not a positive number", "deepseek-negative-theta"),
    ("deepseek", lambda r: r.update(rms_norm_eps=0), "rms_norm_eps=0 is not a positive number", "deepseek-zero-eps"),
]


@pytest.mark.parametrize(("base", "change", "fragment"), [c[:3] for c in CONFIGS], ids=[c[3] for c in CONFIGS])
@pytest.mark.parametrize("command", ["generate", "memory"])
def test_a_config_value_kvviz_cannot_run_is_one_line_naming_the_file_once_and_the_key(
        folders, tmp_path, kvviz_cli, base, change, fragment, command):
    folder = _edited(folders, tmp_path, base, change)
    args = ("--prompt", "a b", "--max-new-tokens", "2") if command == "generate" else ()
    done = kvviz_cli(command, "--model", str(folder), *args)
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and fragment in lines[0], done.stderr
    assert lines[0].count(str(folder / "config.json")) == 1, done.stderr


def test_float8_weights_are_refused_in_one_line_naming_the_tensor(folders, tmp_path, kvviz_cli):
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "float8"
    shutil.copytree(folders["llama"], folder)
    state = load_file(str(folder / "model.safetensors"))
    state["model.layers.0.mlp.up_proj.weight"] = state["model.layers.0.mlp.up_proj.weight"].to(torch.float8_e4m3fn)
    save_file(state, str(folder / "model.safetensors"))
    done = kvviz_cli("generate", "--model", str(folder), "--prompt", "a b", "--max-new-tokens", "2")
    assert done.returncode == 2 and done.stderr == (
        f"kvviz: {folder / 'model.safetensors'}: tensor model.layers.0.mlp.up_proj.weight is float8_e4m3fn; kvviz "
        "reads float32, float16 and bfloat16 weights (dequantize the checkpoint first)\n")


@pytest.mark.parametrize("what", ["missing", "fifo"])
def test_a_llama_folder_without_a_readable_config_says_so_not_that_it_is_no_gpt2(folders, tmp_path, kvviz_cli, what):
    folder = tmp_path / what
    shutil.copytree(folders["llama"], folder)
    (folder / "config.json").unlink()
    if what == "fifo":
        os.mkfifo(folder / "config.json")  # reading it would wait for a writer forever
    done = kvviz_cli("generate", "--model", str(folder), "--prompt", "a b", "--max-new-tokens", "2")
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert "GPT-2 checkpoint" not in done.stderr and str(folder / "config.json") in done.stderr
    assert ("missing" if what == "missing" else "not a regular file") in done.stderr


def test_a_gpt2_checkpoint_with_a_head_of_its_own_is_refused_not_run_with_the_wrong_head(tmp_path, kvviz_cli):
    """The book's GPTModel trains a separate out_head; transformers saves it as lm_head.weight with
    tie_word_embeddings false. kvviz's GPT-2 ties its head, so it refuses the checkpoint."""
    from helpers_checkpoints import gpt2_config, save_transformers_folder

    config = gpt2_config()
    config.tie_word_embeddings = False
    save_transformers_folder(tmp_path / "untied", config)
    done = kvviz_cli("generate", "--model", str(tmp_path / "untied"), "--prompt", "hi", "--max-new-tokens", "2")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith(f"kvviz: {tmp_path / 'untied' / 'model.safetensors'}: tensor lm_head.weight is an "
                                  "output head of its own") and len(done.stderr.splitlines()) == 1


def test_a_gpt2_checkpoint_that_saves_its_tied_head_still_loads(tmp_path, kvviz_cli):
    from helpers_checkpoints import save_transformers_folder
    from safetensors.torch import load_file, save_file

    save_transformers_folder(tmp_path / "tied")
    state = load_file(str(tmp_path / "tied" / "model.safetensors"))
    state["lm_head.weight"] = state["transformer.wte.weight"].clone()  # the tied head's copy, as some files carry
    save_file(state, str(tmp_path / "tied" / "model.safetensors"))
    done = kvviz_cli("generate", "--model", str(tmp_path / "tied"), "--prompt", "hi", "--max-new-tokens", "2")
    assert done.returncode == 0, done.stderr


def _word_level_folder(folder: Path) -> Path:
    """A Llama folder whose tokenizer.json is a word-level vocabulary without an [UNK] token: a word outside it
    cannot be encoded at all (the tokenizers library raises)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMALL)).save_pretrained(folder)
    tokenizer = Tokenizer(models.WordLevel({"Time": 0, "flies": 1, "fast": 2, "</s>": 3}, unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder


def test_a_prompt_a_word_level_tokenizer_cannot_encode_is_one_line(tmp_path, kvviz_cli):
    folder = _word_level_folder(tmp_path / "words")
    done = kvviz_cli("generate", "--model", str(folder), "--prompt", "Time flies", "--max-new-tokens", "2")
    assert done.returncode == 0, done.stderr  # words it holds
    done = kvviz_cli("generate", "--model", str(folder), "--prompt", "Time crawls", "--max-new-tokens", "2")
    assert done.returncode == 2 and done.stdout == "" and len(done.stderr.splitlines()) == 1, done.stderr
    assert "tokenizer.json cannot encode this prompt" in done.stderr and "Traceback" not in done.stderr


def test_the_app_says_a_prompt_its_tokenizer_cannot_encode_and_runs_the_next(qtbot, tmp_path):
    """The app: the failing prompt is said (the run fails, nothing raised on the GUI thread), and a prompt of
    words the vocabulary holds then runs and steps."""
    from kvviz.app.assembly import open_window
    from kvviz.app.settings import app_settings

    window = open_window(str(_word_level_folder(tmp_path / "words")), "Time crawls", settings=app_settings())
    qtbot.addWidget(window)
    failures = []
    window.session.run_failed.connect(lambda *args: failures.append(args))
    window.show()
    try:
        qtbot.waitUntil(lambda: bool(failures), timeout=60_000)
        assert "cannot encode this prompt" in str(failures[0])
        window.controls.prompt_edit.setText("Time flies")
        window.reset_run()
        qtbot.waitUntil(lambda: window.session.plan is not None, timeout=60_000)
        window.session.step()
        qtbot.waitUntil(lambda: window.session.last_record is not None, timeout=60_000)
    finally:
        window.close()
