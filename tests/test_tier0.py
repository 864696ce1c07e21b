"""Issue #19: tier 0 (tool-result stubs before any summary), continuity, and cost on display.

Engine-level tests drive the R19 call order with lossless_context/demo/host_driver.py against real SQLite
(and PostgreSQL for the new store methods); model calls go to the fake OpenAI-compatible server
on 127.0.0.1, which records every request and returns a known usage with every reply.
"""

from __future__ import annotations

import json
import re

import pytest

from lossless_context import LCMEngine
from lossless_context.pipeline.assemble import STUB_MARK
from lossless_context.pipeline.validate import pairing_problems
from lossless_context.config import LCMConfig
from lossless_context.edits.resummarize import resummarize
from lossless_context.store import open_store
from lossless_context.pipeline.stubs import StubPolicy, make_stub
from tests.support.fake_openai import FakeOpenAI, Reply, SummariserResponder
from lossless_context.demo.host_driver import R19Host

ERROR_LINE = "ERROR: disk quota exceeded writing /var/data/cache.bin (exit code 2)"


class FixedUsage(SummariserResponder):
    """A summary of the request, with a usage the test knows in advance."""

    IN, OUT = 1234, 56

    def __call__(self, req):
        reply = super().__call__(req)
        return Reply(content=reply.content, usage={"prompt_tokens": self.IN, "completion_tokens": self.OUT,
                                                   "total_tokens": self.IN + self.OUT})


def _engine(store: str, url: str | None = None, **kw) -> LCMEngine:
    cfg = {"store": store, **kw}
    if url:
        cfg.update({"summarizer": "openai", "summary_base_url": url})
    return LCMEngine(config=LCMConfig.load(cfg, read_file=False))


