"""The one migration runner (store/migrate.py) on both backends, its SQLite statement splitter,
and the line `lcm doctor` prints about a store's migrations."""

from __future__ import annotations

import hashlib
import logging
import re
import sqlite3

import pytest

from lossless_context.ops.doctor import run_doctor
from lossless_context.store import StoreError, migrate, open_store
from lossless_context.store.postgres import conn as pg_conn, readonly as pg_readonly
from lossless_context.store.postgres.migrations import (DEFINITIONS as PG_DEFINITIONS, MIGRATIONS as PG_MIGRATIONS,
                                                        OPTIONAL as PG_OPTIONAL)
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


# -- the lists pinned: an applied migration never changes ----------------------------------------
# (name, SHA-256 of its SQL) of every migration, in order, as released: computed from the lists
# before they were gathered into store/postgres/migrations/. A new migration is appended here
# with its digest; any other difference means an applied migration was edited, renamed or moved.
SQLITE_PINNED = [
    ('001_initial', '03a09e335f004f4e16af65fcf5727e853344c5bbe0b52916f231712a4bd010ed'),
    ('002_message_aliases', 'c2dc609816106a2d63d94574e912c7e8c0ed02812cf9890e0f8c04830f7f00a5'),
    ('003_presummaries', '1eadc9b65243f882b08b32cbcee4a4b7e1f358c02a6384819644f45f5c386231'),
    ('004_summary_id_watermark', '7bd0d34cb8a70a7ecf099294e3e2dbc0b716326df25fe4ee5eebd7762e8d733b'),
    ('005_messages_session_id', '066bec348c2d77693827ee6fd9389e2f3fc729a7e1a93d744c2b5070cad7ab46'),
    ('006_cjk_trigram', 'f278cfbf5420e652ffd7ca724c51a63b1fee9acdec4216e04230cf7c3c812289'),
    ('007_bulk_message_index', 'ad3b21c526476d5a1030c9baa543601a7032de59d7860958c132ad4cc1a88e2b'),
    ('008_bulk_range_trigger', 'e8d31148fe45be3144884724407da14cd860b09c97e5ed1d668d795af24ff32e'),
    ('009_deferred_message_index', '24dd358162ae1e27ec0fb03922517d91759484c625e48cb6cae124436f16fd5a'),
    ('010_session_index_covers_tokens', 'd4407481ed90dd36a3e9e2dad496c82bffca56cbd6e23268f74329899b454bff'),
    ('011_message_retractions', '2e12cb2c82a5003e3a8c368aa4527905db97c54e38714373e7cf60040b99fbb0'),
    ('012_session_fork_point', '6f91e88efab6e73f2a0eca932c72de47c0df6383a239030473f3bc9a3bc28485'),
    ('013_summary_costs_history_continuity', '72d4a9314a85287c13508073c91f650908249247facf913b8a6dda01b988c173'),
    ('014_message_vectors', '0d6b5330433f1ec55c94ef5f588e11ac864518d019715fc711712182c27dceba'),
    ('015_summaries_scoped_fts', '86cc6ba34fa91e725a65a2880317b264e6e6f8ede7f7a27e24156fbfa45a8aea'),
    ('016_fts_usermerge', '67fbe9a06a9d913d8a6e172cca8a361d606395da971f2fc641bc0088ca525257'),
    ('018_summaries_cjk', '58fd496b4ea4af64765f6e16b32a825904b7359e3e6ae9f2af498efe58109969'),
    ('019_retention', '2cc73683c91338d086221640fce7451d417ff7b4cf8ed25163823b735bd08b4b'),
    ('020_forget_marks', '2dcdc57d8bde3524a3d2a9b898f47c5cb1cd0a21eb1e4f96193d1fc34485fae8'),
]
POSTGRES_PINNED = [
    ('001_initial', '4e9b3e69743c8618c503f2b90c4c6eccb953f0547f8b54aca23c056e41274902'),
    ('002_trigram', '4823124375cb453cff4015f6afc9f8afa89a38deaa201fe43f789dbff5c0fff9'),
    ('003_message_aliases', '2bd654b07e3cf81d6861608eb375eebd985ed439ec0797fd31a7da7b2e17a89c'),
    ('004_presummaries', 'e2c611cd61a62fbb4bd6a6f43963583fe7be9af63694eb16254b52ae5733f414'),
    ('005_messages_session_id', '066bec348c2d77693827ee6fd9389e2f3fc729a7e1a93d744c2b5070cad7ab46'),
    ('006_message_retractions', 'a0c5a5fda1dbc9fd1731371711b8a1bb1739d9694b9a37a233a87a73b35f0c9c'),
    ('007_session_fork_point', '5b5905533b22b41da0e29e8dd38b6e1194fbf1ce8e6c07b97621e827c9c92707'),
    ('008_deferred_message_index', '96466e051a6bfd228cde9ae6a43299a8c00d8844604ca79304e7dc75ad529802'),
    ('009_summary_costs_history_continuity', '75a840b29bbceaf77a29a4cea54fbee72362fe157af9c57fef42af32f76e0ea7'),
    ('010_context_version_notify', 'b0825a22646b467825e24b21cbb5aae8d76d71b8ce7ffb239b51b861fa6f709f'),
    ('011_lineage_notify', 'bafa1dee0aa9fdfd28897207175e63e5b16b3160fbf6d8c654e496819ced7a18'),
    ('012_any_match', '50baaf5c40c387c7b7335effa85c3a881020e5c3741f7dfc5930cc187e32aa82'),
    ('013_message_index_session', '8647d99599e858518928b632c6b2a559247f3b7aab576878c7062b2191f9cfcf'),
    ('014_parts_from_lexemes', '154a99feea9777a63a285f6992d9615eda43d1d40c02f2133cf372cdbe6926d1'),
    ('015_lz4_toast', '6fc5643ef926eae01da281ac8b3e874dcca345eeadcc6614e7955e80e69b4dc4'),
    ('016_summaries_cjk', 'e5ed565912c63c9bb631ffcb98068d0146b4981e39fdb6925a0f2d86ef4399d7'),
    ('017_term_counts', 'ddbfc4db431613d2df561ce332d71f01f0aaf1d2805a0955907b0ae83ca79ebb'),
    ('018_summary_chains', '16d95b794e5935a52ffdbe39aba6626faa23b6fe162b63a24340e42201487cb9'),
    ('019_message_vectors', '4ad0a29fcb2cbdcf6ab6658ba97d8faad4b98c489df252da7b0f305f8c276511'),
    ('020_cjk_messages', '43ed73e3bb0e9b95eaf07cbeae93ccd781b4f0b90538f383d1e15dd52d3cb925'),
    ('021_fts_messages_ranked', '8c48f83be36547ecf88ae9c9823e04133a6462d4f341f953f1c472b03fa21c2d'),
    ('022_summary_outline', '2fee43c31b71adf6bec2902c803b40701afa073670f244e31abc19284e36a2ce'),
    ('023_message_index_cjk_session', 'b783be6c737769efd301b9f33651f19232f93c4ee6b40a503c3fe43481b2d488'),
    ('024_fts_under_summary', 'e38675976794a52e0c0b0a93bd9dec23533adb4fbbdfcb150376d622e15b9191'),
    ('025_fts_newest_in_lineage', '4df1aca2463928259b32ef2488fbb047df8716a557516a5f5e7d6d7cadab7e23'),
    ('026_fts_under_many', '3d4e3a27da76b2803f356811d0d7470512602ee06512885194eac3f324a0a6ed'),
    ('027_term_counts_custom_plans', 'c4b6b9a15e5a1edf35c378e89ae8c0ec5d48e6f8efc636870fc9d0df1c4c06e5'),
    ('028_summary_chains_by_key', 'df88de35e8bdf518135668462c23531c86963d236067b90beeb167610414a5bb'),
    ('029_fts_summaries_in_lineage', '5bee48e463a58ca6804110c6cf5d77b808ba942cdd2828284a5f6a9d58cab0c7'),
    ('030_any_match_newest_summaries', '9a48d8b822ca066144986ff8eea477a1f5b0ed6e45f0c67e0d54696815a33a9f'),
    ('031_term_counts_capped_plans_kept', '2de90fb132ff203e8f57f9283c788281c863c29b2012141fcc73083c02ce9690'),
    ('032_retention', 'da71068caffb831cf3bec8b92e49195551183b4a43fef03b864ca9be9e6bb0f9'),
    ('033_identifier_lexemes', '4e9204441ede67f5464ceba45fc0e7e922296545b31a5aadc36952f4ea34f20a'),
    ('034_forget_marks', '2b62e8722ca1cd45e648e7b369394d2e7cc9e9793c8473c4e87361f84ed63d8c'),
    ('035_identifier_lexemes_flat', 'a3c3f6b4dcc0711b97e4985be72987fd65b5ecd9c0cbaf7fd7668e9f2ac611a1'),
]
# (name, revision, SHA-256 of its SQL) of the PostgreSQL functions' current definitions
# (store/postgres/migrations/functions.py): a changed text with the same revision fails here
# (raise the revision, then update this line: stores recorded the old revision re-run it).
DEFINITIONS_PINNED = [
    ('lcm_ident_lexemes', 1, 'a3c3f6b4dcc0711b97e4985be72987fd65b5ecd9c0cbaf7fd7668e9f2ac611a1'),
    ('lcm_tsvector_of', 1, '33b0509ba7977e560a2e4dff089ed0e7a07bb8f8b01b62d2f675b874e172454f'),
    ('lcm_any_match', 1, '9a48d8b822ca066144986ff8eea477a1f5b0ed6e45f0c67e0d54696815a33a9f'),
    ('lcm_term_counts', 1, '759493f5de3c8ec2324b434e8fea54a482e30b8b5a4978fc4b32fe6cbe1d7063'),
    ('lcm_summary_chains', 1, 'df88de35e8bdf518135668462c23531c86963d236067b90beeb167610414a5bb'),
]


