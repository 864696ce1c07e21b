"""Appending messages to the SQLite store: rows, search indexes and the new active context
in ONE transaction, with large appends pipelined against the caller's row production.

Ingest time is about half Python (building each row: identity, token estimate, JSON) and
half SQLite (inserting rows, FTS5 tokenising). sqlite3 releases the GIL while SQLite works,
so a large append runs its SQL on the store's writer thread (its own connection) while the
calling thread builds the next chunk of rows: the two halves overlap on two cores. The
writer takes the write lock while the first chunk is being built and holds it to COMMIT,
as a single-threaded append would; nothing is visible before COMMIT, and a failure on
either side rolls everything back. Rows already built (a list) are written on the calling
thread: there is nothing to overlap.

Each chunk's rows go in bulk statements with their ids and session positions computed by
SQL from two base values (``?1 + k``), so the writer thread does no per-row Python; the
chunk's last row fires its FTS indexing in the same statement (migrations 007 and 008) —
except in a pipelined append. There the writer thread indexes the batch's rows only while
it would otherwise wait for the caller's next chunk (IDLE_STEP rows at a time), and lists
the rest for indexing after the commit (store/sqlite/index.py): the commit, and so the
caller, never waits for indexing. The caller may build up to DEPTH chunks ahead of the
writer thread: it then goes on while the writer still indexes what the previous append
stored.
"""

from __future__ import annotations

import collections
import functools
import itertools
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable, Iterator, Sequence

from ...messages import clean_text, has_cjk, safe_json
from ...records import NewMessage
from ..base import resolve_new_refs
from .index import INDEX_RANGE

CHUNK = 512  # rows per step (built on the calling thread while the writer inserts the previous one)
FIRST = 64  # rows of the first step: the writer thread idles until they are built
BLOCK = 128  # rows per insert statement (compiling one of 512 rows takes ~80 ms, of 128 ~5 ms)
YIELD_EVERY = 16  # rows built between two chances for the writer thread to take the GIL
DEPTH = 4  # chunks the caller may have queued for the writer thread (memory: ~2 MB each)
IDLE_STEP = 256  # rows the writer thread indexes between two looks for the caller's next chunk
_COLS = 10  # per-row parameters the caller prepares (everything but id, session, seq)
_HEAD = "INSERT INTO messages(id, session_id, seq, uid, ident, role, raw, text, tokens, created_at," \
        " supersedes, large, exploration) VALUES "


