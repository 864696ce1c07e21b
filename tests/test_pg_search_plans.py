"""How searches of messages on PostgreSQL are planned (search.py).

* CJK substrings (migration 020): a needle whose bigrams the statistics call rare goes to
  ``lcm_cjk_messages``, whose plan is kept per connection and fixed by its shape (bigram index,
  then each candidate by key); a common one keeps the statement planned per call, and scoped to
  a lineage reads that lineage's CJK rows (migration 023), however many calls it has had.
* Ranked full-text searches filtered by scope alone (migration 021): ``lcm_fts_messages_ranked``.
* Full-text searches of the messages under one summary (migration 024): ``lcm_fts_under``.

Each must answer exactly what a scan of the texts answers, in scope, with still-unindexed rows;
which searches take a function is seen by a spy on the server. Every test runs on a real
throw-away server.
"""

from __future__ import annotations

import random
import uuid

import pytest

from lossless_context.records import NewMessage
from lossless_context.search.query import plan_query
from lossless_context.store.postgres import search as pg_search
from lossless_context.store.postgres.search import cjk_bigrams
from lossless_context.store.postgres.store import PostgresStore
from tests.support.pg import counted

psycopg = pytest.importorskip("psycopg")

RARE = "青龙七号暗号"
COMMON = "我们已经"
N = 3000


