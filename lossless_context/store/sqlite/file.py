"""An SQLite store as a file: is this file an lcm store, and a consistent copy of one.

For the CLI, which must refuse to touch a file that is not ours before opening it as a
store, and backs a store up while Hermes may be writing to it. Both open the file
read-only; neither runs migrations.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Callable
from urllib.parse import quote

from . import cipher
from ...files import atomic_path

SQLITE_MAGIC = b"SQLite format 3\x00"


class StoreFileError(ValueError):
    """A user-facing reason a file cannot be used as (or copied as) an lcm store."""


def table_names(location: str, key: cipher.StoreKey | None = None) -> set[str]:
    """The tables of an SQLite file (encrypted with ``key``), read without writing anything
    (not even a WAL's -shm: falls back to reading the file as immutable). Raises sqlite3.Error
    if it is unreadable."""
    uri = Path(location).expanduser().resolve().as_uri()
    last: sqlite3.Error | None = None
    for params in ("?mode=ro", "?mode=ro&immutable=1"):
        try:
            c = cipher.connect(uri + params, key, uri=True)
            try:
                return {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            finally:
                c.close()
        except sqlite3.Error as exc:
            last = exc
    assert last is not None
    raise last


def check_store_file(p: Path) -> bool:
    """False when `p` does not exist; True when it is an lcm store or an empty/fresh file.

    Raises StoreFileError for a directory, an unreadable file, a file that is not SQLite,
    or an SQLite database that is not an lcm store (it has tables but no lcm_migrations)."""
    if p.is_dir():
        raise StoreFileError(f"{p} is a directory; give the store file (e.g. {p / 'lcm.db'})")
    if not p.exists():
        return False
    try:
        with open(p, "rb") as fh:
            head = fh.read(16)
    except OSError as exc:
        raise StoreFileError(f"cannot read {p}: {exc.strerror or exc}") from exc
    if not head:
        return True  # an empty file: a store that was created and never written
    key = None
    if head != SQLITE_MAGIC:
        if len(head) < 16:
            raise StoreFileError(f"{p} is not an lcm store (not an SQLite database)")
        try:  # an encrypted store (store/sqlite/cipher.py), or not a database at all
            key = cipher.key_for(p)
        except cipher.CipherError as exc:
            raise StoreFileError(f"{exc} (or {p.name} is not an lcm store)") from exc
    try:
        tables = table_names(str(p), key)
    except cipher.CipherError as exc:
        raise StoreFileError(str(exc)) from exc
    except sqlite3.Error as exc:
        raise StoreFileError(f"cannot open {p}: {exc}") from exc
    if tables and "lcm_migrations" not in tables:
        raise StoreFileError(f"{p} is an SQLite database but not an lcm store (refusing to touch it)")
    return True


def backup_store_file(src: Path, dest: Path,
                      progress: Callable[[int, int], None] | None = None) -> bool:
    """Copy `src` to `dest` with SQLite's online backup API (safe while a writer runs).

    The copy is written to a temporary file beside `dest`, checked (`PRAGMA quick_check`),
    made 0600 and only then renamed over `dest`; on any failure `dest` is untouched.
    `progress(done_pages, total_pages)` is called as pages are copied. An encrypted store is
    copied encrypted with the same key (its own salt). Returns whether the copy is encrypted."""
    if cipher.is_encrypted_file(src):
        with atomic_path(dest, prefix=".lcm-backup.", suffix=".db") as tmp:
            _encrypted_backup(src, tmp)
        return True
    with atomic_path(dest, prefix=".lcm-backup.", suffix=".db") as tmp:
        s = sqlite3.connect(f"file:{quote(str(src.resolve()))}?mode=ro", uri=True, timeout=30)
        d = sqlite3.connect(tmp)
        try:
            def cb(status: int, remaining: int, total: int) -> None:
                if progress is not None:
                    progress(total - remaining, total)

            s.backup(d, pages=1024, progress=cb)
            d.execute("PRAGMA journal_mode=DELETE")
            ok = d.execute("PRAGMA quick_check").fetchone()[0]
        finally:
            d.close()
            s.close()
        if ok != "ok":
            raise StoreFileError(f"the backup failed its integrity check: {ok}")
    return False


def _encrypted_backup(src: Path, tmp: Path) -> None:
    """An encrypted store's consistent copy, encrypted with the same passphrase (one read
    transaction of the source: writers go on), checked before it is used."""
    key = cipher.key_for(src)
    secret = cipher.passphrase()
    if key is None or secret is None:  # (key_for raised already when no key is set)
        raise StoreFileError(f"{src} is encrypted and no key is set")
    out = cipher.StoreKey.new(secret)
    tmp.unlink()  # (sqlcipher_export makes the file)
    s = cipher.connect(f"file:{quote(str(src.resolve()))}?mode=ro", key, uri=True, timeout=30)
    try:
        cipher.export_to(s, str(tmp), out)
    finally:
        s.close()
    d = cipher.connect(str(tmp), out)
    try:
        ok = d.execute("PRAGMA quick_check").fetchone()[0]
    finally:
        d.close()
    if ok != "ok":
        raise StoreFileError(f"the backup failed its integrity check: {ok}")
