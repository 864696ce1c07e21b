"""Large appends: pipelined SQLite writes, the known-prefix context write, background checkpoints.

Every pipelined result is compared with what the one-thread path stores for the same rows,
and every failure is checked to leave nothing behind (one transaction, rolled back)."""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
import uuid

import pytest

from lossless_context.search.query import plan_query
from lossless_context.records import ContextEntry, NewMessage
from lossless_context.store import open_store
from lossless_context.store.sqlite import append as sqlite_append, wal as sqlite_wal
from lossless_context.store.sqlite.store import SQLiteStore

T0 = 1_700_000_000.0
CJK = "数据库迁移计划"


def row(i: int, *, text: str | None = None, supersedes: int | None = None, absorbed=()) -> NewMessage:
    text = text if text is not None else f"message {i} token{i}x " + ("lorem ipsum " * (i % 7))
    return NewMessage(raw={"role": "user", "content": text, "n": i}, role="user", ident=uuid.uuid4().hex,
                      uid=None, text=text, tokens=len(text) // 4 + 1, created_at=T0 + i,
                      supersedes=supersedes, absorbed=list(absorbed))


def rows(n: int, start: int = 0) -> list[NewMessage]:
    out = [row(i) for i in range(start, start + n)]
    out[n // 3] = row(start + n // 3, text=f"{CJK} row {start + n // 3}")
    out[n // 2] = row(start + n // 2, absorbed=[uuid.uuid4().hex])
    return out


def lazy(items: list[NewMessage]):
    yield from items  # a generator: the store cannot know its length, so it pipelines


def dump(s: SQLiteStore, sid: str) -> dict:
    s.wait_indexed()  # a pipelined append's rows are full-text indexed after its commit
    c = s.conn()
    msgs = c.execute("SELECT seq, role, raw, text, tokens, created_at, ident FROM messages WHERE session_id=?"
                     " ORDER BY seq", (sid,)).fetchall()
    fts = c.execute("SELECT count(*) FROM messages_fts WHERE messages_fts MATCH 'lorem'").fetchone()[0]
    cjk = c.execute("SELECT count(*) FROM messages_cjk WHERE text LIKE ?", (f"%{CJK}%",)).fetchone()[0]
    absorbed = c.execute("SELECT count(*) FROM message_absorbed a JOIN messages m ON m.id = a.message_id"
                         " WHERE m.session_id=?", (sid,)).fetchone()[0]
    ctx = [(e.kind, e.ref) for e in s.get_context(sid)[1]]
    return {"msgs": msgs, "fts": fts, "cjk": cjk, "absorbed": absorbed, "ctx_len": len(ctx)}


@pytest.fixture
def store(tmp_path):
    s = open_store(str(tmp_path / "lcm.db"))
    s.ensure_session("a")
    yield s
    s.close()


def test_pipelined_append_stores_what_the_one_thread_path_stores(tmp_path):
    batch = rows(1300)  # three steps of CHUNK and a rest
    out = {}
    for name, given in (("sync", lambda: list(batch)), ("pipelined", lambda: lazy(batch))):
        s = open_store(str(tmp_path / f"{name}.db"))
        s.ensure_session("a")
        if name == "sync":  # one chunk at a time on the calling thread (the small-append path)
            ids = []
            for k in range(0, len(batch), sqlite_append.CHUNK):
                ids += s.append_messages("a", batch[k:k + sqlite_append.CHUNK])
            s.set_context("a", [ContextEntry("m", i) for i in ids])
        else:
            ids = s.append_messages("a", given(), context=[("m", -(k + 1)) for k in range(len(batch))])
            assert s._writer_ex is not None, "a generator of rows must take the pipelined path"
        assert ids == list(range(ids[0], ids[0] + len(batch)))
        assert [e.ref for e in s.get_context("a")[1]] == ids
        out[name] = dump(s, "a")
        # Every row is searchable by its own token (the chunk's FTS indexing covers the whole range).
        for i in (0, 511, 512, 1023, 1299):
            hits = s.search("messages", ["a"], plan_query(f"token{i}x"), limit=5)
            assert [h["id"] for h in hits] == [ids[i]], i
        s.close()
    assert out["sync"] == out["pipelined"]
    assert out["pipelined"]["cjk"] == 1 and out["pipelined"]["absorbed"] == 1
    assert out["pipelined"]["fts"] == sum(1 for r in batch if "lorem" in r.text)


def test_a_failing_row_producer_rolls_everything_back(store):
    first = store.append_messages("a", [row(0)])

    def broken():
        yield from rows(900, 1)
        raise RuntimeError("host gave up")

    with pytest.raises(RuntimeError):
        store.append_messages("a", broken(), context=[("m", first[0])])
    c = store.conn()
    assert c.execute("SELECT count(*) FROM messages").fetchone()[0] == 1
    assert c.execute("SELECT count(*) FROM messages_fts WHERE messages_fts MATCH 'lorem'").fetchone()[0] == 0
    assert c.execute("SELECT count(*) FROM lcm_bulk_indexing").fetchone()[0] == 0
    # The write lock was released: the next (pipelined) append goes through.
    ids = store.append_messages("a", lazy(rows(700, 1)))
    assert len(ids) == 700 and ids[0] == first[0] + 1


def test_a_failing_statement_on_the_writer_thread_rolls_back(store):
    batch = rows(1100)
    batch[800] = row(800, supersedes=10 ** 9)  # no such message: the foreign key fails mid-append
    with pytest.raises(sqlite3.IntegrityError):
        store.append_messages("a", lazy(batch))
    assert store.conn().execute("SELECT count(*) FROM messages").fetchone()[0] == 0
    assert len(store.append_messages("a", lazy(rows(600)))) == 600


def test_an_error_after_sqlite_rolled_back_itself_is_the_error_raised(store):
    """After a full disk or an I/O error SQLite ends the transaction itself; the store's own
    ROLLBACK then failed with "cannot rollback - no transaction is active", and that is what
    the caller saw (in place of the disk being full: CI's runs on a full /tmp showed only it)."""
    with pytest.raises(sqlite3.OperationalError, match="database or disk is full"):
        with store.tx() as c:
            c.execute("INSERT INTO sessions(id, created_at, updated_at) VALUES ('x', 0, 0)")
            c.execute("ROLLBACK")  # (as SQLite does on SQLITE_FULL)
            raise sqlite3.OperationalError("database or disk is full")
    assert store.conn().execute("SELECT count(*) FROM sessions WHERE id='x'").fetchone()[0] == 0
    assert len(store.append_messages("a", [row(0)])) == 1  # (the lock is free)


def test_concurrent_pipelined_appends_on_one_store(store):
    sessions = [f"s{k}" for k in range(4)]
    for sid in sessions:
        store.ensure_session(sid)
    errors: list[BaseException] = []

    def work(sid: str) -> None:
        try:
            for b in range(3):
                ids = store.append_messages(sid, lazy(rows(600, b * 600)), context=None)
                assert len(ids) == 600
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(sid,)) for sid in sessions]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    c = store.conn()
    assert c.execute("SELECT count(*), count(DISTINCT id) FROM messages").fetchone() == (7200, 7200)
    for sid in sessions:
        seqs = [r[0] for r in c.execute("SELECT seq FROM messages WHERE session_id=? ORDER BY id", (sid,))]
        assert seqs == list(range(1800)), sid  # each session's positions in order, no gaps


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_known_context_prefix_is_trusted_only_at_its_version(backend, tmp_path, request):
    location = str(tmp_path / "lcm.db") if backend == "sqlite" else request.getfixturevalue("pg_fresh_dsn")
    s = open_store(location)
    try:
        s.ensure_session("a")
        ids = s.append_messages("a", rows(5), context=[("m", -(k + 1)) for k in range(5)])
        version, entries = s.get_context("a")
        items = [(e.kind, e.ref) for e in entries]
        # Right version: only the tail is written, and the result is the whole list.
        more = s.append_messages("a", rows(3, 5), context=items + [("m", -1), ("m", -2), ("m", -3)],
                                 context_known=(version, len(items)))
        assert [e.ref for e in s.get_context("a")[1]] == ids + more
        # A stale version (another writer replaced the context): the full list is compared and
        # written, so what the caller claims about the prefix is not trusted.
        version2, _ = s.get_context("a")
        s.set_context("a", [ContextEntry("m", ids[0])])
        last = s.append_messages("a", rows(1, 8), context=[("m", ids[1]), ("m", -1)],
                                 context_known=(version2, 1))
        assert [e.ref for e in s.get_context("a")[1]] == [ids[1], last[0]]
    finally:
        s.close()