def nm(text: str, t: float) -> NewMessage:
    return NewMessage(raw={"role": "user", "content": text}, role="user", ident=uuid.uuid4().hex, uid=None,
                      text=text, tokens=len(text) // 2 + 1, created_at=t)


def _texts(rng: random.Random, n: int, rare_every: int) -> list[str]:
    chars = [chr(x) for x in range(0x4E00, 0x4E00 + 3000)]
    return [COMMON + "".join(rng.choice(chars) for _ in range(30)) + (RARE if i % rare_every == 7 else "")
            for i in range(n)]


@pytest.fixture
def cjk_store(pg_fresh_dsn):
    """Two lineages of CJK messages (every one holds COMMON, a few RARE), indexed and analysed,
    then one more RARE message in each left unindexed. Yields (store, dsn, texts by id, session by id)."""
    rng = random.Random(3)
    st = PostgresStore(pg_fresh_dsn, background_index=False)
    texts: dict[int, str] = {}
    owner: dict[int, str] = {}
    try:
        for sid, conv in (("a", "conv-a"), ("b", "conv-b")):
            st.ensure_session(sid, conversation_id=conv)
            batch = _texts(rng, N // 2, 250)
            for i, t in zip(st.append_messages(sid, [nm(t, 1e9 + k) for k, t in enumerate(batch)]), batch):
                texts[i], owner[i] = t, sid
        st.wait_indexed()
        with psycopg.connect(pg_fresh_dsn, autocommit=True) as c:
            c.execute("ANALYZE message_index")
        for sid in ("a", "b"):
            t = f"刚才说的{RARE}不要外传"
            (i,) = st.append_messages(sid, [nm(t, 2e9)])  # listed, not indexed (background_index off)
            texts[i], owner[i] = t, sid
        yield st, pg_fresh_dsn, texts, owner
    finally:
        st.close()


def _expected(texts: dict[int, str], owner: dict[int, str], needle: str, scope: list[str] | None) -> list[int]:
    return sorted((i for i, t in texts.items() if needle in t and (scope is None or owner[i] in scope)),
                  reverse=True)


def _found(st: PostgresStore, needle: str, scope: list[str] | None, limit: int, offset: int = 0) -> list[int]:
    rows = st.search("messages", scope, plan_query(needle), mode="substring", limit=limit, offset=offset)
    return [r["id"] for r in rows]


_ROWS = "RETURNS TABLE(id bigint, session_id text, role text, created_at float8, text text, rank float8)"
_FUNCS = {
    "lcm_cjk_messages": ("scope text[], grams text[], needle text, top int, lim int, skip int",
                         "scope, grams, needle, top, lim, skip"),
    "lcm_fts_messages_ranked": ("scope text[], q tsquery, top int, lim int, skip int", "scope, q, top, lim, skip"),
}


def _spy(dsn: str, name: str = "lcm_cjk_messages") -> None:
    """Count calls of one of the functions on the server: the real function renamed, a wrapper
    that bumps a sequence and returns its rows (the store's own connections call it)."""
    params, args = _FUNCS[name]
    types = ", ".join(p.split()[1] for p in params.split(", "))
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f"CREATE SEQUENCE {name}_calls")
        c.execute(f"ALTER FUNCTION {name}({types}) RENAME TO {name}_real")
        c.execute(f"CREATE FUNCTION {name}({params}) {_ROWS} LANGUAGE plpgsql AS $f$"
                  f" BEGIN PERFORM nextval('{name}_calls'); RETURN QUERY SELECT * FROM {name}_real({args}); END $f$")


def _calls(dsn: str, name: str = "lcm_cjk_messages") -> int:
    with psycopg.connect(dsn, autocommit=True) as c:
        last, called = c.execute(f"SELECT last_value, is_called FROM {name}_calls").fetchone()
        return last if called else 0


def test_rare_and_common_needles_find_what_a_scan_of_the_texts_finds(cjk_store):
    st, dsn, texts, owner = cjk_store
    for needle in (RARE, COMMON, RARE[:3], "不要外传"):
        for scope in (["a"], ["b"], ["a", "b"], None):
            want = _expected(texts, owner, needle, scope)
            assert want, (needle, scope)
            assert _found(st, needle, scope, 10) == want[:10], (needle, scope)
            assert _found(st, needle, scope, 5, offset=3) == want[3:8], (needle, scope)
    # the unindexed rows are seen, and one lineage never sees the other's
    assert _found(st, RARE, ["a"], 50)[0] == max(i for i, s in owner.items() if s == "a")
    assert not set(_found(st, RARE, ["a"], 50)) & {i for i, s in owner.items() if s == "b"}


def test_only_rare_needles_take_the_kept_plan(cjk_store):
    st, dsn, texts, owner = cjk_store
    _spy(dsn)
    assert _found(st, RARE, ["a"], 10) == _expected(texts, owner, RARE, ["a"])[:10]
    assert _calls(dsn) == 1
    assert _found(st, COMMON, ["a"], 10) == _expected(texts, owner, COMMON, ["a"])[:10]
    assert _calls(dsn) == 1  # every message holds its bigrams: planned per call
    # a role filter is not the function's: planned per call too, and still right
    rows = st.search("messages", ["a"], plan_query(RARE), mode="substring", role="user", limit=10)
    assert [r["id"] for r in rows] == _expected(texts, owner, RARE, ["a"])[:10]
    assert _calls(dsn) == 1
    # several targets at once (lcm_grep's path) route the same way
    (msgs, _sums) = st.search_substrings([
        ("messages", {"session_ids": ["b"], "plan": plan_query(RARE), "limit": 10}),
        ("summaries", {"session_ids": ["b"], "plan": plan_query(RARE), "limit": 10})])
    assert [r["id"] for r in msgs] == _expected(texts, owner, RARE, ["b"])[:10]
    assert _calls(dsn) == 2


def _tuples_read(c) -> int:
    c.execute("SELECT pg_stat_force_next_flush()")
    return c.execute("SELECT COALESCE(idx_tup_fetch, 0) + COALESCE(seq_tup_read, 0) FROM pg_stat_user_tables"
                     " WHERE relname = 'messages'").fetchone()[0]


def test_the_kept_plan_reads_only_the_candidates(cjk_store):
    """A rare needle reads a handful of messages through the function (its plan is fixed by its
    shape: at 50,000 CJK messages a generic plan of the plain statement walked every id)."""
    st, dsn, texts, owner = cjk_store
    with psycopg.connect(dsn, autocommit=True) as c:
        if c.info.server_version < 150000:
            pytest.skip("pg_stat_force_next_flush needs PostgreSQL 15")
        grams = cjk_bigrams(RARE)
        before = _tuples_read(c)
        got = c.execute("SELECT id FROM lcm_cjk_messages(%s::text[], %s::text[], %s, 10, 10, 0)",
                        (["a"], grams, RARE)).fetchall()
        after = _tuples_read(c)
        assert [r[0] for r in got] == _expected(texts, owner, RARE, ["a"])[:10]
        assert after - before <= 4 * len(_expected(texts, owner, RARE, None))
        # control: the counter sees a search that reads every message
        before = _tuples_read(c)
        c.execute("SELECT count(*) FROM messages WHERE strpos(text, %s) > 0", (RARE,)).fetchone()
        assert _tuples_read(c) - before >= N


def test_without_statistics_the_planner_decides(pg_fresh_dsn):
    """Before message_index was ever analysed nothing is called rare (the statement is planned
    per call, as before migration 020); once it is, a store that reads them routes rare needles."""
    st = PostgresStore(pg_fresh_dsn, background_index=False)
    try:
        st.ensure_session("a", conversation_id="conv-a")
        with psycopg.connect(pg_fresh_dsn, autocommit=True) as c:
            c.execute("ALTER TABLE message_index SET (autovacuum_enabled = false)")
        texts = _texts(random.Random(5), 400, 50)
        ids = st.append_messages("a", [nm(t, 1e9 + k) for k, t in enumerate(texts)])
        st.wait_indexed()
        want = sorted((i for i, t in zip(ids, texts) if RARE in t), reverse=True)
        _spy(pg_fresh_dsn)
        assert _found(st, RARE, ["a"], 10) == want[:10]
        assert _calls(pg_fresh_dsn) == 0
        with psycopg.connect(pg_fresh_dsn, autocommit=True) as c:
            c.execute("ANALYZE message_index")
    finally:
        st.close()
    again = PostgresStore(pg_fresh_dsn, background_index=False)
    try:
        assert _found(again, RARE, ["a"], 10) == want[:10]
        assert _calls(pg_fresh_dsn) == 1
    finally:
        again.close()


# -- ranked full-text search by scope (migration 021) ------------------------------------------

WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet"]


@pytest.fixture
def fts_store(pg_fresh_dsn):
    """Two lineages of English messages, indexed; some index rows without their session (as
    rows indexed before migration 013 are); then a few more left unindexed."""
    rng = random.Random(11)
    st = PostgresStore(pg_fresh_dsn, background_index=False)
    texts: dict[int, str] = {}
    owner: dict[int, str] = {}

    def add(sid: str, batch: list[str], t0: float) -> None:
        for i, t in zip(st.append_messages(sid, [nm(t, t0 + k) for k, t in enumerate(batch)]), batch):
            texts[i], owner[i] = t, sid

    try:
        for sid, conv in (("a", "conv-a"), ("b", "conv-b")):
            st.ensure_session(sid, conversation_id=conv)
            add(sid, [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12)))
                      + (" ZK-4754 deploy key" if k % 97 == 5 else "") for k in range(600)], 1e9)
        st.wait_indexed()
        with psycopg.connect(pg_fresh_dsn, autocommit=True) as c:
            c.execute("UPDATE message_index SET session_id = NULL WHERE id % 3 = 0")
            c.execute("ANALYZE message_index")
        for sid in ("a", "b"):
            add(sid, ["the ZK-4754 deploy key rotated again", "alpha bravo and the ZK-4754 key"], 2e9)
        yield st, pg_fresh_dsn, texts, owner
    finally:
        st.close()


