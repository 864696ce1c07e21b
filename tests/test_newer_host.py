"""The newer host contract (docs/host-contract.md#n-optional-hooks, docs/host-contract.md#n-message-identity)
through a host of our own."""

from __future__ import annotations

import copy
import json
import threading

import pytest
from collections import Counter

from lossless_context import LCMEngine
from lossless_context.pipeline.validate import pairing_problems
from lossless_context.config import LCMConfig
from lossless_context.demo.sessions import coding_session, turn_ranges
from tests.support.dagcheck import assert_connected
from tests.support.fake_openai import Fail, FailureSequence, FakeOpenAI, SummariserResponder
from tests.support.newhost import NewHost


def _engine(path, **kw):
    return LCMEngine(config=LCMConfig.load({"store": str(path), "summarizer": "extractive", **kw}, read_file=False))


def _turns(msgs):
    return [msgs[a:b] for a, b in turn_ranges(msgs)]


def _location(request, tmp_path, backend):
    return request.getfixturevalue("pg_fresh_dsn") if backend == "postgres" else tmp_path / "l.db"


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_select_context_is_stable_and_valid(tmp_path, request, backend):
    base = _engine(_location(request, tmp_path, backend))
    e = base.clone_for_agent()
    host = NewHost(e, "gw-1")
    host.start()
    sess = coding_session(900, seed=2)
    for turn in _turns(sess.messages):
        host.turn(*turn)
        host.compress()
    assert host.commits >= 2
    # unchanged turn: the identical object comes back (prompt cache keeps hitting)
    a = e.select_context([{"role": "system", "content": host.system_prompt}] + host.history)
    b = e.select_context([{"role": "system", "content": host.system_prompt}] + host.history)
    assert a is b
    for sel in host.selections:
        if isinstance(sel, list):
            assert sel[0]["role"] == "system" and pairing_problems(sel) == []
            assert not any(m.get("role") == "system" for m in sel[1:])
    # messages carried uids: stored once each, versions keyed on uid
    host.engine.on_session_end("gw-1", host.history)
    stored = Counter(m.uid for m in e.store.iter_all_messages())
    assert stored and max(stored.values()) == 1
    assert e.store.stats()["messages"] == len(sess.messages)
    assert_connected(e.store, "gw-1")


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_stale_request_is_swapped_for_the_committed_context(tmp_path, request, backend):
    e = _engine(_location(request, tmp_path, backend))
    host = NewHost(e, "gw-2")
    host.start()
    sess = coding_session(700, seed=4)
    stale = None
    for turn in _turns(sess.messages):
        host.turn(*turn)
        before = [dict(m) for m in host.history]
        if host.compress():
            stale = before
            break
    assert stale is not None
    # a retry built from the pre-compaction history (the pass committed in between)
    req = [{"role": "system", "content": host.system_prompt}] + stale
    sel = e.select_context(req, budget_tokens=e.threshold_tokens)
    assert isinstance(sel, list) and sel[0] is req[0] or sel[0] == req[0]
    # the committed pass shows older messages as a summary, or (a stubs-only tier-0 pass) as stubs
    assert any("<lcm-summary" in str(m.get("content")) or "[tool-output stub]" in str(m.get("content")) for m in sel)
    assert len(json.dumps(sel)) < len(json.dumps(req))
    assert pairing_problems(sel) == []


def test_content_change_under_known_uid_is_a_new_version(tmp_path):
    e = _engine(tmp_path / "l.db")
    host = NewHost(e, "gw-3")
    host.start()
    host.turn({"role": "user", "content": "first draft"}, {"role": "assistant", "content": "ok"})
    uid = host.history[0]["message_uid"]
    host.history[0]["content"] = "edited draft"
    host.turn({"role": "user", "content": "next"})
    versions = [m for m in e.store.iter_all_messages() if m.uid == uid]
    assert [v.raw["content"] for v in versions] == ["first draft", "edited draft"]


def test_abandoned_pass_publishes_nothing(tmp_path):
    seq = FailureSequence([Fail.slow(2.0)], base=SummariserResponder(max_chars=800), cycle=True)
    with FakeOpenAI(responder=seq) as srv:
        e = _engine(tmp_path / "l.db", summarizer="openai", summary_base_url=srv.base_url, summary_timeout=10)
        host = NewHost(e, "gw-4")
        host.start()
        for turn in list(_turns(coding_session(600, seed=9).messages))[:60]:
            host.turn(*turn)
        assert host.compress(force=True, timeout=0.5) is False
        assert host.abandoned == 1
        calls_at_cancel = len(srv.chat_requests)
    st = e.store.stats()
    assert st["summaries_by_depth"] == {}, "nothing published without the commit signal"
    assert calls_at_cancel <= 3, "the engine stopped calling the summariser once cancelled"


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_parallel_sessions_on_one_engine(tmp_path, request, backend):
    e = _engine(request.getfixturevalue("pg_fresh_dsn") if backend == "postgres" else tmp_path / "l.db")
    errors = []

    def run(i):
        try:
            host = NewHost(e, f"par-{i}")
            host.engine = e
            e.update_model(model="test-model", context_length=64_000)
            e.on_session_start(f"par-{i}")
            for turn in _turns(coding_session(500, seed=20 + i).messages):
                for m in turn:
                    host.history.append(m)
                host.compress()
            e.on_session_end(f"par-{i}", host.history)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for i in range(4):
        assert_connected(e.store, f"par-{i}")
    assert e.store.stats()["messages"] == 4 * 500


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_the_same_request_after_a_commit_gets_the_new_context(tmp_path, request, backend):
    """select_context keeps its answer while the committed context is unchanged; a pass committed
    between two identical requests (a provider retry) must show, not the answer kept from before."""
    from lossless_context.messages import summary_node_ids

    e = _engine(_location(request, tmp_path, backend))
    e.update_model("m", 64_000)
    sid = "gw-retry"
    e.on_session_start(sid)
    msgs = coding_session(1400, seed=9).messages
    half = len(msgs) // 2
    system = {"role": "system", "content": "You are a coding agent."}

    def commit(lst):
        out = e.compress([system] + lst, force=True, session_id=sid)
        e.on_session_start(sid, boundary_reason="compression", old_session_id=sid)
        return out[1:]

    def shown(sel):
        return {i for m in sel for i in summary_node_ids(m)}

    def committed():
        return {entry.ref for entry in e.store.get_context(sid)[1] if entry.kind == "s"}

    kept = commit(msgs[:half])
    req = [system] + msgs  # a request still built from the history before the passes
    first = e.select_context(copy.deepcopy(req), budget_tokens=e.threshold_tokens, session_id=sid)
    assert isinstance(first, list) and shown(first) == committed() != set()
    commit(kept + msgs[half:])  # the next pass commits in between
    again = e.select_context(copy.deepcopy(req), budget_tokens=e.threshold_tokens, session_id=sid)
    assert isinstance(again, list) and shown(again) == committed(), "a stale selection came back"
    assert shown(again) != shown(first)
