"""QSettings' INI file read as plain text, never through QSettings.

QSettings turns a value such as `@Variant(...)` into an object as soon as anything reads the value's
section (and when it writes, it reads every section), and for a Python object that means unpickling
it, that is, running code. So before the file is read or written, every entry that QSettings would
deserialise (`@Variant(...)`, `@DateTime(...)`) is deleted from it, and the values are read here, as
QSettings reads the file (qsettings.cpp: readIniLine, iniUnescapedStringList). Only INI files are read
(the app's own store is one); a store in another format (the registry, a property list) reads as empty.
"""

from __future__ import annotations

import codecs
import os
import sys

from PySide6.QtCore import QSettings

from kvviz.core.files import write_atomically

# QSettings reads values with these prefixes through QDataStream, which restores any registered
# type: PySide6's Python-object type restores by unpickling.
UNSAFE_PREFIXES = ("@Variant(", "@DateTime(")

_SPACE = frozenset(b" \t\r\n")
_SPECIAL = frozenset(b"\n\r\";=\\")
_ESCAPES = {ord(k): v for k, v in (("a", "\a"), ("b", "\b"), ("f", "\f"), ("n", "\n"), ("r", "\r"),
                                   ("t", "\t"), ("v", "\v"), ('"', '"'), ("?", "?"), ("'", "'"), ("\\", "\\"))}
_HEX = frozenset(b"0123456789abcdefABCDEF")
_OCT = frozenset(b"01234567")
_BOM = b"\xef\xbb\xbf"


def _ini_lines(data: bytes) -> list[tuple[int, int, int]]:
    """The logical lines of INI text as QSettings splits it: (start, end, index of "=" or -1). A
    line goes on past a newline inside quotes or after a backslash; a ";" outside quotes ends it."""
    lines: list[tuple[int, int, int]] = []
    pos, size = 0, len(data)
    while True:
        start = pos
        while start < size and data[start] in _SPACE:
            start += 1
        i, equals, quoted = start, -1, False
        while i < size:
            ch = data[i]
            i += 1
            if ch not in _SPECIAL:
                continue
            if ch == 0x3D:  # =
                if not quoted and equals == -1:
                    equals = i - 1
            elif ch in (0x0A, 0x0D):
                if i == start + 1:
                    start += 1
                elif not quoted:
                    i -= 1
                    break
            elif ch == 0x5C:  # a backslash takes the next character, and a CR LF or LF CR pair whole
                if i < size:
                    first = data[i]
                    i += 1
                    if i < size and (first, data[i]) in ((0x0A, 0x0D), (0x0D, 0x0A)):
                        i += 1
            elif ch == 0x22:  # "
                quoted = not quoted
            elif i == start + 1:  # a ";" that starts a line: a comment
                while i < size and data[i] not in (0x0A, 0x0D):
                    i += 1
                while i < size and data[i] in _SPACE:
                    i += 1
                start = i
            elif not quoted:
                i -= 1
                break
        pos = i
        if i <= start:
            return lines
        lines.append((start, i, equals))


