"""Issue #23 items 3 and 6 on the real engine and both stores: branches bounded at the fork,
rolled-back messages out of search, `forget` removing a session and repairing its lineage.
"""

from __future__ import annotations

import copy
import json
import os

import pytest

from lossless_context import LCMEngine
from lossless_context.config import LCMConfig
from lossless_context.ops.doctor import run_doctor
from lossless_context.edits.forget import forget_session, rolled_back
from lossless_context.records import ContextEntry
from lossless_context.tokens import estimate_messages_tokens
from tests.support.hostdb import add_session, session_db


@pytest.fixture(params=["sqlite", "postgres"])
def location(request, tmp_path, monkeypatch):
    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "hermes"))
    for k in list(os.environ):
        if k.startswith("LCM_"):
            monkeypatch.delenv(k)
    if request.param == "sqlite":
        return str(tmp_path / "lcm.db")
    return request.getfixturevalue("pg_fresh_dsn")


@pytest.fixture
def host_db(tmp_path):
    """The host's own SessionDB, with the parent session P."""
    db = session_db(tmp_path / "state.db", {"P": None})
    yield db
    db.close()


def _engine(location: str) -> LCMEngine:
    e = LCMEngine(config=LCMConfig.load({"store": location, "summarizer": "extractive"}, read_file=False))
    e.update_model("m", 64_000)
    return e


def _grep(e: LCMEngine, q: str) -> list[str]:
    ans = json.loads(e.handle_tool_call("lcm_grep", {"query": q, "limit": 50}))
    assert "error" not in ans, ans
    return [h["id"] for g in ans["groups"] for h in g["hits"]]


def _turns(tag: str, n: int, big: int = 0) -> list[dict]:
    out = []
    for i in range(n):
        out.append({"role": "user", "content": f"{tag} question {i} " + "u" * big})
        out.append({"role": "assistant", "content": f"{tag} answer {i} " + "a" * big})
    return out


def test_branch_is_bounded_at_the_fork_and_stores_only_what_is_new(location, host_db):
    db = host_db
    reg = _engine(location)
    p = copy.deepcopy(reg)
    p.bind_session_state(db, "P")
    hist = [{"role": "user", "content": "the code word is BLUEFALCON"},
            {"role": "assistant", "content": "noted BLUEFALCON"}] + _turns("early", 14, big=14_000)
    out = p.compress(hist, current_tokens=estimate_messages_tokens(hist))
    assert out != hist
    p.on_session_start("P", boundary_reason="compression", old_session_id="P")
    p.on_session_end("P", out)
    stored_before = p.store.stats()["messages"]
    # /branch: the host copies P's history into B and rebinds (R19: no on_session_start)
    add_session(db, "B", parent="P")
    b = copy.deepcopy(reg)
    b.bind_session_state(db, "B")
    b_hist = copy.deepcopy(out)
    b.on_session_end("B", b_hist)
    assert p.store.stats()["messages"] == stored_before  # the copied history is not stored again
    rows = {s["id"]: s for s in p.store.list_sessions()}
    assert rows["B"]["messages"] == 0 and rows["B"]["boundary_reason"] == "branch"
    # our summary block was recognised, not stored as an ordinary message
    assert not any("<lcm-summary" in (m.text or "") for m in p.store.session_messages("B"))
    # later in P
    p.on_session_end("P", out + [{"role": "user", "content": "PARENTAFTER-99 is new"},
                                 {"role": "assistant", "content": "ok PARENTAFTER-99"}])
    b.on_session_end("B", b_hist + [{"role": "user", "content": "branch only BRANCHNEW-7"},
                                    {"role": "assistant", "content": "fine"}])
    assert _grep(p, "PARENTAFTER-99")  # P sees it
    assert _grep(b, "PARENTAFTER-99") == []  # B does not: it was written after the fork
    assert _grep(b, "BLUEFALCON")  # B still sees the history before the fork
    assert _grep(b, "BRANCHNEW-7") and _grep(p, "BRANCHNEW-7") == []
    # an id from P after the fork is unknown to B
    pid = _grep(p, "PARENTAFTER-99")[0]
    ans = json.loads(b.handle_tool_call("lcm_describe", {"id": pid}))
    assert "unknown id" in ans.get("error", ""), ans