def test_statement_blocks_are_few_fixed_sizes():
    for n in range(0, 3000, 7):
        blocks = list(sqlite_append._blocks(n, 3000))
        assert sum(blocks) == n
        assert set(blocks) <= {sqlite_append.BLOCK} | {1 << k for k in range(10)}
    assert list(sqlite_append._blocks(10, 3)) == [3, 3, 3, 1]  # an old SQLite's variable limit


def test_background_checkpoint_copies_the_wal_and_stops_on_close(tmp_path):
    s = SQLiteStore(str(tmp_path / "lcm.db"))
    s.ensure_session("a")
    big = [row(i, text=f"token{i}x " + "x" * 4000) for i in range(1500)]  # ~12 MB of rows
    s.append_messages("a", lazy(big))
    page = s.conn().execute("PRAGMA page_size").fetchone()[0]
    wal = os.path.getsize(s.location + "-wal")
    # Big enough to ask for a pass, too small for the connections' own (fallback) checkpoint.
    assert sqlite_wal.WAL_POKE_BYTES < wal < sqlite_wal.AUTOCHECKPOINT_PAGES * page
    ck = s._checkpointer
    deadline = time.monotonic() + 30
    while ck.passes == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ck.passes > 0, "a large append must trigger a background checkpoint"
    assert os.path.getsize(s.location) > 8 << 20, "the rows reached the database file itself"
    thread = ck._thread
    s.close()
    assert thread is None or not thread.is_alive()
    assert os.stat(s.location).st_mode & 0o777 == 0o600