def _unescaped(raw: bytes) -> str | list[str]:
    """An INI value as QSettings reads it: a string, or a list when a comma stands outside quotes."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")  # one for the whole value, as in Qt
    items: list[str] | None = None
    text: list[str] = []
    size, quoted, value_quoted = len(raw), False, False

    def skip_spaces(at: int) -> int:
        while at < size and raw[at] in (0x20, 0x09):
            at += 1
        return at

    def chop_spaces(limit: int) -> None:  # trailing spaces and tabs, back to the last escape or quote
        while len(text) > limit:
            text[-1] = text[-1].rstrip(" \t")
            if text[-1]:
                return
            text.pop()

    i = skip_spaces(0)
    chop_limit = 0
    while i < size:
        ch = raw[i]
        if ch == 0x5C:  # backslash
            i += 1
            if i >= size:
                return _finish(items, text)
            ch = raw[i]
            i += 1
            if ch in _ESCAPES:
                text.append(_ESCAPES[ch])
            elif ch == 0x78 or ch in _OCT:  # \x hex, or octal; a UTF-16 unit, as in Qt
                base, digits, value = (16, _HEX, 0) if ch == 0x78 else (8, _OCT, ch - 0x30)
                if ch == 0x78 and i >= size:
                    return _finish(items, text)
                if ch != 0x78 or raw[i] in _HEX:
                    while i < size and raw[i] in digits:
                        value = (value * base + int(chr(raw[i]), 16)) & 0xFFFF
                        i += 1
                    text.append(chr(value))
                    if i >= size:
                        return _finish(items, text)
            elif ch in (0x0A, 0x0D) and i < size and raw[i] in (0x0A, 0x0D) and raw[i] != ch:
                i += 1  # an escaped line break, CR LF or LF CR
            chop_limit = len(text)
        elif ch == 0x22:  # "
            i += 1
            value_quoted, quoted = True, not quoted
            if not quoted:
                i = skip_spaces(i)
                chop_limit = len(text)
        elif ch == 0x2C and not quoted:  # ,
            if not value_quoted:
                chop_spaces(chop_limit)
            items = [] if items is None else items
            items.append("".join(text))
            text, value_quoted = [], False
            i = skip_spaces(i + 1)
            chop_limit = 0
        else:
            j = i + 1
            while j < size and raw[j] not in (0x5C, 0x22, 0x2C):
                j += 1
            text.append(decoder.decode(raw[i:j]))
            i = j
    if not value_quoted:
        chop_spaces(chop_limit)
    return _finish(items, text)


def _finish(items: list[str] | None, text: list[str]) -> str | list[str]:
    if items is None:
        return "".join(text)
    return [*items, "".join(text)]


def _unescaped_key(raw: bytes) -> str:
    """A section or key name as QSettings reads it: %XX and %UXXXX codes, and a backslash for "/"."""
    text = raw.decode("utf-8", errors="replace")
    out, i = [], 0
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            out.append("/")
            i += 1
            continue
        if ch == "%" and i < len(text) - 1:
            first = i + 2 if text[i + 1] == "U" else i + 1
            digits = 4 if text[i + 1] == "U" else 2
            code = text[first:first + digits]
            try:
                out.append(chr(int(code, 16)) if len(code) == digits else "")
            except ValueError:
                out.append("")
            if out[-1]:
                i = first + digits
                continue
            out.pop()
        out.append(ch)
        i += 1
    return "".join(out)


def _is_unsafe(value: str | list[str]) -> bool:
    """Whether QSettings would deserialise `value` (a list is read element by element). Replacement
    characters are ignored: Qt's decoder may hold back an invalid byte that Python's replaces at once."""
    items = value if isinstance(value, list) else [value]
    return any(item.replace("\ufffd", "").startswith(UNSAFE_PREFIXES) for item in items)


def _entries(data: bytes) -> tuple[dict[str, str | list[str]], list[tuple[int, int]]]:
    """The INI text's values by "section/key" (the last one wins, as in QSettings), and the byte
    ranges of the entries QSettings would deserialise."""
    offset = len(_BOM) if data.startswith(_BOM) else 0
    body = data[offset:]
    values: dict[str, str | list[str]] = {}
    unsafe: list[tuple[int, int]] = []
    section = ""
    for start, end, equals in _ini_lines(body):
        line = body[start:end]
        if line.startswith(b"["):
            close = line.find(b"]")
            name = line[1:close if close > 0 else len(line)].strip()
            if name.lower() == b"general":
                section = ""
            elif name.lower() == b"%general":
                section = name[1:].decode("latin-1") + "/"
            else:
                section = _unescaped_key(name) + "/"
            continue
        if equals < 0:
            continue
        value = _unescaped(body[equals + 1:end])
        if _is_unsafe(value):
            unsafe.append((offset + start, offset + end))
        values[section + _unescaped_key(body[start:equals].strip())] = value
    return values, unsafe


def _ini_path(store: QSettings) -> str | None:
    fmt = store.format()
    native_ini = fmt == QSettings.Format.NativeFormat and sys.platform not in ("win32", "darwin")
    if fmt == QSettings.Format.IniFormat or native_ini:
        return store.fileName() or None
    return None


def _read_file(path: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:
        return b""


def plain_values(store: QSettings) -> dict[str, str | list[str]]:
    """Every value of `store`'s INI file, values set but not yet written included, as QSettings
    would read them but without deserialising any: entries that QSettings would deserialise are
    first deleted from the file (see the module's docstring). Raises OSError when such an entry is
    there and the file cannot be rewritten."""
    path = _ini_path(store)
    if path is None:
        return {}
    _delete_unsafe(path)
    store.sync()  # values set but not written reach the file; QSettings reads it again if it changed
    values, rewritten = _delete_unsafe(path)
    if rewritten:
        store.sync()
    return values


def _delete_unsafe(path: str) -> tuple[dict[str, str | list[str]], bool]:
    """The file's values once the entries QSettings would deserialise are deleted from it, and
    whether the file had to be rewritten for that."""
    data = _read_file(path)
    values, unsafe = _entries(data)
    if not unsafe:
        return values, False
    for _attempt in range(len(unsafe) + 8):  # each pass deletes at least one entry
        for start, end in reversed(unsafe):
            data = data[:start] + data[end:]
        values, unsafe = _entries(data)
        if not unsafe:
            break
    else:
        data, values = b"", {}
    mode = os.stat(path).st_mode & 0o777
    write_atomically(path, data)
    os.chmod(path, mode)
    return values, True


def safe_values(store: QSettings) -> dict[str, str | list[str]] | None:
    """`plain_values`, or None when the file holds an entry that could not be deleted."""
    try:
        return plain_values(store)
    except OSError:
        return None
