"""The one migration runner (store/migrate.py) on both backends, its SQLite statement splitter,
and the line `lcm doctor` prints about a store's migrations."""

from __future__ import annotations

import logging
import re
import sqlite3

import pytest

from lossless_context.ops.doctor import run_doctor
from lossless_context.store import StoreError, migrate, open_store
from lossless_context.store.postgres import conn as pg_conn
from lossless_context.store.postgres.migrations import MIGRATIONS as PG_MIGRATIONS, OPTIONAL as PG_OPTIONAL
from lossless_context.store.sqlite import store as sqlite_store
from lossless_context.store.sqlite.migrations import MIGRATIONS as SQLITE_MIGRATIONS

BACKENDS = ["sqlite", "postgres"]


@pytest.fixture(params=BACKENDS)
def location(request, tmp_path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "lcm" / "lcm.db")
    return request.getfixturevalue("pg_fresh_dsn")


def _list_of(location: str) -> list[tuple[str, str]]:
    return SQLITE_MIGRATIONS if location.endswith(".db") else PG_MIGRATIONS


def _patch_list(monkeypatch, location: str, migrations: list[tuple[str, str]]) -> None:
    """The list the writing store's runner reads (the read-only stores keep the real one)."""
    monkeypatch.setattr(sqlite_store if location.endswith(".db") else pg_conn, "MIGRATIONS", migrations)


def _applied_logged(caplog) -> list[str]:
    return [m.group(1) for r in caplog.records
            if (m := re.search(r"applied migration (\S+)$", r.getMessage()))]


# -- the runner on both backends ------------------------------------------------------------

def test_fresh_store_applies_all_then_none(location, caplog):
    caplog.set_level(logging.INFO, logger="lossless_context.store")
    names = [n for n, _ in _list_of(location)]
    s = open_store(location)
    try:
        s.ensure_session("a")
        assert _applied_logged(caplog) == names  # every entry, in list order
        assert s.applied_migrations() == sorted(names)
        assert s.migration_state().pending == [] and s.migration_state().pending_optional == []
    finally:
        s.close()
    caplog.clear()
    s = open_store(location)
    try:
        assert s.get_session("a") is not None
        assert _applied_logged(caplog) == []  # the second open applies none
        assert s.applied_migrations() == sorted(names)
    finally:
        s.close()


def test_store_missing_the_newest_gets_exactly_it_and_read_only_is_refused(location, monkeypatch, caplog):
    full = _list_of(location)
    newest = full[-1][0]
    _patch_list(monkeypatch, location, full[:-1])  # a store made by the version before the newest
    s = open_store(location)
    try:
        s.ensure_session("a")
        assert newest not in s.applied_migrations()
    finally:
        s.close()
    monkeypatch.undo()

    # Opened read-only (`lcm mcp`, another user's file): never migrated, refused by name.
    ro = open_store(location, read_only=True)
    try:
        with pytest.raises(StoreError) as err:
            ro.get_session("a")
        msg = str(err.value)
        assert f"was made by an older version and needs upgrading ({newest});" in msg
        assert ("open it once as its owner (e.g. `lcm doctor`)" if location.endswith(".db")
                else "open it once with a writing lcm (e.g. `lcm doctor`)") in msg
    finally:
        ro.close()

    caplog.set_level(logging.INFO, logger="lossless_context.store")
    caplog.clear()
    s = open_store(location)  # a writing open of the new version
    try:
        assert s.get_session("a") is not None
        assert _applied_logged(caplog) == [newest]
        assert s.applied_migrations() == sorted(n for n, _ in full)
    finally:
        s.close()
    ro = open_store(location, read_only=True)  # now up to date: opens
    try:
        assert ro.get_session("a") is not None
    finally:
        ro.close()


def test_read_only_open_of_a_foreign_database_is_refused(tmp_path):
    path = tmp_path / "other.db"
    c = sqlite3.connect(path)
    c.execute("CREATE TABLE notes (x)")
    c.commit()
    c.close()
    ro = open_store(str(path), read_only=True)
    try:
        with pytest.raises(StoreError, match="is not an lcm store"):
            ro.get_session("a")
    finally:
        ro.close()


