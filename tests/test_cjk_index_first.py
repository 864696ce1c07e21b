"""Issue #40 item 7: a CJK phrase is found through the trigram index first, whatever its rarity
and the lineage's shape: the work of a search does not grow with the history.

Work is counted, not timed: SQLite's progress handler counts the virtual-machine steps a
statement runs (deterministic for the same data). A lone session's phrase said once, early,
was planned as a walk of the session's messages newest first with an index probe for each:
ten times the history, ten times the steps.
"""

from __future__ import annotations

import json
import sqlite3

import pytest

from lossless_context import LCMEngine
from lossless_context.pipeline.ingest import new_message
from lossless_context.store import open_store

RARE = "青龙七号暗号"
COMMON = "数据库迁移计划"


def _store(path: str, n: int) -> None:
    st = open_store(path)
    try:
        st.ensure_session("S", conversation_id="C", platform="cli")
        rows = []
        for i in range(n):
            text = f"message {i} about the deploy queue and the billing worker."
            if i % 7 == 3:
                text += " 服务器配置日志队列任务错误报告版本。"
            if i == 40:
                text += f" 备注请记住发布前的{RARE}不要外传。"
            if i % 50 == 25:
                text += f" 顺便提一下{COMMON}第{i}版已经更新。"
            rows.append(new_message({"role": "user" if i % 2 == 0 else "assistant", "content": text}, 10**9, 0))
        for k in range(0, n, 2000):
            st.append_messages("S", rows[k:k + 2000])
        st.wait_indexed()
    finally:
        st.close()


def _steps(path: str, query: str) -> tuple[int, int, list[str]]:
    """(VM steps of the search's statements, hits, their query plans)."""
    e = LCMEngine(store=path, summarizer="extractive")
    e.update_model("m", 64_000)
    e.on_session_start("S", conversation_id="C", platform="cli")
    json.loads(e.handle_tool_call("lcm_grep", {"query": "warm up"}))
    c = e.store.inner.conn() if hasattr(e.store, "inner") else e.store.conn()
    steps = [0]
    stmts: list[str] = []
    c.set_progress_handler(lambda: steps.__setitem__(0, steps[0] + 1) or 0, 100)
    c.set_trace_callback(stmts.append)
    try:
        ans = json.loads(e.handle_tool_call("lcm_grep", {"query": query}))
    finally:
        c.set_progress_handler(None, 0)
        c.set_trace_callback(None)
    plans = []
    for s in stmts:
        if "messages_cjk MATCH" in s and s.lstrip().upper().startswith(("SELECT", "WITH")):
            plans.append(" | ".join(r[3] for r in c.execute("EXPLAIN QUERY PLAN " + s)))
    e.store.close()
    return steps[0], ans["hits"], plans


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    d = tmp_path_factory.mktemp("cjk")
    small, large = str(d / "small.db"), str(d / "large.db")
    _store(small, 2_000)
    _store(large, 20_000)
    return small, large


@pytest.mark.parametrize("phrase", [RARE, COMMON])
def test_a_cjk_phrase_costs_the_same_in_a_history_ten_times_longer(stores, phrase):
    small, large = stores
    s_steps, s_hits, _ = _steps(small, phrase)
    l_steps, l_hits, plans = _steps(large, phrase)
    assert s_hits >= 1 and l_hits >= 1
    assert plans and all(p.startswith("SCAN messages_cjk VIRTUAL TABLE") for p in plans), plans
    assert not any("messages_session_id" in p or "TEMP B-TREE" in p for p in plans), plans
    assert l_steps < 2 * s_steps + 50, (s_steps, l_steps)


def test_the_trigram_search_still_respects_the_lineage(tmp_path):
    path = str(tmp_path / "two.db")
    _store(path, 500)
    st = open_store(path)
    st.ensure_session("OTHER", conversation_id="elsewhere", platform="cli")
    st.append_messages("OTHER", [new_message({"role": "user", "content": f"他人的{RARE}别看"}, 10**9, 0)])
    st.close()
    _steps_, hits, _plans = _steps(path, RARE)
    assert hits == 1  # the other conversation's message is not in this lineage
    assert sqlite3.connect(path).execute("SELECT count(*) FROM messages_cjk WHERE messages_cjk MATCH ?",
                                         (f'"{RARE}"',)).fetchone()[0] == 2


