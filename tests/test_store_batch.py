"""The batched reads search uses (issue #21): one round trip for many ids on PostgreSQL, the
same answers as the one-id-at-a-time methods on both stores."""

from __future__ import annotations

import json

import pytest

from lossless_context import LCMEngine
from lossless_context.config import LCMConfig
from lossless_context.demo.host_driver import R19Host
from lossless_context.demo.sessions import coding_session
from lossless_context.pipeline.stub_prep import StubPreparer
from lossless_context.pipeline.stubs import stub_policy
from lossless_context.store.base import Store


def _compacted(tmp_path, backend: str, request, sid: str, seed: int) -> LCMEngine:
    """An engine whose store holds a 600-message coding session the host compacted."""
    loc = str(tmp_path / f"{sid}.db") if backend == "sqlite" else request.getfixturevalue("pg_fresh_dsn")
    e = LCMEngine(config=LCMConfig.load({"store": loc}, read_file=False))
    host = R19Host(e, sid, context_length=16_000)
    host.start()
    host.feed(coding_session(600, seed=seed).messages)
    host.end()
    # The reads below are compared with each other: nothing may rewrite a summary meanwhile
    # (the background worker replaces the passes' outlines after them).
    assert e.wait_background(120)
    # ... nor give a tool result its stub (the tier-0 preparer writes them after a pass)
    assert StubPreparer.for_store(e.store.location, e.store, stub_policy(e.config)).wait_idle(120)
    return e



