"""Background merging of the SQLite store's full-text index segments.

FTS5 keeps each index as a set of segments: every write transaction adds one, and its own
automatic merging leaves up to a few per level (sixteen at the smallest level before it
must merge). A query reads every segment for every term, so each costs about as much as
the next, large or small: a store written in many small transactions (a gateway's users
compacting in turns) kept 13 segments of its summaries index, and one user's question took
30 ms a search where the same index in one segment took 4; the 100k-message bench store's
22 segments of messages cost its identifier search 0.40 ms against 0.24.

After a write, once no other write has come for ``QUIET`` seconds, this thread merges, in
steps of at most ``STEP_PAGES`` pages (each its own short write transaction, so another
writer waits at most one step; a step waits at most ``LOCK_WAIT_MS`` for the write lock, then
leaves the work to the next write), every level that holds
two or more segments (``usermerge`` 2, set by migration 016) until none does: at most one
segment per level, a few in all. It reads the index's structure record first, so a write
that left nothing to merge costs no transaction. Merging only rewrites the index: a step
that fails (busy, closing) is left for the next write, and nothing in the index changes
meaning.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
import time
import weakref
from typing import Callable, Iterator

from . import writelock

log = logging.getLogger("lossless_context")

TABLES = ("messages_fts", "messages_cjk", "summaries_fts", "summaries_scoped_fts", "summaries_cjk")
STEP_PAGES = 64  # pages written per merge step (~3 ms): the longest a step holds the write lock
# Merging waits for a moment without writes (between the host's turns, not inside a
# compress() whose next write would wait for a step), unless writes keep coming this long.
QUIET = 0.25
MAX_DELAY = 5.0
LOCK_WAIT_MS = 200  # how long the thread's step waits for the write lock before giving up
_V2 = b"\xff\x00\x00\x01"  # FTS5's marker of a structure record with tombstone fields (3.44+)


def _varint(b: bytes, i: int) -> tuple[int, int]:
    """SQLite's varint at ``b[i]`` (as FTS5 writes its structure record): value, next offset."""
    v = 0
    for k in range(9):
        c = b[i]
        i += 1
        if k == 8:
            return (v << 8) | c, i
        v = (v << 7) | (c & 0x7F)
        if not c & 0x80:
            return v, i
    return v, i


def levels(record: bytes) -> list[tuple[int, int]]:
    """(segments being merged, segments) of each level of an FTS5 structure record (the row
    with id 10 of ``<table>_data``). Raises ValueError on a record it cannot read."""
    try:
        i = 4  # (the cookie)
        v2 = record[4:8] == _V2
        if v2:
            i = 8
        n_levels, i = _varint(record, i)
        _n_segments, i = _varint(record, i)
        _writes, i = _varint(record, i)
        out = []
        for _ in range(n_levels):
            merging, i = _varint(record, i)
            n, i = _varint(record, i)
            for _ in range(n):
                for _ in range(8 if v2 else 3):  # id, first and last page (+ origins, tombstones)
                    _x, i = _varint(record, i)
            out.append((merging, n))
        return out
    except IndexError as exc:
        raise ValueError("unreadable FTS5 structure record") from exc


def has_work(record: bytes | None) -> bool:
    """Whether ``'merge'`` with usermerge 2 would do anything: a level of two or more segments,
    or a merge under way. An unreadable record says yes (the merge itself then decides)."""
    if record is None:
        return False
    try:
        return any(merging or n >= 2 for merging, n in levels(record))
    except ValueError:
        return True


def segments(c: sqlite3.Connection) -> dict[str, int]:
    """How many segments each index has (what merging left, for tests and inspection)."""
    out = {}
    for table in TABLES:
        row = c.execute(f"SELECT block FROM {table}_data WHERE id = 10").fetchone()
        out[table] = sum(n for _m, n in levels(row[0])) if row is not None else 0
    return out


