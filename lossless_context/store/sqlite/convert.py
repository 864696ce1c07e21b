"""Converting an SQLite store file between plaintext and encrypted, or to a new key
(`lcm encrypt`, `lcm decrypt`, `lcm rekey`).

A new copy is written beside the store (SQLCipher's ``sqlcipher_export``: one read
transaction), checked against the original (SQLite's integrity check, the full-text
indexes' own checks, the counts and sums of every table, and the same full-text matches for
words sampled from the newest messages), and only then swapped in with one rename. The old
file is overwritten with zeros through a descriptor held across the rename before it goes
(on an SSD or a copy-on-write file system old blocks may still survive on the device: the
only full answer there is disk encryption), and its ``-wal``/``-shm`` are removed. The store
must not be open in another process meanwhile (checked on Linux through /proc).
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import cipher

_TABLES = ("sessions", "messages", "summaries", "summary_messages", "summary_parents", "context_items",
           "message_retractions", "pruned_spans")
_FTS = ("messages_fts", "summaries_fts", "summaries_scoped_fts")


class ConvertError(cipher.CipherError):
    """The conversion was refused or its copy failed a check (the store is unchanged)."""


@dataclass
class ConvertReport:
    encrypted: bool  # after the conversion
    bytes_before: int
    bytes_after: int
    messages: int
    sampled_terms: int
    seconds: float


def others_using(path: Path) -> list[int]:
    """Other processes holding the store (or its WAL) open ([] where /proc is not readable)."""
    names = {str(path.resolve()), str(path.resolve()) + "-wal", str(path.resolve()) + "-shm"}
    out: list[int] = []
    proc = Path("/proc")
    if not proc.is_dir():
        return out
    me = os.getpid()
    for p in proc.iterdir():
        if not p.name.isdigit() or int(p.name) == me:
            continue
        try:
            for fd in (p / "fd").iterdir():
                try:
                    if os.readlink(fd) in names:
                        out.append(int(p.name))
                        break
                except OSError:
                    continue
        except OSError:
            continue
    return out


def _fingerprint(c: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for t in _TABLES:
        try:
            out[t] = tuple(c.execute(f"SELECT COUNT(*), COALESCE(SUM(rowid), 0) FROM {t}").fetchone())
        except Exception:
            out[t] = None
    return out


def _terms(c: Any, n: int = 8) -> list[str]:
    words: list[str] = []
    for (text,) in c.execute("SELECT text FROM messages ORDER BY id DESC LIMIT 50"):
        for w in re.findall(r"[A-Za-z][A-Za-z0-9_]{5,}", text or ""):
            if w not in words:
                words.append(w)
            if len(words) >= n:
                return words
    return words


def _matches(c: Any, term: str) -> list[int]:
    return [r[0] for r in c.execute("SELECT rowid FROM messages_fts WHERE messages_fts MATCH ? ORDER BY rowid",
                                    (f'"{term}"',))]


def _size(path: Path) -> int:
    return sum(os.path.getsize(str(path) + s) for s in ("", "-wal") if os.path.exists(str(path) + s))


def convert(location: str, src_key: cipher.StoreKey | None, new_secret: bytes | None) -> ConvertReport:
    """Rewrite the store at ``location`` (opened with ``src_key``, None for plaintext) so it is
    encrypted with ``new_secret`` (None: plaintext). See the module doc."""
    t0 = time.monotonic()
    path = Path(location)
    busy = others_using(path)
    if busy:
        raise ConvertError(f"{path} is open in process {', '.join(map(str, busy[:5]))} (Hermes, a gateway, "
                           "another lcm): stop it first; nothing was changed")
    before = _size(path)
    dst_key = cipher.StoreKey.new(new_secret) if new_secret is not None else None
    tmp = path.with_name(f".{path.name}.lcm-convert-{os.getpid()}")
    for suf in ("", "-wal", "-shm", "-journal"):
        Path(str(tmp) + suf).unlink(missing_ok=True)
    drv = cipher.driver()
    src = cipher.connect(str(path), src_key, isolation_level=None) if src_key is not None else \
        drv.connect(str(path), isolation_level=None)
    try:
        src.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        want = _fingerprint(src)
        terms = _terms(src)
        hits = {t: _matches(src, t) for t in terms}
        cipher.export_to(src, str(tmp), dst_key)
        os.chmod(tmp, 0o600)
        check = cipher.connect(str(tmp), dst_key, isolation_level=None)
        try:
            ok = check.execute("PRAGMA integrity_check").fetchone()[0]
            if ok != "ok":
                raise ConvertError(f"the new copy failed SQLite's integrity check ({ok}); the store is unchanged")
            for fts in _FTS:
                check.execute(f"INSERT INTO {fts}({fts}, rank) VALUES ('integrity-check', 1)")
            got = _fingerprint(check)
            if got != want:
                raise ConvertError("the new copy differs from the store "
                                   f"({[t for t in want if want[t] != got.get(t)]}); the store is unchanged")
            for t, ids in hits.items():
                if _matches(check, t) != ids:
                    raise ConvertError(f"the new copy's search for {t!r} differs; the store is unchanged")
            check.execute("PRAGMA journal_mode=WAL")
        finally:
            check.close()
        messages = int(want["messages"][0]) if want.get("messages") else 0
        src.close()  # (its WAL was checkpointed empty: closing writes nothing more)
        # the swap: one rename; the old file is zeroed through a descriptor kept across it
        old = os.open(path, os.O_RDWR)
        try:
            os.replace(tmp, path)
            _zero(old)
        finally:
            os.close(old)
    except BaseException:
        src.close()
        for suf in ("", "-wal", "-shm", "-journal"):
            Path(str(tmp) + suf).unlink(missing_ok=True)
        raise
    for suf in ("-wal", "-shm"):
        Path(str(path) + suf).unlink(missing_ok=True)
    return ConvertReport(dst_key is not None, before, _size(path), messages, len(terms), time.monotonic() - t0)


def _zero(fd: int) -> None:
    size = os.fstat(fd).st_size
    block = b"\x00" * (1 << 20)
    os.lseek(fd, 0, os.SEEK_SET)
    left = size
    while left > 0:
        left -= os.write(fd, block[:min(left, len(block))])
    os.fsync(fd)
