"""Issue #23 items 1 and 7: `/lcm` acts on the live agent's engine; background forks stay out.

The host registers one engine and deep-copies it per agent (R19: copy.deepcopy; newer hosts:
clone_for_agent); the slash command holds the registered object. These tests build the
copies exactly that way and drive them like the host does.
"""

from __future__ import annotations

import copy
import json
import os

import pytest

from lossless_context import LCMEngine
from lossless_context.sessions.forks import BACKGROUND, is_review_list, latest_real_session
from lossless_context.hermes.plugin import register
from lossless_context.tokens import estimate_messages_tokens
from lossless_context.ops.viewer import latest_session
from tests.support.hostdb import session_db

CANARY = "EARLYFACT-4411"


class _Ctx:
    def __init__(self) -> None:
        self.engine = None
        self.commands: dict = {}

    def register_context_engine(self, engine) -> None:
        self.engine = engine

    def register_command(self, name, handler, description="", args_hint="") -> None:
        self.commands[name] = handler


@pytest.fixture
def host_db(tmp_path):
    """The host's own session database (its real class), holding the user's sessions."""
    db = session_db(tmp_path / "state.db", {"user-session": None, "s-a": None})
    yield db
    db.close()


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "hermes"))
    for k in list(os.environ):
        if k.startswith("LCM_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("LCM_STORE", str(tmp_path / "lcm.db"))
    monkeypatch.setenv("LCM_SUMMARIZER", "extractive")
    ctx = _Ctx()
    register(ctx)
    return ctx


def _agent(registered: LCMEngine, sid: str, db) -> LCMEngine:
    eng = copy.deepcopy(registered)  # what R19's agent_init does
    eng.update_model("m", 64_000)
    eng.bind_session_state(session_db=db, session_id=sid)
    eng.on_session_start(sid, platform="cli", model="m")
    return eng


def _history(n: int) -> list[dict]:
    out = []
    for i in range(n):
        out.append({"role": "user", "content": (f"remember {CANARY} " if i == 1 else "") + f"turn {i} " + "u" * 300})
        out.append({"role": "assistant", "content": f"reply {i} " + "r" * 16_000})
    return out


def test_status_grep_describe_act_on_the_live_copy(plugin, host_db):
    registered, handler = plugin.engine, plugin.commands["lcm"]
    live = _agent(registered, "user-session", host_db)
    hist = _history(16)
    out = live.compress(hist, current_tokens=estimate_messages_tokens(hist))
    assert out != hist
    live.on_session_start("user-session", boundary_reason="compression", old_session_id="user-session")
    status = handler("status")
    assert "session user-session" in status
    assert "compactions 1 (this process)" in status and "context 0/0" not in status
    assert "summary levels in the context 1" in status  # what the host's "compressed N times" reads
    # the background review fork (R19: built without the host's session database)
    fork = _agent(registered, "review-fork-1", None)
    assert "session user-session" in handler("status")
    assert CANARY in handler(f"grep {CANARY}")
    sid = next(s for s in live.store.list_sessions() if s["id"] == "user-session")
    summaries = live.store.stats()["summaries_by_depth"]
    assert summaries
    # describe a summary of the live session (its id comes from the live context)
    _, ctx = live.store.get_context("user-session")
    node = next(e.ref for e in ctx if e.kind == "s")
    assert "unknown id" not in handler(f"describe s{node}")
    assert sid["messages"] > 0
    # the fork is linked to the user's session and never its "latest"
    rows = {s["id"]: s for s in live.store.list_sessions()}
    assert rows["review-fork-1"]["boundary_reason"] == BACKGROUND
    assert rows["review-fork-1"]["parent_id"] == "user-session"
    assert latest_session(live.store) == "user-session"
    assert fork.current_session() == "review-fork-1"


def test_figures_are_shared_by_every_copy(plugin, host_db):
    registered = plugin.engine
    a = _agent(registered, "s-a", host_db)
    hist = _history(16)
    a.compress(hist, current_tokens=estimate_messages_tokens(hist))
    b = copy.deepcopy(registered)
    assert b.get_status()["lcm_last_pass_ms"] == a.get_status()["lcm_last_pass_ms"] > 0
    assert b.get_status()["lcm_compactions"] == a.get_status()["lcm_compactions"]


def test_newer_host_review_fork_is_recognised_by_its_prompt(plugin):
    registered, handler = plugin.engine, plugin.commands["lcm"]
    live = registered.clone_for_agent()
    live.update_model("m", 64_000)
    live.bind_session_state(None, "main")
    live.on_session_start("main")
    hist = [dict(m, message_uid=f"{i:032x}") for i, m in enumerate(_history(3))]
    live.on_turn_complete(hist)
    fork = registered.clone_for_agent()
    fork.bind_session_state(None, "fork-sid")
    fork.on_session_start("fork-sid")
    review = hist + [{"role": "user", "content": "Review the conversation above and consider saving to memory "
                                                 "if appropriate.", "message_uid": "f" * 32}]
    assert is_review_list(review)
    fork.on_turn_complete(review)
    rows = {s["id"]: s for s in live.store.list_sessions()}
    assert rows["fork-sid"]["boundary_reason"] == BACKGROUND and rows["fork-sid"]["parent_id"] == "main"
    # the copied conversation aligned with the parent's rows by uid: stored once
    assert rows["main"]["messages"] == len(hist) and rows["fork-sid"]["messages"] == 1
    assert "session main" in handler("status")
    assert latest_session(live.store) == "main"
    # the user's search never shows the host's review instruction
    ans = json.loads(live.handle_tool_call("lcm_grep", {"query": "Review the conversation above"}))
    assert ans["hits"] == 0


def test_latest_real_session_prefers_sessions_with_messages():
    rows = [{"id": "a", "updated_at": 1, "messages": 4}, {"id": "b", "updated_at": 3, "messages": 0},
            {"id": "c", "updated_at": 5, "messages": 9, "boundary_reason": BACKGROUND}]
    assert latest_real_session(rows) == "a"
    assert latest_real_session([{"id": "b", "updated_at": 3, "messages": 0}]) == "b"
    assert latest_real_session([]) is None
