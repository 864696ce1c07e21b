"""Issue #41 (cost of a pass) and #39's head stubs: each tool result's tier-0 stub is decided
once — when it is stored (stub_prep.py, off the pass) or when it first falls out of the keep
window — and reused, by later passes and by the next process on the same store; tool results
in the protected head are stubbed like any other old one.

The tests count calls (never time): `stubs.stub_for` decides one result; `stubs.make_stub`
makes its text. Sessions run through the R19 host driver against real SQLite files.
"""

from __future__ import annotations

import collections
import json

import pytest

from lossless_context import LCMEngine
from lossless_context.config import LCMConfig
from lossless_context.demo.host_driver import R19Host
from lossless_context.pipeline import stub_prep, stubs
from lossless_context.pipeline.assemble import STUB_MARK
from lossless_context.pipeline.validate import pairing_problems


def _engine(store: str, **kw) -> LCMEngine:
    return LCMEngine(config=LCMConfig.load({"store": store, "summarizer": "extractive", **kw}, read_file=False))


def _output(i: int, lines: int) -> str:
    return "\n".join(f"{i:03d}-{n:04d} step compiled pkg/mod_{n}.py in {n % 97} ms" for n in range(lines))


def _turn(i: int, lines: int = 120) -> list[dict]:
    cid = f"call_{i}"
    return [
        {"role": "user", "content": f"Step {i}: build part {i}."},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": cid, "type": "function", "function": {"name": "terminal",
                                                          "arguments": json.dumps({"command": f"make part{i}"})}}]},
        {"role": "tool", "tool_call_id": cid, "content": _output(i, lines)},
        {"role": "assistant", "content": f"Part {i} built. " + "notes " * 60},
    ]