class Merger:
    """One daemon thread per store, started on first need, that merges index segments."""

    def __init__(self, connect: Callable[[], sqlite3.Connection]) -> None:
        self._connect = connect
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._lock = threading.Lock()
        self.step_lock = threading.Lock()  # held for each step's transaction (forks wait: below)
        self.steps = 0
        self._asked = self._served = 0  # pokes made, and pokes the thread has acted on
        self._hurry = False  # settle() is waiting: no quiet moment first
        self._served_cv = threading.Condition()
        self._holds = 0  # hold() blocks under way: no merge starts
        self._pending = False  # a poke came while held
        _live.add(self)

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """No merge step starts while this is held (a prune: the pauses between its
        transactions are for the host's writes, and this process's merge steps took them —
        the quiet moment never comes during a prune, so it merged every MAX_DELAY anyway);
        a step under way ends first. When the last hold ends, one poke if writes came."""
        with self._lock:
            self._holds += 1
        try:
            yield
        finally:
            with self._lock:
                self._holds -= 1
                again = not self._holds and self._pending
                if again:
                    self._pending = False
            if again:
                self.poke()

    def poke(self) -> None:
        """Merge soon (after a write). Sets an event; nothing else on the caller's thread."""
        with self._lock:
            if self._stopping:
                return
            if self._holds:
                self._pending = True  # (merged once the hold ends)
                return
            if self._thread is None or self._pid != os.getpid() or not self._thread.is_alive():
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._run, name="lcm-merge", daemon=True)
                self._thread.start()
        with self._served_cv:
            self._asked += 1
        self._wake.set()

    def settle(self, timeout: float = 60.0) -> bool:
        """Return once the thread has acted on every poke made before this call, without
        waiting for a quiet moment (the bench times searches after it; tests check what
        merging left); False if ``timeout`` ran out first. Never call it on the thread."""
        with self._served_cv:
            want = self._asked
            alive = self._thread is not None and self._thread.is_alive() and self._pid == os.getpid()
            if alive and self._served < want:
                self._hurry = True
                self._wake.set()
                return self._served_cv.wait_for(lambda: self._served >= want or self._stopping, timeout)
            return True

    def _run(self) -> None:
        c = None
        try:
            # Opening a connection takes SQLite's process-wide mutexes: a fork in the middle
            # would hand the child a mutex no thread of it will release, and the child's own
            # first open would wait forever (test_fork_after_use hung so, now and then, right
            # after the first write had started this thread). Forks wait for it as for a step.
            with self.step_lock:
                c = self._connect()
                # A step waits briefly for the write lock, then gives up until the next write: a
                # background job must not queue behind another process's long transaction (nor
                # keep close() waiting for it).
                c.execute(f"PRAGMA busy_timeout={LOCK_WAIT_MS}")
            while True:
                self._wake.wait()
                started = time.monotonic()
                while True:  # a quiet moment first: no write for QUIET seconds (at most MAX_DELAY)
                    self._wake.clear()
                    if self._stopping or self._hurry:
                        break
                    if not self._wake.wait(QUIET) or time.monotonic() - started >= MAX_DELAY:
                        break
                self._wake.clear()
                with self._served_cv:
                    self._hurry = False
                    asked = self._asked
                if self._stopping:
                    return
                try:
                    self.merge(c)
                except Exception as exc:  # busy or closing: the next write's poke retries
                    log.debug("lcm: full-text index merge step skipped: %s", exc)
                with self._served_cv:
                    self._served = asked
                    self._served_cv.notify_all()
        finally:
            if c is not None:
                with self.step_lock:  # (closing takes them too)
                    try:
                        c.close()
                    except sqlite3.Error:
                        pass

    def merge(self, c: sqlite3.Connection) -> int:
        """Merge every table's index on ``c`` until no level holds two segments; returns the
        steps that did work. (The thread calls this; so may a test, on any connection.)"""
        done = 0
        for table in TABLES:
            while not self._stopping and not self._holds:
                with self.step_lock:  # (the read too: a fork must not copy it half done)
                    row = c.execute(f"SELECT block FROM {table}_data WHERE id = 10").fetchone()
                    if not has_work(row[0] if row is not None else None):
                        break
                    writelock.begin_immediate(c, LOCK_WAIT_MS / 1000)  # (polled: writelock.py)
                    try:
                        before = c.total_changes
                        c.execute(f"INSERT INTO {table}({table}, rank) VALUES ('merge', ?)", (STEP_PAGES,))
                        worked = c.total_changes - before >= 2  # (FTS5: fewer means nothing to merge)
                        c.execute("COMMIT")
                    except BaseException:
                        if c.in_transaction:  # (SQLite may have rolled back itself: keep the cause)
                            c.execute("ROLLBACK")
                        raise
                if not worked:
                    break
                done += 1
                self.steps += 1
        return done

    def start_afresh(self) -> None:
        """In a forked child: new locks and event, no thread (the next poke starts one)."""
        self.step_lock, self._lock, self._wake = threading.Lock(), threading.Lock(), threading.Event()
        self._served_cv, self._asked, self._served, self._thread = threading.Condition(), 0, 0, None
        self._hurry = False
        self._holds, self._pending = 0, False  # (no hold of the parent's threads is the child's)

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            t, self._thread = self._thread, None
        self._wake.set()
        with self._served_cv:
            self._served_cv.notify_all()
        if t is not None and t is not threading.current_thread() and self._pid == os.getpid():
            t.join(timeout=30)


# A fork while a step holds the store's write lock would leave the child believing its
# process holds it (SQLite keeps lock state per process; the thread holding it does not
# exist in the child): forks wait for the step under way (bounded: the forking thread may
# itself hold the write lock the step waits for).
_live: "weakref.WeakSet[Merger]" = weakref.WeakSet()
_held: list[Merger] = []


def _before_fork() -> None:
    for m in list(_live):
        if m.step_lock.acquire(timeout=10.0):
            _held.append(m)


def _after_fork_parent() -> None:
    while _held:
        _held.pop().step_lock.release()


def _after_fork_child() -> None:
    # The child has no merge thread, and a lock or event the parent's thread held at the
    # fork would stay held here forever: every merger starts afresh (the next poke starts
    # the child's own thread).
    for m in list(_live):
        m.start_afresh()
    _held.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_parent,
                        after_in_child=_after_fork_child)