def test_summaries_have_their_own_trigram_index(tmp_path):
    """A phrase a summary holds is found through summaries_cjk (migration 018), not a LIKE scan
    of every summary; rewriting a summary's text re-indexes it."""
    from lossless_context.tokens import estimate_messages_tokens

    path = str(tmp_path / "s.db")
    e = LCMEngine(store=path, summarizer="extractive")
    e.update_model("m", 64_000)
    e.bind_session_state(None, "Z")
    hist = []
    for i in range(12):
        hist.append({"role": "user", "content": f"第{i}个问题：请检查{RARE}的配置。" + "服务器日志" * 3000})
        hist.append({"role": "assistant", "content": f"好的，第{i}个回答。" + "队列任务" * 3000})
    out = e.compress(hist, current_tokens=estimate_messages_tokens(hist))
    assert out != hist
    e.on_session_start("Z", boundary_reason="compression", old_session_id="Z")
    c = e.store.inner.conn() if hasattr(e.store, "inner") else e.store.conn()
    sids = [r[0] for r in c.execute("SELECT id FROM summaries WHERE text LIKE ?", (f"%{RARE}%",))]
    assert sids
    stmts: list[str] = []
    c.set_trace_callback(stmts.append)
    try:
        ans = json.loads(e.handle_tool_call("lcm_grep", {"query": RARE, "scope": "summaries"}))
    finally:
        c.set_trace_callback(None)
    assert {h["id"] for g in ans["groups"] for h in g["hits"]} >= {f"s{sids[0]}"}
    used = [s for s in stmts if "summaries_cjk MATCH" in s]
    assert used and not any("LIKE" in s and "summaries" in s for s in stmts), stmts
    assert " | ".join(r[3] for r in c.execute("EXPLAIN QUERY PLAN " + used[0])).startswith(
        "SCAN summaries_cjk VIRTUAL TABLE")
    e.store.update_summary_text(sids[0], "换成别的内容：朱雀三号口令", 10, "normal", "x")
    count = "SELECT count(*) FROM summaries_cjk WHERE summaries_cjk MATCH ?"
    assert c.execute(count, ('"朱雀三号口令"',)).fetchone()[0] == 1
    assert c.execute(count + " AND rowid = ?", (f'"{RARE}"', sids[0])).fetchone()[0] == 0


def test_postgres_walks_a_common_cjk_phrase_newest_first(pg_fresh_dsn, monkeypatch):
    """PostgreSQL: a CJK phrase the statistics call common is found by walking the lineage's CJK
    rows newest first (the planner took its bigrams as independent, called it rare and read
    every match from the bigram index); one common elsewhere but rare in this lineage falls back
    to the index. Same answers as a plain scan either way."""
    import psycopg

    st = open_store(pg_fresh_dsn)
    try:
        st.ensure_session("S", conversation_id="C", platform="cli")
        st.ensure_session("OTHER", conversation_id="D", platform="cli")
        rows, other = [], []
        for i in range(3000):
            text = f"message {i} 服务器配置日志队列任务错误报告版本。" + (f" 顺便提一下{COMMON}第{i}版。" if i % 5 == 0 else "")
            if i == 7:
                text += f" 他人的{RARE}别看"
            rows.append(new_message({"role": "user", "content": text}, 10**9, 0))
            other.append(new_message({"role": "user", "content": f"其他 {i} 的{RARE}数据。"}, 10**9, 0))
        st.append_messages("S", rows)
        st.append_messages("OTHER", other)
        st.wait_indexed()
    finally:
        st.close()
    with psycopg.connect(pg_fresh_dsn, autocommit=True) as c:
        c.execute("ANALYZE message_index")
    e = LCMEngine(store=pg_fresh_dsn, summarizer="extractive")
    e.update_model("m", 64_000)
    e.on_session_start("S", conversation_id="C", platform="cli")
    inner = getattr(e.store, "inner", e.store)
    walks: list = []
    real = type(inner)._cjk_newest

    def spy(self, *a, **k):
        out = real(self, *a, **k)
        walks.append(out is not None)
        return out

    type(inner)._cjk_newest = spy
    try:
        common_hits = json.loads(e.handle_tool_call("lcm_grep", {"query": COMMON, "limit": 20}))
        rare_hits = json.loads(e.handle_tool_call("lcm_grep", {"query": RARE}))
    finally:
        type(inner)._cjk_newest = real
    ids = [int(h["id"][1:]) for g in common_hits["groups"] for h in g["hits"]]
    with psycopg.connect(pg_fresh_dsn) as c:
        want = [r[0] for r in c.execute("SELECT id FROM messages WHERE session_id = 'S' AND strpos(text, %s) > 0"
                                        " ORDER BY id DESC LIMIT 20", (COMMON,))]
        mine = [r[0] for r in c.execute("SELECT id FROM messages WHERE session_id = 'S' AND strpos(text, %s) > 0",
                                        (RARE,))]
    assert ids == want
    assert walks[0] is True  # the common phrase: walked
    # common in the other lineage, once in this one: found (by the walk through this lineage's
    # few CJK rows, or by the index once the walk gives up)
    assert [h["id"] for g in rare_hits["groups"] for h in g["hits"]] == [f"m{mine[0]}"], (rare_hits, walks)
    # a walk that reads its budget without filling the page gives the search back to the index
    from lossless_context.store.postgres import search as pgsearch

    monkeypatch.setattr(pgsearch, "CJK_WALK_CHUNK", 64)  # chunks of at most 512 rows: several
    with psycopg.connect(pg_fresh_dsn) as c:
        want300 = [r[0] for r in c.execute("SELECT id FROM messages WHERE session_id = 'S' AND strpos(text, %s) > 0"
                                           " ORDER BY id DESC LIMIT 300", (COMMON,))]
    assert [r[0] for r in inner._cjk_newest(["S"], COMMON, 300)] == want300
    monkeypatch.setattr(pgsearch, "CJK_WALK_ROWS", 600)
    monkeypatch.setattr(pgsearch, "CJK_WALK_CHUNK", 128)
    assert inner._cjk_newest(["S"], COMMON, 500) is None
    again = json.loads(e.handle_tool_call("lcm_grep", {"query": COMMON, "limit": 20}))
    assert [int(h["id"][1:]) for g in again["groups"] for h in g["hits"]] == want
    e.store.close()
