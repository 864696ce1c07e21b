"""The Store methods ops/ works through (export, import, viewer, doctor), on both backends:
portable SQL reads and one-transaction writes, the doctor's repairs and the backend's own
checks. ops/ reaches no backend's private API (checked at the end)."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest

from lossless_context.records import ContextEntry, NewMessage, NewSummary
from lossless_context.store import StoreError, open_store
from tests import test_store

T0 = 1_700_000_000.0
location, store = test_store.location, test_store.store  # (the fixtures: one store on each backend)


def nm(text: str, role: str = "user") -> NewMessage:
    return NewMessage(raw={"role": role, "content": text}, role=role, ident=uuid.uuid4().hex, uid=None, text=text,
                      tokens=len(text) // 4 + 1, created_at=T0)


def test_query_rows_reads_portable_sql(store):
    store.ensure_session("s")
    ids = store.append_messages("s", [nm("50% off"), nm("plain", "assistant"), nm("100% sure")])
    rows = store.query_rows("SELECT id, role, text FROM messages WHERE session_id=? AND text LIKE '%' || ? || '%'"
                            " ORDER BY id", ("s", "% "))  # (a literal % in the text and in a parameter)
    assert [tuple(r) for r in rows] == [(ids[0], "user", "50% off"), (ids[2], "user", "100% sure")]
    assert store.query_rows("SELECT COUNT(*) FROM messages")[0][0] == 3
    assert store.query_rows("SELECT id FROM messages WHERE id > ?", (ids[-1],)) == []


def test_write_rows_is_one_transaction(store):
    def add(ex):
        ex("INSERT INTO sessions(id, created_at, updated_at) VALUES (?, ?, ?)", ("w1", T0, T0))
        return ex("SELECT id FROM sessions WHERE id=?", ("w1",)).fetchone()[0]

    assert store.write_rows(add) == "w1"
    assert store.get_session("w1") is not None

    def fails(ex):
        ex("INSERT INTO sessions(id, created_at, updated_at) VALUES (?, ?, ?)", ("w2", T0, T0))
        assert ex("UPDATE sessions SET updated_at=? WHERE id=?", (T0 + 1, "w1")).rowcount == 1
        raise RuntimeError("stop")

    with pytest.raises(RuntimeError):
        store.write_rows(fails)
    assert store.get_session("w2") is None  # rolled back, with the update
    assert store.get_session("w1")["updated_at"] == T0


def test_write_rows_with_explicit_ids_moves_the_id_counters(store):
    store.ensure_session("s")
    [first] = store.append_messages("s", [nm("first")])

    def put(ex):
        ex("INSERT INTO messages(id, session_id, seq, ident, role, raw, text, tokens, created_at)"
           " VALUES (?,?,?,?,?,?,?,?,?)", (first + 500, "s", 1, "x" * 32, "user", '{"role":"user"}', "own id", 1, T0))

    store.write_rows(put, explicit_ids=("messages", "summaries"))
    [after] = store.append_messages("s", [nm("next")])
    assert after > first + 500  # the next row never meets the id the import gave


def test_messages_containing(store):
    store.ensure_session("s")
    ids = store.append_messages("s", [
        nm("has <a> and </a>"), nm("has <a> only"), nm("HAS <A> AND </A>"),
        nm("tool has <a> and </a>", "tool"), nm("assistant: <a> x </a>", "assistant")])
    assert store.messages_containing(["<a>", "</a>"], ["user", "assistant"]) == [(ids[0], "s"), (ids[4], "s")]
    assert store.messages_containing(["<a>"], ["user"]) == [(ids[0], "s"), (ids[1], "s")]
    assert store.messages_containing(["<a>"], []) == []


def test_doctor_repairs_orphan_staged_and_reattaches(store):
    store.ensure_session("s")
    ids = store.append_messages("s", [nm("one"), nm("two"), nm("three")])
    store.set_context("s", [ContextEntry("m", ids[0])])
    version, ctx = store.get_context("s")
    store.stage_pass("s", "p1", [NewSummary("k", "leaf", 0, "x", 1, 1, "normal", "t", None, None, 1,
                                            message_ids=[ids[0]])], [("s", "k")], version, len(ctx))
    store.write_rows(lambda ex: ex("DELETE FROM staged_passes WHERE pass_id=?", ("p1",)))
    staged = "SELECT COUNT(*) FROM summaries WHERE state='staged'"
    assert store.query_rows(staged)[0][0] == 1
    store.delete_orphan_staged()
    assert store.query_rows(staged)[0][0] == 0

    store.reattach_messages({"s": [ids[2], ids[1]]})
    v2, ctx = store.get_context("s")
    assert [(e.kind, e.ref) for e in ctx] == [("m", ids[0]), ("m", ids[1]), ("m", ids[2])]
    assert v2 > version


def test_self_checks_and_migration_state(store, location):
    store.ensure_session("s")
    store.append_messages("s", [nm("hello")])
    store.wait_indexed()
    checks = store.self_checks()
    names = [c.name for c in checks]
    if location.endswith(".db"):
        assert names == ["sqlite integrity_check", "foreign keys", "full-text index messages_fts in sync",
                         "full-text index summaries_fts in sync", "full-text index summaries_scoped_fts in sync"]
    else:
        assert names == ["full-text index message_index in sync", "indexed messages carry their session",
                         "pg_trgm substring index", "lz4 compression of message text"]
    assert all(c.ok and not c.repaired for c in checks), checks
    st = store.migration_state()
    assert st.applied and not st.pending


def test_self_checks_find_and_repair_a_broken_index(store, location):
    store.ensure_session("s")
    ids = store.append_messages("s", [nm("findable words here")])
    store.wait_indexed()
    if location.endswith(".db"):
        name = "full-text index messages_fts in sync"
        store.write_rows(lambda ex: ex("INSERT INTO messages_fts(messages_fts, rowid, text) VALUES('delete', ?, ?)",
                                       (ids[0], "findable words here")))
    else:
        name = "full-text index message_index in sync"
        store.write_rows(lambda ex: ex("DELETE FROM message_index WHERE id=?", (ids[0],)))
    [bad] = [c for c in store.self_checks() if c.name == name]
    assert not bad.ok and not bad.repaired
    [fixed] = [c for c in store.self_checks(repair=True) if c.name == name]
    assert fixed.repaired
    assert [c.ok for c in store.self_checks() if c.name == name] == [True]


def test_a_read_only_store_reads_and_refuses_writes(location):
    w = open_store(location)  # (made and migrated by a writer first)
    w.ensure_session("s")
    w.append_messages("s", [nm("kept")])
    w.close()
    ro = open_store(location, read_only=True)
    try:
        assert ro.query_rows("SELECT text FROM messages") == [("kept",)]
        with pytest.raises(StoreError):
            ro.write_rows(lambda ex: ex("DELETE FROM messages"))
        assert all(c.ok for c in ro.self_checks())
    finally:
        ro.close()


def test_ops_uses_no_backend_private_api():
    """ops/ goes through the Store interface only: no connection, transaction or dialect SQL
    of one backend, and no check of which backend it holds."""
    ops = Path(__file__).resolve().parent.parent / "lossless_context" / "ops"
    banned = re.compile(r"\.conn\(\)|\.tx\(\)|read_sql\(|write_sql\(|maintenance_connection|type: *ignore"
                        r"|\.kind\s*[!=]=\s*\"(sqlite|postgresql)\"")
    found = [f"{p.name}:{i}" for p in sorted(ops.glob("*.py"))
             for i, line in enumerate(p.read_text().splitlines(), 1) if banned.search(line)]
    assert found == []


def test_store_is_abstract_and_every_backend_complete():
    """Store is an interface: a backend that leaves a method out cannot be made (a TypeError
    naming it, not a NotImplementedError at the first call); both backends, and their
    read-only kinds, implement every one."""
    from lossless_context.store.base import Store
    from lossless_context.store.postgres.readonly import ReadOnlyPostgresStore
    from lossless_context.store.postgres.store import PostgresStore
    from lossless_context.store.sqlite.readonly import ReadOnlySQLiteStore
    from lossless_context.store.sqlite.store import SQLiteStore

    for cls in (SQLiteStore, ReadOnlySQLiteStore, PostgresStore, ReadOnlyPostgresStore):
        assert not cls.__abstractmethods__, (cls.__name__, sorted(cls.__abstractmethods__))
    assert {"query_rows", "write_rows", "self_checks", "space", "session_activity", "forget_salt",
            "publish_pass"} <= Store.__abstractmethods__
    with pytest.raises(TypeError, match="space"):
        type("Half", (Store,), {})()
