"""The SQLite store's search statements read what they need: checked on a real store through
each statement the store sends (its trace) and SQLite's own plan for it.

A ranked full-text search (store/sqlite/search.py ``_ranked``) ranks in the index, then reads
the rows it keeps by key. Given a lineage's sessions and 100+ ids, SQLite's planner chose the
(session_id, id) index for that read instead: a probe per session and id, where one per id
finds the same rows (on an encrypted store every index page read from the file is decrypted
and checked)."""

from __future__ import annotations

import re
import uuid

from lossless_context.records import NewMessage
from lossless_context.search.query import plan_query
from lossless_context.store.sqlite.store import SQLiteStore

SESSIONS = 12
PER_SESSION = 40  # every message matches: a page of 200 reads 200 rows


def _nm(text: str, t: float) -> NewMessage:
    return NewMessage(raw={"role": "user", "content": text}, role="user", ident=uuid.uuid4().hex, uid=None,
                      text=text, tokens=len(text) // 4 + 1, created_at=t)


def test_a_ranked_search_reads_its_rows_by_key_in_a_lineage(tmp_path):
    st = SQLiteStore(str(tmp_path / "lcm.db"))
    try:
        sids = [f"s{k}" for k in range(SESSIONS)]
        parent = None
        for k, sid in enumerate(sids):
            st.ensure_session(sid, conversation_id="conv", parent_id=parent)
            parent = sid
            st.append_messages(sid, [_nm(f"webhook retry {k}-{i} " + "word " * (i % 9), 1e9 + k * 100 + i)
                                     for i in range(PER_SESSION)])
        st.wait_indexed()
        sent: list[str] = []
        c = st.conn()
        c.set_trace_callback(sent.append)
        try:
            got = st.search("messages", sids, plan_query("webhook retry"), mode="fts", order="rank", limit=200)
        finally:
            c.set_trace_callback(None)
        assert len(got) == 200 and {r["session_id"] for r in got} <= set(sids)
        fetches = [s for s in sent if re.search(r"FROM messages t\b.*WHERE t\.id IN \(", s)]
        assert fetches, sent
        for sql in fetches:
            plan = [r[3] for r in c.execute("EXPLAIN QUERY PLAN " + sql)]
            assert any("INTEGER PRIMARY KEY" in p for p in plan), plan
            assert not any("INDEX" in p.replace("INTEGER PRIMARY KEY", "") for p in plan), plan
    finally:
        st.close()


def test_the_same_rows_as_reading_every_match(tmp_path):
    """The ranked page equals the one statement that joins every match to its row."""
    st = SQLiteStore(str(tmp_path / "lcm.db"))
    try:
        for k in range(3):
            st.ensure_session(f"s{k}", conversation_id=f"c{k % 2}")
            st.append_messages(f"s{k}", [_nm(f"deploy key {i} " + "retry " * (i % 5), 1e9 + i) for i in range(150)])
        st.wait_indexed()
        plan = plan_query("deploy retry")
        for scope in (["s0"], ["s0", "s2"], None):
            got = [(r["id"], r["rank"]) for r in st.search("messages", scope, plan, mode="fts", order="rank",
                                                          limit=120, offset=5)]
            where = f" AND t.session_id IN ({','.join('?' * len(scope))})" if scope else ""
            want = st.conn().execute(
                "SELECT t.id, bm25(messages_fts) AS r FROM messages_fts JOIN messages t ON t.id = messages_fts.rowid"
                f" WHERE messages_fts MATCH ?{where} ORDER BY r LIMIT 120 OFFSET 5",
                (plan.fts_match, *(scope or ()))).fetchall()
            assert got == [tuple(w) for w in want], scope
    finally:
        st.close()