def test_a_branch_never_names_its_parents_nodes_made_after_the_fork(location, host_db):
    """The parent compacts on after a /branch, condensing summaries the branch shares into a
    node made after the fork. The branch cannot open that node, and no answer of its tools
    names it either: not as a parent, not in a chain, not as a hit's summary chain."""
    db = host_db
    reg = _engine(location)
    p = copy.deepcopy(reg)
    p.bind_session_state(db, "P")
    hist = _turns("early", 16, big=14_000)
    out = p.compress(hist, current_tokens=estimate_messages_tokens(hist))
    assert out != hist
    p.on_session_start("P", boundary_reason="compression", old_session_id="P")
    p.on_session_end("P", out)
    add_session(db, "B", parent="P")
    b = copy.deepcopy(reg)
    b.bind_session_state(db, "B")
    b.on_session_end("B", copy.deepcopy(out))
    shared = {int(i[1:]) for i in _grep(b, "early question 5") if i.startswith("s")}
    assert shared, "no summary before the fork to share"
    cur = out
    for k in range(6):  # P goes on until a node over the shared summaries exists
        cur = cur + _turns(f"later{k}", 6, big=14_000)
        nxt = p.compress(cur, current_tokens=estimate_messages_tokens(cur), force=True)
        if nxt != cur:
            p.on_session_start("P", boundary_reason="compression", old_session_id="P")
            cur = nxt
        p.on_session_end("P", cur)
    after = {q for s_id in shared for q in p.store.summary_parents(s_id)}
    assert after, "the parent never condensed the shared summaries"
    for q in after:
        assert "unknown id" in json.loads(b.handle_tool_call("lcm_describe", {"id": f"s{q}"})).get("error", "")
    named: set[str] = set()
    ans = json.loads(b.handle_tool_call("lcm_grep", {"query": "early question 5", "limit": 50}))
    for g in ans["groups"]:
        for h in g["hits"]:
            named.update(h["summary_chain"])
            d = json.loads(b.handle_tool_call("lcm_describe", {"id": h["id"]}))
            named.update(d.get("parents", []) + d.get("chain", []) + d.get("covered_by", []))
    assert named.isdisjoint({f"s{q}" for q in after}), named
    # the parent itself still sees its node over them
    d = json.loads(p.handle_tool_call("lcm_describe", {"id": f"s{min(shared)}"}))
    assert set(d["parents"]) & {f"s{q}" for q in after}


def test_undo_takes_the_message_out_of_search_and_a_resend_brings_it_back(location):
    e = _engine(location)
    e.bind_session_state(None, "U")
    base = _turns("chat", 3)
    e.on_session_end("U", base)
    oops = [{"role": "user", "content": "my password is OOPS-SECRET-123"},
            {"role": "assistant", "content": "I will remember that"}]
    e.on_session_end("U", base + oops)
    assert _grep(e, "OOPS-SECRET-123")
    e.on_session_end("U", base)  # /undo: the host's list lost the last turn
    assert _grep(e, "OOPS-SECRET-123") == []
    _v, ctx = e.store.get_context("U")
    assert len(ctx) == len(base)
    e.on_session_end("U", base + [{"role": "user", "content": "something else"}])
    assert _grep(e, "OOPS-SECRET-123") == []
    assert run_doctor(e.store).ok


def test_rolled_back_is_only_a_lost_tail():
    def ents(*refs):
        return [ContextEntry("m", r, f"i{r}", "user", 1) for r in refs]

    assert rolled_back(ents(1, 2, 3, 4), ents(1, 2)) == [3, 4]
    assert rolled_back(ents(1, 2, 3), ents(1, 2, 3, 5)) == []
    assert rolled_back(ents(1, 2, 3), ents(1, 3)) == []  # a message dropped in the middle: not an undo
    assert rolled_back(ents(1, 2, 3), ents(1, 2, 7)) == [3]  # a retry: the reply was replaced
    assert rolled_back(ents(1, 2), ents(3, 4)) == []  # nothing in common: another list, not an undo


