"""The agent tools over a real store built by real compactions."""

from __future__ import annotations

import json

import pytest

from lossless_context import LCMEngine
from lossless_context.config import LCMConfig
from lossless_context.demo.sessions import coding_session, turn_ranges
from lossless_context.demo.host_driver import R19Host
from tests.support.pg import module_store_location
from tests.support.recall import message_hits, recovered

HOSTILE = [
    "AND", "OR NOT", "NEAR(a b)", '"', '""', "*", "NEAR(", ")", "--", "'; DROP TABLE messages; --",
    "col:term", "^start", "a\x00b", "x" * 10_000, "重试次数上限", "リトライ", "ทดสอบ", "🔥🚀", "", "   ",
    "the of and", "(((", "[a-z", "(a+)+$", "\ud800 lone", "%_\\", "messages_fts MATCH 'x'",
]


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def built(request, tmp_path_factory):
    """A store built by real compactions, on each backend."""
    location = module_store_location(request, tmp_path_factory, "tools")
    e = LCMEngine(config=LCMConfig.load({"store": location, "summarizer": "extractive"}, read_file=False))
    sess = coding_session(2500, seed=7)
    host = R19Host(e, session_id="alpha", overhead_tokens=2500)
    host.start(context_length=64_000)
    msgs = sess.messages
    for a, b in turn_ranges(msgs):
        host.add(*msgs[a:b])
        host.maybe_compress()
    host.end()
    assert host.compactions >= 4
    return e, sess


def call(e, name, **args):
    out = e.handle_tool_call(name, args)
    return json.loads(out)


def test_canaries_found_grouped_and_recovered_verbatim(built):
    e, sess = built
    for c in sess.canaries:
        res = call(e, "lcm_grep", query=c.value)
        hits = [(g, h) for g in res["groups"] for h in g["hits"]]
        assert hits, c
        g, h = hits[0]
        assert c.value in h["snippet"] or c.value in json.dumps(h.get("message"))
        # grouped by the top-level summary that covers the hit, with the chain above it
        if h["summary_chain"]:
            assert g["summary_id"] == h["summary_chain"][-1]
        # the message that holds it comes back as the original (every page of it), not a
        # summary or a snippet that merely mentions it
        assert recovered(e, message_hits(res), sess.messages[c.message_index]), (
            f"canary {c.key} ({c.value}) not recovered as its original message")


def test_natural_language_query_and_identifier_rank_first(built):
    e, sess = built
    c = next(x for x in sess.canaries if x.kind in ("error_string", "path_in_decision", "number_in_tool_output"))
    res = call(e, "lcm_grep", query=f"what happened with {c.value} earlier?")
    first = res["groups"][0]["hits"][0]
    assert c.value in first["snippet"] or c.value in json.dumps(first.get("message"))


