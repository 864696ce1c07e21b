"""A lineage's summaries among a gateway's (both backends).

A gateway's store holds every user's summaries; a search is of one user's lineage. Planned as
one statement, a search of the lineage's summaries read the query's matches among all of them
(or walked them newest first down to the lineage's): among 46,000 summaries a lineage's newest
matches of "retry" took 145 ms on PostgreSQL, 45 on SQLite. Now PostgreSQL tests a small
lineage's summaries by key (``lcm_fts_summaries``, migration 029) and SQLite searches its
index of summaries by session (migration 015; or the lineage's id ranges newest first); each
must answer what the store-wide search, kept to the lineage, answers. Here 24 users compact in turns, so each lineage's summaries are runs of ids
between everyone else's.
"""

from __future__ import annotations

import contextlib
import random
import uuid
from typing import Any, Iterator

import pytest

from lossless_context.records import NewMessage, NewSummary
from lossless_context.search.query import plan_query
from lossless_context.store import open_store
from lossless_context.store.postgres import search as pg_search
from lossless_context.store.postgres.store import PostgresStore
from lossless_context.store.sqlite import search as sqlite_search
from tests.support.pg import counted

WORDS = ["deploy", "window", "ledger", "invoice", "cache", "queue", "shard", "replica", "quota", "cursor"]
USERS, PASSES, PER_PASS = 24, 6, 3
_SUMMARY_READS = ("SELECT COALESCE(seq_tup_read, 0) + COALESCE(idx_tup_fetch, 0) FROM pg_stat_user_tables"
                  " WHERE relname = 'summaries'")
T0 = 1_700_000_000.0


