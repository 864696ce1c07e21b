"""Issue #21: the PostgreSQL store's pooled connections.

A store call hands its connection back in the calling thread, noting the time (not through the
pool's worker thread: that hand-off cost ~0.1 ms per call, bench/RESULTS.md). A connection that
sat idle longer than IDLE_CHECK_SECONDS is checked before use, so one the server ended in the
meantime is replaced instead of failing the call.
"""

from __future__ import annotations

import psycopg
import pytest

from lossless_context.store.postgres import conn as pg_conn
from lossless_context.store.postgres.store import PostgresStore


def _pid(store: PostgresStore) -> int:
    return store.read_sql(lambda c: c.execute("SELECT pg_backend_pid()").fetchone()[0])


@pytest.fixture()
def store(pg_fresh_dsn):
    st = PostgresStore(pg_fresh_dsn, background_index=False)  # no indexer thread taking connections
    st.ensure_session("s")
    yield st
    st.close()


def test_an_idle_connection_the_server_ended_is_replaced_before_use(store, pg_fresh_dsn, monkeypatch):
    first = _pid(store)
    with psycopg.connect(pg_fresh_dsn, autocommit=True) as c:
        assert c.execute("SELECT pg_terminate_backend(%s)", (first,)).fetchone()[0]
        # the backend is gone once the server no longer lists it
        while c.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (first,)).fetchone()[0]:
            pass
    monkeypatch.setattr(pg_conn, "IDLE_CHECK_SECONDS", -1.0)  # every handed-back connection is "idle"
    second = _pid(store)  # no StoreError: the check found it dead and the pool replaced it
    assert second != first
    assert store.get_session("s") is not None
