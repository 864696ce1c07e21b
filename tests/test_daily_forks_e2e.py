"""Issue #23 items 3 and 7 through the real hermes-agent agent loop, offline.

`/branch` runs the host's own handler (`CLICommandsMixin._handle_branch_command`, through
tests/support/hermes_host.py), and the host's background memory review runs on its own thread
with `memory.nudge_interval: 3`. Each run is `run_agent.AIAgent` in a subprocess against the
fake OpenAI-compatible server on 127.0.0.1.
"""

from __future__ import annotations

import json
import sqlite3

import pytest

from tests.support.fake_openai import ChatResponder, FakeOpenAI, Router, SummariserResponder
from tests.support.hermes_host import run_hermes

# every test runs on each Hermes host (tests/support/hosts.py): 0.19, 0.22, and 0.20 when a mirror is given
pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("hermes_host")]

CANARY = "BLUEFALCON-4471"
AFTER = "PARENTAFTER-99"


def _db(run) -> sqlite3.Connection:
    return sqlite3.connect(run.hermes_home / "lcm" / "lcm.db")


def _sessions(c: sqlite3.Connection) -> dict:
    return {r[0]: {"parent_id": r[1], "boundary_reason": r[2]}
            for r in c.execute("SELECT id, parent_id, boundary_reason FROM sessions")}


@pytest.mark.parametrize("reply_chars", [200, 30_000], ids=["below-threshold", "after-compaction"])
def test_branch_sees_its_parent_only_up_to_the_fork(tmp_path, reply_chars):
    router = Router(chat=ChatResponder(reply_chars=reply_chars), summariser=SummariserResponder(max_chars=2000))
    with FakeOpenAI(responder=router) as srv:
        turns = [f"Step {i}: keep going with the billing refactor." for i in range(9)]
        turns[1] = f"Remember {CANARY}, we need it later."
        first = run_hermes(srv, turns + [{"command": "/branch experiment"}, "Now in the branch: try plan B."],
                           engine="lcm", workdir=tmp_path, extra_config={"lcm": {"summarizer": "auto"}})
        assert first.ok, first.describe()
        ids = first.turns[len(turns)]["command_output"]
        parent, branch = ids["parent_session_id"], ids["branch_session_id"]
        assert parent != branch and first.result["session_id"] == parent
        assert first.turns[-1]["session_id"] == branch
        if reply_chars > 1000:
            assert first.turns[len(turns) - 1]["compression_count"], "the parent compacted before the branch"

        # later, in the parent: a message the branch must never see
        later = run_hermes(srv, [f"New code word {AFTER} for the parent only."], engine="lcm",
                           hermes_home=first.hermes_home, home=first.home, session_id=parent, resume=True)
        assert later.ok, later.describe()
        # back in the branch
        back = run_hermes(srv, [{"command": f"/lcm grep {AFTER}"}, {"command": f"/lcm grep {CANARY}"},
                                {"command": "/lcm status"}],
                          engine="lcm", hermes_home=first.hermes_home, home=first.home, session_id=branch, resume=True)
        assert back.ok, back.describe()
        after_hits, canary_hits, status = (t.get("command_output") for t in back.turns)
        assert f"session {branch}" in status, status
        assert after_hits == "no matches", after_hits
        assert CANARY in canary_hits, canary_hits

        with _db(back) as c:
            # the parent does have it: the store is not simply missing the message
            assert c.execute("SELECT COUNT(*) FROM messages WHERE session_id=? AND text LIKE ?",
                             (parent, f"%{AFTER}%")).fetchone()[0] >= 1
            # the copied history is not stored again: the user said the canary once
            said = c.execute("SELECT session_id FROM messages WHERE role='user' AND text LIKE ?",
                             (f"%{CANARY}%",)).fetchall()
            assert said == [(parent,)], said
            # our own summary block never becomes a stored message
            assert c.execute("SELECT COUNT(*) FROM messages WHERE raw LIKE '%<lcm-summary%'").fetchone()[0] == 0
            s = _sessions(c)
            assert s[branch]["parent_id"] == parent


