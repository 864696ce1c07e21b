"""Issue #43: a SQLite writer waiting for the write lock takes it soon after it is released
(store/sqlite/writelock.py).

SQLite's own busy handler sleeps up to 100 ms at a time once it has waited ~0.3 s; behind a
prune's short transactions and short pauses, such a writer kept missing the pauses (2.4 s
waits at 1M). Every writer of the store — the engine's transactions, the indexer's search
wait, the index merger — now tries BEGIN IMMEDIATE with no busy handler and polls in short
sleeps. The tests drive the wait with an injected sleep and clock (no timing): another
connection holds the lock, and each poll's sleep sees the busy timeout in force at BEGIN.
"""

from __future__ import annotations

import sqlite3
import uuid

import pytest

from lossless_context.records import NewMessage
from lossless_context.store import open_store
from lossless_context.store.base import StoreError
from lossless_context.store.sqlite import merge as sqlite_merge, store as sqlite_store, writelock



def _write(st, n: int) -> None:
    """Many small transactions: one message each (a full-text segment each)."""
    st.ensure_session("s", conversation_id="c")
    for k in range(n):
        text = f"deploy ledger retry {k} quota webhook"
        st.append_messages("s", [NewMessage(raw={"role": "user", "content": text}, role="user", ident=uuid.uuid4().hex,
                                            uid=None, text=text, tokens=8, created_at=1e9 + k)])


class Poll:
    """The injected sleep: records each sleep and the busy timeout on the waiting
    connection at that moment (the one its next BEGIN runs under); the holder commits at
    the ``release``-th sleep."""

    def __init__(self, waiter: sqlite3.Connection, holder: sqlite3.Connection, release: int) -> None:
        self.waiter, self.holder, self.release = waiter, holder, release
        self.sleeps: list[float] = []
        self.timeouts: list[int] = []

    def __call__(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.timeouts.append(self.waiter.execute("PRAGMA busy_timeout").fetchone()[0])
        if len(self.sleeps) == self.release:
            self.holder.execute("COMMIT")


def _holder(path: str) -> sqlite3.Connection:
    h = sqlite3.connect(path, isolation_level=None, timeout=0)
    h.execute("BEGIN IMMEDIATE")
    return h


@pytest.fixture
def store(tmp_path, monkeypatch):
    # (a short long-wait: were BEGIN left to SQLite's busy handler, the test fails in a
    # second instead of hanging for the real 30 s)
    monkeypatch.setattr(sqlite_store, "BUSY_TIMEOUT_MS", 400)
    st = open_store(str(tmp_path / "w.db"))
    st.ensure_session("s", conversation_id="c")
    with st.tx():  # (its connection's busy timeout now the store's)
        pass
    yield st
    st.close()


def test_an_engine_write_behind_another_writer_polls_the_lock_with_no_busy_handler(store, monkeypatch):
    c = store.conn()
    h = _holder(store.location)
    poll = Poll(c, h, release=5)
    monkeypatch.setattr(writelock, "sleep", poll)
    with store.tx() as cc:  # the path of every engine write (appends, passes, a prune's batches)
        assert cc.in_transaction
        cc.execute("UPDATE sessions SET updated_at = updated_at WHERE id = 's'")
    assert len(poll.sleeps) == 5  # it waited, and took the lock at the first try after the release
    assert poll.timeouts == [0] * 5  # each BEGIN while the lock was held: no SQLite busy handler
    assert all(s <= 0.005 for s in poll.sleeps)  # a released lock is noticed within a few ms
    # the other statements keep the store's busy timeout
    assert c.execute("PRAGMA busy_timeout").fetchone()[0] == sqlite_store.BUSY_TIMEOUT_MS
    h.close()


def test_a_writer_gives_up_at_its_bound_and_keeps_its_busy_timeout(store, monkeypatch):
    c = store.conn()
    h = _holder(store.location)
    now = [0.0]
    poll_sleeps: list[float] = []

    def fake_sleep(seconds: float) -> None:
        poll_sleeps.append(seconds)
        now[0] += seconds

    monkeypatch.setattr(writelock, "sleep", fake_sleep)
    monkeypatch.setattr(writelock, "clock", lambda: now[0])
    with pytest.raises(StoreError, match="busy"):
        with store.tx():
            pass
    bound = sqlite_store.BUSY_TIMEOUT_MS / 1000 * 2
    assert bound <= now[0] <= bound + writelock.POLL_LONG  # it waited its whole bound, polling
    assert poll_sleeps and max(poll_sleeps) <= writelock.POLL_LONG  # (a few ms apart, also late in the wait)
    assert not c.in_transaction
    assert c.execute("PRAGMA busy_timeout").fetchone()[0] == sqlite_store.BUSY_TIMEOUT_MS
    h.execute("ROLLBACK")
    h.close()
    with store.tx():  # and the next write goes through
        pass


def test_the_index_merger_polls_the_lock_and_keeps_its_connections_busy_timeout(tmp_path, monkeypatch):
    st = open_store(str(tmp_path / "m.db"))
    try:
        monkeypatch.setattr(sqlite_merge.Merger, "poke", lambda self: None)
        _write(st, 60)
        st.wait_indexed()
        c = sqlite3.connect(st.location, isolation_level=None, timeout=0)
        c.execute(f"PRAGMA busy_timeout={sqlite_merge.LOCK_WAIT_MS}")  # (as the merge thread's connection)
        h = _holder(st.location)
        poll = Poll(c, h, release=3)
        monkeypatch.setattr(writelock, "sleep", poll)
        assert st.merger.merge(c) > 0
        assert poll.timeouts == [0] * 3 and len(poll.sleeps) == 3
        assert c.execute("PRAGMA busy_timeout").fetchone()[0] == sqlite_merge.LOCK_WAIT_MS
        c.close()
        h.close()
    finally:
        st.close()


def test_a_search_indexing_another_process_rows_polls_the_lock(tmp_path, monkeypatch):
    st = open_store(str(tmp_path / "i.db"))
    try:
        st.ensure_session("s", conversation_id="c")
        c = st.conn()
        # rows listed by "another process" and not yet indexed (as a crash or another writer leaves them)
        _write(st, 3)
        st.wait_indexed()
        lo, hi = c.execute("SELECT MIN(id), MAX(id) FROM messages").fetchone()
        with st.tx() as w:
            w.execute("INSERT INTO messages_fts(messages_fts, rowid, text) SELECT 'delete', id, text FROM messages")
            w.execute("INSERT INTO lcm_index_pending(lo, hi) VALUES (?, ?)", (lo, hi))
        h = _holder(st.location)
        poll = Poll(c, h, release=4)
        monkeypatch.setattr(writelock, "sleep", poll)
        st.wait_indexed()  # (a search's wait: bounded by SEARCH_LOCK_WAIT)
        assert poll.timeouts == [0] * 4
        assert c.execute("SELECT COUNT(*) FROM lcm_index_pending").fetchone()[0] == 0
        assert c.execute("SELECT COUNT(*) FROM messages_fts WHERE messages_fts MATCH 'ledger'").fetchone()[0] == 3
        assert c.execute("PRAGMA busy_timeout").fetchone()[0] == sqlite_store.BUSY_TIMEOUT_MS
        h.close()
    finally:
        st.close()