def _blocks(n: int, limit: int) -> Iterator[int]:
    """Rows per statement: blocks of BLOCK, the rest in powers of two. Compiling a statement
    grows faster than its row count (a 500-row one takes ~60 ms) and each distinct size is
    compiled once per connection, so only a few small fixed sizes are ever used."""
    block = max(1, min(BLOCK, limit))
    for _ in range(n // block):
        yield block
    rest = n % block
    bit = 1 << max(0, rest.bit_length() - 1)
    while rest:
        if rest & bit:
            yield bit
            rest -= bit
        bit >>= 1


@functools.lru_cache(maxsize=16)
def _insert_sql(n: int) -> str:
    """A statement for n rows: ids and seqs are ?1 + k and ?3 + k, the session is ?2."""
    rows = []
    for k in range(n):
        p = 4 + k * _COLS
        rows.append(f"(?1+{k},?2,?3+{k}," + ",".join(f"?{p + i}" for i in range(_COLS)) + ")")
    return _HEAD + ",".join(rows)


class Prepared:
    """One chunk of rows as SQL parameters, built on the calling thread."""

    __slots__ = ("n", "flat", "cjk", "absorbed")

    def __init__(self, rows: Sequence[NewMessage]) -> None:
        flat: list[Any] = []
        cjk: list[tuple[int, str]] = []
        absorbed: list[tuple[int, str]] = []
        for k, r in enumerate(rows):
            text = clean_text(r.text)
            if has_cjk(text):  # the rows the GLOB of migration 006 picks
                cjk.append((k, text))
            flat += (r.uid, r.ident, r.role, safe_json(r.raw), text, r.tokens, r.created_at, r.supersedes,
                     int(r.large), r.exploration)
            if r.absorbed:
                absorbed.extend((k, u) for u in r.absorbed)
        self.n, self.flat, self.cjk, self.absorbed = len(rows), flat, cjk, absorbed


class Batch:
    """One append transaction on one connection; every method runs on that connection's thread."""

    def __init__(self, conn: Callable[[], sqlite3.Connection], begin: Callable[[sqlite3.Connection], None],
                 write_context: Callable[..., None], session_id: str,
                 context: Sequence[tuple[str, int]] | None, context_known: tuple[int, int] | None,
                 defer_index: bool = False) -> None:
        self._conn, self._begin, self._write_context = conn, begin, write_context
        self.session_id, self.context, self.context_known = session_id, context, context_known
        self.defer_index = defer_index  # index rows only while idle; list the rest in lcm_index_pending
        # (deferred indexing) chunks the caller has submitted / the writer has started, and
        # whether the caller has no more: the writer is idle while submitted == started.
        self.submitted = self.started = 0
        self.closing = False
        self.indexed = 0  # rows of this batch up to this id are in the full-text index
        self.c: sqlite3.Connection | None = None
        self.absorbed: list[tuple[int, str]] = []
        self._seq = 0
        self._next = self.first = 0  # the first new row's id, and the next one's (known once begun)

    @property
    def ids(self) -> list[int]:
        """The rows' ids so far: consecutive from `first`."""
        return list(range(self.first, self._next))

    def begin(self) -> None:
        """Take the write lock (while the caller builds the first rows) and fix the ids."""
        c = self._conn()
        self._begin(c)
        self.c = c
        try:
            self._seq = c.execute("SELECT COALESCE(MAX(seq), -1) + 1 FROM messages WHERE session_id=?",
                                  (self.session_id,)).fetchone()[0]
            # The ids SQLite would pick itself (max + 1, no AUTOINCREMENT), fixed up front so
            # the rows can go in bulk statements; the write lock is held since BEGIN IMMEDIATE.
            self._next = self.first = c.execute("SELECT COALESCE(MAX(id), 0) + 1 FROM messages").fetchone()[0]
            self.indexed = self.first - 1
            # Gate the per-row insert triggers off and index each chunk in bulk instead
            # (migrations 007 and 008 say why).
            c.execute("INSERT INTO lcm_bulk_indexing(active) VALUES (1)")
            c.execute("INSERT INTO lcm_bulk_range(lo, hi) VALUES (0, 0)")
        except BaseException:
            self.rollback()
            raise

    def insert(self, p: Prepared, started: threading.Event | None = None) -> None:
        c = self.c
        assert c is not None
        self.started += 1
        first, seq = self._next, self._seq
        if not self.defer_index:
            # The row with id `hi` fires the FTS indexing of the whole chunk (migration 008).
            c.execute("UPDATE lcm_bulk_range SET lo=?, hi=?", (first, first + p.n - 1))
        if started is not None:
            started.set()  # the caller goes on building rows while the chunk's statement runs
        k = 0
        for n in _blocks(p.n, (c.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) - 3) // _COLS):
            c.execute(_insert_sql(n), [first + k, self.session_id, seq + k, *p.flat[k * _COLS:(k + n) * _COLS]])
            k += n
        if p.cjk:
            c.executemany("INSERT INTO messages_cjk(rowid, text) VALUES (?, ?)", [(first + k, t) for k, t in p.cjk])
        self.absorbed.extend((first + k, u) for k, u in p.absorbed)
        self._next, self._seq = first + p.n, seq + p.n
        if self.defer_index:
            self._index_while_idle(c)

    def _index_while_idle(self, c: sqlite3.Connection) -> None:
        """Index this batch's rows, a step at a time, until the caller's next chunk arrives
        (or it has none: the commit must not wait for indexing)."""
        while self.indexed < self._next - 1 and self.started == self.submitted and not self.closing:
            hi = min(self._next - 1, self.indexed + IDLE_STEP)
            c.execute(INDEX_RANGE, (self.indexed + 1, hi))
            self.indexed = hi

    def finish(self) -> list[int]:
        """Write the new active context (after the rows: foreign keys are checked as it goes)
        and commit."""
        c = self.c
        assert c is not None
        try:
            c.execute("DELETE FROM lcm_bulk_indexing")
            c.execute("DELETE FROM lcm_bulk_range")
            if self.defer_index and self._next - 1 > self.indexed:
                c.execute("INSERT INTO lcm_index_pending(lo, hi) VALUES (?, ?)", (self.indexed + 1, self._next - 1))
            if self.absorbed:
                c.executemany("INSERT OR IGNORE INTO message_absorbed(message_id, uid) VALUES (?, ?)", self.absorbed)
            c.execute("UPDATE sessions SET updated_at=? WHERE id=?", (time.time(), self.session_id))
            if self.context is not None:
                known, ck = None, self.context_known
                if ck is not None and c.execute("SELECT context_version FROM sessions WHERE id=?",
                                                (self.session_id,)).fetchone() == (ck[0],):
                    known = ck[1]
                self._write_context(c, self.session_id, resolve_new_refs(self.context, self.ids, known or 0), known)
            c.execute("COMMIT")
        except BaseException:
            self.rollback()
            raise
        self.c = None
        return self.ids

    def rollback(self) -> None:
        if self.c is not None:
            c, self.c = self.c, None
            try:
                c.execute("ROLLBACK")
            except sqlite3.Error:
                pass


def _yielding(rows: Iterator[NewMessage], every: int = YIELD_EVERY) -> Iterator[NewMessage]:
    """The rows, with the GIL let go every few: the writer thread, back from SQLite between
    two statements, would otherwise wait up to the interpreter's switch interval (5 ms) while
    this thread runs Python."""
    for k, r in enumerate(rows):
        if not k % every:
            time.sleep(0)
        yield r


def append(batch: Batch, rows: Iterable[NewMessage], writer: Callable[[], ThreadPoolExecutor] | None,
           on_ids: Callable[[list[int]], None] | None = None) -> list[int]:
    """Run `batch` over `rows`: on this thread, or — given a writer — with the SQL on the
    writer thread while this thread builds the next chunk of rows. `on_ids` gets the new
    ids on this thread (Store.append_messages says when)."""
    it = iter(rows)
    if writer is None:
        chunk = list(itertools.islice(it, CHUNK))
        if not chunk:
            if on_ids is not None:
                on_ids([])
            return []
        batch.begin()
        try:
            while chunk:
                batch.insert(Prepared(chunk))
                chunk = list(itertools.islice(it, CHUNK))
        except BaseException:
            batch.rollback()
            raise
        ids = batch.finish()
        if on_ids is not None:
            on_ids(ids)
        return ids
    ex = writer()
    it = _yielding(it)
    begun = ex.submit(batch.begin)
    queued = collections.deque([begun])  # the writer thread's work, oldest first
    count = 0
    try:
        chunk = list(itertools.islice(it, FIRST))  # built while the writer begins
        while chunk:
            p = Prepared(chunk)
            count += p.n
            while len(queued) >= DEPTH:
                queued.popleft().result()
            idle = all(f.done() for f in queued)
            started = threading.Event()
            batch.submitted += 1
            running = ex.submit(batch.insert, p, started)
            queued.append(running)
            if idle:  # let the writer thread take the GIL and start before building on
                while not started.wait(0.05) and not running.done():
                    pass
            chunk = list(itertools.islice(it, CHUNK))  # built while the writer inserts
        batch.closing = True
        # Ids are consecutive from the first (fixed under the write lock when the batch
        # began): the caller may use them while the writer inserts the last rows and commits.
        begun.result()
        ids = list(range(batch.first, batch.first + count))
        if on_ids is not None:
            on_ids(ids)
        while queued:
            queued.popleft().result()
        if not count:
            ex.submit(batch.rollback).result()
            return []
        ex.submit(batch.finish).result()
        return ids
    except BaseException:
        batch.closing = True
        for f in queued:  # (the writer thread's queue runs out before the rollback)
            try:
                f.result()
            except BaseException:
                pass
        ex.submit(batch.rollback).result()
        raise