def _tool_output(i: int, lines: int = 260, error: bool = False) -> str:
    body = [f"{i:03d}-{n:04d} build step compiled module pkg/mod_{n}.py in {n % 97} ms" for n in range(lines)]
    if error:
        body.insert(lines // 2, ERROR_LINE)
    return "\n".join(body)


def _turn(i: int, error: bool = False) -> list[dict]:
    cid = f"call_{i}"
    return [
        {"role": "user", "content": f"Step {i}: run the build for part {i}."},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": cid, "type": "function", "function": {"name": "terminal", "arguments": json.dumps({"command": f"make part{i}"})}}]},
        {"role": "tool", "tool_call_id": cid, "content": _tool_output(i, error=error)},
        {"role": "assistant", "content": f"Part {i} built."},
    ]


def _stubs_by_call(messages: list[dict]) -> dict[str, str]:
    return {m["tool_call_id"]: m["content"] for m in messages
            if m.get("role") == "tool" and STUB_MARK in str(m.get("content"))}


def test_a_pass_that_stubs_enough_makes_no_model_call_and_stubs_stay_stable(tmp_path):
    with FakeOpenAI(responder=FixedUsage()) as srv:
        # the newest result and the newest 2,000 tokens stay verbatim: stubbing the older
        # results alone brings this session under the pass's target
        e = _engine(str(tmp_path / "l.db"), srv.base_url, tool_stub_keep_results=1, tool_stub_keep_tokens=2000)
        host = R19Host(e, "t0")
        host.start(context_length=64_000)
        host.add({"role": "user", "content": "Objective: get the whole build green."})
        for i in range(14):
            host.add(*_turn(i, error=(i == 2)))
        assert e.should_compress(host.estimate())
        assert host.maybe_compress()
        assert not host.invalid
        first = _stubs_by_call(host.messages)
        assert first, "old tool results became stubs"
        assert srv.chat_requests == [], "tier 0 alone reached the target: no summariser call"
        st = e.get_status()
        assert st["lcm_tier0_passes"] == 1 and st["lcm_stubbed_results"] == len(first)
        assert st["lcm_cost_last_pass"]["calls"] == 0
        # the newest results stay verbatim; every tool message is still answered
        tools = [m for m in host.messages if m.get("role") == "tool"]
        assert len(tools) == 14 and tools[-1]["content"] == _tool_output(13) and len(first) == 13
        # an error line is never cut out of a stub
        assert ERROR_LINE in first["call_2"]
        # lcm_expand gives the original back byte for byte
        mid = re.search(r'lcm_expand\(id=\\?"(m\d+)', first["call_0"]).group(1)
        got = json.loads(e.handle_tool_call("lcm_expand", {"id": mid}))
        assert got["truncated"] is False and got["message"]["content"] == _tool_output(0)

        # later passes show the very same stub text (the provider's prompt cache holds)
        for i in range(14, 40):
            host.add(*_turn(i))
            host.maybe_compress()
        assert not host.invalid
        later = _stubs_by_call(host.messages)
        again = {k: v for k, v in later.items() if k in first}
        assert again and all(first[k] == v for k, v in again.items())
        # the store keeps the originals: a stub handed back by the host is never stored as a message
        assert e.store.get_messages([int(mid[1:])])[int(mid[1:])].raw["content"] == _tool_output(0)
        import sqlite3

        host.end()  # (the turns after the last pass are handed over at the end)
        with sqlite3.connect(tmp_path / "l.db") as c:
            assert c.execute("SELECT COUNT(*) FROM messages WHERE raw LIKE ?", (f"%{STUB_MARK}%",)).fetchone()[0] == 0
            assert c.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 1 + 4 * 40


def test_make_stub_is_deterministic_and_keeps_every_error_line():
    text = "\n".join(["ok line %d" % n for n in range(400)] + [f"ERROR: failure {n}" for n in range(12)])
    pol = StubPolicy(stub_tokens=80)
    a = make_stub(text, ("terminal", '{"command": "pytest"}'), pol)
    assert a == make_stub(text, ("terminal", '{"command": "pytest"}'), pol)
    for n in range(12):
        assert f"ERROR: failure {n}" in a
    assert "ERROR" in a.splitlines()[0]  # the header says it failed
    assert len(a) < len(text) // 4


def _continuity_session(host: R19Host, turns: int) -> None:
    host.add({"role": "user", "content": "OBJECTIVE-7781: migrate the billing service to the new ledger."})
    for i in range(turns):
        _continuity_session_step(host, i)


@pytest.mark.parametrize("passes", [1, 10, 100])
def test_objective_and_latest_plan_survive_any_number_of_compactions(tmp_path, passes):
    e = _engine(str(tmp_path / "c.db"))  # the built-in extractive summariser
    e.protect_first_n = 0  # (else the objective stays verbatim in the protected head)
    host = R19Host(e, "cont")
    host.start(context_length=64_000)
    _continuity_session(host, 2)
    done = 0
    i = 2
    while done < passes:
        _continuity_session_step(host, i)
        i += 1
        if host.maybe_compress(force=(passes == 100)):
            done += 1
    assert not host.invalid
    block = next(m["content"] for m in host.messages if "<lcm-summary" in str(m.get("content")))
    assert "OBJECTIVE-7781" in block
    latest = f"backfill batch {i - 1}"
    # the latest plan is in the block, or verbatim in the recent messages
    assert latest in block or any(latest in str(m.get("content")) for m in host.messages)
    assert "Continuity" in block


def _continuity_session_step(host: R19Host, i: int) -> None:
    cid = f"todo_{i}"
    todos = [{"id": "1", "content": "schema", "status": "completed"},
             {"id": "2", "content": f"backfill batch {i}", "status": "in_progress"}]
    host.add({"role": "user", "content": f"Continue with batch {i}."},
             {"role": "assistant", "content": "", "tool_calls": [
                 {"id": cid, "type": "function", "function": {"name": "todo", "arguments": json.dumps({"todos": todos})}}]},
             {"role": "tool", "tool_call_id": cid, "content": json.dumps({"todos": todos})},
             {"role": "assistant", "content": f"Batch {i} done. " + "details " * 900})


def _chat_turns(host: R19Host, n: int = 30) -> None:
    """Long chat turns without tool output (so the pass must summarise)."""
    for i in range(n):
        host.add({"role": "user", "content": f"Question {i}: " + "context words " * 400},
                 {"role": "assistant", "content": f"Answer {i}: " + "reply words " * 400})


@pytest.mark.parametrize("background", ["off", "auto"])
def test_costs_are_what_the_provider_reported(tmp_path, background):
    """The pass's own calls, or (background on: the pass waits for no model) the worker's that
    replace its placeholders right after: each booked on its node, the session's spend alike."""
    with FakeOpenAI(responder=FixedUsage()) as srv:
        e = _engine(str(tmp_path / "k.db"), srv.base_url, tool_stubs=False, background_compaction=background)
        host = R19Host(e, "cost")
        host.start(context_length=64_000)
        _chat_turns(host)
        assert host.maybe_compress()
        assert e.wait_background(60)
        calls = len(srv.chat_requests)
        assert calls >= 1
        st = e.get_status()
        sess = st["lcm_cost_session"]
        assert (sess["calls"], sess["input_tokens"], sess["output_tokens"]) == (
            calls, calls * FixedUsage.IN, calls * FixedUsage.OUT)
        # per node: every model call is booked on the node it made, and lcm_describe shows it
        ids = sorted(e.store.get_summaries(range(1, 10_000)))
        costs = e.store.get_summary_costs(ids)
        assert sum(c["calls"] for c in costs.values()) == calls
        assert sum(c["input_tokens"] for c in costs.values()) == calls * FixedUsage.IN
        assert e.store.summary_cost_totals("cost")["calls"] == calls
        node = next(iter(costs))
        got = json.loads(e.handle_tool_call("lcm_describe", {"id": f"s{node}"}))
        assert got["cost"]["calls"] == costs[node]["calls"] and got["cost"]["output_tokens"] == costs[node]["output_tokens"]


def _first_summary_id(messages: list[dict]) -> str:
    from lossless_context.messages import summary_node_ids

    for m in messages:
        ids = summary_node_ids(m)
        if ids:
            return f"s{sorted(ids)[0]}"
    raise AssertionError("no summary node in the context")


def test_resummarize_replaces_the_text_and_keeps_the_old_one(tmp_path):
    e = _engine(str(tmp_path / "r.db"), tool_stubs=False)
    host = R19Host(e, "rs")
    host.start(context_length=64_000)
    _chat_turns(host)
    assert host.maybe_compress()
    sid = int(_first_summary_id(host.messages)[1:])
    before = e.store.get_summaries([sid])[sid]
    with FakeOpenAI(responder=FixedUsage()) as srv:
        e2 = _engine(str(tmp_path / "r.db"), srv.base_url)
        out = resummarize(e2.store, e2.summary_escalator(), sid, 400)
        assert len(srv.chat_requests) == 1
    after = e2.store.get_summaries([sid])[sid]
    assert after.id == before.id and after.level == "normal" and before.level != "normal"
    assert out["history"] == 1
    assert e2.store.summary_history(sid)[0]["text"] == before.text
    assert after.text != before.text
    _, mids_before = e.store.summary_children(sid)
    assert e2.store.summary_children(sid)[1] == mids_before  # same span, same place in the DAG


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_continuity_and_costs_are_kept_by_both_stores(tmp_path, backend, request):
    loc = str(tmp_path / "s.db") if backend == "sqlite" else request.getfixturevalue("pg_fresh_dsn")
    s = open_store(loc)
    try:
        s.ensure_session("a")
        assert s.get_continuity("a") in (None, "")
        s.set_continuity("a", '{"objective": [1, "x"]}')
        assert s.get_continuity("a") == '{"objective": [1, "x"]}'
        s.set_continuity("a", '{"objective": [2, "y"]}')
        assert s.get_continuity("a") == '{"objective": [2, "y"]}'
    finally:
        s.close()
    s = open_store(loc)  # survives a restart
    try:
        assert s.get_continuity("a") == '{"objective": [2, "y"]}'
    finally:
        s.close()


def test_stubbed_output_is_always_valid(tmp_path):
    e = _engine(str(tmp_path / "v.db"))
    host = R19Host(e, "valid")
    host.start(context_length=64_000)
    for i in range(60):
        host.add(*_turn(i, error=(i % 7 == 0)))
        host.maybe_compress()
        assert not pairing_problems(host.messages)
    assert not host.invalid


def test_objective_and_todo_state_after_the_real_hosts_compress(tmp_path, hermes_host):
    """Through hermes-agent's own loop and its /compress: the objective and the state after the
    agent's last `todo` call are in the context the host continues with."""
    from tests.support.fake_openai import ChatResponder, Router, ScriptedResponder, ToolCall
    from tests.support.hermes_host import run_hermes

    todos = [{"id": "1", "content": "write the LEDGERPLAN schema", "status": "completed"},
             {"id": "2", "content": "backfill LEDGERPLAN rows", "status": "in_progress"}]
    chat = ScriptedResponder({"make a plan": ToolCall("todo", {"todos": todos})},
                             then=ChatResponder(reply_chars=6000))
    with FakeOpenAI(responder=Router(chat=chat, summariser=SummariserResponder(max_chars=1500))) as srv:
        turns = ["OBJECTIVE-4412: move billing onto the new ledger.", "First make a plan with the todo tool."]
        turns += [f"Step {i}: keep going with the backfill." for i in range(8)]
        turns += [{"command": "/compress"}]
        run = run_hermes(srv, turns, engine="lcm", workdir=tmp_path, toolsets=["context_engine", "todo"],
                         extra_config={"lcm": {"summarizer": "auto"}})
        assert run.ok, run.describe()
        assert chat.tool_results, "the todo tool ran in the host"
        out = run.turns[-1]["command_output"]
        assert out["after"] < out["before"], out
        text = json.dumps(run.messages)
        assert "OBJECTIVE-4412" in text
        # the latest todo state: in our block's continuity section, or verbatim where it stands
        assert "backfill LEDGERPLAN rows" in text and "in_progress" in text
        block = next((m["content"] for m in run.messages if "<lcm-summary" in str(m.get("content"))), "")
        assert block, "the host's /compress went through our engine"
        assert "backfill LEDGERPLAN rows" in block or any(
            "backfill LEDGERPLAN rows" in str(m.get("content")) and m.get("role") == "tool" for m in run.messages)


def test_prune_keeps_the_hosts_row_keys(tmp_path):
    """The newer host commits what `prune_tool_results_only` returns as its own rows: a stubbed
    row keeps every key the host put on it (`_db_persisted`, `message_uid`, `_tool_call_uid`,
    its timestamp …) with only the content changed — as the host's own prune does — or the
    host writes it to its session database a second time."""
    from tests.support.newhost import stamp

    e = _engine(str(tmp_path / "p.db"), tool_stub_keep_results=1, tool_stub_keep_tokens=2000)
    e.update_model(model="m", context_length=64_000)
    e.bind_session_state(None, "pr")
    msgs = [stamp({"role": "user", "content": "Objective: get the whole build green."})]
    for i in range(14):
        msgs += [stamp(m) for m in _turn(i)]
    for n, m in enumerate(msgs):
        m.update({"_db_persisted": True, "timestamp": 1_700_000_000 + n, "finish_reason": "stop"})
    before = [dict(m) for m in msgs]
    out, n = e.prune_tool_results_only(msgs, current_tokens=40_000)
    assert n > 0 and out is not msgs and len(out) == len(msgs)
    assert msgs == before  # the host's own list is left as it was
    stubbed = [(o, m) for o, m in zip(before, out) if o["content"] != m["content"]]
    assert len(stubbed) == n and all(STUB_MARK in m["content"] for _o, m in stubbed)
    for orig, m in stubbed:
        assert {k: v for k, v in m.items() if k != "content"} == {k: v for k, v in orig.items() if k != "content"}
    assert all(m is o for m, o in zip(out, msgs) if m["content"] == o["content"])
    assert pairing_problems(out) == []


def test_continuity_reads_a_todo_result_from_the_stored_message_when_its_call_asks(tmp_path):
    """continuity.gather reads a tool result's text only for a plan call that asks for it, and
    from the stored message (the host's list may hold its stub); the plan is the result's full
    list, not the call's partial one. Records come from a real store (raw decoded lazily)."""
    from lossless_context.pipeline import continuity
    from lossless_context.pipeline.assemble import Slot
    from lossless_context.records import NewMessage
    from lossless_context.store import open_store

    full = [{"id": "1", "content": "schema", "status": "completed"},
            {"id": "2", "content": "backfill LEDGER-9", "status": "in_progress"}]
    partial = {"todos": [{"id": "2", "status": "in_progress"}], "merge": True}
    msgs = [{"role": "user", "content": "OBJECTIVE-31: move billing."},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "t1", "type": "function", "function": {"name": "todo", "arguments": json.dumps(partial)}}]},
            {"role": "tool", "tool_call_id": "t1", "content": json.dumps({"todos": full})},
            {"role": "tool", "tool_call_id": "other", "content": "x" * 5000}]
    store = open_store(str(tmp_path / "g.db"))
    try:
        store.ensure_session("g")
        ids = store.append_messages("g", [NewMessage(raw=m, role=m["role"], ident=f"i{k}", uid=None,
                                                     text=str(m["content"]), tokens=10, created_at=1.0)
                                          for k, m in enumerate(msgs)])
        records = store.get_messages(ids)
        shown = [dict(m) for m in msgs]
        shown[2]["content"] = "[tool output stubbed]"  # what the host's list holds after tier 0
        slots = [Slot("m", [mid], m, m["role"], 10, call_ids=("t1",) if k == 1 else (),
                      result_for=m.get("tool_call_id")) for k, (mid, m) in enumerate(zip(ids, shown))]
        st, _edits = continuity.gather(continuity.State(None, None, None, [], []), slots, records)
        assert st.objective is not None and st.objective.text == "OBJECTIVE-31: move billing."
        assert st.plan is not None and "backfill LEDGER-9" in st.plan.text and "schema" in st.plan.text
        assert st.plan_mids == [ids[1], ids[2]]
        # Without records the host's own messages are read (the stub holds no list: the call's is used).
        st2, _ = continuity.gather(continuity.State(None, None, None, [], []), slots, {})
        assert st2.objective is not None and st2.objective.text == "OBJECTIVE-31: move billing."
        assert st2.plan is not None and "schema" not in st2.plan.text and st2.plan_mids == [ids[1], ids[2]]
        # Any mapping is a message (a read-only view too), the same as a dict.
        from types import MappingProxyType

        ro = [Slot(s.kind, s.refs, MappingProxyType(s.msg), s.role, s.tokens, s.call_ids, s.result_for)
              for s in slots]
        assert continuity.gather(continuity.State(None, None, None, [], []), ro, {}) == (st2, _)
    finally:
        store.close()