def test_describe_and_expand_summary_tree_paging(built):
    e, _ = built
    st = e.store.stats()
    top_depth = max(st["summaries_by_depth"])
    res = call(e, "lcm_grep", query="pytest", scope="summaries", limit=50)
    sids = [h["id"] for g in res["groups"] for h in g["hits"]]
    assert sids
    d = call(e, "lcm_describe", id=sids[0])
    for k in ("kind", "depth", "tokens", "time_start", "time_end", "messages_covered", "parents", "children",
              "level", "text"):
        assert k in d
    assert top_depth >= 1
    # a leaf expands to its messages verbatim, paged by tokens: all pages == all children
    leaf = next(s for s in e.store.get_summaries(range(1, 5000)).values() if s.kind == "leaf" and s.n_messages > 5)
    kids, mids = e.store.summary_children(leaf.id)
    got, cursor = [], None
    for _ in range(200):
        page = call(e, "lcm_expand", id=f"s{leaf.id}", max_tokens=500, **({"cursor": cursor} if cursor else {}))
        got += [c["id"] for c in page["children"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert got == [f"m{m}" for m in mids]
    full = e.store.get_messages(mids)
    page = call(e, "lcm_expand", id=f"s{leaf.id}", max_tokens=12_000)
    for ch in page["children"]:
        if "message" in ch:
            assert ch["message"] == full[int(ch["id"][1:])].raw


def test_large_message_pages_round_trip(built):
    e, _ = built
    big = max(e.store.iter_all_messages(), key=lambda m: len(m.text))
    assert big.large and len(big.raw["content"]) > 100_000
    d = call(e, "lcm_describe", id=f"m{big.id}")
    assert d["large"] and d["exploration"]
    parts, cursor = [], None
    for _ in range(500):
        page = call(e, "lcm_expand", id=f"m{big.id}", max_tokens=4000, **({"cursor": cursor} if cursor else {}))
        parts.append(page["page"])
        assert len(json.dumps(page)) < 60_000, "pages stay well under the host's large-result cut-off"
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert "".join(parts) == big.raw["content"]


def test_grep_paging_and_filters(built):
    e, _ = built
    p1 = call(e, "lcm_grep", query="invoice", limit=5)
    assert p1["hits"] == 5 and p1["next_cursor"]
    p2 = call(e, "lcm_grep", query="invoice", limit=5, cursor=p1["next_cursor"])
    ids1 = {h["id"] for g in p1["groups"] for h in g["hits"]}
    ids2 = {h["id"] for g in p2["groups"] for h in g["hits"]}
    assert ids1 and ids2 and not ids1 & ids2
    r = call(e, "lcm_grep", query="invoice", role="user", limit=20)
    assert all(h["role"] == "user" for g in r["groups"] for h in g["hits"])
    rx = call(e, "lcm_grep", query=r"ERR_[A-Z_]+\d+", mode="regex", limit=5)
    assert rx["hits"] >= 1
    assert call(e, "lcm_grep", query="invoice", since="2999-01-01T00:00:00Z")["hits"] == 0
    top = call(e, "lcm_grep", query="pytest", scope="summaries", limit=1)["groups"][0]["hits"][0]["id"]
    under = call(e, "lcm_grep", query="pytest", summary_id=top, scope="messages", limit=10)
    for g in under["groups"]:
        for h in g["hits"]:
            assert top in h["summary_chain"]


@pytest.mark.parametrize("q", HOSTILE, ids=range(len(HOSTILE)))
@pytest.mark.parametrize("mode", ["text", "regex"])
def test_hostile_queries_answer_json(built, q, mode):
    e, _ = built
    out = e.handle_tool_call("lcm_grep", {"query": q, "mode": mode})
    data = json.loads(out)
    assert isinstance(data, dict)
    assert "error" in data or "groups" in data
    if "error" in data:
        assert "internal error" not in data["error"]


def test_cjk_substring_search(tmp_path):
    e = LCMEngine(config=LCMConfig.load({"store": str(tmp_path / "l.db"), "summarizer": "extractive"}, read_file=False))
    e.on_session_start("cjk")
    e.ingest([{"role": "user", "content": "请把重试次数上限改成五次"}, {"role": "assistant", "content": "好的"}])
    e.ingest([{"role": "user", "content": "ログのテキストを確認して"}, {"role": "assistant", "content": "plain → ascii"}])
    res = call(e, "lcm_grep", query="重试次数上限")  # 3+ CJK characters: the trigram index
    assert res["hits"] == 1
    assert call(e, "lcm_grep", query="テキスト")["hits"] == 1
    assert call(e, "lcm_grep", query="重试")["hits"] == 1  # 2 characters: the LIKE fallback
    assert call(e, "lcm_grep", query="次数上限改成七次")["hits"] == 0
    plan = e.store.conn().execute(
        "EXPLAIN QUERY PLAN SELECT rowid FROM messages_cjk WHERE messages_cjk MATCH ?", ('"重试次"',)).fetchall()
    assert any("VIRTUAL TABLE INDEX" in str(r) for r in plan)


@pytest.mark.parametrize("args,needle", [
    ({}, "query is required"), ({"query": 5}, "query is required"), ({"query": "x", "limit": "lots"}, "limit"),
    ({"query": "x", "mode": "fuzzy"}, "mode"), ({"query": "x", "since": "yesterday"}, "since"),
    ({"query": "x", "cursor": "!!"}, "cursor"), ({"query": "x", "summary_id": "m3"}, "summary_id"),
    ({"query": "x", "session_scope": "all"}, "disabled"),
])
def test_argument_errors(built, args, needle):
    e, _ = built
    data = json.loads(e.handle_tool_call("lcm_grep", args))
    assert needle in data["error"]


def test_unknown_ids_and_tools(built):
    e, _ = built
    for name in ("lcm_describe", "lcm_expand"):
        for bad in ("s999999", "m999999", "x1", "", None, 12):
            data = json.loads(e.handle_tool_call(name, {"id": bad}))
            assert "error" in data
    assert "error" in json.loads(e.handle_tool_call("lcm_nope", {}))
    assert "error" in json.loads(e.handle_tool_call("lcm_grep", "not json"))


def test_expand_query_without_model_returns_excerpts(built):
    e, sess = built
    c = sess.canaries[0]
    res = call(e, "lcm_expand_query", prompt=c.question, query=c.value)
    assert "excerpts" in res and any(c.value in x["text"] for x in res["excerpts"])
    assert all(x["id"].startswith("m") for x in res["excerpts"])