def _ranked_by_sql(dsn: str, q: str, scope: list[str] | None, n: int) -> list[int]:
    """The ranking computed from every message's own text (nothing indexed is used)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        return [r[0] for r in c.execute(
            "SELECT id FROM (SELECT id, -ts_rank_cd(lcm_tsvector(text), to_tsquery('english', %s), 1) AS r"
            " FROM messages WHERE lcm_tsvector(text) @@ to_tsquery('english', %s)"
            " AND (%s::text[] IS NULL OR session_id = ANY(%s::text[]))) s ORDER BY r, id DESC LIMIT %s",
            (q, q, scope, scope, n)).fetchall()]


def test_ranked_search_by_scope_answers_what_the_texts_answer(fts_store):
    st, dsn, texts, owner = fts_store
    _spy(dsn, "lcm_fts_messages_ranked")
    calls = 0
    for query in ("ZK-4754", "deploy key", "alpha"):
        plan = plan_query(query)
        for scope in (["a"], ["b"], ["a", "b"], None):
            for limit, offset in ((10, 0), (5, 4)):
                got = [r["id"] for r in st.search("messages", scope, plan, mode="fts", order="rank",
                                                  limit=limit, offset=offset)]
                calls += 1
                # (the query the store sends: an identifier as its whole lexeme, migration 033)
                want = _ranked_by_sql(dsn, st._tsq(plan.pg_tsquery), scope, limit + offset)[offset:]
                assert got == want, (query, scope, limit, offset)
                assert got, (query, scope)
    assert _calls(dsn, "lcm_fts_messages_ranked") == calls
    # unindexed rows are among the hits, and a lineage never sees the other's
    got = st.search("messages", ["a"], plan_query("ZK-4754"), mode="fts", order="rank", limit=50)
    assert {r["id"] for r in got} == {i for i, t in texts.items() if "ZK-4754" in t and owner[i] == "a"}


def _newest_by_sql(dsn: str, q: str, scope: list[str] | None, n: int) -> list[int]:
    """The newest matches computed from every message's own text (nothing indexed is used)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        return [r[0] for r in c.execute(
            "SELECT id FROM messages WHERE lcm_tsvector(text) @@ to_tsquery('english', %s)"
            " AND (%s::text[] IS NULL OR session_id = ANY(%s::text[])) ORDER BY id DESC LIMIT %s",
            (q, scope, scope, n)).fetchall()]