def test_a_forked_child_gets_its_own_writer_thread(tmp_path):
    s = open_store(str(tmp_path / "lcm.db"))
    s.ensure_session("a")
    s.append_messages("a", lazy(rows(600)))  # the parent's writer thread exists now
    pid = os.fork()
    if pid == 0:  # child: the parent's threads are gone; a pipelined append must still work
        code = 1
        try:
            s._local = threading.local()  # (a child must not reuse the parent's connections)
            s._conns = []
            code = 0 if len(s.append_messages("a", lazy(rows(600, 600)))) == 600 else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert s.conn().execute("SELECT count(*) FROM messages").fetchone()[0] == 1200
    s.close()


def test_raw_json_of_pipelined_rows_round_trips(store):
    batch = rows(700)
    ids = store.append_messages("a", lazy(batch))
    got = store.get_messages([ids[0], ids[399], ids[-1]])
    for i, k in ((ids[0], 0), (ids[399], 399), (ids[-1], 699)):
        assert got[i].raw == batch[k].raw
        assert json.loads(json.dumps(got[i].raw)) == batch[k].raw


def test_new_store_files_get_large_pages_and_old_ones_keep_theirs(tmp_path):
    fresh = open_store(str(tmp_path / "new.db"))
    fresh.ensure_session("a")
    assert fresh.conn().execute("PRAGMA page_size").fetchone()[0] == sqlite_wal.PAGE_SIZE
    fresh.close()
    old_path = str(tmp_path / "old.db")
    c = sqlite3.connect(old_path)
    c.execute("PRAGMA page_size=4096")
    c.execute("CREATE TABLE unrelated(x)")  # the file exists with 4 KB pages before the store opens it
    c.close()
    old = open_store(old_path)
    old.ensure_session("a")
    ids = old.append_messages("a", lazy(rows(700)), context=[("m", -k) for k in range(1, 701)])
    assert old.conn().execute("PRAGMA page_size").fetchone()[0] == 4096
    assert len(ids) == 700 and dump(old, "a")["ctx_len"] == 700
    old.close()


def test_an_existing_directory_keeps_its_mode_and_a_new_one_is_private(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o755)  # e.g. /tmp or a notes folder the user pointed the store into
    s = open_store(str(shared / "lcm.db"))
    s.ensure_session("a")
    s.append_messages("a", rows(3))
    with s.compaction_lock("a", timeout=5):  # takes the store's own lock directory
        pass
    assert os.stat(shared).st_mode & 0o777 == 0o755, "the store changed a directory it did not create"
    assert os.stat(s.location).st_mode & 0o777 == 0o600
    assert os.stat(s.location + ".locks").st_mode & 0o777 == 0o700
    s.close()
    nested = open_store(str(tmp_path / "new" / "deeper" / "lcm.db"))
    nested.ensure_session("a")
    assert os.stat(tmp_path / "new" / "deeper").st_mode & 0o777 == 0o700
    nested.close()


def test_on_ids_gets_the_ids_before_a_pipelined_append_commits(store):
    store.append_messages("a", rows(5))
    seen: list[tuple[list[int], int]] = []

    def on_ids(ids: list[int]) -> None:
        other = sqlite3.connect(store.location)  # another reader: sees only committed rows
        try:
            seen.append((list(ids), other.execute("SELECT count(*) FROM messages").fetchone()[0]))
        finally:
            other.close()

    ids = store.append_messages("a", lazy(rows(1100, start=5)), on_ids=on_ids)
    assert [(got, visible) for got, visible in seen] == [(ids, 5)], "once, with the final ids, before the commit"
    assert ids == list(range(ids[0], ids[0] + 1100))
    sync: list[list[int]] = []
    more = store.append_messages("a", rows(3, start=2000), on_ids=sync.append)
    assert sync == [more]


def test_a_failing_on_ids_rolls_the_append_back(store):
    def boom(ids: list[int]) -> None:
        raise RuntimeError("the caller could not use them")

    with pytest.raises(RuntimeError):
        store.append_messages("a", lazy(rows(900)), context=[("m", -k) for k in range(1, 901)], on_ids=boom)
    assert store.conn().execute("SELECT count(*) FROM messages").fetchone()[0] == 0
    assert store.get_context("a")[1] == []
    assert store.append_messages("a", lazy(rows(600))) and dump(store, "a")["fts"] > 0, "the store is usable after"


def test_on_ids_on_postgres_gets_the_committed_ids(pg_fresh_dsn):
    s = open_store(pg_fresh_dsn)
    try:
        s.ensure_session("a")
        got: list[list[int]] = []
        ids = s.append_messages("a", lazy(rows(40)), on_ids=got.append)
        assert got == [ids] and len(ids) == 40
        assert s.append_messages("a", [], on_ids=got.append) == [] and got[-1] == []
    finally:
        s.close()