def _digests(migrations) -> list[tuple[str, str]]:
    return [(name, hashlib.sha256(sql.encode()).hexdigest()) for name, sql in migrations]


def test_every_released_migration_is_unchanged_and_in_order():
    assert _digests(SQLITE_MIGRATIONS)[:len(SQLITE_PINNED)] == SQLITE_PINNED
    assert _digests(PG_MIGRATIONS)[:len(POSTGRES_PINNED)] == POSTGRES_PINNED
    # (new entries only after the pinned ones; names keep their order)
    for ms in (SQLITE_MIGRATIONS, PG_MIGRATIONS):
        names = [n for n, _ in ms]
        assert names == sorted(names) and len(set(names)) == len(names)
    assert [(d.name, d.revision, hashlib.sha256(d.sql.encode()).hexdigest())
            for d in PG_DEFINITIONS] == DEFINITIONS_PINNED


def test_postgres_list_is_declared_in_one_place():
    """Every PostgreSQL migration is named in migrations.ORDER with the module holding it, and
    every module's every entry is in ORDER (the package refuses to import otherwise)."""
    from lossless_context.store.postgres import migrations as pkg
    assert [n for n, _m in pkg.ORDER] == [n for n, _ in PG_MIGRATIONS]
    assert pkg.gather(pkg.ORDER) == PG_MIGRATIONS
    with pytest.raises(ImportError, match="ORDER and the modules' entries differ"):
        pkg.gather(pkg.ORDER[:-1])  # an entry a module holds but ORDER forgot
    with pytest.raises(ImportError, match="ORDER and the modules' entries differ"):
        pkg.gather([*pkg.ORDER, pkg.ORDER[0]])  # an entry listed twice
    with pytest.raises(ImportError, match="is in .*schema, not .*plans"):
        pkg.gather([(n, pkg.plans if n == "001_initial" else m) for n, m in pkg.ORDER])