class _Count:
    """Counts stubs.stub_for calls per message id (the pass's and the preparer's)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.by_id: collections.Counter[int] = collections.Counter()
        self.made = 0
        real_for, real_make = stubs.stub_for, stubs.make_stub

        def stub_for(rec, msg, call, policy):
            self.by_id[rec.id] += 1
            return real_for(rec, msg, call, policy)

        def make_stub(*a, **k):
            self.made += 1
            return real_make(*a, **k)

        monkeypatch.setattr(stubs, "stub_for", stub_for)
        monkeypatch.setattr(stub_prep, "stub_for", stub_for)
        monkeypatch.setattr(stubs, "make_stub", make_stub)
        # A text stubbed before (by an earlier test, or the preparer) comes from the process's
        # cache without a make_stub call: count from an empty cache.
        stubs.forget_cached_stubs()


def _drain(e: LCMEngine) -> None:
    assert stub_prep.StubPreparer.for_store(e.store.location, e.store, stubs.stub_policy(e.config)).wait_idle(30)


def test_each_result_is_decided_once_across_passes_and_processes(tmp_path, monkeypatch):
    count = _Count(monkeypatch)
    store = str(tmp_path / "once.db")
    # short results (some not worth a stub, decided on the header alone) and long ones
    turns = [_turn(i, lines=(6 if i % 3 == 0 else 240)) for i in range(60)]
    e = _engine(store)
    host = R19Host(e, "once", context_length=64_000)
    host.start()
    for t in turns[:40]:
        host.add(*t)
        host.maybe_compress()
        _drain(e)
    assert host.compactions >= 2
    assert not host.invalid
    # a new process on the same store (`hermes chat -q` runs one per turn) decides nothing again
    e2 = _engine(store)
    host2 = R19Host(e2, "once", context_length=64_000)
    host2.messages = host.messages
    host2.start()
    for t in turns[40:]:
        host2.add(*t)
        host2.maybe_compress()
        _drain(e2)
    assert host2.compactions >= 1
    assert count.by_id, "no tool result was ever considered for a stub"
    twice = {mid: n for mid, n in count.by_id.items() if n > 1}
    assert not twice, f"stubs decided more than once: {twice}"
    shown = [m for m in host2.messages if m.get("role") == "tool" and STUB_MARK in str(m.get("content"))]
    assert shown, "no stub reached the context"
    # the short results were declined from their header, without making a stub
    st = e2.store
    declined = [r for r in st.get_messages(list(count.by_id)).values()
                if r.exploration == stubs.declined_mark(stubs.stub_policy(e2.config))]
    assert declined and count.made <= len(count.by_id) - len(declined)


def test_prepared_stubs_are_the_ones_a_pass_would_make(tmp_path, monkeypatch):
    """Results handed over between passes (a newer host's on_turn_complete) are stubbed in the
    background; the pass that finds them old shows those stubs and makes none itself."""
    store = str(tmp_path / "prep.db")
    e = _engine(store)
    sid = "prep"
    msgs: list[dict] = [{"role": "user", "content": "Objective: build everything."}]
    for i in range(30):
        msgs.extend(_turn(i))
    e.on_session_start(sid, platform="cli")
    e.update_model(model="m", context_length=64_000)
    e.on_turn_complete(msgs, session_id=sid)
    _drain(e)
    count = _Count(monkeypatch)
    out = e.compress(list(msgs), current_tokens=60_000, session_id=sid)
    assert out != msgs and not pairing_problems(out)
    assert count.made == 0 and not count.by_id, "the pass made stubs the preparer had made"
    shown = {m["tool_call_id"]: m["content"] for m in out if m.get("role") == "tool" and STUB_MARK in m["content"]}
    assert shown
    # the same text as a pass makes on a store that never prepared anything
    e2 = _engine(str(tmp_path / "inline.db"))
    monkeypatch.setattr(stub_prep.StubPreparer, "submit", lambda self, items: None)
    stubs.forget_cached_stubs()  # (else the preparer's stubs come back from the process's cache)
    e2.on_session_start(sid, platform="cli")
    e2.update_model(model="m", context_length=64_000)
    out2 = e2.compress(list(msgs), current_tokens=60_000, session_id=sid)
    assert count.made > 0
    shown2 = {m["tool_call_id"]: m["content"] for m in out2 if m.get("role") == "tool" and STUB_MARK in m["content"]}
    assert shown == shown2


def test_a_large_tool_result_in_the_head_is_stubbed(tmp_path):
    """#39: a 39K-character tool result in the protected head used to stay verbatim in every
    context; it is stubbed like any other old result, and lcm_expand returns the original."""
    e = _engine(str(tmp_path / "head.db"))
    host = R19Host(e, "head", context_length=64_000)
    host.start()
    big = "\n".join(f"line {i}: value={i * 7} path=src/mod_{i % 50}.py status ok" for i in range(700))
    host.add({"role": "user", "content": "Read the log, then we talk."},
             {"role": "assistant", "content": "", "tool_calls": [
                 {"id": "c1", "type": "function",
                  "function": {"name": "read_file", "arguments": '{"path": "app.log"}'}}]},
             {"role": "tool", "tool_call_id": "c1", "content": big},
             {"role": "assistant", "content": "Read it."})
    for i in range(160):
        host.add({"role": "user", "content": f"question {i} " + "words " * 120},
                 {"role": "assistant", "content": f"answer {i} " + "text " * 120})
        host.maybe_compress()
    assert host.compactions >= 1
    head_tool = next(m for m in host.messages if m.get("role") == "tool")
    assert STUB_MARK in head_tool["content"] and len(head_tool["content"]) < len(big) // 10
    assert host.messages[0]["content"] == "Read the log, then we talk."  # the head itself stays
    mid = head_tool["content"].split('lcm_expand(id="m', 1)[1].split('"', 1)[0]
    page = json.loads(e.handle_tool_call("lcm_expand", {"id": f"m{mid}", "max_tokens": 20_000}))
    assert page["message"]["content"] == big and not page["truncated"]
    assert not pairing_problems(host.context())


def test_the_newest_results_rule_still_keeps_recent_work_outside_the_head():
    """Only the head loses the count rule: a recent result after it stays verbatim."""
    from lossless_context.pipeline.assemble import Slot

    pol = stubs.StubPolicy(keep_results=6, keep_tokens=100)
    slots = [Slot("m", [i], {"role": "tool"}, "tool", 500, text_tokens=500) for i in range(4)]
    assert stubs.candidates(slots, pol) == []  # four results, all among the newest six
    assert stubs.candidates(slots, pol, head_end=2) == [0, 1]  # the head's are old all the same


def test_header_floor_never_declines_a_stub_that_pays():
    """The floor check is exact: whenever it declines, the full stub would not pay either."""
    from lossless_context.pipeline.assemble import large_representation
    from lossless_context.records import MessageRecord
    from lossless_context.tokens import estimate_message_tokens, estimate_text_tokens

    pol = stubs.StubPolicy()
    call = ("terminal", json.dumps({"command": "pytest -q tests/test_x.py"}))
    declined = 0
    for n in range(1, 60):
        text = "\n".join(f"row {k} value {k * 13} ERROR_{k}" if k % 7 == 0 else f"row {k}" for k in range(n))
        msg = {"role": "tool", "tool_call_id": "c", "content": text}
        rec = MessageRecord(1, "s", 0, None, "", "tool", msg, text, estimate_text_tokens(text) + 4, 0.0)
        full = stubs.make_stub(text, call, pol, rec.tokens)
        pays = estimate_message_tokens(large_representation(msg, 1, rec.tokens, full)) * 10 <= rec.tokens * 7
        floor = stubs.header_floor(text, call, rec.tokens)
        floor_pays = estimate_message_tokens(large_representation(msg, 1, rec.tokens, floor)) * 10 <= rec.tokens * 7
        assert floor_pays or not pays, n
        declined += not floor_pays
    assert declined  # the check does decline some


def test_a_pass_reports_the_tokens_of_the_list_it_returns(tmp_path, monkeypatch):
    """#41: a pass measures each of the host's messages once (the engine's estimates seed the
    compactor's memo, and the output is not measured again): what it records and what it notes
    for the provider's next count must still be the estimate of the list it returned."""
    from lossless_context.tokens import estimate_messages_tokens

    e = _engine(str(tmp_path / "tokens.db"))
    noted: list[int] = []
    real_note = e.units.note_pass_output  # (the engine's provider units: contract/units.py)
    monkeypatch.setattr(e.units, "note_pass_output", lambda sid, est: (noted.append(est), real_note(sid, est)))
    outputs: list[int] = []
    real_compress = e.compress

    def compress(messages, *a, **k):
        out = real_compress(messages, *a, **k)
        if out is not messages:
            outputs.append(estimate_messages_tokens(out))
        return out

    monkeypatch.setattr(e, "compress", compress)
    host = R19Host(e, "tokens", context_length=64_000)
    host.start()
    for i in range(60):
        host.add(*_turn(i, lines=(6 if i % 3 == 0 else 240)))
        host.maybe_compress()
    assert host.compactions >= 2 and len(outputs) == host.compactions
    assert noted == outputs
    staged = [p["tokens_after"] for p in e.passes.last() if p["outcome"] == "staged"]
    assert staged[-len(outputs):] == outputs


def test_a_pass_takes_the_ingests_estimates_of_the_messages_it_stored(tmp_path, monkeypatch):
    """#41: the messages a pass stores are measured once: the ingest's estimates (made while it
    builds their rows) are the pass's for those very objects; the host's list measures the same
    as a fresh estimate of every message."""
    from lossless_context import engine as engine_mod
    from lossless_context.tokens import estimate_message_tokens, measured_messages

    seen: list[tuple[int, int]] = []

    def checked(messages, known=None):
        total, memo = measured_messages(messages, known)
        assert total == sum(estimate_message_tokens(m) for m in messages)
        assert all(n == estimate_message_tokens(m) for m, n in memo.values())
        seen.append((len(messages), sum(1 for m in messages if known and id(m) in known)))
        return total, memo

    monkeypatch.setattr(engine_mod, "measured_messages", checked)
    e = _engine(str(tmp_path / "known.db"))
    host = R19Host(e, "known", context_length=64_000)
    host.start()
    for i in range(60):
        host.add(*_turn(i, lines=(6 if i % 3 == 0 else 240)))
        host.maybe_compress()
    assert host.compactions >= 2 and len(seen) >= host.compactions
    assert all(hits > 0 for _n, hits in seen)  # (each pass stored the messages that arrived since the last)
