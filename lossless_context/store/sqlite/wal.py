"""Background WAL checkpoints for the SQLite store.

In WAL mode every committed page is written twice: into the WAL at COMMIT, and later back
into the database file by a checkpoint. SQLite runs that checkpoint inside whichever COMMIT
pushes the WAL past its threshold, so a large ingest paid for copying (and fsyncing) the
previous batches too. After a large append the store asks this thread to checkpoint
instead (PASSIVE: it never blocks readers or the writer); the connections' own automatic
checkpoint stays on at a higher threshold, so the WAL stays bounded even if this thread
cannot keep up or is gone (after a fork).
"""

from __future__ import annotations

import os
import sqlite3
import threading
from typing import Callable

WAL_POKE_BYTES = 4 << 20  # a WAL bigger than this (SQLite's own default threshold) is worth a pass
PAGE_SIZE = 16384  # of a new store file (store/sqlite.py says why)
AUTOCHECKPOINT_PAGES = 2048  # the connections' own fallback threshold (32 MB with 16 KB pages)


class Checkpointer:
    """One daemon thread per store, started on first need, that runs passive checkpoints."""

    def __init__(self, path: str, connect: Callable[[], sqlite3.Connection]) -> None:
        self._wal = path + "-wal"
        self._connect = connect
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._lock = threading.Lock()
        self.passes = 0

    def poke(self) -> None:
        """Checkpoint soon if the WAL has grown (a stat call; nothing else on the caller's thread)."""
        try:
            if os.path.getsize(self._wal) < WAL_POKE_BYTES:
                return
        except OSError:
            return
        with self._lock:
            if self._stopping:
                return
            if self._thread is None or self._pid != os.getpid() or not self._thread.is_alive():
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._run, name="lcm-checkpoint", daemon=True)
                self._thread.start()
        self._wake.set()

    def _run(self) -> None:
        c = None
        try:
            c = self._connect()
            while True:
                self._wake.wait()
                self._wake.clear()
                if self._stopping:
                    return
                try:
                    c.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                    self.passes += 1
                except sqlite3.Error:
                    pass  # busy or closing: the next poke (or an automatic checkpoint) retries
        finally:
            if c is not None:
                try:
                    c.close()
                except sqlite3.Error:
                    pass

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            t, self._thread = self._thread, None
        self._wake.set()
        if t is not None and t is not threading.current_thread() and self._pid == os.getpid():
            t.join(timeout=30)