def test_forget_removes_a_session_and_repairs_a_branch_that_shared_it(location, host_db):
    db = host_db
    reg = _engine(location)
    p = copy.deepcopy(reg)
    p.bind_session_state(db, "P")
    hist = [{"role": "user", "content": "FORGETME-5150 is the launch code"}] + _turns("old", 14, big=14_000)
    hist.insert(1, {"role": "assistant", "content": "noted"})
    out = p.compress(hist, current_tokens=estimate_messages_tokens(hist))
    p.on_session_start("P", boundary_reason="compression", old_session_id="P")
    p.on_session_end("P", out)
    add_session(db, "B", parent="P")
    b = copy.deepcopy(reg)
    b.bind_session_state(db, "B")
    b.on_session_end("B", copy.deepcopy(out) + [{"role": "user", "content": "KEEPME-77 lives in the branch"},
                                                 {"role": "assistant", "content": "ok"}])
    other = copy.deepcopy(reg)
    add_session(db, "O")
    other.bind_session_state(db, "O")
    other.on_session_end("O", [{"role": "user", "content": "unrelated FORGETME-5150 mention in O"}])
    assert _grep(b, "FORGETME-5150")
    report = forget_session(p.store, "P")
    assert report.messages >= len(hist) - 2 and "B" in report.repaired
    assert p.store.get_session("P") is None
    assert _grep(b, "FORGETME-5150") == [] and _grep(b, "KEEPME-77")
    assert _grep(other, "FORGETME-5150")  # another conversation's own message is not touched
    doc = run_doctor(p.store)
    assert doc.ok, doc.render_text()
    rows = {s["id"]: s for s in p.store.list_sessions()}
    assert rows["B"]["parent_id"] is None
    # the branch keeps working
    b.on_session_end("B", [{"role": "user", "content": "KEEPME-77 lives in the branch"},
                           {"role": "assistant", "content": "ok"}, {"role": "user", "content": "after the forget"}])
    assert _grep(b, "after the forget")
    assert run_doctor(p.store).ok


def test_an_undo_that_reaches_a_pass_takes_the_message_out_of_search(location):
    """Issue #40 item 1: on 0.19.0 the list after an /undo usually reaches the engine through
    compress(); the rollback rule runs there too."""
    e = _engine(location)
    e.bind_session_state(None, "UP")
    base = _turns("chat", 8, big=9_000)
    oops = [{"role": "user", "content": "my password is OOPS-PASS-4471"},
            {"role": "assistant", "content": "I will remember OOPS-PASS-4471"}]
    e.on_session_end("UP", base + oops)
    assert _grep(e, "OOPS-PASS-4471")
    after = base + _turns("later", 2, big=9_000)  # /undo, then a new turn: over the threshold
    out = e.compress(after, current_tokens=estimate_messages_tokens(after))
    assert out != after  # a real pass
    assert _grep(e, "OOPS-PASS-4471") == []
    e.on_session_start("UP", boundary_reason="compression", old_session_id="UP")
    assert _grep(e, "OOPS-PASS-4471") == []
    assert run_doctor(e.store).ok


def test_a_manual_compress_of_a_prefix_keeps_the_tail_once(location):
    """/compress here N hands compress() a prefix (the host re-appends the verbatim tail): the
    tail is hidden at most until the host's next list, never stored twice or lost."""
    e = _engine(location)
    e.bind_session_state(None, "PC")
    hist = _turns("early", 10, big=8_000) + [{"role": "user", "content": "tail fact TAILWORD-77"},
                                             {"role": "assistant", "content": "ok TAILWORD-77"}]
    e.on_session_end("PC", hist)
    before = _grep(e, "TAILWORD-77")
    assert len(before) == 2
    head, tail = hist[:-2], hist[-2:]
    out = e.compress(head, current_tokens=estimate_messages_tokens(hist), force=True)
    assert out != head
    e.on_session_end("PC", head)
    e.on_session_start("PC", boundary_reason="compression", old_session_id="PC")
    e.on_session_end("PC", out + tail + _turns("next", 1))
    assert sorted(_grep(e, "TAILWORD-77")) == sorted(before)
    assert e.store.stats()["messages"] == len(hist) + 2
    assert run_doctor(e.store).ok
