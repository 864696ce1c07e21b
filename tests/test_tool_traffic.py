"""Issue #40 item 6: the engine's own tool traffic (lcm_* calls, their JSON answers, the
questions that asked for them and the replies reading them back) ranks below the originals it
quotes, on both backends; lcm_expand_query cites the originals.
"""

from __future__ import annotations

import json

from lossless_context.retrieval.traffic import is_answer, is_call
from lossless_context.tokens import estimate_messages_tokens
from tests import test_branch_undo_forget as undo
from tests.test_branch_undo_forget import _engine, _turns

location = undo.location  # the fixture: SQLite and PostgreSQL

TERM = "svc-kappa-5"


def _searched_three_times(e, sid: str, compact: bool) -> list[dict]:
    hist = [{"role": "user", "content": f"Our staging cluster is called {TERM}; deploys go there first."},
            {"role": "assistant", "content": f"Understood: {TERM} is staging."}]
    hist += _turns("chat", 6, big=6_000 if compact else 0)
    e.on_session_end(sid, hist)
    for k in range(3):
        call_id = f"call_{k}"
        hist = hist + [{"role": "user", "content": f"what was {TERM} again?"},
                       {"role": "assistant", "content": "", "tool_calls": [
                           {"id": call_id, "type": "function",
                            "function": {"name": "lcm_grep", "arguments": json.dumps({"query": TERM})}}]}]
        answer = e.handle_tool_call("lcm_grep", {"query": TERM}, messages=hist)
        hist = hist + [{"role": "tool", "tool_call_id": call_id, "content": answer},
                       {"role": "assistant", "content": f"{TERM} is the staging cluster, as you said."}]
        hist += _turns(f"more{k}", 2, big=6_000 if compact else 0)
        e.on_session_end(sid, hist)
    if compact:
        out = e.compress(hist, current_tokens=estimate_messages_tokens(hist))
        assert out != hist
        e.on_session_start(sid, boundary_reason="compression", old_session_id=sid)
    return hist


def _hits(e, limit: int = 8) -> list[dict]:
    ans = json.loads(e.handle_tool_call("lcm_grep", {"query": TERM, "limit": limit}))
    assert "error" not in ans, ans
    return [h for g in ans["groups"] for h in g["hits"]]


def _check(e) -> None:
    hits = _hits(e)
    top = [h.get("message", {}).get("content", "") for h in hits[:2]]
    assert not any(h.get("tool_traffic") for h in hits[:2]), hits
    assert any("staging cluster is called" in t for t in top), hits  # what the user said, on top
    seen_traffic = False
    for h in hits:  # every original before every piece of traffic
        if h.get("tool_traffic"):
            seen_traffic = True
        else:
            assert not seen_traffic or h["kind"] == "summary", hits
    assert sum(1 for h in hits if h.get("tool_traffic")) >= 3  # still listed, after the originals
    ans = json.loads(e.handle_tool_call("lcm_expand_query", {"prompt": f"what is {TERM}?", "query": TERM}))
    cited = ans["sources"]
    assert cited and all(c in {h["id"] for h in hits if not h.get("tool_traffic")} | {c for c in cited if c.startswith("s")}
                         for c in cited), (cited, hits)


def test_originals_outrank_the_agents_earlier_searches(location):
    e = _engine(location)
    e.bind_session_state(None, "K")
    _searched_three_times(e, "K", compact=False)
    _check(e)


def test_originals_outrank_earlier_searches_after_a_pass(location):
    e = _engine(location)
    e.bind_session_state(None, "KC")
    _searched_three_times(e, "KC", compact=True)
    _check(e)


def test_what_counts_as_traffic():
    call = f'→ lcm_grep({{"query": "{TERM}"}})'
    assert is_call("assistant", call) and is_call("assistant", "Let me look.\n" + call)
    assert not is_call("assistant", "→ terminal({\"cmd\": \"ls\"})\n" + call)  # another tool too
    assert not is_call("user", call) and not is_call("assistant", "x" * 300 + "\n" + call)
    assert is_answer("tool", json.dumps({"query": TERM, "mode": "text", "hits": 1, "groups": []}))
    assert is_answer("tool", json.dumps({"id": "m12", "role": "user", "message": {}}))
    assert is_answer("tool", json.dumps({"prompt": "p", "sources": ["m1"]}))
    assert not is_answer("tool", json.dumps({"stdout": TERM}))  # another tool's result
    assert not is_answer("assistant", json.dumps({"id": "m12"}))
