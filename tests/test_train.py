"""Training the embedded model: corpus preparation, the chunked head loss, and a short real run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from kvviz.train import HELD_OUT_PLAYS, TrainSettings, head_cross_entropy, normalize_speakers, read_corpus, train
from kvviz.weights import load_model


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


def test_a_short_training_run_learns_and_writes_a_loadable_model(tmp_path):
    (tmp_path / "texts").mkdir()
    corpus = _tiny_corpus(tmp_path / "texts")
    assert "ROMEO:" in read_corpus(corpus)["romeo_and_juliet"]
    settings = TrainSettings(steps=12, batch_size=2, block_size=32, learning_rate=3e-3, warmup_steps=1,
                             eval_every=100, seed=3)
    out = tmp_path / "model"
    figures = train(settings, corpus, out)

    assert figures["steps"] == 12 and figures["tokens_seen"] == 12 * 2 * 32
    assert figures["validation_loss"] < 8.0, "twelve steps on a repeated speech must learn something"
    assert json.loads((out / "training.json").read_text())["figures"]["validation_loss"] == figures["validation_loss"]
    card = (out / "MODEL_CARD.md").read_text()
    assert f"{figures['validation_loss']:.3f}" in card and "--steps 12" in card
    assert load_model(str(out)).config.n_layer == 6


@pytest.mark.parametrize(("args", "fragment"), [
    (["--block-size", "300"], "block-size 300 is longer than the kvviz-shakespeare context of 256 tokens"),
    (["--block-size", "200"], "too few for block-size 200"),  # the tiny corpus holds fewer tokens
    (["--corpus", "no-such-corpus"], "no-such-corpus is neither a folder nor a .tar.gz archive"),
])
def test_bad_training_input_is_one_line_and_status_2(tmp_path, capsys, monkeypatch, args, fragment):
    from kvviz.cli import main

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
    from kvviz.cli import main

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    defaults = TrainSettings()
    for option, value in (("steps", defaults.steps), ("sequences per step", defaults.batch_size),
                          ("tokens per sequence", defaults.block_size), ("random seed", defaults.seed)):
        assert f"{option} (default: {value})" in text, option
