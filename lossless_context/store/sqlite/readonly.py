"""An SQLite store opened for reading only: inspecting a store you cannot write.

`lcm status`, `grep`, `describe`, `sessions`, `context`, `export` and `doctor` (without
`--repair`) only read. A store on a read-only mount, another user's store shared read-only,
or a backup copy must still answer them; the ordinary store would try to create the file,
fix its mode, switch it to WAL and apply migrations, and fail on the first of those.

This store opens the file with SQLite's `mode=ro` and `PRAGMA query_only`; when even the
WAL's shared-memory file cannot be created next to it (a directory the user cannot write),
it opens the file as `immutable=1`, which reads the database file alone (a WAL left by a
writer that is still running is then not seen: the note in `why` says so). Every write
fails with a StoreError that names the store and the reason, and a search uses what is
already full-text indexed (indexing a backlog would be a write).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path
from typing import Iterator

from ..base import StoreError
from .. import migrate
from .store import BUSY_TIMEOUT_MS, SQLiteStore
from .migrations import MIGRATIONS
from . import cipher as sqlite_cipher


def is_read_only(location: str) -> bool:
    """True when this process can read the SQLite file but not write it (or its directory)."""
    path = Path(location).expanduser()
    if not path.is_file() or not os.access(path, os.R_OK):
        return False
    return not os.access(path, os.W_OK) or not os.access(path.parent, os.W_OK | os.X_OK)


class ReadOnlySQLiteStore(SQLiteStore):
    """SQLiteStore that never writes: reads work, writes raise StoreError."""

    read_only = True

    def __init__(self, location: str) -> None:
        super().__init__(location)
        self.why = "read-only: opened for inspection (the file or its directory is not writable)"
        self._immutable = False

    def _prepare_file(self) -> None:
        if not Path(self.location).is_file():
            raise StoreError(f"cannot open store {self.location}: no such file")
        self._key = sqlite_cipher.key_for(self.location) if sqlite_cipher.is_encrypted_file(self.location) else None

    def _connect(self) -> sqlite3.Connection:
        uri = Path(self.location).resolve().as_uri()
        last: Exception | None = None
        for params in (("?mode=ro", False), ("?mode=ro&immutable=1", True)):
            try:
                c = sqlite_cipher.connect(uri + params[0], self._key, uri=True, timeout=BUSY_TIMEOUT_MS / 1000,
                                          isolation_level=None, check_same_thread=False)
                c.execute("PRAGMA query_only=ON")
                c.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()  # WAL: needs the -shm file
            except sqlite3.Error as exc:
                last = exc
                if any(w in str(exc).lower() for w in ("locked", "busy")):
                    break  # a writer holds the file: never read around its lock (immutable would be stale)
                continue
            if params[1] and not self._immutable:
                self._immutable = True
                self.why += "; read as an immutable file (changes a running writer has not checkpointed are not seen)"
            with self._conns_lock:
                self._conns.append(c)
            return c
        raise StoreError(f"cannot open store {self.location} read-only: {last}")

    def _migrate(self, c: sqlite3.Connection) -> None:
        done = migrate.read_applied(self.location, lambda: [r[0] for r in c.execute("SELECT name FROM lcm_migrations")],
                                    sqlite3.Error)
        migrate.require_applied(self.location, MIGRATIONS, done, (),
                                "open it once as its owner (e.g. `lcm doctor`)")

    def _refuse(self) -> StoreError:
        return StoreError(f"store {self.location} is {self.why}: nothing can be written")

    @contextlib.contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        raise self._refuse()
        yield  # pragma: no cover  (a generator, for contextmanager)

    def _begin(self, c: sqlite3.Connection) -> None:  # type: ignore[override]  # an instance method over the base's staticmethod: it refuses
        raise self._refuse()

    def append_messages(self, *args, **kwargs):
        raise self._refuse()

    def wait_indexed(self) -> None:
        return None  # indexing a backlog is a write: searches use what is indexed

    def _index_before_search(self) -> None:
        return None

    @contextlib.contextmanager
    def compaction_lock(self, session_id: str, timeout: float) -> Iterator[bool]:
        raise self._refuse()
        yield False  # pragma: no cover