def test_postgres_optional_failure_skipped_with_warning_rest_applied(pg_fresh_dsn, monkeypatch, caplog):
    """An OPTIONAL entry that fails runs in a savepoint: rolled back, warned, not recorded; the
    entries after it are applied in the same transaction; a read-only open does not require it."""
    broken = [(n, "SELECT 1/0;" if n == "015_lz4_toast" else sql) for n, sql in PG_MIGRATIONS]
    monkeypatch.setattr(pg_conn, "MIGRATIONS", broken)
    s = open_store(pg_fresh_dsn)
    try:
        s.ensure_session("a")
        applied = s.applied_migrations()
        assert "015_lz4_toast" not in applied and PG_MIGRATIONS[-1][0] in applied
        warned = [r for r in caplog.records if r.levelno == logging.WARNING
                  and "optional migration 015_lz4_toast skipped" in r.getMessage()]
        assert warned and "division by zero" in warned[0].getMessage()
        st = s.migration_state()
        assert st.pending == [] and st.pending_optional == ["015_lz4_toast"]
    finally:
        s.close()
    ro = open_store(pg_fresh_dsn, read_only=True)
    try:
        assert ro.get_session("a") is not None
    finally:
        ro.close()


def test_runner_optional_and_required_failures():
    """The runner alone, on an in-memory SQLite database: an optional entry that fails is
    skipped (its savepoint rolled back), a required one that fails stops the run."""
    c = sqlite3.connect(":memory:", isolation_level=None)
    c.execute("CREATE TABLE rec (name TEXT)")

    def apply(name: str, sql: str) -> bool:
        for stmt in migrate.split_sql(sql):
            c.execute(stmt)
        c.execute("INSERT INTO rec VALUES (?)", (name,))
        return True

    class Savepoint:
        def __enter__(self):
            c.execute("SAVEPOINT opt")

        def __exit__(self, kind, exc, tb):
            c.execute("ROLLBACK TO opt" if kind else "RELEASE opt")
            if kind:
                c.execute("RELEASE opt")

    ms = [("001", "CREATE TABLE a (x);"), ("002", "CREATE TABLE b (x); SELECT * FROM nowhere;"),
          ("003", "CREATE TABLE c (x);")]
    c.execute("BEGIN")
    done = migrate.apply_pending("mem", ms, set(), apply, optional={"002"}, savepoint=Savepoint,
                                 failure=sqlite3.Error)
    c.execute("COMMIT")
    assert done == ["001", "003"]
    tables = {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert tables == {"rec", "a", "c"}  # 002's table rolled back with its savepoint
    assert migrate.pending(ms, {"001", "003"}) == ["002"]
    assert migrate.pending(ms, {"001", "003"}, optional={"002"}) == []
    with pytest.raises(sqlite3.OperationalError):
        migrate.apply_pending("mem", [("004", "SELECT * FROM nowhere;"), ("005", "CREATE TABLE e (x);")],
                              set(), apply)
    assert "e" not in {r[0] for r in c.execute("SELECT name FROM sqlite_master")}


# -- the splitter -----------------------------------------------------------------------------

def _line_splitter(script: str) -> list[str]:
    """The hand-written splitter the store used before sqlite3.complete_statement (the reference
    the new one is checked against): statements end at a line ending in `;`, a CREATE TRIGGER
    at a line `END;`."""
    out, buf, depth = [], [], 0
    for line in script.splitlines():
        s = line.strip()
        if not s:
            continue
        buf.append(line)
        up = s.upper()
        if up.startswith("CREATE TRIGGER"):
            depth = 1
        if depth and up == "END;":
            depth = 0
            out.append("\n".join(buf))
            buf = []
            continue
        if not depth and s.endswith(";"):
            out.append("\n".join(buf))
            buf = []
    if buf:
        out.append("\n".join(buf))
    return out


def _norm(sql: str | None) -> str:
    return " ".join((sql or "").split())


def _schema(split) -> list[tuple[str, str, str, str]]:
    c = sqlite3.connect(":memory:", isolation_level=None)
    for _name, script in SQLITE_MIGRATIONS:
        for stmt in split(script):
            c.execute(stmt)
    return sorted((t, n, tb, _norm(sql)) for t, n, tb, sql in
                  c.execute("SELECT type, name, tbl_name, sql FROM sqlite_master"))


def test_splitter_matches_the_old_one_on_every_sqlite_migration():
    for name, script in SQLITE_MIGRATIONS:
        new, old = migrate.split_sql(script), _line_splitter(script)
        assert [_norm(s) for s in new] == [_norm(s) for s in old], name
        assert all(sqlite3.complete_statement(s) for s in new), name
    # executed on fresh databases, both give the same schema (every table, index, trigger, view)
    new_schema, old_schema = _schema(migrate.split_sql), _schema(_line_splitter)
    assert new_schema == old_schema
    assert any(t == "trigger" for t, *_ in new_schema)  # the trigger bodies were kept whole


def test_splitter_cases():
    script = """
        CREATE TABLE t (x TEXT DEFAULT 'a;b'); CREATE TABLE u (y); -- a note; with a semicolon
        /* a block; comment */
        CREATE TRIGGER t_ai AFTER INSERT ON t BEGIN
            INSERT INTO u VALUES (';');
            UPDATE u SET y = 'end;' WHERE y IS NULL;
        END;
        ;
        INSERT INTO t VALUES ('x')
    """
    stmts = migrate.split_sql(script)
    assert stmts[0] == "CREATE TABLE t (x TEXT DEFAULT 'a;b');"
    assert stmts[1] == "CREATE TABLE u (y);"
    assert stmts[2].startswith("-- a note; with a semicolon") and stmts[2].endswith("END;")
    assert "UPDATE u SET y = 'end;'" in stmts[2]
    assert stmts[3] == "INSERT INTO t VALUES ('x')" and len(stmts) == 4  # the lone `;` is dropped
    c = sqlite3.connect(":memory:", isolation_level=None)
    for s in stmts:
        c.execute(s)
    assert c.execute("SELECT y FROM u").fetchall() == [(";",)]
    assert migrate.split_sql("  \n ") == [] and migrate.split_sql("SELECT 1") == ["SELECT 1"]


# -- lcm doctor -------------------------------------------------------------------------------

def _migrations_line(store) -> tuple[bool, bool, str]:
    (c,) = [c for c in run_doctor(store).checks if c.name == "schema migrations"]
    return c.ok, c.info, c.detail


def test_doctor_reports_the_migrations(location):
    full = _list_of(location)
    optional = PG_OPTIONAL if not location.endswith(".db") else frozenset()
    if optional:
        psycopg = pytest.importorskip("psycopg")
    s = open_store(location)
    try:
        s.ensure_session("a")
        assert _migrations_line(s) == (True, False, f"{len(full)} applied, none pending")
        # What a store opened without migrating would show (the read-only stores of `lcm mcp`:
        # an optional entry the server could not apply; a required one a newer lcm added).
        newest = full[-1][0]
        gone = sorted(optional)[:1]
        if s.kind == "sqlite":
            with s.tx() as c:
                c.execute("DELETE FROM lcm_migrations WHERE name=?", (newest,))
                c.execute("INSERT INTO lcm_migrations(name, applied_at) VALUES ('999_from_the_future', 0)")
        else:
            with psycopg.connect(location, autocommit=True) as c:
                c.execute("DELETE FROM lcm_migrations WHERE name = ANY(%s)", ([newest, *gone],))
                c.execute("INSERT INTO lcm_migrations(name, applied_at) VALUES ('999_from_the_future', 0)")
        ok, info, detail = _migrations_line(s)
        assert not ok and f"pending: {newest} " in detail
        assert detail.startswith(f"{len(full) - 1 - len(gone)} applied;")
        assert not run_doctor(s).ok
        if s.kind == "sqlite":
            with s.tx() as c:
                c.execute("INSERT INTO lcm_migrations(name, applied_at) VALUES (?, 0)", (newest,))
        else:
            with psycopg.connect(location, autocommit=True) as c:
                c.execute("INSERT INTO lcm_migrations(name, applied_at) VALUES (%s, 0)", (newest,))
        ok, info, detail = _migrations_line(s)
        assert ok and info and "recorded by a newer lcm: 999_from_the_future" in detail
        if gone:
            assert "optional, not applied" in detail and gone[0] in detail
    finally:
        s.close()