@pytest.fixture
def interleaved_store(pg_fresh_dsn):
    """Three sessions written in turns (their ids interleave), some index rows without their
    session, then a few rows left unindexed. Yields (store, dsn)."""
    rng = random.Random(5)
    st = PostgresStore(pg_fresh_dsn, background_index=False)
    try:
        for sid in ("s1", "s2", "s3"):
            st.ensure_session(sid, conversation_id=f"conv-{sid}")
        for turn in range(30):
            for k, sid in enumerate(("s1", "s2", "s3")):
                n = 5 + (turn * 7 + k * 3) % 17
                st.append_messages(sid, [nm(" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 9)))
                                            + (" ZK-4754 deploy key" if rng.random() < 0.05 else ""),
                                            1e9 + turn) for _ in range(n)])
        st.wait_indexed()
        with psycopg.connect(pg_fresh_dsn, autocommit=True) as c:
            c.execute("UPDATE message_index SET session_id = NULL WHERE id % 5 = 0")
        for sid in ("s1", "s3"):
            st.append_messages(sid, [nm("alpha bravo ZK-4754 deploy key, not indexed yet", 2e9)])
        yield st, pg_fresh_dsn
    finally:
        st.close()


@pytest.mark.parametrize("walk,chunk", [(4000, 256), (300, 7), (40, 3), (1, 1)])
def test_newest_matches_of_a_lineage_answer_what_the_texts_answer(interleaved_store, monkeypatch, walk, chunk):
    """A lineage's newest matches of a term (order="recent": lcm_fts_newest walks each session
    newest first in chunks, newest session first, and runs the planned statement when the page
    would take more than its budget) and the whole store's (the newest rows walked, then the
    index below them): the same answer whichever part finds them - walks that cover everything
    (4000), or stop short of the page (300, 40, 1), in chunks of 256 rows down to one - with
    interleaved sessions, index rows that lack their session and rows not indexed."""
    monkeypatch.setattr(pg_search, "NEWEST_WALK_ROWS", walk)
    monkeypatch.setattr(pg_search, "NEWEST_BUDGET_ROWS", walk)
    monkeypatch.setattr(pg_search, "NEWEST_CHUNK_ROWS", chunk)
    st, dsn = interleaved_store
    for query in ("alpha", "ZK-4754", "deploy key", "alpha bravo", "golf"):
        plan = plan_query(query)
        for scope in (["s1"], ["s2"], ["s1", "s3"], ["s3", "s2", "s1", "nobody"], None):
            for limit, offset in ((10, 0), (5, 4), (60, 0)):
                got = [r["id"] for r in st.search("messages", scope, plan, mode="fts", order="recent",
                                                  limit=limit, offset=offset)]
                want = _newest_by_sql(dsn, plan.pg_tsquery, scope, limit + offset)[offset:]
                assert got == want, (query, scope, limit, offset, walk)
                assert got, (query, scope)


