"""select_context on PostgreSQL asks the server nothing while nothing changed (issue #21).

Migration 010 announces every context-version change on channel lcm_context; the store keeps
versions from those notifications (store/postgres_versions.py). Real server, real second
connections standing in for other processes and hosts. Reads of the row are counted by a
recording wrapper around the store's own ``context_version`` (it still runs).
"""

from __future__ import annotations

import time

import psycopg
import pytest

from lossless_context.store import open_store
from lossless_context.store.postgres.versions import APPLICATION_NAME

HANG_GUARD = 30.0  # seconds: only a broken listener takes this long


@pytest.fixture
def store(pg_fresh_dsn):
    s = open_store(pg_fresh_dsn)
    yield s
    s.close()


def _counting(store) -> list[str]:
    calls: list[str] = []
    real = store.context_version

    def context_version(sid: str) -> int:
        calls.append(sid)
        return real(sid)

    store.context_version = context_version
    return calls


def _until(pred) -> bool:
    end = time.monotonic() + HANG_GUARD
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.01)
    return False


def test_versions_come_from_notifications_not_queries(store, pg_fresh_dsn):
    store.ensure_session("a")
    store.set_context("a", [])
    assert store.version_listener_ready(HANG_GUARD)
    reads = _counting(store)
    v1 = store.cached_context_version("a")
    assert v1 == store.get_session("a")["context_version"]
    for _ in range(200):
        assert store.cached_context_version("a") == v1
    assert reads == ["a"]  # one read, then none while nothing changed

    # This process's own write is seen at once (the cache forgets the session on commit).
    store.set_context("a", [])
    assert store.cached_context_version("a") == v1 + 1
    # So is another store object's in the same process (one cache per DSN and process).
    other = open_store(pg_fresh_dsn)
    try:
        other.set_context("a", [])
        assert store.cached_context_version("a") == v1 + 2
    finally:
        other.close()
    n = len(reads)

    # Another process or host: a plain connection bumps the version; the notification brings it.
    with psycopg.connect(pg_fresh_dsn, autocommit=True) as c:
        c.execute("UPDATE sessions SET context_version = context_version + 5 WHERE id = 'a'")
    assert _until(lambda: store.cached_context_version("a") == v1 + 7)
    assert len(reads) == n  # learned without reading the row


def test_a_lost_listener_falls_back_to_reading_the_row(store, pg_fresh_dsn):
    store.ensure_session("b")
    assert store.version_listener_ready(HANG_GUARD)
    v = store.cached_context_version("b")
    with psycopg.connect(pg_fresh_dsn, autocommit=True) as c:
        # the listener's session names itself
        killed = c.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                           " WHERE datname = current_database() AND application_name = %s",
                           (APPLICATION_NAME,)).fetchall()
        assert killed and all(r[0] for r in killed)
        assert _until(lambda: not store.version_listener_ready(0))
        c.execute("UPDATE sessions SET context_version = context_version + 1 WHERE id = 'b'")
    # While it is away (or just back: it clears what it knew) the row is read: never stale.
    assert store.cached_context_version("b") == v + 1
    assert store.version_listener_ready(HANG_GUARD)  # and it comes back by itself
    assert store.cached_context_version("b") == v + 1


def test_a_deleted_session_is_dropped_from_the_cache(store, pg_fresh_dsn):
    store.ensure_session("c")
    store.set_context("c", [])
    assert store.version_listener_ready(HANG_GUARD)
    assert store.cached_context_version("c") >= 1
    with psycopg.connect(pg_fresh_dsn, autocommit=True) as c:
        c.execute("DELETE FROM context_items WHERE session_id = 'c'")
        c.execute("DELETE FROM sessions WHERE id = 'c'")
    assert _until(lambda: store.cached_context_version("c") == 0)


# -- scopes: the lineage and ancestry every tool call reads (migration 011) -----------------

def _counting_reads(store, name: str) -> list[str]:
    """Record calls of the store's server read behind ``name`` (``read_lineage``)."""
    calls: list[str] = []
    if name == "lineage":
        real = store.read_lineage

        def read(sid: str) -> list[str]:
            calls.append(sid)
            return real(sid)

        store.read_lineage = read
    return calls


