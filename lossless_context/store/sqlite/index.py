"""Full-text indexing of large appends after their commit (the deferred message index).

FTS5 tokenising is most of what SQLite does for a large append. A pipelined append
(store/sqlite/append.py) therefore indexes its rows only while its writer thread would
otherwise wait for the caller, and lists the id range of the rest in ``lcm_index_pending``
in the same transaction (migration 009); after the commit the store's writer thread
indexes the listed ranges, at most STEP rows per transaction, each range leaving the list
in the transaction that indexes it. The tokenising then overlaps with what the caller
does next (the host's next turn, the rows of the next append) instead of delaying the
compress() that stored the messages.

Nothing is lost and search is never stale: the list is committed with the rows, so a
crash between the two leaves a record of exactly what is still to index; and before a
full-text match, :meth:`Indexer.wait` waits for the jobs this process queued and indexes
whatever is still listed (left by a crash, or by another process) itself.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from typing import Callable

from . import writelock

log = logging.getLogger("lossless_context")

STEP = 4096  # rows per indexing transaction: another writer waits at most one step
SEARCH_LOCK_WAIT = 2.0  # seconds a search waits for the write lock to index another process's rows
BUSY_PAUSE = 10.0  # seconds after a search waited in vain during which searches do not wait again

_NEXT = "SELECT rowid, lo, hi FROM lcm_index_pending ORDER BY lo LIMIT 1"
INDEX_RANGE = "INSERT INTO messages_fts(rowid, text) SELECT id, text FROM messages WHERE id BETWEEN ? AND ?"


def index_pending(c: sqlite3.Connection, begin: Callable[[sqlite3.Connection], None]) -> int:
    """Index every listed range on connection `c`; returns how many ids it covered."""
    done = 0
    while True:
        begin(c)
        try:
            # Read under the write lock: another process may have indexed it meanwhile.
            row = c.execute(_NEXT).fetchone()
            if row is None:
                c.execute("COMMIT")
                return done
            rid, lo, hi = row
            top = min(hi, lo + STEP - 1)
            c.execute(INDEX_RANGE, (lo, top))  # (a row deleted meanwhile is simply not there)
            if top >= hi:
                c.execute("DELETE FROM lcm_index_pending WHERE rowid=?", (rid,))
            else:
                c.execute("UPDATE lcm_index_pending SET lo=? WHERE rowid=?", (top + 1, rid))
            c.execute("COMMIT")
        except BaseException:
            try:
                c.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            raise
        done += top - lo + 1


class Indexer:
    """The deferred index of one store: jobs on its writer thread, and waiting for them."""

    def __init__(self, conn: Callable[[], sqlite3.Connection], begin: Callable[[sqlite3.Connection], None],
                 writer: Callable[[], ThreadPoolExecutor], done: Callable[[], None] | None = None) -> None:
        self._conn, self._begin, self._writer = conn, begin, writer
        self.done = done  # called after rows were indexed (the store's merge thread: merge.py)
        self._lock = threading.Lock()
        self._jobs: list[Future] = []
        self._pid = os.getpid()
        self._busy_until = 0.0  # (monotonic) searches do not wait for the lock before this
        _live.add(self)

    def soon(self) -> None:
        """Index what is listed, on the writer thread (after the append that listed it)."""
        job = self._writer().submit(self._run)
        with self._lock:
            if self._pid != os.getpid():  # a forked child: the parent's jobs never finish here
                self._jobs, self._pid = [], os.getpid()
            self._jobs = [j for j in self._jobs if not j.done()] + [job]

    def _run(self) -> None:
        try:
            if index_pending(self._conn(), self._begin) and self.done is not None:
                self.done()
        except Exception as exc:  # the ranges stay listed: the next job or search retries
            log.warning("lcm: deferred full-text indexing failed (will retry): %s", exc)

    def drain(self, timeout: float | None = None) -> None:
        """Wait for the jobs this process queued (they run on the writer thread; never call
        this on it, nor while the calling thread holds the write lock)."""
        with self._lock:
            jobs = self._jobs if self._pid == os.getpid() else []
            self._jobs = [j for j in jobs if not j.done()] if timeout is not None else []
        futures_wait(jobs, timeout)  # (_run does not raise)

    def before_write(self, c: sqlite3.Connection) -> None:
        """Before a thread takes the write lock on `c`: wait for this process's jobs directly
        rather than by polling the lock (not while `c` holds it: a job would wait for it)."""
        if not c.in_transaction:
            self.drain()

    def wait(self, lock_wait: float | None = None) -> None:
        """Return once every stored message is in the full-text index (or, if indexing
        fails, log it: search then may miss the newest messages, nothing is lost).

        Rows listed by another process need the write lock to be indexed here; with
        `lock_wait` (seconds) this waits at most that long for it — a search must not stall
        behind another process's long append, whose own writer indexes them soon anyway."""
        c = self._conn()
        if c.in_transaction:  # (the jobs would wait for this thread's write lock)
            return
        self.drain()
        if c.execute("SELECT 1 FROM lcm_index_pending LIMIT 1").fetchone() is None:
            return
        if lock_wait is None:
            begin = self._begin
        elif time.monotonic() < self._busy_until:
            return  # (a search just waited in vain: the next ones of this grep do not)
        else:
            wait_ms = int(lock_wait * 1000)

            def begin(conn: sqlite3.Connection) -> None:  # (polled: store/sqlite/writelock.py)
                writelock.begin_immediate(conn, lock_wait, wait_ms)
            was = c.execute("PRAGMA busy_timeout").fetchone()[0]
            c.execute(f"PRAGMA busy_timeout={wait_ms}")  # (bounds its other statements' waits)
        try:
            if index_pending(c, begin) and self.done is not None:
                self.done()
        except Exception as exc:
            if lock_wait is not None:
                self._busy_until = time.monotonic() + BUSY_PAUSE
            log.warning("lcm: full-text indexing of the newest messages failed or waited too long "
                        "(searching what is indexed): %s", exc)
        finally:
            if lock_wait is not None:
                c.execute(f"PRAGMA busy_timeout={int(was)}")

    def pending(self) -> int:
        """Ids listed and not yet indexed."""
        return self._conn().execute("SELECT COALESCE(SUM(hi - lo + 1), 0) FROM lcm_index_pending").fetchone()[0]


# A fork while the writer thread indexes would leave the child believing its process holds
# the store's write lock (SQLite keeps lock state per process, and the thread holding it
# does not exist in the child): the child's first write would wait for it forever. Forks
# wait for the running jobs instead (nothing, usually).
_live: "weakref.WeakSet[Indexer]" = weakref.WeakSet()


def _before_fork() -> None:
    for indexer in list(_live):
        indexer.drain(timeout=10.0)  # (bounded: the forking thread might hold the write lock)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork)