# The driver pauses after each turn as a user does (join_background): 0.22 cancels a review the
# next turn overtakes, and queues one bound for its managed local server until the machine is idle.
@pytest.mark.parametrize("deferred", [False, True], ids=["immediate", "idle-queue"])
def test_background_review_fork_is_linked_and_never_the_default(tmp_path, hermes_host, deferred):
    if deferred and not hermes_host.at_least("0.22"):
        pytest.skip("the idle queue of background reviews is new in 0.22")
    router = Router(chat=ChatResponder(reply_chars=400), summariser=SummariserResponder(max_chars=2000))
    with FakeOpenAI(responder=router) as srv:
        turns = [f"Turn {i}: the deploy notes for service {i}." for i in range(7)]
        turns[1] = f"Remember {CANARY} for the release."
        run = run_hermes(srv, turns, engine="lcm", workdir=tmp_path, join_background=60,
                         toolsets=["context_engine", "memory"], defer_reviews=deferred,
                         extra_config={"memory": {"memory_enabled": True, "nudge_interval": 3},
                                       "lcm": {"summarizer": "auto"}})
        assert run.ok, run.describe()
        assert not run.result.get("background_alive"), run.result.get("background_alive")
        queued = sum((t.get("background_reviews") or {}).get("queued", 0) for t in run.result["turns"])
        assert (queued > 0) == deferred, run.result["turns"]
        live = run.result["session_id"]
        # the host did run its review: its prompt reached the model
        reviews = [r for r in srv.chat_requests
                   if any("Review the conversation" in json.dumps(m.get("content")) for m in r.messages)]
        assert reviews, "the host's background review never ran"
        with _db(run) as c:
            s = _sessions(c)
            forks = [k for k, v in s.items() if v["boundary_reason"] == "background"]
            assert forks, s  # 0.19.0's review agent registers a session of its own: recognised
            for k in forks:
                assert s[k]["parent_id"] == live, (k, s[k])
            # the review prompt is never stored as one of the user's messages in the live session
            assert c.execute("SELECT COUNT(*) FROM messages WHERE session_id=? AND text LIKE ?",
                             (live, "%Review the conversation%")).fetchone()[0] == 0
            # a fork stores only what it adds: no copy of the parent's messages, not our block,
            # and the host's review prompt as the host's instruction, never as user speech
            parent = {r[0] for r in c.execute("SELECT ident FROM messages WHERE session_id=?", (live,))}
            for k in forks:
                rows = c.execute("SELECT role, ident, text FROM messages WHERE session_id=?", (k,)).fetchall()
                assert not [r for r in rows if r[1] in parent], k
                assert not [r for r in rows if '<lcm-summary nodes="' in r[2]], k
                assert not [r for r in rows if r[0] == "user" and "Review the conversation" in r[2]], k
        # the CLI's default session is the user's, not the review's
        from tests.test_cli import ok, run_lcm

        found = ok(run_lcm("grep", CANARY, home=run.hermes_home))
        assert CANARY in found.stdout, found.stdout
        context = ok(run_lcm("context", "--json", home=run.hermes_home))
        assert json.loads(context.stdout)["session"] == live, (s, context.stdout[:2000])


class _ReviewThatSavesAMemory:
    """The user's turns get ordinary replies; the host's review asks for a memory write first and
    then answers, each time with usage that puts the fork's request over its threshold, so the
    0.22 host compacts the fork before its second call."""

    def __init__(self) -> None:
        self.chat = ChatResponder(reply_chars=6000)
        self.review_calls = 0

    def __call__(self, req):
        from tests.support.fake_openai import Reply, ToolCall, _content_text, _usage

        msgs = req.get("messages") or []
        users = [m for m in msgs if m.get("role") == "user"]
        if users and "Review the conversation" in _content_text(users[-1].get("content")):
            self.review_calls += 1
            if msgs[-1].get("role") != "tool":
                return Reply(content="", tool_calls=[ToolCall("memory", {
                    "action": "add", "target": "memory", "content": f"Deploy note {self.review_calls}"})],
                    usage=_usage(60_000, 20))
            return Reply(content="Saved the deploy notes.", usage=_usage(60_000, 20))
        return self.chat(req)


@pytest.mark.hosts("0.22")
def test_a_compacting_review_fork_leaves_the_store_healthy(tmp_path):
    """0.22 compacts its review fork (issue #38: no commit signal ever comes): the fork's passes
    live in the fork's own session, nothing is left staged, the parent keeps its own context,
    and `lcm doctor` is healthy without a repair."""
    review = _ReviewThatSavesAMemory()
    router = Router(chat=review, summariser=SummariserResponder(max_chars=2000))
    with FakeOpenAI(responder=router) as srv:
        turns = [f"Turn {i}: the deploy notes for service {i}." for i in range(6)]
        run = run_hermes(srv, turns, engine="lcm", workdir=tmp_path, join_background=60,
                         toolsets=["context_engine", "memory"],
                         extra_config={"memory": {"memory_enabled": True, "nudge_interval": 3},
                                       "lcm": {"summarizer": "auto"}})
        assert run.ok, run.describe()
    live = run.result["session_id"]
    fork_passes = [c for c in run.result["engine_calls"] if c["method"] == "compress"]
    assert review.review_calls >= 2 and fork_passes, "the host never compacted its review fork"
    with _db(run) as c:
        s = _sessions(c)
        forks = [k for k, v in s.items() if v["boundary_reason"] == "background"]
        assert forks and all(s[k]["parent_id"] == live for k in forks), s
        by_session = dict(c.execute("SELECT session_id, COUNT(*) FROM summaries GROUP BY session_id").fetchall())
        assert any(by_session.get(k) for k in forks), by_session  # the fork's own pass, in its session
        assert not by_session.get(live), "the fork published into the parent"
        assert c.execute("SELECT COUNT(*) FROM staged_passes").fetchone()[0] == 0
        # what `lcm doctor` would call stale an hour from now: nothing
        c.execute("UPDATE staged_passes SET created_at = created_at - 7200")
    from tests.test_cli import ok, run_lcm

    ok(run_lcm("doctor", home=run.hermes_home))  # (exits non-zero when a check fails)