def test_continuity_facts_are_each_stored_messages_own(tmp_path):
    """continuity.gather keeps what it read of an assistant message by the message's stored
    text: the same id in another store (or the same message with its raw replaced) gives that
    message's facts, and a context of stored records gathers what the same records made
    eagerly (never read by the memo) gather."""
    import copy

    from lossless_context.demo.sessions import SessionStream
    from lossless_context.pipeline import continuity
    from lossless_context.pipeline.assemble import Slot
    from lossless_context.records import NewMessage

    def todo(i: int, item: str) -> dict:
        return {"role": "assistant", "content": "", "tool_calls": [
            {"id": f"t{i}", "type": "function", "function": {"name": "todo", "arguments": json.dumps(
                {"todos": [{"id": "1", "content": item, "status": "in_progress"}]})}},
            {"id": f"w{i}", "type": "function", "function": {"name": "write_file", "arguments": json.dumps(
                {"path": f"src/{item}.py", "content": "x"})}}]}

    def gather(store, msgs):
        ids = store.append_messages("g", [NewMessage(raw=m, role=m["role"], ident=f"i{k}-{m['role']}", uid=None,
                                                     text=str(m.get("content")), tokens=10, created_at=1.0)
                                          for k, m in enumerate(msgs)])
        records = store.get_messages(ids)
        slots = [Slot("m", [mid], m, m["role"], 10, call_ids=tuple(tc["id"] for tc in m.get("tool_calls") or ()),
                      result_for=m.get("tool_call_id")) for mid, m in zip(ids, msgs)]
        return ids, slots, records, continuity.gather(continuity.State(None, None, None, [], []), slots, records)

    stores = [open_store(str(tmp_path / f"{name}.db")) for name in ("a", "b", "c")]
    try:
        for s in stores:
            s.ensure_session("g")
        a = [{"role": "user", "content": "start"}, todo(1, "alpha"),
             {"role": "assistant", "content": "Plan: alpha first, then the rest."}]
        b = [{"role": "user", "content": "start"}, todo(1, "beta"),
             {"role": "assistant", "content": "Next steps: beta."}]
        ids_a, slots_a, rec_a, (st_a, ed_a) = gather(stores[0], a)
        ids_b, slots_b, rec_b, (st_b, ed_b) = gather(stores[1], b)
        assert ids_a == ids_b  # (the same ids, other messages)
        assert "alpha" in st_a.plan.text and ed_a == {1: ["src/alpha.py"]}
        assert "beta" in st_b.plan.text and ed_b == {1: ["src/beta.py"]}
        again = continuity.gather(continuity.State(None, None, None, [], []), slots_a, stores[0].get_messages(ids_a))
        assert again == (st_a, ed_a)
        # A record whose raw is replaced is read from its new raw.
        rec_a[ids_a[1]].raw = todo(1, "gamma")
        st_g, ed_g = continuity.gather(continuity.State(None, None, None, [], []), slots_a, rec_a)
        assert "gamma" in st_g.plan.text and ed_g == {1: ["src/gamma.py"]}
        # A generated session: stored records and eager copies of them gather the same.
        msgs = list(SessionStream("coding", 600, 3))
        _ids, slots, records, got = gather(stores[2], msgs)
        eager = {k: copy.copy(r) for k, r in records.items()}
        assert all(type(r).__name__ == "MessageRecord" for r in eager.values())
        assert got == continuity.gather(continuity.State(None, None, None, [], []), slots, eager)
        assert got[1], "the generated session edits files"
    finally:
        for s in stores:
            s.close()