def _nm(text: str, t: float) -> NewMessage:
    return NewMessage(raw={"role": "user", "content": text}, role="user", ident=uuid.uuid4().hex, uid=None, text=text,
                      tokens=len(text) // 4 + 1, created_at=t)


@pytest.fixture(params=["sqlite", "postgres"])
def gateway(request, tmp_path):
    """(store, {user: the ids of its published summaries}). Each user's summaries say what
    most say ("deploy ... retry") and some a rarer thing ("ERR_QUOTA_7"); one user's passes
    are staged only (never found)."""
    if request.param == "sqlite":
        st = open_store(str(tmp_path / "gw.db"))
    else:  # one connection: the server's statistics of what it read are what some tests count
        st = PostgresStore(request.getfixturevalue("pg_fresh_dsn"), pool_max=1)
    rng = random.Random(29)
    mine: dict[str, list[int]] = {f"u{u}": [] for u in range(USERS)}
    try:
        for u in mine:
            st.ensure_session(u, conversation_id=f"conv-{u}")
        t = T0
        for p in range(PASSES):
            for u in mine:
                mids = st.append_messages(u, [_nm(f"{u} said {rng.choice(WORDS)}", t + k) for k in range(PER_PASS)])
                v, e = st.get_context(u)
                sums = [NewSummary(key=f"L{k}", kind="leaf", depth=0, level="normal", summarizer="test",
                                   text=" ".join(rng.choice(WORDS) for _ in range(6)) + " retry"
                                   + (" ERR_QUOTA_7" if (p + k) % 4 == 0 else ""),
                                   tokens=10, source_tokens=100, t_start=t, t_end=t + k, n_messages=1,
                                   message_ids=[mid]) for k, mid in enumerate(mids)]
                km, _ = st.stage_pass(u, f"{u}-{p}", sums, [("s", s.key) for s in sums], v, len(e))
                if u != "u5":
                    assert st.publish_pass(f"{u}-{p}")
                    mine[u] += sorted(km.values())
                t += 10
        mine["u5"] = []
        yield st, mine
    finally:
        st.close()


@contextlib.contextmanager
def _stats_server(st, request) -> Iterator[Any]:
    """A connection to the PostgreSQL store's server (its statistics flushed on demand: 15+),
    the summaries analysed; the test is skipped on SQLite or an older server."""
    if st.kind != "postgresql":
        pytest.skip("PostgreSQL's statistics")
    psycopg = pytest.importorskip("psycopg")
    with psycopg.connect(request.getfixturevalue("pg_fresh_dsn"), autocommit=True) as c:
        if c.info.server_version < 150000:
            pytest.skip("pg_stat_force_next_flush needs PostgreSQL 15")
        c.execute("ANALYZE summaries")
        yield c


def _spy_scoped(monkeypatch) -> list[int]:
    """A list that grows each time SQLite searches the index of summaries by session."""
    used: list[int] = []
    real = sqlite_search.SQLiteSearch._search_scoped
    monkeypatch.setattr(sqlite_search.SQLiteSearch, "_search_scoped",
                        lambda self, *a, **k: used.append(1) or real(self, *a, **k))
    return used


def _kept(st, scope: list[str], q: str, order: str) -> list[dict]:
    """The store-wide search (every user's summaries), kept to ``scope``."""
    rows = st.search("summaries", None, plan_query(q), mode="fts", order=order, limit=10_000)
    return [r for r in rows if r["session_id"] in scope]


@pytest.mark.parametrize("route", ["default", "other", "whole", "runs"])
def test_a_lineages_summaries_are_what_the_store_wide_search_keeps(gateway, monkeypatch, route):
    """Ranked and newest first, paged: a lineage's summaries (one user, two users, a user whose
    passes were never published) equal the store-wide search kept to the lineage, by every
    route: ``default`` PostgreSQL's probe by key and SQLite's index of summaries by session
    (migration 015); ``other`` PostgreSQL's planned statement (a lineage above its probe
    size) and SQLite's id ranges joined into one; ``whole`` a lineage too large to list,
    searched as one range; ``runs`` SQLite's ranges, one per run of a pass (the last three
    with the index by session out of the way, as for a lineage of too many sessions)."""
    st, mine = gateway
    if route != "default":
        monkeypatch.setattr(sqlite_search, "MAX_SCOPED_SESSIONS", 0)
    if route == "other":
        monkeypatch.setattr(pg_search, "SUMMARY_PROBE_ROWS", 2)
        monkeypatch.setattr(sqlite_search, "MAX_RANGES", 1)
    elif route == "whole":
        monkeypatch.setattr(pg_search, "SUMMARY_PROBE_ROWS", 2)
        monkeypatch.setattr(sqlite_search, "MAX_LISTED", 3)
    elif route == "runs":
        monkeypatch.setattr(sqlite_search, "NEAR_SUMMARY_IDS", 0)  # one range per run of a pass
    used = _spy_scoped(monkeypatch)
    for scope in (["u3"], ["u0", "u17"], ["u5"], ["u23", "nobody"]):
        for q in ("retry", "ERR_QUOTA_7", "deploy window", "absentword"):
            for order in ("rank", "recent"):
                want = _kept(st, scope, q, order)
                for limit, offset in ((5, 0), (4, 3), (100, 0)):
                    got = st.search("summaries", scope, plan_query(q), mode="fts", order=order, limit=limit,
                                    offset=offset)
                    assert [r["id"] for r in got] == [r["id"] for r in want[offset:offset + limit]], \
                        (scope, q, order, limit, offset)
                    if order == "rank":
                        assert [r["rank"] for r in got] == pytest.approx([r["rank"] for r in want[offset:offset + limit]])
                    assert {r["id"] for r in got} <= {i for u in scope for i in mine.get(u, [])}
    assert _kept(st, ["u3"], "retry", "recent") and not _kept(st, ["u5"], "retry", "recent")
    assert bool(used) == (route == "default" and st.kind == "sqlite")


def _summary(text: str, mid: int, t: float) -> NewSummary:
    return NewSummary(key="L", kind="leaf", depth=0, level="normal", summarizer="test", text=text, tokens=10,
                      source_tokens=100, t_start=t, t_end=t, n_messages=1, message_ids=[mid])


def test_sqlite_sessions_named_in_the_index_of_summaries_by_session(tmp_path, monkeypatch):
    """SQLite names a lineage's sessions as phrases of the session column (migration 015). A
    phrase also matches a longer id that holds its words ("a" in "a-b" and "a b"): those
    summaries are not the lineage's and are not returned; an id with a double quote is
    quoted; an id without a letter or digit (its phrase would be empty) and a lineage of more
    sessions than MAX_SCOPED_SESSIONS take the id ranges."""
    st = open_store(str(tmp_path / "s.db"))
    used = _spy_scoped(monkeypatch)
    sids = ["a", "a-b", "a b", 'say "hi"', "---", "b"]
    ids: dict[str, list[int]] = {}
    try:
        t = T0
        for p in range(3):
            for sid in sids:
                st.ensure_session(sid, conversation_id="c-" + sid)
                mid = st.append_messages(sid, [_nm(f"{sid} msg", t)])[0]
                v, e = st.get_context(sid)
                km, _ = st.stage_pass(sid, f"{sid}/{p}", [_summary(f"retry number {p} a b hi", mid, t)],
                                      [("s", "L")], v, len(e))
                assert st.publish_pass(f"{sid}/{p}")
                ids.setdefault(sid, []).append(km["L"])
                t += 1
        for scope, scoped in ((["a"], True), (["a b"], True), (['say "hi"'], True), (["---"], False),
                              (["---", "b"], False), (["a", "nobody"], True)):
            used.clear()
            got = st.search("summaries", scope, plan_query("retry"), mode="fts", order="recent", limit=10)
            assert [r["id"] for r in got] == sorted((i for s in scope for i in ids.get(s, [])), reverse=True), scope
            assert bool(used) == scoped, scope
        monkeypatch.setattr(sqlite_search, "MAX_SCOPED_SESSIONS", 1)
        used.clear()
        got = st.search("summaries", ["a", "b"], plan_query("retry"), mode="fts", order="recent", limit=10)
        assert [r["id"] for r in got] == sorted(ids["a"] + ids["b"], reverse=True) and not used
    finally:
        st.close()


def test_postgres_reads_only_the_lineages_summaries(gateway, request):
    """On PostgreSQL a lineage's newest matches of a word every summary holds read about the
    lineage's summaries, not every user's (432 here)."""
    st, mine = gateway
    with _stats_server(st, request) as c:
        total = c.execute("SELECT count(*) FROM summaries").fetchone()[0]
        for order in ("rank", "recent"):
            got, n = counted(st, c, _SUMMARY_READS, lambda: st.search("summaries", ["u3"], plan_query("retry"),
                                                                      mode="fts", order=order, limit=5))
            assert len(got) == 5
            assert n <= 3 * len(mine["u3"]) < total / 4, order


def test_postgres_counts_a_common_word_of_summaries_from_the_statistics(gateway, request):
    """A word ANALYZE finds in most summaries is counted from the planner's statistics, capped
    or among the newest, without reading the summaries (a windowed count of four common words
    among 46,000 summaries read them: 250 ms); a rare one is still counted."""
    st, mine = gateway
    with _stats_server(st, request) as c:
        total = c.execute("SELECT count(*) FROM summaries").fetchone()[0]
        rare = c.execute("SELECT count(*) FROM summaries WHERE tsv @@ to_tsquery('english', %s)",
                         (plan_query("ERR_QUOTA_7").pg_tsquery,)).fetchone()[0]

        retry = plan_query("retry")
        # (at most the newest id is read: the store's size)
        got, n = counted(st, c, _SUMMARY_READS, lambda: st.term_counts("summaries", [retry], 50))
        assert got == [51] and n <= 1
        got, n = counted(st, c, _SUMMARY_READS, lambda: st.term_counts("summaries", [retry], 200, newest=100))
        assert n <= 1 and 90 <= got[0] <= 101  # the word's frequency (every summary) times the window
        assert st.term_counts_many([("summaries", [retry])], 50) == [[51]]
        assert st.term_counts("summaries", [plan_query("ERR_QUOTA_7")], total) == [rare] and 0 < rare < total


def test_postgres_pairs_that_meet_are_found_in_the_newest_summaries(gateway, request):
    """A search's term-pair tests of summaries (lcm_any_match, migration 030) answer what
    counting each pair answers; a pair that meets is found among the newest summaries, reading
    a few of them rather than the full-text index's entries for both words (every summary's,
    here; a gateway's 48,000: 16 ms for a question's pairs)."""
    st, mine = gateway
    with _stats_server(st, request) as c:
        pairs = [plan_query(q).subset([0, 1], "AND") for q in ("retry deploy", "retry ERR_QUOTA_7", "ledger window",
                                                                "retry absentword", "absentword ERR_QUOTA_7")]
        want = [n > 0 for n in st.term_counts("summaries", pairs, 1)]
        assert want == [True, True, True, False, False]
        entries = ("SELECT COALESCE(sum(idx_tup_read), 0) FROM pg_stat_user_indexes"  # by any index
                   " WHERE relname = 'summaries'")
        meet = [pairs[0], pairs[2]]  # words half (a fifth) of the summaries hold together
        for _ in range(6):  # past the calls after which PL/pgSQL may keep a generic plan
            st.any_match("summaries", meet, 5.0)
        got, n = counted(st, c, entries, lambda: st.any_match("summaries", meet, 5.0))
        assert got == [True, True]
        assert n <= 2 * 64  # the newest summaries, until each pair meets
        assert st.any_match("summaries", pairs, 5.0) == want


def test_doctor_checks_and_rebuilds_the_index_of_summaries_by_session(tmp_path):
    """`lcm doctor` checks the index of summaries by session with the other full-text indexes
    and rebuilds it with --repair; the lineage's search then finds what it held."""
    import sqlite3

    from lossless_context.ops.doctor import run_doctor

    path = str(tmp_path / "d.db")
    st = open_store(path)
    try:
        st.ensure_session("u", conversation_id="c")
        mid = st.append_messages("u", [_nm("hello", T0)])[0]
        v, e = st.get_context("u")
        km, _ = st.stage_pass("u", "p", [_summary("the retry limit", mid, T0)], [("s", "L")], v, len(e))
        assert st.publish_pass("p")
        name = "full-text index summaries_scoped_fts in sync"
        assert [k.ok for k in run_doctor(st).checks if k.name == name] == [True]
        c = sqlite3.connect(path, isolation_level=None)
        c.execute("INSERT INTO summaries_scoped_fts(summaries_scoped_fts) VALUES ('delete-all')")
        c.close()
        assert st.search("summaries", ["u"], plan_query("retry"), mode="fts", order="recent") == []
        [check] = [k for k in run_doctor(st, repair=True).checks if k.name == name]
        assert not check.ok and check.repaired
        assert [k.ok for k in run_doctor(st).checks if k.name == name] == [True]
        got = st.search("summaries", ["u"], plan_query("retry"), mode="fts", order="recent")
        assert [r["id"] for r in got] == [km["L"]]
    finally:
        st.close()


@pytest.mark.parametrize("route", ["spans", "runs", "runs and the rest", "runs joined"])
def test_a_lineages_newest_messages_are_what_the_store_wide_search_keeps(gateway, monkeypatch, route):
    """A lineage's newest matching messages, paged, equal the store-wide search kept to the
    lineage, whichever way SQLite walks it: each session's span (``spans``: a session dense in
    its ids), the runs of a session sparse in its span (a gateway's user: ``runs``), with its
    older part beyond the listed ids as one range (``runs and the rest``), or the runs joined
    down to a few ranges (``runs joined``)."""
    st, mine = gateway
    if st.kind != "sqlite":
        pytest.skip("SQLite's id ranges")
    listed = []
    real = sqlite_search._runs
    monkeypatch.setattr(sqlite_search, "_runs", lambda *a: listed.append(a[1]) or real(*a))
    if route != "spans":
        monkeypatch.setattr(sqlite_search, "SPARSE_SPAN", 10)  # each user's span here is ~430 ids
        monkeypatch.setattr(sqlite_search, "NEAR_SUMMARY_IDS", 0)
    if route == "runs and the rest":
        monkeypatch.setattr(sqlite_search, "MAX_LISTED", 5)
    elif route == "runs joined":
        monkeypatch.setattr(sqlite_search, "MAX_RANGES", 2)
    for scope in (["u3"], ["u0", "u17"], ["u5"], ["u23", "nobody"]):
        for q in ("said", "deploy", "u3", "absentword"):
            rows = st.search("messages", None, plan_query(q), mode="fts", order="recent", limit=10_000)
            want = [r["id"] for r in rows if r["session_id"] in scope]
            for limit, offset in ((5, 0), (4, 3), (100, 0)):
                got = st.search("messages", scope, plan_query(q), mode="fts", order="recent", limit=limit,
                                offset=offset)
                assert [r["id"] for r in got] == want[offset:offset + limit], (scope, q, limit, offset)
    assert bool(listed) == (route != "spans")