def test_other_searches_keep_their_planned_statements(fts_store):
    st, dsn, texts, owner = fts_store
    _spy(dsn, "lcm_fts_messages_ranked")
    plan = plan_query("alpha")
    st.search("messages", ["a"], plan, mode="fts", order="recent", limit=10)  # newest first
    st.search("messages", ["a"], plan, mode="fts", order="rank", role="user", limit=10)  # a filter
    st.search("messages", ["a"], plan, mode="fts", order="rank", since=1.0, limit=10)
    st.search("summaries", ["a"], plan, mode="fts", order="rank", limit=10)
    assert _calls(dsn, "lcm_fts_messages_ranked") == 0
    st.search("messages", ["a"], plan, mode="fts", order="rank", limit=10)
    assert _calls(dsn, "lcm_fts_messages_ranked") == 1


# -- a common CJK needle in one lineage of many (migration 023; searches never prepared) -------

_READS = ("SELECT COALESCE(idx_tup_fetch, 0) + COALESCE(seq_tup_read, 0) FROM pg_stat_user_tables"
          " WHERE relname = 'message_index'")


def _reads(c) -> int:
    return c.execute(_READS).fetchone()[0]


def _index_reads(st: PostgresStore, c, fn):
    """(fn(), the message_index rows read while it ran), as the server counts them (``st`` has
    one connection: pool_max=1)."""
    return counted(st, c, _READS, fn)


def test_a_common_word_reads_only_its_own_lineage_every_time(pg_fresh_dsn):
    """120 users; the oldest searches a word in 30% of all messages. Its bigrams occur
    together, so it is common (not routed by their product: 2.7%); the search reads the user's
    own CJK rows, not every match in the store (7,184 here, before migration 023) nor the
    newest rows down to its own - on its first call and on its twelfth (a statement the driver
    prepared could be given one generic plan by the server: at 60,000 messages the scoped
    statement before 023 turned into that walk on its 11th call, 101 -> 59,730 rows)."""
    users, per, word = 120, 200, "已经部署"
    st = PostgresStore(pg_fresh_dsn, background_index=False, pool_max=1)  # one connection: its stats
    try:
        rng = random.Random(8)
        chars = [chr(x) for x in range(0x4E00, 0x4E00 + 3000)]
        mine: list[int] = []
        for u in range(users):
            sid = f"user{u}"
            st.ensure_session(sid, conversation_id=sid)
            texts = ["".join(rng.choice(chars) for _ in range(30)) + (word if rng.random() < 0.3 else "")
                     for _ in range(per)]
            ids = st.append_messages(sid, [nm(t, 1e9 + u * per + k) for k, t in enumerate(texts)])
            if u == 0:
                mine = [i for i, t in zip(ids, texts) if word in t]
        st.wait_indexed()
        with psycopg.connect(pg_fresh_dsn, autocommit=True) as c:
            if c.info.server_version < 150000:
                pytest.skip("pg_stat_force_next_flush needs PostgreSQL 15")
            c.execute("ANALYZE message_index")
            want = sorted(mine, reverse=True)[:10]

            def search_reads() -> int:
                got, reads = _index_reads(st, c, lambda: _found(st, word, ["user0"], 10))
                assert got == want
                return reads

            first = search_reads()
            for _ in range(10):
                _found(st, word, ["user0"], 10)
            twelfth = search_reads()
            assert first <= 2 * per and twelfth <= 2 * per, (first, twelfth)
            # control: reading every match of the word, as the search did, is counted
            c.execute("SELECT pg_stat_force_next_flush()")
            before = _reads(c)
            n = c.execute("SELECT count(*) FROM message_index x WHERE x.cjk @> %s::text[]",
                          (cjk_bigrams(word),)).fetchone()[0]
            c.execute("SELECT pg_stat_force_next_flush()")
            assert n > 20 * per * 0.3 and _reads(c) - before >= n
    finally:
        st.close()


# -- the messages under one summary (migration 024) ---------------------------------------------

UNDER_WORDS = ["deploy", "window", "rollback", "plan", "ledger", "invoice", "retry", "budget", "cache", "queue"]