@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_batched_reads_equal_the_single_ones(tmp_path, backend, request):
    e = _compacted(tmp_path, backend, request, "batch", 4)
    st = e.store
    mids = [m.id for m in st.iter_all_messages()]
    assert len(mids) >= 600
    probe = mids[::7] + [10**9]  # an unknown id answers []
    many = st.message_summaries_many(probe)
    assert many == {m: st.message_summaries(m) for m in probe}
    assert any(many.values()), "the session was compacted: some messages are covered"
    sids = sorted({s for v in many.values() for s in v})
    parents = st.summary_parents_many(sids + [10**9])
    assert parents == {s: st.summary_parents(s) for s in sids + [10**9]}
    # every hit's chain up the DAG in one call: what the level-by-level default reads
    inner = st.inner if hasattr(st, "inner") else st
    chains = st.summary_chains(probe, sids[:2] + [10**9])
    assert chains == Store.summary_chains(inner, probe, sids[:2] + [10**9])
    covering, walked = chains
    assert covering == many
    assert any(walked.values()), "the DAG has more than one level"
    for s in walked:  # each key's parents are the published ones, every first parent walked
        assert walked[s] == st.summary_parents(s)
        assert not walked[s] or walked[s][0] in walked
    assert st.summary_chains([], []) == ({}, {})
    ranges = [(-3, 2), (40, 55), (50, 60), (590, 700), (9, 8)]  # overlapping, past the end, empty
    got = st.session_messages_in("batch", ranges)
    want = Store.session_messages_in(st.inner if hasattr(st, "inner") else st, "batch", ranges)
    assert [m.id for m in got] == [m.id for m in want] and got
    assert [m.seq for m in got] == sorted({m.seq for m in got})
    other = R19Host(e, "batch-2", context_length=16_000)
    other.start()
    other.feed(coding_session(80, seed=5).messages)
    other.end()
    spans = [("batch", lo, hi) for lo, hi in ranges] + [("batch-2", 3, 9), ("batch-2", 7, 12), ("nobody", 0, 5)]
    got2 = st.messages_in(spans)
    want2 = Store.messages_in(st.inner if hasattr(st, "inner") else st, spans)
    key = lambda m: (m.session_id, m.seq)  # noqa: E731
    assert sorted(map(key, got2)) == sorted(map(key, want2)) and len(got2) == len(set(map(key, got2)))
    assert {m.session_id for m in got2} == {"batch", "batch-2"}
    assert [m.id for m in got2 if m.session_id == "batch"] == [m.id for m in got]
    # pair tests in one call answer what a capped count per pair answers, on both targets
    from lossless_context.search.query import plan_query

    words = ["error", "file", "test", "zebracornx", "function", "config"]
    pairs = [plan_query(f"{a} {b}").subset([0, 1], "AND") for k, a in enumerate(words) for b in words[k + 1:]]
    for target in ("messages", "summaries"):
        met = st.any_match(target, pairs, 30.0)
        assert met == [c > 0 for c in st.term_counts(target, pairs, 0)], target
        assert True in met and False in met, target
    e.store.close()


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_ancestry_in_one_read_equals_the_walk(tmp_path, backend, request):
    loc = str(tmp_path / "a.db") if backend == "sqlite" else request.getfixturevalue("pg_fresh_dsn")
    e = LCMEngine(config=LCMConfig.load({"store": loc}, read_file=False))
    st = e.store
    st.ensure_session("root")
    e.ingest([{"role": "user", "content": "root turn"}], session_id="root")
    st.ensure_session("mid", parent_id="root")
    st.set_fork_point("mid")
    e.ingest([{"role": "user", "content": "mid turn"}], session_id="mid")
    st.ensure_session("leaf", parent_id="mid")
    st.set_fork_point("leaf")
    got = st.ancestry("leaf")
    assert [a[0] for a in got] == ["leaf", "mid", "root"] and got[0][2] is not None and got[2][2] is None
    inner = st.inner if hasattr(st, "inner") else st
    assert got == Store.ancestry(inner, "leaf")
    assert st.ancestry("nobody") == Store.ancestry(inner, "nobody") == []
    e.store.close()


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_expanding_a_summary_reads_exactly_the_messages_each_page_shows(tmp_path, backend, request, monkeypatch):
    import json

    e = _compacted(tmp_path, backend, request, "exp", 6)
    st = e.store
    inner = st.inner if hasattr(st, "inner") else st
    leaves = {s for m in st.iter_all_messages() for s in st.message_summaries(m.id)}
    leaf = max(leaves, key=lambda s: len(st.summary_children(s)[1]))
    _, mids = st.summary_children(leaf)
    assert len(mids) >= 16, "a leaf over enough messages"
    # the outline: the summary and its children's sizes, what the default reads from the records
    rec, outline = st.summary_outline(leaf)
    assert (rec, outline) == Store.summary_outline(inner, leaf)
    assert [r for _, r, _ in outline] == mids and all(k == "m" for k, _, _ in outline)
    top = max(st.session_summary_ids("exp"), key=lambda s: st.get_summaries([s])[s].depth)
    assert st.summary_outline(top) == Store.summary_outline(inner, top)
    assert st.summary_outline(top)[1][0][0] == "s"
    assert st.summary_outline(10**9) == (None, [])
    if backend == "postgres":  # the summary and the outline in one connection use (pipelined)
        uses = []
        real_read = inner._read
        monkeypatch.setattr(inner, "_read", lambda fn: uses.append(fn) or real_read(fn))
        st.summary_outline(leaf)
        assert len(uses) == 1
        monkeypatch.undo()
    reads: list[list[int]] = []
    real = st.get_messages
    monkeypatch.setattr(st, "get_messages", lambda ids: reads.append(list(ids)) or real(ids))
    pages, cursor = [], None
    while True:
        args = {"id": f"s{leaf}", "max_tokens": 2_000}
        if cursor:
            args["cursor"] = cursor
        out = json.loads(e.handle_tool_call("lcm_expand", args))
        pages.append(out)
        cursor = out.get("next_cursor")
        if not cursor:
            break
    assert len(pages) > 1, "the leaf takes several pages"
    shown = [c["id"] for p in pages for c in p["children"]]
    assert shown == [f"m{m}" for m in mids]  # every message, in order, once
    # one read per page, of exactly the messages it shows
    assert reads == [[int(c["id"][1:]) for c in p["children"]] for p in pages]
    stored = real(mids)
    for c in (c for p in pages for c in p["children"]):
        rec = stored[int(c["id"][1:])]
        if "message" in c and isinstance(rec.raw.get("content"), str):
            assert c["message"]["content"] == rec.raw["content"]  # the original, as stored
    for p in pages:  # each page within its budget, the first child always shown
        assert sum(min(stored[int(c["id"][1:])].tokens + 20, 150 if c.get("truncated") else 10**9)
                   for c in p["children"][1:]) <= 2_000
    # a message larger than the page is shown as a preview that points at its own pages
    big = next(m for m in mids if stored[m].tokens + 20 > 200)
    cursor, seen = None, None
    while seen is None:
        args = {"id": f"s{leaf}", "max_tokens": 200, **({"cursor": cursor} if cursor else {})}
        out = json.loads(e.handle_tool_call("lcm_expand", args))
        seen = next((c for c in out["children"] if c["id"] == f"m{big}"), None)
        cursor = out["next_cursor"]
        assert seen is not None or cursor
    assert seen["truncated"] and seen["preview"] == stored[big].text[:400] and "message" not in seen
    assert f'lcm_expand(id="m{big}")' in seen["note"]
    e.store.close()


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_hit_details_equal_the_three_reads_and_are_one_read_on_postgres(tmp_path, backend, request):
    e = _compacted(tmp_path, backend, request, "hits", 7)
    st = e.store
    inner = st.inner if hasattr(st, "inner") else st
    mids = [m.id for m in st.iter_all_messages()]
    covered = [m for m in mids[::9] if st.message_summaries(m)][:2]  # first: retracted and covered
    probe = covered + [m for m in mids[::9] if m not in covered] + [10**9]  # an unknown id too
    assert st.retract_messages(probe[:3]) == 3
    sids = sorted({s for m in probe for s in st.message_summaries(m)})[:3]
    hidden, msgs, covering, parents = st.hit_details(probe, sids)
    assert hidden == set(probe[:3]) == st.retracted(probe)
    assert msgs == st.get_messages(probe) and 10**9 not in msgs
    assert (covering, parents) == st.summary_chains(probe, sids)
    assert any(covering.values()) and any(parents.values())
    assert st.hit_details([], []) == (set(), {}, {}, {})
    if backend == "postgres":
        reads = []
        real = inner._read
        inner._read = lambda fn: reads.append(fn) or real(fn)
        try:
            assert st.hit_details(probe, sids) == (hidden, msgs, covering, parents)
        finally:
            del inner._read
        assert len(reads) == 1  # one connection use, the three statements pipelined
    # lcm_grep hides a retracted message, and shows it again with its chain once restored
    gone = probe[0]
    rec = st.get_messages([gone])[gone]
    word = max(rec.text.split(), key=len)

    def hits() -> dict[str, list[str]]:
        out = json.loads(e.handle_tool_call("lcm_grep", {"query": word, "scope": "messages", "limit": 50}))
        return {h["id"]: h["summary_chain"] for g in out["groups"] for h in g["hits"]}

    assert f"m{gone}" not in hits()
    st.restore_messages([gone])
    shown = hits()
    assert f"m{gone}" in shown
    walk, node = [], covering[gone][0]
    while node is not None:
        walk.append(f"s{node}")
        node = (parents.get(node) or st.summary_parents(node) or [None])[0]
    assert shown[f"m{gone}"] == walk
    e.store.close()


