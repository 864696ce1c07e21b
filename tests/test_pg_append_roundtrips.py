"""Round trips of the PostgreSQL store's append (issue 41): what the host waits for when it hands
over a batch of new messages is mostly the server's answers, one wait per round trip, and each
wait costs a scheduling turn on a busy machine. The append runs in pipeline mode (conn.py): the
session locked, its version and last seq and the inserts (sent as their rows are built) with one
wait for their answers, then everything after together with the commit — two round trips where
it took ten.

Counted, not timed: a proxy between the store and the throw-away server reads the client's
side of the wire protocol and counts the points where the client waits for an answer.
"""

from __future__ import annotations

import socket
import threading
import time
import uuid
from urllib.parse import urlsplit, urlunsplit

import pytest

from lossless_context.records import NewMessage
from lossless_context.store.postgres import conn as pg_conn
from lossless_context.store.postgres.store import PostgresStore

psycopg = pytest.importorskip("psycopg")


class SyncProxy:
    """A TCP forwarder on 127.0.0.1 that reads the client's side of the wire protocol and counts,
    over all its connections, the points where the client waits for the server: each Sync
    (extended protocol: one per statement outside pipeline mode; the end of a pipeline), each
    Flush (a result read inside a pipeline) and each simple Query. Between two of them a
    pipelining client sends without waiting."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.lock = threading.Lock()
        self.waits = 0
        self.seen: list[str] = []  # every client message type, in order (for failure messages)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def count(self) -> int:
        with self.lock:
            return self.waits

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, from_client: bool) -> None:
        buf = b""
        started = False  # the startup message has no type byte
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                if from_client:
                    buf += data
                    while True:
                        if not started:
                            if len(buf) < 4 or len(buf) < int.from_bytes(buf[:4], "big"):
                                break
                            buf, started = buf[int.from_bytes(buf[:4], "big"):], True
                            continue
                        if len(buf) < 5 or len(buf) < 1 + int.from_bytes(buf[1:5], "big"):
                            break
                        with self.lock:
                            kind = buf[:1].decode("latin-1")
                            # (a Flush right after a Sync - psycopg's end of a pipeline - is the same
                            # wait; an empty Query is the pool's liveness check of a connection's
                            # first checkout (conn.py), not the store call's own)
                            empty = kind == "Q" and int.from_bytes(buf[1:5], "big") == 5
                            if kind == "Q" and empty:
                                kind = "q"
                            elif kind in "SHQ" and not (kind == "H" and self.seen and self.seen[-1] == "S"):
                                self.waits += 1
                            self.seen.append(kind)
                        buf = buf[1 + int.from_bytes(buf[1:5], "big"):]
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.closed = True
        self.listener.close()


def via(proxy: SyncProxy, dsn: str) -> str:
    u = urlsplit(dsn)
    return urlunsplit(u._replace(netloc=f"{u.username}@127.0.0.1:{proxy.port}"))


def nm(text: str, absorbed: tuple[str, ...] = ()) -> NewMessage:
    return NewMessage(raw={"role": "user", "content": text}, role="user", ident=uuid.uuid4().hex, uid=None,
                      text=text, tokens=len(text) // 4 + 1, created_at=time.time(), absorbed=absorbed)


def waits_of(proxy: SyncProxy, call) -> tuple[int, object, str]:
    """How often `call` waited for the server; its result; the messages it sent."""
    before, mark = proxy.count(), len(proxy.seen)
    out = call()
    # (the client has its answers, so the proxy has read every message it sent)
    return proxy.count() - before, out, "".join(proxy.seen[mark:])


@pytest.fixture
def proxied(pg_fresh_dsn):
    u = urlsplit(pg_fresh_dsn)
    proxy = SyncProxy(u.hostname or "127.0.0.1", u.port or 5432)
    st = PostgresStore(via(proxy, pg_fresh_dsn), background_index=False)
    try:
        yield proxy, st
    finally:
        st.close()
        proxy.close()


def test_an_append_with_its_context_takes_two_round_trips(proxied, monkeypatch):
    proxy, st = proxied
    monkeypatch.setattr(pg_conn, "IDLE_CHECK_SECONDS", 3600.0)  # (no liveness check on checkout here)
    st.ensure_session("s")
    st.append_messages("s", [nm("warm")], context=[("m", -1)])  # (connections opened, migrated)
    version, _ = st.get_context("s")
    rows = [nm(f"row {i} " + "x" * (i % 50)) for i in range(500)]
    ctx = [("m", st.session_messages("s")[0].id)] + [("m", -(i + 1)) for i in range(len(rows))]
    n, ids, sent = waits_of(proxy, lambda: st.append_messages("s", rows, context=ctx, context_known=(version, 1)))
    assert n == 2, f"{n} round trips: {sent}"
    # ... and it did all it did before: rows, order, context, version
    assert ids == sorted(ids) and len(ids) == 500
    got = st.session_messages("s")
    assert [m.text for m in got] == ["warm"] + [r.text for r in rows]
    assert [m.seq for m in got] == list(range(501))
    new_version, entries = st.get_context("s")
    assert new_version == version + 1
    assert [e.ref for e in entries] == [got[0].id] + ids


def test_an_append_without_context_and_with_absorbed_uids_still_takes_two(proxied, monkeypatch):
    proxy, st = proxied
    monkeypatch.setattr(pg_conn, "IDLE_CHECK_SECONDS", 3600.0)
    st.ensure_session("s")
    st.append_messages("s", [nm("warm")])
    rows = [nm(f"row {i}", absorbed=(f"u{i}",) if i % 3 == 0 else ()) for i in range(30)]
    n, _, sent = waits_of(proxy, lambda: st.append_messages("s", rows))
    assert n == 2, f"{n} round trips: {sent}"
    with psycopg.connect(st.location, autocommit=True) as c:
        assert c.execute("SELECT count(*) FROM message_absorbed").fetchone()[0] == 10


def test_an_append_that_fails_in_the_pipeline_stores_nothing(proxied):
    """An error inside the pipelined transaction (here: no such session, the insert's foreign
    key) surfaces to the caller and rolls everything back."""
    _, st = proxied
    st.ensure_session("s")
    st.append_messages("s", [nm("kept")])
    with pytest.raises(psycopg.errors.ForeignKeyViolation):
        st.append_messages("nobody", [nm("lost")], context=[("m", -1)])
    assert [m.text for m in st.session_messages("s")] == ["kept"]
    assert st.append_messages("s", [nm("next")])  # the connection is usable again
    assert [m.seq for m in st.session_messages("s")] == [0, 1]


def _inserting_elsewhere(dsn: str) -> bool:
    """Whether another connection's transaction has inserted into messages (it holds the table's
    RowExclusiveLock: the head's read takes only AccessShareLock)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        return bool(c.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_locks l JOIN pg_class r ON r.oid = l.relation"
            " WHERE r.relname = 'messages' AND l.mode = 'RowExclusiveLock' AND l.granted"
            " AND l.pid <> pg_backend_pid())").fetchone()[0])