@pytest.fixture
def under_store(pg_fresh_dsn):
    """1,500 messages of one session (plus a second lineage's) under three leaves and a
    condensed summary over the first two; the last 200 are still unindexed when summarised.
    Yields (store, dsn, {summary id: ids of the messages under it}, leaf over the oldest 100)."""
    from lossless_context.records import NewSummary

    rng = random.Random(11)
    st = PostgresStore(pg_fresh_dsn, background_index=False, pool_max=1)  # one connection: its stats

    def text(i: int) -> str:
        words = " ".join(rng.choice(UNDER_WORDS) for _ in range(8))
        return words + (" ERR_DEPLOY_WINDOW_7 happened" if i % 9 == 0 else "") + (" rollback plan" if i % 4 == 0 else "")

    def msgs(n: int, t0: float) -> list[NewMessage]:
        out = [nm(text(i), t0 + i) for i in range(n)]
        for k, m in enumerate(out):
            if k % 2:
                m.raw, m.role = {"role": "assistant", "content": m.text}, "assistant"
        return out

    try:
        st.ensure_session("s", conversation_id="conv-s")
        st.ensure_session("t", conversation_id="conv-t")
        st.append_messages("t", msgs(300, 1e9))
        ids = st.append_messages("s", msgs(1300, 1e9 + 1000))
        st.wait_indexed()
        ids += st.append_messages("s", msgs(200, 1e9 + 5000))  # listed, not indexed
        v, e = st.get_context("s")

        def leaf(key: str, mids: list[int]) -> NewSummary:
            return NewSummary(key=key, kind="leaf", depth=0, text=f"{key} deploy rollback", tokens=10,
                              source_tokens=100, level="normal", summarizer="test", t_start=1e9, t_end=2e9,
                              n_messages=len(mids), message_ids=mids)

        km, _ = st.stage_pass("s", "p", [
            leaf("A", ids[:100]), leaf("B", ids[100:250]), leaf("D", ids[250:]),
            NewSummary(key="C", kind="condensed", depth=1, text="C deploy", tokens=10, source_tokens=100,
                       level="normal", summarizer="test", t_start=1e9, t_end=2e9, n_messages=250,
                       child_keys=["A", "B"]),
        ], [("s", "C"), ("s", "D")], v, len(e))
        assert st.publish_pass("p")
        under = {km["A"]: set(ids[:100]), km["B"]: set(ids[100:250]), km["D"]: set(ids[250:]),
                 km["C"]: set(ids[:250])}
        yield st, pg_fresh_dsn, under, km["A"]
    finally:
        st.close()


@pytest.mark.parametrize("probe_rows", [2000, 120])
def test_a_search_under_a_summary_is_the_search_of_its_messages(under_store, monkeypatch, probe_rows):
    """Every route of lcm_fts_under (each message read by key: probe_rows 2000; the index's
    matches kept when under the summary: 120, taken by the larger summaries) answers what the
    same search of the whole lineage answers, restricted to the summary's messages - ranked or
    newest first, paged, with role and time filters, unindexed messages included, and never a
    message of another lineage."""
    monkeypatch.setattr(pg_search, "UNDER_PROBE_ROWS", probe_rows)
    st, dsn, under, _ = under_store
    for query in ("ERR_DEPLOY_WINDOW_7", '"rollback plan"', "ledger invoice", "budget"):
        plan = plan_query(query)
        for order in ("rank", "recent"):
            for filters in ({}, {"role": "assistant"}, {"since": 1e9 + 1100, "until": 1e9 + 5100}):
                for scope in (["s"], ["t"], None):
                    whole = st.search("messages", scope, plan, mode="fts", order=order, limit=5000, **filters)
                    for sid, mids in under.items():
                        want = [r for r in whole if r["id"] in mids]
                        got = st.search("messages", scope, plan, mode="fts", order=order, under_summary=sid,
                                        limit=7, offset=2, **filters)
                        assert [r["id"] for r in got] == [r["id"] for r in want[2:9]], (query, order, filters, scope)
                        assert [r["rank"] for r in got] == pytest.approx([r["rank"] for r in want[2:9]])
                        if scope == ["t"]:
                            assert got == []
    # the unindexed messages (the last 200, all under D) are found
    unindexed = sorted(max(under.values(), key=len))[-200:]
    got = st.search("messages", ["s"], plan_query("ERR_DEPLOY_WINDOW_7"), mode="fts", order="recent",
                    under_summary=max(under, key=lambda k: len(under[k])), limit=3)
    assert got and all(r["id"] in unindexed for r in got)


