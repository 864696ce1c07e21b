"""Issue #23 through the real hermes-agent 0.19.0 agent loop, offline.

`/lcm` on the live session (item 1) and a store that cannot be used (item 4): each drives
`run_agent.AIAgent` in a subprocess against the fake OpenAI-compatible server on 127.0.0.1.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.support.fake_openai import ChatResponder, FakeOpenAI, Router, ScriptedResponder, SummariserResponder, ToolCall
from tests.support.hermes_host import run_hermes

# every test runs on each Hermes host (tests/support/hosts.py): 0.19, 0.22, and 0.20 when a mirror is given
pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("hermes_host")]

CANARY = "EARLYFACT-2231"


def _turns(n: int = 9) -> list:
    turns = [f"Question {i}: keep going with the billing refactor." for i in range(n)]
    turns[1] = f"Remember {CANARY}, we need it later."
    return turns


def test_slash_commands_see_the_live_session(tmp_path):
    router = Router(chat=ChatResponder(reply_chars=30_000), summariser=SummariserResponder(max_chars=2000))
    with FakeOpenAI(responder=router) as srv:
        turns = _turns() + [{"command": "/lcm status"}, {"command": f"/lcm grep {CANARY}"},
                            {"command": "/lcm context"}]
        # The pass itself calls the host's model here (by default, below the hard threshold, a
        # worker does right after it: tests/test_background_default.py).
        lcm = {"summarizer": "auto", "background_compaction": "off"}
        run = run_hermes(srv, turns, engine="lcm", workdir=tmp_path, extra_config={"lcm": lcm})
        assert run.ok, run.describe()
        sid = run.result["session_id"]
        status, grep, context = (t.get("command_output") for t in run.turns[-3:])
        assert f"session {sid}" in status, status
        assert "compactions 0 (this process)" not in status and "context 0/0" not in status, status
        # the host's "Session compressed N times — accuracy may degrade" reads compression_count:
        # the summary levels the model reads, not the number of lossless passes
        import sqlite3

        from lossless_context.messages import summary_node_ids

        levels = run.turns[len(_turns()) - 1]["compression_count"]
        shown = {n for m in run.messages for n in summary_node_ids(m)}
        assert shown
        c = sqlite3.connect(run.hermes_home / "lcm" / "lcm.db")
        depth = max(c.execute(f"SELECT depth FROM summaries WHERE id IN ({','.join('?' * len(shown))})",
                              sorted(shown)).fetchall())[0]
        assert levels == depth + 1, (levels, depth)
        # the host's model summarised (/lcm status counts the pass's calls and a worker's alike)
        assert int(re.search(r"summariser calls (\d+) \(0 in the background\)", status)[1]) >= 1, status
        assert CANARY in grep, grep
        assert f"active context of {sid}" in context and " s" in context, context
        # a resumed session: /lcm describe finds the summary nodes of the session it resumed
        nodes = [w for w in context.split() if w.startswith("s") and w[1:].isdigit()]
        assert nodes
        srv.responder = Router(chat=ChatResponder(reply_chars=200), summariser=SummariserResponder())
        again = run_hermes(srv, [{"command": f"/lcm describe {nodes[0]}"}, "hello again",
                                 {"command": f"/lcm describe {nodes[0]}"}],
                           engine="lcm", hermes_home=run.hermes_home, home=run.home, session_id=sid, resume=True)
        assert again.ok, again.describe()
        for t in (again.turns[0], again.turns[2]):
            out = t.get("command_output")
            assert "unknown id" not in out and f'"id": "{nodes[0]}"' in out, out


def test_a_store_under_a_regular_file_does_not_let_the_context_grow(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    store = blocker / "lcm" / "lcm.db"
    chat = ScriptedResponder({"search the history": ToolCall("lcm_grep", {"query": CANARY})},
                             then=ChatResponder(reply_chars=30_000))
    with FakeOpenAI(responder=Router(chat=chat, summariser=SummariserResponder())) as srv:
        turns = _turns(12)
        turns[9] = "search the history for it"
        turns.append({"command": "/lcm status"})
        run = run_hermes(srv, turns, engine="lcm", workdir=tmp_path, extra_config={"lcm": {"store": str(store)}})
        assert run.ok, run.describe()
        # every request stayed within the 64K window (chars/4), and compaction kept working
        sizes = [sum(len(json.dumps(m)) for m in r.messages) // 4 for r in srv.chat_requests if r.body.get("stream")]
        assert max(sizes) < 64_000, sizes
        # the model's tool got the path and the reason
        [res] = [json.loads(m["content"]) for m in chat.tool_results]
        assert str(store) in res["error"] and "NotADirectoryError" in res["error"], res
        # the user: /lcm status names the store and the reason; the log says it once
        status = run.turns[-1]["command_output"]
        assert "unavailable" in status and str(blocker) in status, status
        agent_log = (run.hermes_home / "logs" / "agent.log").read_text()
        assert agent_log.count("the session goes on without it") == 1


def test_undo_takes_the_message_out_of_search(tmp_path):
    chat = ScriptedResponder({"look it up": ToolCall("lcm_grep", {"query": "OOPS-SECRET-123"}, "call_undo_1"),
                              "check again": ToolCall("lcm_grep", {"query": "OOPS-SECRET-123"}, "call_undo_2")},
                             then=ChatResponder(reply_chars=300))
    with FakeOpenAI(responder=Router(chat=chat, summariser=SummariserResponder())) as srv:
        turns = ["hello there", "my password is OOPS-SECRET-123", "look it up", {"command": "/undo"},
                 {"command": "/undo"}, "check again"]
        run = run_hermes(srv, turns, engine="lcm", workdir=tmp_path, extra_config={"lcm": {"summarizer": "extractive"}})
        assert run.ok, run.describe()
        first, second = [json.loads(m["content"]) for m in chat.tool_results]
        assert first["hits"] >= 1  # said, and found (the question in flight itself is not a hit)
        assert second["hits"] == 0, second  # undone: no longer found
        # the host's own history lost the turn too (the later tool call names it as its query)
        assert not any("OOPS-SECRET-123" in str(m.get("content")) for m in run.messages if m["role"] == "user")


def test_slash_grep_finds_live_messages_below_the_threshold(tmp_path):
    """Below the threshold 0.19.0 hands the engine no message list: /lcm reads the host's own
    record of the live session first, so what was just said is found."""
    router = Router(chat=ChatResponder(reply_chars=200), summariser=SummariserResponder())
    with FakeOpenAI(responder=router) as srv:
        turns = _turns(4) + [{"command": f"/lcm grep {CANARY}"}, {"command": "/lcm status"}]
        run = run_hermes(srv, turns, engine="lcm", workdir=tmp_path)
        assert run.ok, run.describe()
        grep, status = (t.get("command_output") for t in run.turns[-2:])
        assert not any(t.get("compression_count") for t in run.turns), "stayed below the threshold"
        assert CANARY in grep, grep
        assert "[active context]" in grep, grep
        assert "messages stored 0;" not in status, status


def test_a_resumed_transcript_of_originals_keeps_our_summaries(tmp_path):
    """The host crashed between our committed pass and its own write of the compacted list
    (state.db still holds the originals as the live transcript): the resumed session hands
    the originals back. They stand for our summary again (ingest_replay.py): no message is
    summarised twice, and lcm doctor stays healthy."""
    import sqlite3

    from lossless_context.ops.doctor import run_doctor
    from lossless_context.store import open_store

    router = Router(chat=ChatResponder(reply_chars=30_000), summariser=SummariserResponder(max_chars=2000))
    with FakeOpenAI(responder=router) as srv:
        run = run_hermes(srv, _turns(), engine="lcm", workdir=tmp_path, extra_config={"lcm": {"summarizer": "extractive"}})
        assert run.ok, run.describe()
        sid = run.result["session_id"]
        store_path = run.hermes_home / "lcm" / "lcm.db"
        lcm = sqlite3.connect(store_path)
        assert lcm.execute("SELECT COUNT(*) FROM summaries WHERE kind = 'leaf'").fetchone()[0]  # a pass committed
        lcm.close()
        # the crash: the archived originals are the live transcript again, the compacted rows gone
        host_db = sqlite3.connect(run.hermes_home / "state.db")
        with host_db:
            archived = set(host_db.execute("SELECT role, content FROM messages WHERE session_id = ? AND compacted = 1",
                                           (sid,)).fetchall())
            active = host_db.execute("SELECT id, role, content FROM messages WHERE session_id = ? AND active = 1"
                                     " ORDER BY id", (sid,)).fetchall()
            # the compacted list the host wrote: the head and tail again and our summary between
            end = max(i for i, role, content in active
                      if (role, content) in archived or str(content).startswith("<lcm-summary"))
            assert archived and any(str(c).startswith("<lcm-summary") for _, _, c in active)
            host_db.execute("DELETE FROM messages WHERE session_id = ? AND active = 1 AND id <= ?", (sid, end))
            host_db.execute("UPDATE messages SET active = 1, compacted = 0 WHERE session_id = ? AND compacted = 1",
                            (sid,))
        host_db.close()
        again = run_hermes(srv, ["Question 9: and the invoices?", "Question 10: and the refunds?"], engine="lcm",
                           hermes_home=run.hermes_home, home=run.home, session_id=sid, resume=True,
                           extra_config={"lcm": {"summarizer": "extractive"}})
        assert again.ok, again.describe()
        assert any("<lcm-summary" in str(m.get("content")) for m in again.messages)
    store = open_store(str(store_path))
    try:
        rep = run_doctor(store)
        assert rep.ok, rep.render_text()
        lcm = sqlite3.connect(store_path)
        twice = lcm.execute("SELECT COUNT(*) FROM (SELECT sm.message_id FROM summary_messages sm JOIN summaries s"
                            " ON s.id = sm.summary_id WHERE s.state = 'published' GROUP BY 1 HAVING COUNT(*) > 1)"
                            ).fetchone()[0]
        lcm.close()
        assert twice == 0
    finally:
        store.close()
