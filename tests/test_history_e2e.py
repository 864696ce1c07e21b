"""Issue #40's field scenarios through the real hermes-agent 0.19.0 agent loop, offline: what
the user undid stays gone even when the list after the undo reaches the engine through a pass.
"""

from __future__ import annotations

import pytest

from tests.support.fake_openai import ChatResponder, FakeOpenAI, Router, ScriptedResponder, SummariserResponder, ToolCall
from tests.support.hermes_host import hermes_available, run_hermes

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not hermes_available(), reason="hermes-agent not importable")]

SECRET = "OOPS-SECRET-8812"


def _store_hits(run, query: str) -> list[str]:
    """lcm_grep on the run's store after the host exited (no live list ingested on the way)."""
    import json

    from lossless_context import LCMEngine

    e = LCMEngine(store=str(run.hermes_home / "lcm" / "lcm.db"), summarizer="extractive")
    e.update_model("m", 64_000)
    e.on_session_start(run.result["session_id"])
    ans = json.loads(e.handle_tool_call("lcm_grep", {"query": query, "limit": 50}))
    assert "error" not in ans, ans
    return [h["id"] for g in ans["groups"] for h in g["hits"]]


def test_an_undo_whose_next_list_reaches_a_pass_is_not_searchable(tmp_path):
    """The secret is stored (a tool call hands the live list over), the user undoes it, and the
    next list reaches the engine only through compress(): the secret must not be found."""
    chat = ScriptedResponder({"look it up": ToolCall("lcm_grep", {"query": SECRET}, "call_undo_1")},
                             then=ChatResponder(reply_chars=30_000))
    with FakeOpenAI(responder=Router(chat=chat, summariser=SummariserResponder())) as srv:
        turns = [f"Question {i}: keep going with the billing refactor." for i in range(3)]
        turns += [f"my password is {SECRET}", "look it up", {"command": "/undo"}, {"command": "/undo"}]
        turns += [f"Question {i}: and the invoices?" for i in range(3, 8)]
        run = run_hermes(srv, turns, engine="lcm", workdir=tmp_path, end_session=False,
                         extra_config={"lcm": {"summarizer": "extractive"}})
        assert run.ok, run.describe()
        assert chat.tool_results, "the secret was handed to the engine before the undo"
        names = [c.get("method") for c in run.engine_calls if not c.get("depth")]
        assert "compress" in names[names.index("handle_tool_call"):], "a pass ran after the undo"
        assert not any(SECRET in str(m.get("content")) for m in run.messages)
        assert _store_hits(run, SECRET) == []
