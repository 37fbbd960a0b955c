"""An export of several files replaces the earlier set together or leaves it exactly as it was
(kvviz.core.files.replacing_together): a failure while writing, a failure while putting the files in place,
and the stale files of a longer earlier set. Qt-free."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvviz.core.files import replacing_together


def contents(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


@pytest.fixture
def earlier(tmp_path) -> Path:
    for name in ("a.png", "b.png", "c.png"):
        (tmp_path / name).write_bytes(b"earlier " + name.encode())
    return tmp_path


def test_a_failure_while_writing_keeps_every_earlier_file(earlier):
    before = contents(earlier)
    with pytest.raises(OSError, match="No space"), replacing_together(earlier) as files:
        files.write(earlier / "a.png", b"new a")
        files.write(earlier / "b.png", b"new b")
        raise OSError(28, "No space left on device")
    assert contents(earlier) == before


def test_a_failure_while_putting_files_in_place_puts_the_earlier_ones_back(earlier):
    before = contents(earlier)
    with pytest.raises(OSError), replacing_together(earlier) as files:
        for name in ("a.png", "b.png", "d.png"):
            files.write(earlier / name, b"new " + name.encode())
        (earlier / "d.png").mkdir()  # taken by a folder once the writing is done: the last rename fails
    (earlier / "d.png").rmdir()
    assert contents(earlier) == before


def test_a_whole_set_replaces_the_earlier_one_and_its_stale_files(earlier):
    (earlier / "mine.txt").write_bytes(b"mine")
    with replacing_together(earlier, stale=lambda: [earlier / "b.png", earlier / "c.png"]) as files:
        files.write(earlier / "a.png", b"new a")
    assert contents(earlier) == {"a.png": b"new a", "mine.txt": b"mine"}


def test_a_failure_removes_the_folders_it_made(tmp_path):
    with pytest.raises(KeyboardInterrupt), replacing_together(tmp_path / "new" / "deck") as files:
        files.write(tmp_path / "new" / "deck" / "a.png", b"a")
        raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []
