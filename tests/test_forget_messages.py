"""Issue #40 item 4: `lcm forget m123` / `lcm forget --turn m123` remove one message or one
turn for good — its rows and index entries, and its text from every summary built over it
(rebuilt without it, ids kept) — on both backends, with `--dry-run` showing what goes.
"""

from __future__ import annotations

import json
import os

import pytest

from lossless_context.messages import is_summary_message
from lossless_context.ops.doctor import run_doctor
from lossless_context.edits.forget import forget_messages, plan_forget_messages
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
    from lossless_context.edits.forget import forget_session

    store = str(tmp_path / "lcm.db")
    e = _compacted(store)
    e.bind_session_state(None, "KEEP")
    e.on_session_end("KEEP", _turns("other", 2))
    forget_session(e.store, "F")
    e.store.close()
    for suffix in ("", "-wal"):
        if os.path.exists(store + suffix):
            assert b"zebraquux77" not in open(store + suffix, "rb").read().lower()


# -- a live host hands a forgotten message over again (its own history still holds it) -------------

PASTED = "my password is hunter2-QX9"


def _live(location: str):
    """A live session below its threshold: a pasted secret in turn 3 (user and reply), turns
    around it, stored the way the host hands them over (on_turn_complete / on_session_end)."""
    e = _engine(location)
    e.bind_session_state(None, "L")
    e.on_session_start("L", platform="cli")
    hist = _turns("before", 3, big=6_000) + [{"role": "user", "content": PASTED},
                                             {"role": "assistant", "content": f"noted: {PASTED[15:]}"}] + \
        _turns("after", 2, big=6_000)
    e.on_session_end("L", [dict(m) for m in hist])
    e.store.wait_indexed()
    return e, hist


def _stored_with(e, text: str) -> list[int]:
    return [m.id for m in e.store.iter_all_messages() if text in (m.text or "")]


@pytest.mark.parametrize("how", ["message", "turn"])
def test_a_forgotten_message_the_live_host_hands_over_again_is_not_stored_again(location, how):
    """`lcm forget` on a live session: the host's own history still holds the message and hands
    it over with every list. It is aligned as forgotten — not stored, not searchable, in no
    active context, not in what a pass returns — while the rest of the list, a new turn and the
    same words said again later are stored as usual."""
    e, hist = _live(location)
    secret = _stored_with(e, PASTED)
    assert len(secret) == 1
    plan = plan_forget_messages(e.store, secret, turn=how == "turn")
    assert len(plan.messages) == (2 if how == "turn" else 1)
    done = forget_messages(e.store, plan)
    assert done["marks"] == len(plan.messages)
    assert _stored_with(e, PASTED) == [] and _stored_with(e, "hunter2") == ([] if how == "turn" else _stored_with(e, "hunter2"))
    # the host's next lists: the same history with a new turn (on_session_end, a tool call's list, a pass)
    new_turn = [{"role": "user", "content": "next question NEWTURN-1"}, {"role": "assistant", "content": "next answer"}]
    e.on_session_end("L", [dict(m) for m in hist + new_turn])
    e.handle_tool_call("lcm_grep", {"query": "NEWTURN"}, messages=[dict(m) for m in hist + new_turn])
    assert _stored_with(e, PASTED) == [], "the live host's copy of a forgotten message was stored again"
    assert len(_stored_with(e, "NEWTURN-1")) == 1
    found = json.dumps(json.loads(e.handle_tool_call("lcm_grep", {"query": "password hunter2"})))
    assert PASTED not in found and (how == "message" or "QX9" not in found), found
    _v, ctx = e.store.get_context("L")
    rows = e.store.get_messages([x.ref for x in ctx if x.kind == "m"])
    assert not [r for r in rows.values() if PASTED in r.text]
    out = e.compress([dict(m) for m in hist + new_turn], force=True)
    assert any(is_summary_message(m) for m in out), "the pass compacted nothing"
    assert PASTED not in json.dumps(out), "a pass put the forgotten message back into the model's view"
    e.on_session_start("L", boundary_reason="compression", old_session_id="L")
    assert _stored_with(e, PASTED) == [] and run_doctor(e.store).ok, run_doctor(e.store).render_text()
    # the same words said again, later in the session, are the user's new message
    again = [{"role": "user", "content": PASTED}, {"role": "assistant", "content": "you said it again"}]
    e.on_session_end("L", [dict(m) for m in out + again])
    assert len(_stored_with(e, PASTED)) == 1


def test_a_forgotten_message_stays_forgotten_when_the_message_before_it_goes_too(location):
    """Each mark is anchored at the message kept before it; forgetting that one moves the mark."""
    e, hist = _live(location)
    secret = _stored_with(e, PASTED)
    forget_messages(e.store, plan_forget_messages(e.store, secret))
    before = _stored_with(e, "before answer 2")
    forget_messages(e.store, plan_forget_messages(e.store, before))
    e.on_session_end("L", [dict(m) for m in hist])
    assert _stored_with(e, PASTED) == [] and _stored_with(e, "before answer 2") == []
    assert len(_stored_with(e, "after question 0")) == 1


def test_the_marks_hold_no_text_and_no_plain_hash(tmp_path):
    """A mark is a digest keyed with the store's own random salt and stretched: two stores that
    forgot the same message hold different digests, neither equal to a plain hash of it, and
    nothing of the text is in the file."""
    import hashlib
    import sqlite3

    from lossless_context.messages import content_ident

    digests = []
    for name in ("a", "b"):
        store = str(tmp_path / f"{name}.db")
        e, _hist = _live(store)
        forget_messages(e.store, plan_forget_messages(e.store, _stored_with(e, PASTED), turn=True))
        e.store.close()
        with sqlite3.connect(store) as c:
            rows = c.execute("SELECT session_id, anchor, digest FROM forget_marks").fetchall()
            salt = c.execute("SELECT salt FROM forget_salt").fetchone()[0]
        assert len(rows) == 2 and len(salt) == 32
        digests.append(sorted(r[2] for r in rows))
        ident = content_ident({"role": "user", "content": PASTED})
        plain = {ident, hashlib.sha256(PASTED.encode()).hexdigest(), hashlib.sha256(ident.encode()).hexdigest()}
        assert not plain & {r[2] for r in rows}
        for suffix in ("", "-wal"):
            if os.path.exists(store + suffix):
                raw = open(store + suffix, "rb").read()
                assert b"hunter2" not in raw and ident.encode() not in raw
    assert not set(digests[0]) & set(digests[1])


def test_forget_scrubs_in_short_steps_and_never_vacuums_under_the_write_lock(tmp_path, monkeypatch):
    """#43: `lcm forget` leaves nothing of the text on disk without rewriting the file under
    the write lock (a VACUUM held it for seconds to minutes on a large store): no VACUUM, the
    full-text indexes merged in steps, each its own transaction, and between two steps another
    connection writes at once (a write lock still held would refuse it: busy_timeout 0)."""
    import sqlite3

    from lossless_context.store.sqlite import records

    store = str(tmp_path / "lcm.db")
    e, _hist = _live(store)
    e.store.wait_indexed()
    other = sqlite3.connect(store, timeout=0, isolation_level=None)
    other.execute("PRAGMA busy_timeout=0")
    between: list[int] = []

    def pause(seconds: float) -> None:  # (the scrub's pause between two steps)
        other.execute("BEGIN IMMEDIATE")
        other.execute("UPDATE sessions SET updated_at = updated_at WHERE id = 'nobody'")
        other.execute("COMMIT")
        between.append(1)

    monkeypatch.setattr(records, "_sleep", pause)
    seen: list[str] = []
    e.store.conn().set_trace_callback(seen.append)
    try:
        forget_messages(e.store, plan_forget_messages(e.store, _stored_with(e, PASTED), turn=True))
    finally:
        e.store.conn().set_trace_callback(None)
        other.close()
    assert not [s for s in seen if s.strip().upper().startswith("VACUUM")]
    merges = [s for s in seen if "'merge'" in s]
    assert merges and len(between) >= 1
    e.store.close()
    for suffix in ("", "-wal"):
        if os.path.exists(store + suffix):
            assert b"hunter2" not in open(store + suffix, "rb").read()
