"""The PostgreSQL store's deferred full-text index (store/postgres_index.py, migration 008),
and the store on a managed-style server: a role without superuser rights that may not create
pg_trgm. Every test runs against a real throw-away server (tests/support/pg.py)."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from lossless_context.ops.doctor import run_doctor
from lossless_context.search.query import plan_query
from lossless_context.records import NewMessage
from lossless_context.store.postgres.store import PostgresStore
from lossless_context.store.postgres.migrations import MIGRATIONS

psycopg = pytest.importorskip("psycopg")

ROOT = Path(__file__).resolve().parent.parent
CJK = "青龙七号暗号"


def nm(text: str) -> NewMessage:
    return NewMessage(raw={"role": "user", "content": text}, role="user", ident=uuid.uuid4().hex, uid=None,
                      text=text, tokens=len(text) // 4 + 1, created_at=time.time())


def fts_ids(store: PostgresStore, query: str, sessions=None) -> list[int]:
    return [r["id"] for r in store.search("messages", sessions, plan_query(query), mode="fts", limit=50)]


def sub_ids(store: PostgresStore, query: str) -> list[int]:
    return [r["id"] for r in store.search("messages", None, plan_query(query), mode="substring", limit=50)]


def indexed_ids(dsn: str) -> set[int]:
    with psycopg.connect(dsn, autocommit=True) as c:
        return {r[0] for r in c.execute("SELECT id FROM message_index")}


@pytest.fixture
def quiet_store(pg_fresh_dsn):
    """A store that never indexes by itself: whatever is indexed, the test indexed."""
    st = PostgresStore(pg_fresh_dsn, background_index=False)
    yield st
    st.close()


def test_search_right_after_append_sees_the_unindexed_rows(quiet_store, pg_fresh_dsn):
    st = quiet_store
    st.ensure_session("s")
    old = st.append_messages("s", [nm(f"routine note {i} about widgets") for i in range(20)])
    st.wait_indexed()
    new = st.append_messages("s", [nm(f"the flaky webhook retry limit is 7 (remember {CJK})")])
    assert st.stats()["unindexed_messages"] == 1 and new[0] not in indexed_ids(pg_fresh_dsn)
    # every search primitive sees the committed, not yet indexed row
    assert fts_ids(st, "webhook retry limit") == new
    assert fts_ids(st, "widgets")[:1] == [old[-1]] and len(fts_ids(st, "widgets")) == 20
    assert st.term_counts("messages", [plan_query("webhook")], 100) == [1]
    assert sub_ids(st, CJK) == new
    ranked = st.search("messages", ["s"], plan_query("webhook"), mode="fts", order="rank", limit=5)
    assert [r["id"] for r in ranked] == new and ranked[0]["rank"] < 0
    # once indexed: the same answers, the row found once
    assert st.index_pending_batch() == new
    assert st.stats()["unindexed_messages"] == 0
    assert fts_ids(st, "webhook retry limit") == new and sub_ids(st, CJK) == new
    assert st.term_counts("messages", [plan_query("webhook")], 100) == [1]


def test_backlog_left_by_a_dead_process_is_seen_and_indexed(pg_fresh_dsn):
    child = (
        "import os, sys, time, uuid\n"
        "from lossless_context.records import NewMessage\n"
        "from lossless_context.store.postgres.store import PostgresStore\n"
        "st = PostgresStore(sys.argv[1], background_index=False)\n"
        "st.ensure_session('dead')\n"
        "rows = [NewMessage(raw={'role': 'user', 'content': t}, role='user', ident=uuid.uuid4().hex, uid=None,\n"
        "                   text=t, tokens=3, created_at=time.time()) for t in\n"
        "        [f'orphaned backlog entry {i} zebracorn' for i in range(300)]]\n"
        "st.append_messages('dead', rows)\n"
        "os._exit(0)  # dies without indexing or closing anything\n"
    )
    r = subprocess.run([sys.executable, "-c", child, pg_fresh_dsn], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    quiet = PostgresStore(pg_fresh_dsn, background_index=False)
    try:
        assert quiet.stats()["unindexed_messages"] == 300 and not indexed_ids(pg_fresh_dsn)
        assert len(fts_ids(quiet, "zebracorn")) == 50  # (a page of them)
        assert quiet.term_counts("messages", [plan_query("zebracorn")], 1000) == [300]
    finally:
        quiet.close()
    st = PostgresStore(pg_fresh_dsn)  # a normal store picks the backlog up by itself
    try:
        st.wait_indexed()
        assert st.stats()["unindexed_messages"] == 0 and len(indexed_ids(pg_fresh_dsn)) == 300
        assert st.term_counts("messages", [plan_query("zebracorn")], 1000) == [300]
    finally:
        st.close()


def test_concurrent_indexers_index_each_row_exactly_once(quiet_store, pg_fresh_dsn):
    quiet_store.ensure_session("s")
    ids = quiet_store.append_messages("s", [nm(f"row {i} of the shared backlog") for i in range(1200)])
    workers = [PostgresStore(pg_fresh_dsn, background_index=False) for _ in range(4)]
    start = threading.Barrier(len(workers))
    got: list[list[int]] = [[] for _ in workers]
    errors: list[BaseException] = []

    def run(k: int) -> None:
        try:
            start.wait()
            while True:
                batch = workers[k].index_pending_batch(25)
                if not batch:
                    return
                got[k].extend(batch)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(workers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for w in workers:
        w.close()
    assert not errors
    flat = [i for g in got for i in g]
    assert len(flat) == len(set(flat)) == len(ids) and set(flat) == set(ids)
    assert indexed_ids(pg_fresh_dsn) == set(ids) and quiet_store.stats()["unindexed_messages"] == 0


def test_store_made_before_the_deferred_index_is_upgraded_online(pg_fresh_dsn):
    old = [m for m in MIGRATIONS if m[0] < "008"]
    with psycopg.connect(pg_fresh_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE lcm_migrations (name TEXT PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)")
        for name, sql in old:
            c.execute(sql)
            c.execute("INSERT INTO lcm_migrations VALUES (%s, 0)", (name,))
        c.execute("INSERT INTO sessions(id, created_at, updated_at) VALUES ('s', 0, 0)")
        c.execute("INSERT INTO messages(session_id, seq, ident, role, raw, text, tokens, created_at)"
                  " SELECT 's', g, 'i' || g, 'user', '{}', 'legacy row ' || g || ' about src/billing/invoice.py',"
                  " 5, g FROM generate_series(0, 99) g")
    st = PostgresStore(pg_fresh_dsn, background_index=False)
    try:
        assert "008_deferred_message_index" in st.applied_migrations()
        assert st.stats()["unindexed_messages"] == 100  # every old row listed, none lost
        assert len(fts_ids(st, "invoice")) == 50 and len(fts_ids(st, "billing")) == 50
        st.ensure_session("s")
        new = st.append_messages("s", [nm("a fresh row about src/billing/invoice.py")])
        # (found while still listed; among the legacy rows' equal matches it now ranks last: its
        # identifier lexemes, migration 033, lengthen it a little, so the newest-first tie-break
        # no longer puts it first)
        assert fts_ids(st, "fresh src/billing/invoice.py")[0] == new[0] and fts_ids(st, "fresh billing")[0] == new[0]
        st.wait_indexed()
        assert st.stats()["unindexed_messages"] == 0 and len(indexed_ids(pg_fresh_dsn)) == 101
        assert st.term_counts("messages", [plan_query("billing")], 1000) == [101]
        # (the raw rows belong to no context: only the index check applies to them)
        assert [c.ok for c in run_doctor(st).checks if c.name == "full-text index message_index in sync"] == [True]
    finally:
        st.close()


def test_doctor_finds_and_repairs_a_message_missing_from_the_index(quiet_store, pg_fresh_dsn):
    quiet_store.ensure_session("s")
    ids = quiet_store.append_messages("s", [nm(f"doctor row {i}") for i in range(5)])
    quiet_store.wait_indexed()
    with psycopg.connect(pg_fresh_dsn, autocommit=True) as c:
        c.execute("DELETE FROM message_index WHERE id = %s", (ids[2],))  # damage: neither indexed nor listed
    assert quiet_store.index_missing() == 1
    chk = [c for c in run_doctor(quiet_store).checks if c.name == "full-text index message_index in sync"][0]
    assert not chk.ok and "1 messages" in chk.detail
    chk = [c for c in run_doctor(quiet_store, repair=True).checks
           if c.name == "full-text index message_index in sync"][0]
    assert chk.repaired and quiet_store.index_missing() == 0 and ids[2] in indexed_ids(pg_fresh_dsn)


@pytest.fixture
def app_role_dsn(pg_server):
    """A database the superuser owns, used by a plain role that owns only its schema: it
    may not create extensions (so pg_trgm is unavailable), like many managed services."""
    name = pg_server.create_database("managed")
    role = f"app_{uuid.uuid4().hex[:8]}"
    pg_server.admin(f"CREATE ROLE {role} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE")
    with psycopg.connect(pg_server.dsn(name), autocommit=True) as c:
        c.execute(f"CREATE SCHEMA app AUTHORIZATION {role}")
        c.execute(f"ALTER ROLE {role} IN DATABASE {name} SET search_path = app")
        c.execute("REVOKE CREATE ON DATABASE " + name + " FROM PUBLIC")
    yield pg_server.dsn(name).replace("lcm@", f"{role}@")
    pg_server.drop_database(name)
    pg_server.admin(f"DROP ROLE IF EXISTS {role}")


def test_plain_role_without_pg_trgm(app_role_dsn, caplog):
    with psycopg.connect(app_role_dsn, autocommit=True) as c:
        assert c.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone() == (False,)
    caplog.set_level(logging.WARNING, logger="lossless_context.store")
    st = PostgresStore(app_role_dsn)
    try:
        st.ensure_session("s")
        ids = st.append_messages("s", [nm(f"managed row {i} mentions {CJK}" if i == 7 else f"managed row {i}")
                                       for i in range(30)])
        assert not st.has_trigram_index()
        assert any("002_trigram skipped" in r.getMessage() for r in caplog.records)
        assert sub_ids(st, CJK) == [ids[7]] and fts_ids(st, "managed")[:1] == [ids[-1]]
        assert [r["id"] for r in st.search("summaries", None, plan_query(CJK), mode="substring")] == []
        st.wait_indexed()
        assert sub_ids(st, CJK) == [ids[7]]
        rep = run_doctor(st)  # (these rows belong to no context: the reachability check fails, as on SQLite)
        assert all(c.ok for c in rep.checks if c.name != "every message reachable from a context or the DAG")
        notice = [c for c in rep.checks if c.name == "pg_trgm substring index"]
        assert notice and "pg_trgm is not installed" in notice[0].detail
    finally:
        st.close()


# -- lcm_any_match (migration 012): pair tests in one call, never a sequential scan -----------

def _seq_scans(dsn: str) -> tuple[int, int]:
    with psycopg.connect(dsn, autocommit=True) as c:
        return c.execute("SELECT seq_scan, COALESCE(idx_scan, 0) FROM pg_stat_user_tables"
                         " WHERE relname = 'message_index'").fetchone()


def _flush_stats(c) -> None:
    c.execute("SELECT pg_stat_force_next_flush()")


def test_any_match_answers_like_counts_and_sees_unindexed_rows(quiet_store):
    st = quiet_store
    st.ensure_session("s")
    st.append_messages("s", [nm(f"alpha note {i} about widgets") for i in range(30)]
                       + [nm(f"bravo report {i} about gadgets") for i in range(30)])
    st.wait_indexed()
    st.append_messages("s", [nm("a charlie line that mentions widgets once")])  # listed, not indexed
    plans = [plan_query(q) for q in ("alpha widgets", "alpha gadgets", "bravo gadgets", "charlie widgets",
                                     "charlie gadgets")]
    pairs = [p.subset(list(range(len(p.items))), "AND") for p in plans]
    assert st.any_match("messages", pairs, 5.0) == [True, False, True, True, False]
    assert [c > 0 for c in st.term_counts("messages", pairs, 0)] == [True, False, True, True, False]
    # no time left: nothing is tested, nothing is claimed
    assert st.any_match("messages", pairs, -1.0) == [None] * 5


def test_any_match_never_scans_the_whole_index(pg_fresh_dsn):
    """Two common terms that never meet: a LIMIT 1 planned as a sequential scan reads every row
    (0.8 s at 1M messages). The function is planned with enable_seqscan off."""
    st = PostgresStore(pg_fresh_dsn)
    try:
        st.ensure_session("s")
        st.append_messages("s", [nm(f"{'alpha' if i % 2 else 'bravo'} common line {i}") for i in range(400)])
        st.wait_indexed()
        with psycopg.connect(pg_fresh_dsn, autocommit=True) as c:
            if c.info.server_version < 150000:
                pytest.skip("pg_stat_force_next_flush needs PostgreSQL 15")
            c.execute("ANALYZE message_index")
            # control: on a small table the planner's own choice is a sequential scan
            seq0, _ = _seq_scans(pg_fresh_dsn)
            c.execute("SELECT EXISTS (SELECT 1 FROM message_index x WHERE x.tsv @@ to_tsquery('english',"
                      " 'alpha & bravo'))")
            _flush_stats(c)
            seq1, idx1 = _seq_scans(pg_fresh_dsn)
            assert seq1 > seq0
            assert c.execute("SELECT lcm_any_match('messages', ARRAY[to_tsquery('english', 'alpha & bravo')],"
                             " interval '5 s')").fetchone()[0] == [False]
            _flush_stats(c)
            seq2, idx2 = _seq_scans(pg_fresh_dsn)
        assert seq2 == seq1 and idx2 > idx1
        pair = plan_query("alpha bravo").subset([0, 1], "AND")
        assert st.any_match("messages", [pair], 5.0) == [False]
    finally:
        st.close()


def test_term_counts_use_the_indexes_and_count_what_plain_sql_counts(pg_fresh_dsn):
    """lcm_term_counts (migration 017): capped counts per query in one call, never a sequential
    scan (a summary's tsvector is ~4 KB out of line: scanning read and decompressed each one per
    term); still-listed messages count; a window (newest rows) and the cap hold."""
    from lossless_context.records import NewSummary

    st = PostgresStore(pg_fresh_dsn, background_index=False)
    try:
        st.ensure_session("s")
        ids = st.append_messages("s", [nm(f"{'alpha' if i % 3 else 'bravo'} line {i} widgets") for i in range(90)])
        st.wait_indexed()
        st.append_messages("s", [nm("alpha listed, not indexed yet")])
        sums = [NewSummary(key=f"k{i}", kind="leaf", depth=0, text=f"{'alpha' if i % 2 else 'bravo'} summary {i} "
                           + "filler words " * 300, tokens=10, source_tokens=100, level="normal", summarizer="t",
                           t_start=1.0, t_end=2.0 + i, n_messages=1, message_ids=[ids[i]]) for i in range(40)]
        st.stage_pass("s", "p", sums, [("s", f"k{i}") for i in range(40)], 1, 90)
        assert st.publish_pass("p")
        plans = [plan_query(q) for q in ("alpha", "bravo", "zulu", "alpha widgets")]
        plans = [p.subset(list(range(len(p.items))), "AND") for p in plans]  # as searches ask
        with psycopg.connect(pg_fresh_dsn, autocommit=True) as c:
            def plain(table: str, q: str, floor: int = 0) -> int:
                return c.execute(f"SELECT count(*) FROM {table} WHERE to_tsvector('english', text)"
                                 " @@ to_tsquery('english', %s) AND id > %s", (q, floor)).fetchone()[0]

            want_m = [plain("messages", p.pg_tsquery) for p in plans]
            want_s = [plain("summaries", p.pg_tsquery) for p in plans]
            assert want_m == [61, 30, 0, 60] and want_s == [20, 20, 0, 0]
            assert st.term_counts("messages", plans, 1_000) == want_m  # the listed row included
            assert st.term_counts("summaries", plans, 1_000) == want_s
            assert st.term_counts("messages", plans, 10) == [11, 11, 0, 11]  # capped: cap + 1
            from types import SimpleNamespace  # an operand the server refuses: counted as common,
            refused = SimpleNamespace(pg_tsquery="'alpha' & (")  # the others still exactly
            assert st.term_counts("summaries", [plans[0], refused, plans[1]], 1_000) == [20, 1_001, 20]
            # both targets in one call (one statement): what one call per target answers
            reads = []
            real = st._read
            st._read = lambda fn: reads.append(fn) or real(fn)
            try:
                assert st.term_counts_many([("messages", plans), ("summaries", plans)], 1_000) == [want_m, want_s]
            finally:
                del st._read
            assert len(reads) == 1
            assert st.term_counts_many([("messages", plans), ("summaries", [plans[0], refused])], 10) == [
                [11, 11, 0, 11], [11, 11]]  # a refusal: each target alone, as term_counts copes
            assert st.term_counts_many([("messages", []), ("summaries", plans[2:3])], 5) == [[], [0]]
            top = st.max_row_id("summaries")
            assert st.term_counts("summaries", plans, 1_000, newest=10) == [
                plain("summaries", p.pg_tsquery, top - 10) for p in plans]
            if int(c.execute("SHOW server_version_num").fetchone()[0]) < 150000:
                pytest.skip("pg_stat_force_next_flush needs PostgreSQL 15")
            c.execute("ANALYZE summaries")

            def scans() -> tuple[int, int]:
                _flush_stats(c)
                return c.execute("SELECT seq_scan, COALESCE(idx_scan, 0) FROM pg_stat_user_tables"
                                 " WHERE relname = 'summaries'").fetchone()

            seq0, _ = scans()  # control: the planner's own choice for a capped count here
            c.execute("SELECT count(*) FROM (SELECT 1 FROM summaries x WHERE x.tsv @@"
                      " to_tsquery('english', 'alpha') LIMIT 1001) a")
            seq1, idx1 = scans()
            assert seq1 > seq0
            assert c.execute("SELECT lcm_term_counts('summaries', ARRAY[to_tsquery('english', 'alpha')],"
                             " 1000, NULL)").fetchone()[0] == [20]
            seq2, idx2 = scans()
            assert seq2 == seq1 and idx2 > idx1
    finally:
        st.close()


def test_a_filled_index_without_statistics_is_analysed(pg_fresh_dsn, monkeypatch):
    """Searches skip counting common terms by the planner's lexeme statistics; a store that
    fills message_index faster than autovacuum looks analyses it itself, once."""
    from lossless_context.store.postgres import index as pg_index

    monkeypatch.setattr(pg_index, "STATS_ROWS", 50)

    def analysed() -> tuple[bool, bool]:
        with psycopg.connect(pg_fresh_dsn, autocommit=True) as c:
            last = c.execute("SELECT last_analyze FROM pg_stat_user_tables WHERE relname = 'message_index'").fetchone()[0]
            stats = c.execute("SELECT EXISTS (SELECT 1 FROM pg_stats WHERE tablename = 'message_index'"
                              " AND attname = 'tsv')").fetchone()[0]
        return last is not None, stats

    st = PostgresStore(pg_fresh_dsn, background_index=False)
    try:
        st.ensure_session("s")
        st.append_messages("s", [nm(f"webhook retry note {i}") for i in range(30)])
        st.wait_indexed()
        assert analysed() == (False, False)  # (last_analyze: ours; autovacuum sets last_autoanalyze)
        st.append_messages("s", [nm(f"webhook retry note {i}") for i in range(30, 60)])
        st.wait_indexed()
        assert analysed() == (True, True)
    finally:
        st.close()


def test_scoped_search_uses_the_indexed_session_and_rows_from_before_it(quiet_store, pg_fresh_dsn):
    """message_index keeps each row's session (migration 013): a scoped search filters there.
    Rows indexed before the column existed (NULL) are looked up in messages until the indexer
    fills them; either way a search never leaves its scope."""
    st = quiet_store
    for sid in ("a", "b"):
        st.ensure_session(sid)
    a = st.append_messages("a", [nm(f"webhook retry limit in a, note {i}") for i in range(5)])
    b = st.append_messages("b", [nm(f"webhook retry limit in b, note {i}") for i in range(5)])
    st.wait_indexed()
    with psycopg.connect(pg_fresh_dsn, autocommit=True) as c:
        assert c.execute("SELECT count(*) FROM message_index WHERE session_id IS NULL").fetchone()[0] == 0
        assert dict(c.execute("SELECT session_id, count(*) FROM message_index GROUP BY 1").fetchall()) == {"a": 5, "b": 5}
        # as if indexed before migration 013: half of each session without its session
        c.execute("UPDATE message_index SET session_id = NULL WHERE id % 2 = 0")
    for order in ("rank", "recent"):
        got = {r["id"] for r in st.search("messages", ["a"], plan_query("webhook retry"), mode="fts",
                                          order=order, limit=50)}
        assert got == set(a), order
        assert {r["id"] for r in st.search("messages", None, plan_query("webhook retry"), mode="fts",
                                           order=order, limit=50)} == set(a) | set(b)
    filled = 0
    assert st.index_unscoped() == 5
    while (n := st.fill_index_sessions(batch=2)):
        filled += n
    assert filled == 5 and st.index_unscoped() == 0
    with psycopg.connect(pg_fresh_dsn, autocommit=True) as c:
        assert dict(c.execute("SELECT session_id, count(*) FROM message_index GROUP BY 1").fetchall()) == {"a": 5, "b": 5}
    assert [r["id"] for r in st.search("messages", ["b"], plan_query("webhook retry"), mode="fts", limit=50)] \
        == sorted(b, reverse=True)


def test_the_background_indexer_fills_sessions_left_from_before_013(pg_fresh_dsn):
    st = PostgresStore(pg_fresh_dsn, background_index=False)
    st.ensure_session("a")
    st.append_messages("a", [nm(f"old row {i}") for i in range(30)])
    st.wait_indexed()
    st.close()
    with psycopg.connect(pg_fresh_dsn, autocommit=True) as c:
        c.execute("UPDATE message_index SET session_id = NULL")
    bg = PostgresStore(pg_fresh_dsn)  # its indexer starts at open and fills when idle
    try:
        deadline = time.monotonic() + 60
        while bg.index_unscoped() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert bg.index_unscoped() == 0
    finally:
        bg.close()


# Migration 014: the parts of compound tokens come from the first parse's whole lexemes.
COMPOUND_TEXTS = [
    "see src/billing/invoice.py and models.py for ERR_TIMEOUT",
    "mail ops-team@example.org or open https://status.example.com/incidents/42 today",
    r"the config lives in C:\Users\dev\settings.json, key=retry_limit value=7",
    "host db-primary.internal.example.net:5432 refused; retrying on api.v2.example.io",
    "plain words only: the quota file moved to the new bucket last week",
]


def test_a_tsvector_holds_every_whole_token_and_its_parts(pg_fresh_dsn):
    st = PostgresStore(pg_fresh_dsn, background_index=False)
    st.ensure_session("s")  # connects, hence migrates
    st.close()
    with psycopg.connect(pg_fresh_dsn, autocommit=True) as c:
        def lexemes(sql: str, t: str) -> set[str]:
            return set(c.execute(f"SELECT tsvector_to_array({sql})", (t,)).fetchone()[0])

        for t in COMPOUND_TEXTS:
            got = lexemes("lcm_tsvector_of(%s::text)", t)
            whole = lexemes("to_tsvector('english', %s::text)", t)
            # every word a separator-split reading of the text has (what FTS5 indexes)
            words = lexemes("to_tsvector('english', translate(%s::text, './\\:@=', '      '))", t)
            # and each identifier's runs of parts as one lexeme (migration 033: idents.py)
            idents = set(c.execute("SELECT lcm_ident_lexemes(%s::text)", (t,)).fetchone()[0] or [])
            assert got == whole | words | idents, (t, got ^ (whole | words | idents))
        assert {"src/billing/invoice.py", "src", "bill", "invoic", "py"} <= lexemes(
            "lcm_tsvector_of(%s::text)", COMPOUND_TEXTS[0])
        positions = c.execute("SELECT lcm_tsvector_of(%s::text)::text = to_tsvector('english', %s::text)::text",
                              (COMPOUND_TEXTS[-1], COMPOUND_TEXTS[-1])).fetchone()[0]
        assert positions  # a text without compound tokens is parsed once, as to_tsvector does


def test_message_text_is_compressed_with_lz4_and_reads_back_exactly(pg_fresh_dsn):
    st = PostgresStore(pg_fresh_dsn, background_index=False)
    try:
        st.ensure_session("s")
        assert "015_lz4_toast" in st.applied_migrations()  # the test server is built with lz4
        big = "\n".join(f"line {i}: src/app/module_{i % 37}.py raised ERR_{i % 11} after {i}ms" for i in range(3000))
        mid = st.append_messages("s", [nm(big), nm("small")])[0]
        assert st.get_messages([mid])[mid].text == big
        with psycopg.connect(pg_fresh_dsn, autocommit=True) as c:
            assert c.execute("SELECT pg_column_compression(text), pg_column_compression(raw) FROM messages"
                             " WHERE id = %s", (mid,)).fetchone() == ("lz4", "lz4")
        st.wait_indexed()
        assert fts_ids(st, "ERR_7") == [mid]
    finally:
        st.close()


def test_one_statement_append_stores_every_column_as_given(pg_fresh_dsn):
    st = PostgresStore(pg_fresh_dsn, background_index=False)
    try:
        st.ensure_session("s")
        first = st.append_messages("s", [nm("v1 of the plan")])[0]
        rows = [
            NewMessage(raw={"role": "user", "content": "v2 of the plan", "name": "Ann"}, role="user", ident="i-a",
                       uid="u-1", text="v2 of the plan", tokens=5, created_at=1.5, supersedes=first,
                       absorbed=["u-0", "u-0"], large=True, exploration="explored"),
            NewMessage(raw={"role": "assistant", "content": None, "tool_calls": []}, role="assistant", ident="i-b",
                       uid=None, text="", tokens=1, created_at=2.25),
            NewMessage(raw={"role": "tool", "content": "nul\x00 and \ud800 lone"}, role="tool", ident="i-c",
                       uid="u-3", text="nul\x00 and \ud800 lone", tokens=3, created_at=3.0),
        ]
        ids = st.append_messages("s", rows)
        assert ids == sorted(ids) and ids[0] > first
        with psycopg.connect(pg_fresh_dsn, autocommit=True) as c:
            got = c.execute("SELECT id, seq, uid, ident, role, text, tokens, created_at, supersedes, large,"
                            " exploration FROM messages WHERE id = ANY(%s) ORDER BY id", (ids,)).fetchall()
            absorbed = c.execute("SELECT uid FROM message_absorbed WHERE message_id = %s", (ids[0],)).fetchall()
            listed = c.execute("SELECT count(*) FROM message_index_pending WHERE message_id = ANY(%s)",
                               (ids,)).fetchone()[0]
        assert [g[1] for g in got] == [1, 2, 3]
        assert got[0][2:] == ("u-1", "i-a", "user", "v2 of the plan", 5, 1.5, first, True, "explored")
        assert got[1][2:] == (None, "i-b", "assistant", "", 1, 2.25, None, False, None)
        assert "\x00" not in got[2][5] and got[2][5].startswith("nul")  # cleaned as SQLite cleans it
        assert absorbed == [("u-0",)] and listed == 3  # every new row is listed for the indexer
        msgs = st.get_messages(ids)
        assert msgs[ids[0]].raw == rows[0].raw and msgs[ids[1]].raw == rows[1].raw
    finally:
        st.close()


def test_the_indexer_merges_gin_pending_entries_once_it_is_done(quiet_store, pg_fresh_dsn):
    # Every search scans a GIN index's pending list whole (3 ms instead of 1 for one count with
    # 3,000 rows listed): the indexer merges it after a burst, not autovacuum later.
    st = quiet_store
    st.ensure_session("s")

    def pending_pages_merged_now() -> int:  # gin_clean_pending_list: how many it moved (0: none left)
        with psycopg.connect(pg_fresh_dsn, autocommit=True) as c:
            return c.execute("SELECT gin_clean_pending_list('message_index_tsv'::regclass)").fetchone()[0]

    st.append_messages("s", [nm(f"row {i} about the flaky webhook and retry limit {i * 13}") for i in range(400)])
    while st.index_pending_batch():  # batches alone leave the entries pending (the control)
        pass
    assert pending_pages_merged_now() > 0
    from lossless_context.store.postgres.index import MERGE_ROWS

    st.append_messages("s", [nm(f"row {i} about the quota file and its bucket {i * 17}")
                             for i in range(MERGE_ROWS + 100)])
    st.wait_indexed()  # the indexer's drain: past MERGE_ROWS rows it merges
    assert pending_pages_merged_now() == 0
    assert len(fts_ids(st, "quota bucket")) == 50  # (searches see it all, as before)


def test_a_cjk_substring_search_of_summaries_uses_their_bigram_index(pg_fresh_dsn):
    st = PostgresStore(pg_fresh_dsn, background_index=False)
    try:
        st.ensure_session("s")  # migrated
        with psycopg.connect(pg_fresh_dsn, autocommit=True) as c:
            c.execute("SET enable_seqscan = off")  # a tiny table: ask whether the index can serve it
            plan = "\n".join(r[0] for r in c.execute(
                "EXPLAIN SELECT id FROM summaries t WHERE lcm_cjk_grams(t.text) @> %s::text[]"
                " AND t.text LIKE %s", (["重试", "试次"], "%重试次%")).fetchall())
        assert "summaries_cjk" in plan, plan
    finally:
        st.close()


def test_a_large_append_goes_in_chunks_and_keeps_seq_order(pg_fresh_dsn, monkeypatch):
    from lossless_context.store.postgres import append as pg_append

    monkeypatch.setattr(pg_append, "APPEND_CHUNK_ROWS", 3)
    monkeypatch.setattr(pg_append, "APPEND_CHUNK_CHARS", 200)  # and by size: the big row alone
    st = PostgresStore(pg_fresh_dsn, background_index=False)
    try:
        st.ensure_session("s")
        texts = [f"chunked row {i}" if i != 5 else "big " * 100 for i in range(11)]
        assert pg_append.chunks([len(t) * 2 for t in texts]) == [
            (0, 3), (3, 5), (5, 6), (6, 9), (9, 11)]
        ids = st.append_messages("s", [nm(t) for t in texts])
        got = st.session_messages("s", after_seq=-1, limit=100)
        assert [m.id for m in got] == ids and ids == sorted(ids)
        assert [m.text for m in got] == texts and [m.seq for m in got] == list(range(11))
        with psycopg.connect(pg_fresh_dsn, autocommit=True) as c:
            assert c.execute("SELECT count(*) FROM message_index_pending").fetchone()[0] == 11
    finally:
        st.close()


def test_an_append_finds_the_sessions_last_seq_in_one_index_step(pg_fresh_dsn):
    """The statistics of a session that was new stay behind while it grows: MAX(seq) was then
    planned through the (session_id, id) index and read the whole session on every append."""
    from lossless_context.store.postgres.store import APPEND_HEAD

    st = PostgresStore(pg_fresh_dsn, background_index=False)
    try:
        for k in range(5):
            st.ensure_session(f"old{k}")
            st.append_messages(f"old{k}", [nm(f"old {i}") for i in range(600)])
        with psycopg.connect(pg_fresh_dsn, autocommit=True) as c:
            c.execute("ANALYZE messages")  # every session known to the statistics is one of these
        st.ensure_session("s")  # so any other is estimated at one row
        st.append_messages("s", [nm("first")] + [nm(f"row {i}") for i in range(2000)])

        def rows_read(sql: str) -> int:
            with psycopg.connect(pg_fresh_dsn, autocommit=True) as c:
                plan = c.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, ("s",)).fetchone()[0][0]["Plan"]

            def walk(node: dict) -> int:
                own = node.get("Actual Rows", 0) * node.get("Actual Loops", 1) if "Scan" in node["Node Type"] else 0
                return own + sum(walk(k) for k in node.get("Plans", []))

            return walk(plan)

        control = "SELECT COALESCE(MAX(seq), -1) FROM messages WHERE session_id=%s"
        assert rows_read(control) > 1000  # the old statement reads the session
        assert rows_read(APPEND_HEAD) <= 2  # the session's row and its last message
        assert st.append_messages("s", [nm("next")]) and st.session_messages("s", 2000)[0].seq == 2001
    finally:
        st.close()


def _pending(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as c:
        return c.execute("SELECT count(*) FROM message_index_pending").fetchone()[0]


def _held_append(st: PostgresStore, session: str):
    """An append of `st` under way until the returned event is set: its rows are lazy and the
    first one waits (the store reads them inside the append)."""
    go, inside = threading.Event(), threading.Event()

    def rows():
        inside.set()
        go.wait(60)
        yield nm("the held append's row")

    t = threading.Thread(target=st.append_messages, args=(session, rows()), daemon=True)
    t.start()
    assert inside.wait(30)
    return go, t


def test_the_background_indexer_gives_way_to_an_append_under_way(pg_fresh_dsn, monkeypatch):
    """Issue 41: while the host waits for an append, the background indexer starts no batch
    (its lcm_tsvector work would share the cores with the append); it indexes once the append
    is done - and, past YIELD_SECONDS, even while one is still under way."""
    from lossless_context.store.postgres import index as pg_index

    monkeypatch.setattr(pg_index, "YIELD_SECONDS", 60.0)
    st = PostgresStore(pg_fresh_dsn)  # (its background indexer on)
    other = PostgresStore(pg_fresh_dsn, background_index=False)
    try:
        for s in ("s", "t", "u"):
            st.ensure_session(s)
        st.append_messages("u", [nm("first")])
        st.wait_indexed()
        go, held = _held_append(st, "s")
        other.append_messages("t", [nm(f"listed row {i}") for i in range(40)])
        st.append_messages("u", [nm("a second append wakes the indexer")])  # (it ends: the held one does not)
        deadline = time.monotonic() + 1.5  # (an observation window, not a timing claim)
        while time.monotonic() < deadline:
            assert _pending(pg_fresh_dsn) >= 41, "the indexer ran a batch during an append"
            time.sleep(0.05)
        go.set()
        held.join(30)
        deadline = time.monotonic() + 60
        while _pending(pg_fresh_dsn) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _pending(pg_fresh_dsn) == 0  # the append done, the indexer took the rows

        monkeypatch.setattr(pg_index, "YIELD_SECONDS", 0.2)  # an append that lasts: indexed anyway
        go, held = _held_append(st, "s")
        other.append_messages("t", [nm(f"more listed row {i}") for i in range(10)])
        st.append_messages("u", [nm("and a third")])
        deadline = time.monotonic() + 60
        while _pending(pg_fresh_dsn) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _pending(pg_fresh_dsn) == 0 and held.is_alive()
        go.set()
        held.join(30)
        assert [m.text for m in st.session_messages("s")][-1] == "the held append's row"
    finally:
        other.close()
        st.close()