def test_hit_chains_read_summaries_by_key_on_postgres(tmp_path, request):
    """A hit's chain up the DAG reads each summary it names by key: before migration 028 the
    plan kept for every call joined the whole summaries table by hash (a gateway's 46,000
    summaries: 7 ms on every lcm_grep page and lcm_describe). Here 4,000 other summaries
    (published, and one of the chain's parents staged only: never named) and the same chains."""
    e = _compacted(tmp_path, "postgres", request, "keys", 3)
    st = e.store
    inner = st.inner if hasattr(st, "inner") else st
    mids = [m.id for m in st.iter_all_messages()]
    probe = [m for m in mids[::5] if st.message_summaries(m)][:6]
    sids = sorted({s for m in probe for s in st.message_summaries(m)})
    want = Store.summary_chains(inner, probe, sids)
    dsn = request.getfixturevalue("pg_fresh_dsn")
    psycopg = pytest.importorskip("psycopg")
    with psycopg.connect(dsn, autocommit=True) as c:
        if c.info.server_version < 150000:
            pytest.skip("pg_stat_force_next_flush needs PostgreSQL 15")
        cols = ", ".join(r[0] for r in c.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'summaries'"
            " AND column_name NOT IN ('id', 'tsv') ORDER BY ordinal_position"))
        c.execute(f"INSERT INTO summaries ({cols}) SELECT {cols} FROM summaries, generate_series(1, 4000 /"
                  " (SELECT count(*) FROM summaries)::int + 1)")
        top = max(s for s in want[1] if want[1][s] == [])  # a summary at the top of its chain
        staged = c.execute(f"INSERT INTO summaries ({cols}) SELECT {cols} FROM summaries WHERE id = %s"
                           " RETURNING id", (top,)).fetchone()[0]
        c.execute("UPDATE summaries SET state = 'staged' WHERE id = %s", (staged,))
        c.execute("INSERT INTO summary_parents(parent_id, child_id, ord) VALUES (%s, %s, 0)", (staged, top))
        c.execute("ANALYZE summaries")

        def summaries_read() -> int:
            c.execute("SELECT pg_stat_force_next_flush()")
            return c.execute("SELECT COALESCE(seq_tup_read, 0) + COALESCE(idx_tup_fetch, 0) FROM pg_stat_user_tables"
                             " WHERE relname = 'summaries'").fetchone()[0]

        assert st.summary_chains(probe, sids) == want
        for _ in range(7):  # the function on this connection, past the calls after which a plan is generic
            c.execute("SELECT * FROM lcm_summary_chains(%s::bigint[], %s::bigint[])", (probe, sids)).fetchall()
        before = summaries_read()
        c.execute("SELECT * FROM lcm_summary_chains(%s::bigint[], %s::bigint[])", (probe, sids)).fetchall()
        assert summaries_read() - before <= 4 * (len(want[1]) + len(probe))
    e.store.close()