# -- PostgreSQL: a fresh store and an upgraded one; the functions' current definitions ------------

def _pg_schema(dsn: str) -> dict[str, list]:
    """Everything the migrations and definitions make, as text: tables and columns, indexes,
    constraints, triggers, functions (whole definitions, settings included), extensions."""
    import psycopg
    q = {
        "columns": "SELECT table_name, column_name, data_type, is_nullable, column_default, is_generated,"
                   " generation_expression FROM information_schema.columns WHERE table_schema = 'public'",
        "indexes": "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = 'public'",
        "constraints": "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint"
                       " WHERE connamespace = 'public'::regnamespace",
        "triggers": "SELECT tgname, pg_get_triggerdef(oid) FROM pg_trigger WHERE NOT tgisinternal",
        "functions": "SELECT p.proname, pg_get_functiondef(p.oid) FROM pg_proc p"
                     " WHERE p.pronamespace = 'public'::regnamespace AND p.prokind = 'f'"
                     " AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.objid = p.oid AND d.deptype = 'e')",
        "extensions": "SELECT extname FROM pg_extension",
    }
    with psycopg.connect(dsn, autocommit=True) as c:
        return {k: sorted(tuple(str(x) for x in r) for r in c.execute(sql)) for k, sql in q.items()}


@pytest.fixture
def pg_databases(pg_server):
    """Make empty databases on the test server (dropped afterwards)."""
    made: list[str] = []

    def make() -> str:
        made.append(pg_server.create_database())
        return pg_server.dsn(made[-1])

    yield make
    from tests.support.pg import close_pools
    for name in made:
        close_pools(name)
        pg_server.drop_database(name)


def _apply_by_hand(dsn: str, migrations) -> None:
    """A store as an older lcm left it: these migrations applied and recorded, nothing else."""
    import psycopg
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE TABLE lcm_migrations (name TEXT PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)")
        for name, sql in migrations:
            c.execute(sql)
            c.execute("INSERT INTO lcm_migrations VALUES (%s, 0)", (name,))