def test_a_search_under_an_old_leaf_reads_only_its_messages(under_store):
    """The leaf over the oldest 100 of 1,800 messages, searched for a word most messages hold:
    the search reads about its 100 rows of message_index, not the word's matches in the whole
    store (nor, as the statement before migration 024 did at 100k messages, the index from the
    newest id down to the leaf, testing each row)."""
    st, dsn, under, oldest = under_store
    with psycopg.connect(dsn, autocommit=True) as c:
        if c.info.server_version < 150000:
            pytest.skip("pg_stat_force_next_flush needs PostgreSQL 15")

        plan = plan_query("budget")
        want = [r["id"] for r in st.search("messages", ["s"], plan, mode="fts", order="recent", limit=5000)
                if r["id"] in under[oldest]][:12]
        assert want
        got, reads = _index_reads(st, c, lambda: st.search("messages", ["s"], plan, mode="fts", order="recent",
                                                           under_summary=oldest, limit=12))
        assert [r["id"] for r in got] == want
        assert reads <= 2 * len(under[oldest])

        def walk() -> None:  # control: the counter sees a walk of the index
            with st.maintenance_connection() as own:
                own.execute("SELECT count(*) FROM message_index x WHERE x.id > 0 AND x.tsv IS NOT NULL").fetchone()

        assert _index_reads(st, c, walk)[1] >= 1000


def test_the_newest_matches_of_a_common_word_read_the_newest_rows(under_store):
    """A phrase a quarter of the messages hold, newest first, in a lineage of 100 sessions: the
    search reads about as many index rows as it walks to fill the page - the walk stops with the
    page (a walk kept in a CTE read every row of its bound), and the index is not read for every
    match (what the planner chose at 1M messages: all 25,756 of ``reconcile_day`` rechecked on
    their rows to keep the newest 50; at this size it walks by itself)."""
    st, dsn, under, _ = under_store
    with psycopg.connect(dsn, autocommit=True) as c:
        if c.info.server_version < 150000:
            pytest.skip("pg_stat_force_next_flush needs PostgreSQL 15")
        c.execute("ANALYZE message_index")

        plan = plan_query('"rollback plan"')
        scope = ["s"] + [f"s-{k}" for k in range(99)]  # a lineage of 100 sessions
        want = _newest_by_sql(dsn, plan.pg_tsquery, scope, 20)
        got, reads = _index_reads(st, c, lambda: st.search("messages", scope, plan, mode="fts", order="recent",
                                                           limit=20))
        assert [r["id"] for r in got] == want
        assert reads <= 2 * pg_search.NEWEST_CHUNK_ROWS  # the walk reads whole chunks
        assert len(_newest_by_sql(dsn, plan.pg_tsquery, ["s"], 5000)) > 400  # what reading every match costs


def test_an_old_lineage_finds_its_newest_matches_among_its_own_rows(pg_fresh_dsn):
    """A gateway: the oldest of 21 users searches a word half of everyone's messages hold,
    newest first. The search reads about the rows of its own sessions it walks, not the newer
    users' rows above them nor every match in the store (at 1M messages such a search of
    "retry" took 830 ms before migration 025)."""
    rng = random.Random(2)
    st = PostgresStore(pg_fresh_dsn, background_index=False, pool_max=1)  # one connection: its stats
    try:
        mine: list[int] = []
        for u in range(21):
            st.ensure_session(f"user{u}", conversation_id=f"conv-{u}")
            ids = st.append_messages(f"user{u}", [
                nm(" ".join(rng.choice(WORDS) for _ in range(6)) + (" budget" if rng.random() < 0.5 else ""), 1e9 + k)
                for k in range(300)])
            if u == 0:
                mine = ids
        st.wait_indexed()
        with psycopg.connect(pg_fresh_dsn, autocommit=True) as c:
            if c.info.server_version < 150000:
                pytest.skip("pg_stat_force_next_flush needs PostgreSQL 15")
            c.execute("ANALYZE message_index")

            plan = plan_query("budget")
            want = _newest_by_sql(pg_fresh_dsn, plan.pg_tsquery, ["user0"], 20)
            assert want and set(want) <= set(mine)
            for _ in range(2):  # a first call, and one with its plans kept
                got, reads = _index_reads(st, c, lambda: st.search("messages", ["user0"], plan, mode="fts",
                                                                   order="recent", limit=20))
                assert [r["id"] for r in got] == want
                assert reads <= 2 * pg_search.NEWEST_CHUNK_ROWS  # the walk reads whole chunks
    finally:
        st.close()
