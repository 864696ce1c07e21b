"""The one atomic-write helper (lossless_context/files.py): whole or nothing, private by default."""

from __future__ import annotations

import stat

import pytest

from lossless_context.files import atomic_path, atomic_text, write_text_atomic


def _mode(p) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_written_whole_and_private(tmp_path) -> None:
    dest = tmp_path / "out.txt"
    write_text_atomic(dest, "one\n")
    assert dest.read_text() == "one\n" and _mode(dest) == 0o600
    write_text_atomic(dest, "two\n", mode=0o644)  # (a config file keeps the mode it had)
    assert dest.read_text() == "two\n" and _mode(dest) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_a_failure_leaves_the_destination_untouched(tmp_path) -> None:
    dest = tmp_path / "out.txt"
    dest.write_text("kept")
    with pytest.raises(RuntimeError):
        with atomic_text(dest) as fh:
            fh.write("half")
            raise RuntimeError("interrupted")
    assert dest.read_text() == "kept"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]  # no temporary file left


def test_the_temporary_file_is_private_while_filled(tmp_path) -> None:
    with atomic_path(tmp_path / "x.db", mode=0o600) as tmp:
        assert tmp.parent == tmp_path and _mode(tmp) == 0o600
        tmp.write_bytes(b"data")
    assert (tmp_path / "x.db").read_bytes() == b"data"
