"""The originals a grep folds its summary hits into, on PostgreSQL (migration 026).

``Store.search_under_summaries`` asks, for up to 30 summaries at once, the newest messages
under each that match a query. ``lcm_fts_under_many`` answers each query's summaries together:
either each summary probed message by message, or - when the statistics say the query's index
rows are few next to the summaries' messages - one read of the full-text index ANDed with the
summaries' id ranges (at most 16: spans joined, then cut at the widest gaps), the rows of other
sessions and of the gaps dropped after. Both routes must answer exactly what one search under
each summary answers. The store here is a gateway's: two users' messages interleaved, summaries
with gaps between them, nested ones, and the newest messages still unindexed.
"""

from __future__ import annotations

import random
import uuid

import pytest

from lossless_context.records import NewMessage, NewSummary
from lossless_context.search.query import plan_query
from lossless_context.store.base import Store
from lossless_context.store.postgres import search as pg_search
from lossless_context.store.postgres.store import PostgresStore
from tests.support.pg import counted

psycopg = pytest.importorskip("psycopg")

_FETCHED = "SELECT idx_tup_fetch FROM pg_stat_user_tables WHERE relname = 'message_index'"

WORDS = ["deploy", "window", "ledger", "invoice", "cache", "queue", "shard", "replica", "quota", "cursor"]
BATCHES = 48  # of the lineage's messages, 9 each; the other user's 6 in between


def _nm(text: str, t: float, role: str = "user") -> NewMessage:
    return NewMessage(raw={"role": role, "content": text}, role=role, ident=uuid.uuid4().hex, uid=None, text=text,
                      tokens=len(text) // 4 + 1, created_at=t)


def _leaf(key: str, mids: list[int]) -> NewSummary:
    return NewSummary(key=key, kind="leaf", depth=0, text=f"{key} deploy", tokens=10, source_tokens=100,
                      level="normal", summarizer="test", t_start=1e9, t_end=2e9, n_messages=len(mids),
                      message_ids=mids)


def _condensed(key: str, children: list[str], depth: int) -> NewSummary:
    return NewSummary(key=key, kind="condensed", depth=depth, text=f"{key} deploy", tokens=10, source_tokens=100,
                      level="normal", summarizer="test", t_start=1e9, t_end=2e9, n_messages=0,
                      child_keys=children)


@pytest.fixture
def gateway(pg_fresh_dsn):
    """(store, summary id -> ids of the messages under it). The lineage "s" has 48 batches of 9
    messages, each followed by 6 of user "t"; every third batch of "s" is under no summary (a
    gap), the others each under a leaf (32 leaves: more spans than ranges); pairs of leaves
    under condensed summaries, two of those under one of depth 2. The last two batches are
    appended after the index caught up: still listed for indexing when searched."""
    rng = random.Random(26)
    st = PostgresStore(pg_fresh_dsn, background_index=False, pool_max=1)

    def text(i: int) -> str:
        words = " ".join(rng.choice(WORDS) for _ in range(7))
        return words + (" ERR_SYNC_LAG_9 raised" if i % 5 == 0 else "") + (" rollback plan" if i % 3 == 0 else "")

    try:
        st.ensure_session("s", conversation_id="conv-s")
        st.ensure_session("t", conversation_id="conv-t")
        batches: list[list[int]] = []
        t, k = 1e9, 0
        for b in range(BATCHES):
            if b == BATCHES - 2:
                st.wait_indexed()
            mine = [_nm(text(k + j), t + j, "assistant" if (k + j) % 2 else "user") for j in range(9)]
            batches.append(st.append_messages("s", mine))
            st.append_messages("t", [_nm(text(k + j), t + 10 + j) for j in range(6)])
            t, k = t + 20, k + 9
        v, e = st.get_context("s")
        leaves = {f"L{b}": batches[b] for b in range(BATCHES) if b % 3 != 2}
        names = sorted(leaves, key=lambda n: int(n[1:]))
        pairs = {f"C{n}": names[n:n + 2] for n in range(0, len(names) - 1, 2)}
        summaries = [_leaf(n, leaves[n]) for n in names]
        summaries += [_condensed(n, kids, 1) for n, kids in pairs.items()]
        summaries.append(_condensed("D", ["C0", "C2"], 2))
        top = [n for n in pairs if n not in ("C0", "C2")] + ["D"]
        km, _ = st.stage_pass("s", "p", summaries, [("s", n) for n in top], v, len(e))
        assert st.publish_pass("p")
        under = {km[n]: set(m) for n, m in leaves.items()}
        for n, kids in pairs.items():
            under[km[n]] = set().union(*(leaves[c] for c in kids))
        under[km["D"]] = under[km["C0"]] | under[km["C2"]]
        with psycopg.connect(pg_fresh_dsn, autocommit=True) as c:
            c.execute("ANALYZE message_index")
        yield st, under, set(batches[-2]) | set(batches[-1])
    finally:
        st.close()


@pytest.mark.parametrize("weight", [0.0, 1e9])
def test_summaries_searched_together_answer_one_search_each(gateway, monkeypatch, weight):
    """Either route (every summary probed: weight 0; the index read once over the summaries'
    ranges: weight 1e9) answers what one search under each summary answers - newest first, up
    to the limit, with role and time filters, in the lineage, the other user's lineage or all,
    for several queries asked together, and the still-unindexed messages found."""
    monkeypatch.setattr(pg_search, "UNDER_INDEX_WEIGHT", weight)
    st, under, unindexed = gateway
    sids = sorted(under)
    queries = ["ERR_SYNC_LAG_9", '"rollback plan"', "ledger invoice", "quota"]
    for q in queries:  # the estimate the route is chosen by exists (else weight would not matter)
        assert st._index_rows(plan_query(q).pg_tsquery) > 0
    asks = [(sid, plan_query(queries[n % len(queries)])) for n, sid in enumerate(sids)]
    asks += [(sids[0], plan_query("quota")), (sids[-1], plan_query("ERR_SYNC_LAG_9"))]
    seen_unindexed = False
    for filters in ({}, {"role": "assistant"}, {"since": 1e9 + 200, "until": 1e9 + 700}):
        for scope in (["s"], ["t"], None):
            for limit in (3, 12):
                got = st.search_under_summaries(scope, asks, limit=limit, **filters)
                want = Store.search_under_summaries(st, scope, asks, limit=limit, **filters)
                assert got == want, (filters, scope, limit)
                for (sid, _), rows in zip(asks, got):
                    assert {r["id"] for r in rows} <= under[sid]
                    seen_unindexed = seen_unindexed or any(r["id"] in unindexed for r in rows)
                if scope == ["t"]:
                    assert got == [[]] * len(asks)
    assert seen_unindexed  # (the last two batches; the first of them under a leaf)


def test_the_index_route_is_one_read_of_the_index(gateway, monkeypatch, pg_fresh_dsn):
    """Taken, the index route reads the query's matches once for all the summaries (here at
    most every match in the store: the ranges span the other user's rows too), not each of 49
    summaries' messages until its page is full."""
    st, under, _ = gateway
    with psycopg.connect(pg_fresh_dsn, autocommit=True) as c:
        if c.info.server_version < 150000:
            pytest.skip("pg_stat_force_next_flush needs PostgreSQL 15")

        def reads(weight: float) -> tuple[list, int]:
            monkeypatch.setattr(pg_search, "UNDER_INDEX_WEIGHT", weight)
            asks = [(sid, plan_query("ERR_SYNC_LAG_9")) for sid in sorted(under)]
            return counted(st, c, _FETCHED, lambda: st.search_under_summaries(["s"], asks, limit=12))

        probed, probe_reads = reads(0.0)
        once, index_reads = reads(1e9)
        assert once == probed
        n = len(set().union(*under.values()))
        matches = c.execute("SELECT count(*) FROM message_index WHERE tsv @@ to_tsquery('english', %s)",
                            (plan_query("ERR_SYNC_LAG_9").pg_tsquery,)).fetchone()[0]
        assert matches < n // 2
        assert probe_reads >= n // 2  # each summary's messages read by key, until its page is full
        # the index's candidates in the summaries' ranges, each read once (a candidate holds
        # the words; the phrase is checked on its row): about the query's matches, no more
        assert index_reads <= matches * 1.1 < probe_reads / 3


def test_a_windowed_count_reads_its_window_after_capped_counts(pg_fresh_dsn):
    """lcm_term_counts counts a term's matches capped (the whole store) and among the newest
    rows (a window: a common term's frequency, for its weight). PL/pgSQL plans the count once
    generically after five calls on a connection: the windowed count then read every match in
    the store, the window tested on each row (at 1M messages 8 -> 45 ms a grep of a common
    identifier, depending on which counts a connection had served). Migration 027 plans each
    call with its arguments: the windowed count reads within its window, however many
    capped counts came before it (migration 031: in a function of its own, the capped counts'
    plans kept)."""
    rng = random.Random(27)
    st = PostgresStore(pg_fresh_dsn, background_index=False, pool_max=1)  # one connection: its stats
    try:
        st.ensure_session("s", conversation_id="conv-s")
        st.append_messages("s", [_nm(" ".join(rng.choice(WORDS) for _ in range(6))
                                     + (" rollback plan" if k % 3 == 0 else ""), 1e9 + k) for k in range(6000)])
        st.wait_indexed()
        with psycopg.connect(pg_fresh_dsn, autocommit=True) as c:
            if c.info.server_version < 150000:
                pytest.skip("pg_stat_force_next_flush needs PostgreSQL 15")
            c.execute("ANALYZE message_index")
            plan = plan_query('"rollback plan"')
            assert st.term_counts("messages", [plan], 100) == [101]  # capped
            for _ in range(6):
                st.term_counts("messages", [plan], 100)

            got, fetched = counted(st, c, _FETCHED, lambda: st.term_counts("messages", [plan], 1000, newest=600))
            assert got == [200]
            # the window's rows (or its matches, as the plan goes), not the store's 2,000 matches
            assert fetched <= 600
            # 031: the capped counts keep their plans (their own statements), and alternating
            # with windowed counts changes neither answer nor what a window reads
            for _ in range(6):
                assert st.term_counts("messages", [plan], 100) == [101]
                assert st.term_counts("messages", [plan], 1000, newest=300) == [100]
            got, fetched = counted(st, c, _FETCHED, lambda: st.term_counts("messages", [plan], 1000, newest=600))
            assert got == [200] and fetched <= 600
            assert st.term_counts("messages", [plan], 5000) == [2000]
    finally:
        st.close()