def test_lineage_is_read_once_then_kept_until_a_session_changes(store, pg_fresh_dsn):
    store.ensure_session("p", conversation_id="conv")
    store.ensure_session("q", parent_id="p", conversation_id="conv")
    assert store.version_listener_ready(HANG_GUARD)
    reads = _counting_reads(store, "lineage")
    first = store.lineage("q")
    assert set(first) == {"p", "q"}
    for _ in range(100):
        assert store.lineage("q") == first
    assert reads == ["q"]  # one read, then none while nothing changed

    # This process's own change is seen at once (kept scopes are dropped on commit).
    store.ensure_session("r", conversation_id="conv")
    assert set(store.lineage("q")) == {"p", "q", "r"}
    n = len(reads)
    assert n == 2

    # The server's notice of that own change arrives later and bumps the generation once
    # more; wait for it (a fence) before taking the generation the rest compares with.
    cache = store._versions()
    _fence(cache, pg_fresh_dsn, [], 1)
    generation = cache.scope_generation()

    # Another process or host adds a session to the conversation: the notice drops the scope.
    _fence(cache, pg_fresh_dsn, ["INSERT INTO sessions(id, conversation_id, created_at, updated_at)"
                                 " VALUES ('s', 'conv', 1, 1)"], 2)
    assert cache.scope_generation() == generation + 1
    assert "s" in store.lineage("q")
    # ... and writes that leave every lineage as it was keep it
    k = len(reads)
    store.set_context("q", [])
    _fence(cache, pg_fresh_dsn, [
        "INSERT INTO sessions(id, created_at, updated_at) VALUES ('p', 1, 1) ON CONFLICT (id) DO NOTHING",
        "UPDATE sessions SET updated_at = 5, conversation_id = 'conv' WHERE id = 'q'"], 3)
    assert cache.scope_generation() == generation + 1
    assert "s" in store.lineage("q") and len(reads) == k


def _fence(cache, dsn: str, statements: list[str], n: int) -> None:
    """Run ``statements`` from another connection, then wait until every notice they sent was
    handled: a notification sent after their commits arrives after any of theirs."""
    cache.note("fence", n - 1)
    with psycopg.connect(dsn, autocommit=True) as c:
        for sql in statements:
            c.execute(sql)
        c.execute("SELECT pg_notify('lcm_context', %s)", (f"{n} fence",))
    assert _until(lambda: cache.get("fence") == n)


def test_ancestry_with_fork_points_is_kept_and_dropped_on_a_fork(store, pg_fresh_dsn):
    store.ensure_session("base")
    store.ensure_session("branch", parent_id="base")
    assert store.version_listener_ready(HANG_GUARD)
    before = store.ancestry("branch")
    assert [a[0] for a in before] == ["branch", "base"] and before[0][2] is None
    store.set_fork_point("branch")  # own write: seen at once
    after = store.ancestry("branch")
    assert after[0][2] is not None
    with psycopg.connect(pg_fresh_dsn, autocommit=True) as c:  # another host clears it
        c.execute("UPDATE sessions SET fork_message_id = NULL, fork_summary_id = NULL WHERE id = 'branch'")
    assert _until(lambda: store.ancestry("branch")[0][2] is None)


def test_a_scope_read_that_raced_a_notice_is_not_kept(store):
    store.ensure_session("z")
    assert store.version_listener_ready(HANG_GUARD)
    cache = store._versions()
    generation = cache.scope_generation()
    cache.scopes_changed()  # a notice arrives while the read is under way
    cache.scope_put(("lineage", "z"), generation, ("stale",))
    assert cache.scope_get(("lineage", "z")) is None
    assert store.lineage("z") == ["z"]


def test_scopes_are_read_from_the_server_while_the_listener_is_away(store, pg_fresh_dsn):
    store.ensure_session("w", conversation_id="cw")
    assert store.version_listener_ready(HANG_GUARD)
    assert store.lineage("w") == ["w"]
    with psycopg.connect(pg_fresh_dsn, autocommit=True) as c:
        c.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                  " WHERE datname = current_database() AND application_name = %s", (APPLICATION_NAME,))
        assert _until(lambda: not store.version_listener_ready(0))
        c.execute("INSERT INTO sessions(id, conversation_id, created_at, updated_at) VALUES ('w2', 'cw', 2, 2)")
    assert set(store.lineage("w")) == {"w", "w2"}  # never stale: read while it is away