def _open_once(location: str) -> None:
    """Open a store for writing (which migrates it) and close it."""
    s = open_store(location)
    try:
        assert s.get_session("none") is None
    finally:
        s.close()


def test_postgres_fresh_and_upgraded_stores_have_the_same_schema(pg_databases):
    """A store made now, and stores made by older versions (before the kept plans, 019; before
    the identifiers, 032; by the version before the functions' definitions, 035) then opened by
    this one, end with the same tables, indexes, triggers and functions. And the definitions at
    revision 1 are the functions the migrations alone leave (stores made before them unchanged)."""
    fresh = pg_databases()
    _open_once(fresh)
    want = _pg_schema(fresh)
    assert {"lcm_any_match", "lcm_tsvector_of", "lcm_ident_lexemes"} <= {f for f, _ in want["functions"]}
    for last in ("019_message_vectors", "032_retention", PG_MIGRATIONS[-1][0]):
        old = pg_databases()
        _apply_by_hand(old, [m for m in PG_MIGRATIONS if m[0] <= last])
        before = _pg_schema(old)
        _open_once(old)
        assert _pg_schema(old) == want, last
        if last == PG_MIGRATIONS[-1][0]:  # every migration, no definition run yet
            first = {d.name for d in PG_DEFINITIONS if d.revision == 1}
            assert first and [f for f in before["functions"] if f[0] in first] \
                == [f for f in want["functions"] if f[0] in first]


def test_postgres_a_changed_definition_runs_once_and_never_goes_back(pg_fresh_dsn, monkeypatch, caplog):
    """A definition at a higher revision than the store recorded runs on the next writing open
    (after the migrations, recorded in lcm_definitions), once; until then a read-only open is
    refused and the doctor names it; an older lcm (the lower revision) leaves the newer one."""
    import psycopg
    caplog.set_level(logging.INFO, logger="lossless_context.store")
    s = open_store(pg_fresh_dsn)
    s.ensure_session("a")
    s.close()
    with psycopg.connect(pg_fresh_dsn, autocommit=True) as c:
        assert dict(c.execute("SELECT name, revision FROM lcm_definitions").fetchall()) \
            == {d.name: d.revision for d in PG_DEFINITIONS}
    old = PG_DEFINITIONS[2]
    new = migrate.Definition(old.name, old.revision + 1,
                             old.sql.replace("$fn$;", "$fn$;\n        COMMENT ON FUNCTION " + old.name
                                             + " IS 'revision two';", 1))
    assert new.sql != old.sql
    changed = [new if d is old else d for d in PG_DEFINITIONS]
    monkeypatch.setattr(pg_conn, "DEFINITIONS", changed)
    monkeypatch.setattr(pg_readonly, "DEFINITIONS", changed)
    ro = open_store(pg_fresh_dsn, read_only=True)
    try:
        with pytest.raises(StoreError, match=f"needs upgrading \\({old.name}\\)"):
            ro.get_session("a")
    finally:
        ro.close()
    caplog.clear()
    s = open_store(pg_fresh_dsn)
    try:
        s.ensure_session("a")
        defined = [r.getMessage() for r in caplog.records if "defined " in r.getMessage()]
        assert defined == [f"lcm store {s.location}: defined {old.name} (revision {new.revision})"]
        assert s.migration_state().pending == []
    finally:
        s.close()

    def comment() -> str | None:
        with psycopg.connect(pg_fresh_dsn, autocommit=True) as c:
            return c.execute("SELECT obj_description(oid, 'pg_proc') FROM pg_proc WHERE proname = %s",
                             (old.name,)).fetchone()[0]

    assert comment() == "revision two"
    caplog.clear()
    _open_once(pg_fresh_dsn)  # again: nothing to do
    assert not [r for r in caplog.records if "defined " in r.getMessage()]
    ro = open_store(pg_fresh_dsn, read_only=True)
    try:
        assert ro.get_session("a") is not None
    finally:
        ro.close()
    monkeypatch.undo()  # an older lcm (revision 1) on the same store: leaves revision 2
    caplog.clear()
    _open_once(pg_fresh_dsn)
    assert not [r for r in caplog.records if "defined " in r.getMessage()]
    with psycopg.connect(pg_fresh_dsn, autocommit=True) as c:
        assert c.execute("SELECT revision FROM lcm_definitions WHERE name = %s", (old.name,)).fetchone() \
            == (new.revision,)
    with psycopg.connect(pg_fresh_dsn, autocommit=True) as c:  # a store missing it: the doctor says so
        c.execute("DELETE FROM lcm_definitions WHERE name = %s", (old.name,))
    s = open_store(pg_fresh_dsn, read_only=True)
    try:
        with pytest.raises(StoreError, match="needs upgrading"):
            s.get_session("a")
    finally:
        s.close()