def test_an_append_sends_each_chunk_while_the_next_is_built(proxied, pg_fresh_dsn, monkeypatch):
    """Rows handed over lazily (a large ingest builds them as the store takes them) go to the
    server a chunk at a time, without waiting for an answer: the server inserts one chunk while
    the client builds the next, as SQLite's writer thread does."""
    from lossless_context.store.postgres import append as pg_append

    proxy, st = proxied
    monkeypatch.setattr(pg_conn, "IDLE_CHECK_SECONDS", 3600.0)
    monkeypatch.setattr(pg_append, "STREAM_CHUNK_ROWS", 10)
    st.ensure_session("s")
    st.append_messages("s", [nm("warm")])
    seen: dict[str, object] = {}
    before = proxy.count()

    def rows():
        for i in range(35):
            if i == 25:  # two chunks sent, the third one being built
                deadline = time.monotonic() + 30.0
                while not _inserting_elsewhere(pg_fresh_dsn) and time.monotonic() < deadline:
                    time.sleep(0.02)
                seen["inserted"] = _inserting_elsewhere(pg_fresh_dsn)
                seen["waits"] = proxy.count() - before
            yield nm(f"lazy {i}")

    ids = st.append_messages("s", rows())
    assert seen == {"inserted": True, "waits": 0}, seen
    got = st.session_messages("s")
    assert [m.text for m in got] == ["warm"] + [f"lazy {i}" for i in range(35)]
    assert [m.seq for m in got] == list(range(36)) and [m.id for m in got[1:]] == ids == sorted(ids)


def test_a_retried_append_stores_the_rows_its_first_try_built(pg_fresh_dsn, monkeypatch):
    """A transaction that the server rolled back (a deadlock, a serialisation failure) runs
    again: rows handed over lazily and built by the first try are sent again, not lost."""
    from lossless_context.store.postgres import store as pg_store

    st = PostgresStore(pg_fresh_dsn, background_index=False)
    try:
        st.ensure_session("s")
        st.append_messages("s", [nm("warm")])
        real, tries = pg_store.send_messages, []

        def failing_once(c, sid, rows):
            read = real(c, sid, rows)
            tries.append(1)
            if len(tries) == 1:
                raise psycopg.errors.TransactionRollback("rolled back (test)")
            return read

        monkeypatch.setattr(pg_store, "send_messages", failing_once)
        ids = st.append_messages("s", (nm(f"built once {i}") for i in range(40)))
        assert len(tries) == 2
        got = st.session_messages("s")
        assert [m.text for m in got] == ["warm"] + [f"built once {i}" for i in range(40)]
        assert [m.id for m in got[1:]] == ids and [m.seq for m in got] == list(range(41))
    finally:
        st.close()


@pytest.mark.parametrize("sqlstate", ["40001", "40P01"])
def test_an_append_the_server_rolled_back_runs_again(pg_fresh_dsn, monkeypatch, sqlstate):
    """A serialization failure or a deadlock the server reports (SQLSTATE class 40: the
    transaction was rolled back) runs the append again; it is no outage. (psycopg's classes
    for these codes are not subclasses of its TransactionRollback, class 40's own.)"""
    from lossless_context.store.postgres import store as pg_store

    st = PostgresStore(pg_fresh_dsn, background_index=False)
    try:
        st.ensure_session("s")
        real, tries = pg_store.send_messages, []

        def rolled_back_once(c, sid, rows):
            tries.append(1)
            if len(tries) == 1:
                c.execute(f"DO $$ BEGIN RAISE EXCEPTION 'rolled back (test)' USING ERRCODE = '{sqlstate}'; END $$")
            return real(c, sid, rows)

        monkeypatch.setattr(pg_store, "send_messages", rolled_back_once)
        ids = st.append_messages("s", (nm(f"again {i}") for i in range(12)))
        assert len(tries) == 2 and len(ids) == 12
        assert [m.text for m in st.session_messages("s")] == [f"again {i}" for i in range(12)]
    finally:
        st.close()
