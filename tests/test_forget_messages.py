"""Issue #40 item 4: `lcm forget m123` / `lcm forget --turn m123` remove one message or one
turn for good — its rows and index entries, and its text from every summary built over it
(rebuilt without it, ids kept) — on both backends, with `--dry-run` showing what goes.
"""

from __future__ import annotations

import json
import os

from lossless_context.ops.doctor import run_doctor
from lossless_context.pipeline.forget import forget_messages, plan_forget_messages
from lossless_context.tokens import estimate_messages_tokens
from tests import test_branch_undo_forget as undo
from tests.test_branch_undo_forget import _engine, _grep, _turns
from tests.test_cli import ok, one_line_failure, run_lcm

location = undo.location  # the fixture: SQLite and PostgreSQL

SECRET = "ZEBRAQUUX77"


def _compacted(location: str, with_tool: bool = False):
    """A session whose secret turn (a tool call in it with `with_tool`) is under a leaf summary
    that a condensed one may sit on, and a later message in the active context."""
    e = _engine(location)
    e.bind_session_state(None, "F")
    turn = [{"role": "user", "content": f"my key is {SECRET}, keep it"}]
    if with_tool:
        turn += [{"role": "assistant", "content": "", "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "vault", "arguments": '{"k": "x"}'}}]},
                 {"role": "tool", "tool_call_id": "c1", "content": f"vault stored {SECRET}"}]
    turn += [{"role": "assistant", "content": f"stored {SECRET}"}]
    hist = _turns("early", 2, big=3_000) + turn + _turns("mid", 10, big=8_000)
    out = e.compress(hist, current_tokens=estimate_messages_tokens(hist))
    assert out != hist
    e.on_session_start("F", boundary_reason="compression", old_session_id="F")
    tail = [{"role": "user", "content": f"one more {SECRET} in the tail"}, {"role": "assistant", "content": "ok"}]
    e.on_session_end("F", out + tail)
    e.store.wait_indexed()
    return e


def _summary_texts(e) -> dict[int, str]:
    ids = sorted(e.store.session_summary_ids("F"))
    return {k: r.text for k, r in e.store.get_summaries(ids).items()}


def _ids(hits: list[str]) -> list[int]:
    return sorted(int(h[1:]) for h in hits if h.startswith("m"))


def test_forgetting_a_turn_rebuilds_its_summaries_without_it(location):
    e = _compacted(location, with_tool=True)
    hits = _ids(_grep(e, SECRET))
    first = hits[0]  # the user message of the turn, under a leaf
    before = _summary_texts(e)
    over = [k for k, t in before.items() if SECRET in t]
    assert over, "a summary quotes the secret"
    e.store.replace_summary(over[0], before[over[0]] + " (re-summarised)", 10, "normal", "x")  # a history row
    plan = plan_forget_messages(e.store, [first], turn=True)
    assert len(plan.messages) == 4  # user, the call, its result, the reply
    assert set(over) <= set(plan.rebuilt) and not plan.dropped
    # planning changed nothing
    assert _summary_texts(e)[over[0]].endswith("(re-summarised)") and _ids(_grep(e, SECRET)) == hits
    done = forget_messages(e.store, plan)
    assert done["messages"] == 4
    after = _summary_texts(e)
    assert set(after) == set(before)  # ids kept
    assert not any(SECRET in t for t in after.values())
    assert all(e.store.summary_history(k) == [] for k in plan.rebuilt)
    left = _ids(_grep(e, SECRET))
    assert left == [h for h in hits if h not in plan.messages] and len(left) == 1  # the tail's own mention
    assert run_doctor(e.store).ok
    # the context still opens: every summary in it expands
    _v, ctx = e.store.get_context("F")
    for item in ctx:
        if item.kind == "s":
            ans = json.loads(e.handle_tool_call("lcm_expand", {"id": f"s{item.ref}"}))
            assert "error" not in ans and SECRET not in json.dumps(ans)


def test_forgetting_a_message_in_the_active_context(location):
    e = _compacted(location)
    tail = [h for h in _ids(_grep(e, SECRET))][-1]
    _v, ctx = e.store.get_context("F")
    assert ("m", tail) in [(x.kind, x.ref) for x in ctx]
    plan = plan_forget_messages(e.store, [tail])
    assert plan.messages == [tail] and "F" in plan.contexts
    forget_messages(e.store, plan)
    _v, ctx = e.store.get_context("F")
    assert ("m", tail) not in [(x.kind, x.ref) for x in ctx]
    assert tail not in _ids(_grep(e, SECRET))
    assert run_doctor(e.store).ok


def test_a_leaf_with_nothing_left_is_deleted_and_the_context_repaired(location):
    e = _compacted(location)
    _v, ctx = e.store.get_context("F")
    leaf = next(x.ref for x in ctx if x.kind == "s" and e.store.get_summaries([x.ref])[x.ref].kind == "leaf")
    _kids, msgs = e.store.summary_children(leaf)
    plan = plan_forget_messages(e.store, msgs)
    assert leaf in plan.dropped
    forget_messages(e.store, plan)
    assert e.store.get_summaries([leaf]) == {}
    _v, ctx = e.store.get_context("F")
    assert ("s", leaf) not in [(x.kind, x.ref) for x in ctx]
    assert run_doctor(e.store).ok


def test_cli_dry_run_then_forget_leaves_no_trace_in_the_file(tmp_path, monkeypatch):
    store = str(tmp_path / "lcm.db")
    e = _compacted(store)
    first = _ids(_grep(e, SECRET))[0]
    e.store.close()
    size = os.path.getsize(store)
    dry = ok(run_lcm("--store", store, "forget", f"m{first}", "--turn", "--dry-run", home=tmp_path))
    assert f"m{first}" in dry.stdout and "would forget 2 message(s)" in dry.stdout, dry.stdout
    assert "summaries rebuilt" in dry.stdout
    raw = open(store, "rb").read() + (open(store + "-wal", "rb").read() if os.path.exists(store + "-wal") else b"")
    assert b"zebraquux77" in raw.lower() and os.path.getsize(store) >= size // 2  # nothing changed
    ok(run_lcm("--store", store, "forget", f"m{first}", "--turn", "--yes", home=tmp_path))
    assert "unknown message" in one_line_failure(
        run_lcm("--store", store, "forget", f"m{first + 100_000}", "--yes", home=tmp_path), code=1)
    tail = json.loads(ok(run_lcm("--store", store, "grep", SECRET, "--json", home=tmp_path)).stdout)
    # only the tail's own mention is left: forget it too, and nothing of the secret stays on disk
    ids = [h["id"] for g in tail["groups"] for h in g["hits"]]
    assert len(ids) == 1, tail
    ok(run_lcm("--store", store, "forget", ids[0], "--yes", home=tmp_path))
    for suffix in ("", "-wal"):
        if os.path.exists(store + suffix):
            assert b"zebraquux77" not in open(store + suffix, "rb").read().lower()


def test_forgetting_a_session_leaves_no_trace_in_the_file(tmp_path):
    from lossless_context.pipeline.forget import forget_session

    store = str(tmp_path / "lcm.db")
    e = _compacted(store)
    e.bind_session_state(None, "KEEP")
    e.on_session_end("KEEP", _turns("other", 2))
    forget_session(e.store, "F")
    e.store.close()
    for suffix in ("", "-wal"):
        if os.path.exists(store + suffix):
            assert b"zebraquux77" not in open(store + suffix, "rb").read().lower()
