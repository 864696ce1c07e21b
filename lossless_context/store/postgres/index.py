"""The PostgreSQL store's deferred full-text index of messages (migration 008).

Committing a message only lists its id in ``message_index_pending`` (a statement trigger on
``messages``). An indexer takes listed ids in batches: one statement deletes a batch from the
list (``FOR UPDATE SKIP LOCKED``, so concurrent indexers - threads, processes, hosts - never
take the same id) and writes those rows' tsvector and CJK bigrams into ``message_index``; the
two happen in one transaction, so a row is indexed exactly once and a crash in between loses
nothing (the ids are listed again on rollback). A backlog left by a process that died is
taken by the next indexer of any process.

Searches never wait for the indexer: they read ``message_index`` and compute the still-listed
rows on the fly (``search.py``), so they see every committed message.

Each store runs one background indexer thread, woken after each append and at first use. It
gives way to this store's appends: it starts no batch while one is under way (for at most
YIELD_SECONDS), so the host's wait for an append does not share the cores with indexing - the
indexer costs the server several times what the append does (lcm_tsvector per text). SQLite's
indexer, on the writer thread, never overlaps an append either.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from typing import Any, Callable, Iterator

from ...messages import CJK_CLASS
from .idents import backfill_done, backfill_step

log = logging.getLogger("lossless_context.store")

BATCH = 256  # rows per indexing transaction (texts may be up to ~160 KB)
# A store that has indexed this many rows while message_index has no planner statistics yet
# analyses it itself: searches read the lexeme statistics (search.py) to skip counting common
# terms, and the planner needs them to choose the index; autovacuum only gets there a minute
# or more after a large import (or never, where an operator turned it off).
STATS_ROWS = 5_000

# CJK_CLASS (messages.py): the ranges of migration 008's lcm_cjk_grams, a cheap test before
# computing bigrams.

INDEX_BATCH_SQL = (
    "WITH claimed AS ("
    " DELETE FROM message_index_pending WHERE message_id IN ("
    "  SELECT message_id FROM message_index_pending ORDER BY message_id LIMIT %s FOR UPDATE SKIP LOCKED)"
    " RETURNING message_id)"
    " INSERT INTO message_index(id, session_id, tsv, cjk)"
    " SELECT m.id, m.session_id, COALESCE(m.tsv, lcm_tsvector(m.text)),"
    f" CASE WHEN m.text ~ '{CJK_CLASS}' THEN lcm_cjk_grams(m.text) END"
    " FROM claimed c JOIN messages m ON m.id = c.message_id"
    " ON CONFLICT (id) DO NOTHING RETURNING id"
)


# Rows indexed before migration 013 get their session, a batch at a time, when nothing is listed.
FILL_SESSION_SQL = (
    "UPDATE message_index x SET session_id = m.session_id FROM messages m"
    " WHERE m.id = x.id AND x.id IN (SELECT id FROM message_index WHERE session_id IS NULL"
    " ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED) RETURNING x.id"
)
FILL_BATCH = 2_000

# The GIN indexes searches read (the indexer's, and the summaries' that compaction writes to)
# and how many rows the indexer indexes between merges of their pending entries. Each GIN
# lookup scans the pending list: at 1M messages one term count took 4.4-4.9 ms merged, +0.9 ms
# with 100 rows pending, +1.8 ms with 500. A compaction pass appends 20-50 messages, so this
# merges every few passes (merging after every drain made no measurable difference to
# compress() either).
# The longest the background indexer waits for appends under way before it takes a batch
# anyway (a long first import must not leave every row to the searches' on-the-fly path).
YIELD_SECONDS = 2.0

GIN_INDEXES = ("message_index_tsv", "message_index_cjk", "summaries_tsv", "summaries_cjk")
MERGE_ROWS = 100


class PostgresIndexer:
    """Background and on-demand indexing of listed messages for one store."""

    def __init__(self, write: Callable[[Callable[[Any], Any]], Any], read: Callable[[Callable[[Any], Any]], Any],
                 location: str) -> None:
        self._write = write
        self._read = read
        self._location = location
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._closed = False
        self._failed_logged = False
        self._since_stats = 0
        self._stats_known = False
        self._sessions_filled = False  # rows indexed before migration 013 all have their session
        self._idents_filled = False  # rows indexed before migration 033 all have their identifier lexemes
        self._merge_failed_logged = False
        self._since_merge = 0
        self._turn = threading.Condition()  # appends under way (appending()), for the thread to wait on
        self._appending = 0

    @contextlib.contextmanager
    def appending(self) -> Iterator[None]:
        """Mark an append of this store as under way: the background thread starts no batch
        meanwhile (it finishes the one it has)."""
        with self._turn:
            self._appending += 1
        try:
            yield
        finally:
            with self._turn:
                self._appending -= 1
                self._turn.notify_all()

    def _give_way(self) -> None:
        """Wait (at most YIELD_SECONDS) until no append of this store is under way."""
        deadline = time.monotonic() + YIELD_SECONDS
        with self._turn:
            while self._appending and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._turn.wait(left)

    def index_batch(self, batch: int = BATCH) -> list[int]:
        """Index one batch of listed messages; the ids this call indexed (empty: none left
        that no one else is indexing)."""
        def tx(c: Any) -> list[int]:
            return [r[0] for r in c.execute(INDEX_BATCH_SQL, (int(batch),)).fetchall()]

        return self._write(tx)

    def drain(self, give_way: bool = False) -> int:
        """Index until nothing is listed (or what is left is being indexed by others).
        `give_way`: before each batch, let this store's appends under way finish first."""
        n = 0
        while True:
            if give_way:
                self._give_way()
            got = self.index_batch()
            if not got:
                if n:
                    self._statistics(n)
                    self._since_merge += n
                    if self._since_merge >= MERGE_ROWS:
                        self._since_merge = 0
                        self._merge_pending_entries()
                return n
            n += len(got)

    def _merge_pending_entries(self) -> None:
        """Move the GIN indexes' pending entries into the indexes proper, now, off the search
        path. GIN (fastupdate) keeps new entries in an unsorted list (up to 4 MB) that every
        search scans whole until autovacuum or a full list merges it: with 3,000 rows pending
        one term count took 3.0 ms instead of 0.96."""
        try:
            self._write(lambda c: c.execute(
                "SELECT gin_clean_pending_list(i::regclass) FROM unnest(%s::text[]) AS i",
                (list(GIN_INDEXES),)))
        except Exception as exc:  # e.g. a role that does not own the index: autovacuum still does it
            if not self._merge_failed_logged:
                log.info("lcm store %s: could not merge pending index entries (autovacuum will):"
                         " %s", self._location, exc)
                self._merge_failed_logged = True

    def _statistics(self, indexed: int) -> None:
        """ANALYZE message_index once STATS_ROWS rows were indexed and it has no statistics."""
        self._since_stats += indexed
        if self._stats_known or self._since_stats < STATS_ROWS:
            return
        self._since_stats = 0
        if self._read(lambda c: c.execute(
                "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_stats WHERE schemaname = current_schema()"
                " AND tablename = 'message_index' AND attname = 'tsv')").fetchone()[0]):
            self._stats_known = True  # from here on autovacuum keeps them
            return
        try:
            self._write(lambda c: c.execute("ANALYZE message_index"))
            self._stats_known = True
        except Exception as exc:  # e.g. a role that does not own the table: searches still work
            log.info("lcm store %s: could not analyse message_index (searches count every term"
                     " until autovacuum has): %s", self._location, exc)

    def fill_sessions(self, batch: int = FILL_BATCH) -> int:
        """Give rows indexed before migration 013 their session; how many this call filled
        (0: none left that no one else is filling)."""
        return len(self._write(lambda c: c.execute(FILL_SESSION_SQL, (int(batch),)).fetchall()))

    def backfill_identifiers(self, timeout: float = 3600.0) -> bool:
        """Give every row indexed before migration 033 its identifier lexemes now (what the
        background thread does when idle; tests and the bench wait for it). False if another
        indexer still holds the work after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            if backfill_step(self._write):
                continue
            if backfill_done(self._read):
                self._idents_filled = True
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)  # another indexer (this process's thread, another host) is at it

    def wait_indexed(self, timeout: float = 60.0) -> None:
        """Index what is listed; then wait (bounded) for rows other indexers hold."""
        deadline = time.monotonic() + timeout
        while True:
            self.drain()
            if not self.pending() or time.monotonic() > deadline:
                return
            time.sleep(0.01)  # another indexer's batch commits within moments

    def pending(self) -> int:
        """Messages committed but not yet in ``message_index``."""
        return self._read(lambda c: c.execute("SELECT count(*) FROM message_index_pending").fetchone()[0])

    def kick(self) -> None:
        """Wake the background indexer (started on first use, again in a forked child)."""
        if self._closed:
            return
        with self._lock:
            if self._pid != os.getpid():  # a forked child does not inherit the thread
                self._thread, self._pid = None, os.getpid()
                self._wake = threading.Event()
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="lcm-pg-indexer", daemon=True)
                self._thread.start()
        self._wake.set()

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        with self._turn:
            self._turn.notify_all()
        t = self._thread
        if t is not None and t is not threading.current_thread() and self._pid == os.getpid():
            t.join(timeout=5.0)
            if t.is_alive():
                return
        with self._lock:  # a store used again after close() indexes in the background again
            self._thread = None
            self._closed = False

    def _run(self) -> None:
        wake = self._wake
        while not self._closed:
            wake.wait(timeout=30.0)  # also picks up a backlog another process left behind
            wake.clear()
            if self._closed:
                return
            try:
                self.drain(give_way=True)
                while not self._sessions_filled and not self._closed and not wake.is_set():
                    # (an append wakes the indexer: new rows first; they carry their session)
                    self._sessions_filled = not self.fill_sessions()
                while not self._idents_filled and not self._closed and not wake.is_set():
                    self._idents_filled = not backfill_step(self._write)  # (idents.py)
                self._failed_logged = False
            except Exception as exc:  # the store may be unreachable: searches still see everything
                if not self._failed_logged:
                    log.warning("lcm store %s: background indexing failed (searches compute the"
                                " unindexed rows until it works again): %s", self._location, exc)
                    self._failed_logged = True
