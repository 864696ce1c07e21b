"""A tool call the host's list ends waiting for (pipeline/assemble.pending_start).

The host appends a tool call's results right after the call: a pass over a list that ends in
the call (a prefix handed to a manual /compress, a pass between the call and its results)
must keep the call last in its output, verbatim, under no leaf. Folded with the span before
it, the results the host appends next are orphans; the replay side of the same bug is in
tests/test_ingest_replay.py and tests/test_ingest_oracle.py.
"""

from __future__ import annotations

import json

from lossless_context import LCMEngine
from lossless_context.config import LCMConfig
from lossless_context.demo.host_driver import R19Host
from lossless_context.pipeline.validate import pairing_problems, pending_calls

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()


def _text(seed: int, n: int) -> str:
    return " ".join(f"{WORDS[(seed + j) % len(WORDS)]}{j % 7}" for j in range(n))


def _call(call_id: str) -> dict:
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": "read_file", "arguments": json.dumps({"path": "a.py"})}}]}


def test_a_pass_never_folds_the_call_the_list_ends_waiting_for(tmp_path):
    """The fresh tail would hold the waiting call alone (the user message before it is larger
    than the tail's budget), and the summary block cannot stand between the head's last user
    message and an assistant: the tail's start is moved forward to find it a role. It must
    stop at the call, not move past it to the end of the list (the call then in the leaf)."""
    e = LCMEngine(config=LCMConfig.load({"store": str(tmp_path / "l.db"), "summarizer": "extractive",
                                         "fresh_tail_tokens": 100}, read_file=False))
    host = R19Host(e, session_id="s")
    host.start(context_length=16_000)
    msgs: list[dict] = [{"role": "user", "content": "start " + _text(0, 50)},
                        {"role": "assistant", "content": "ok " + _text(1, 50)},
                        {"role": "user", "content": "go " + _text(2, 50)}]
    for i in range(12):
        msgs += [_call(f"c{i}"), {"role": "tool", "tool_call_id": f"c{i}", "content": f"result {i} " + _text(i, 600)}]
    msgs.append({"role": "user", "content": "next " + _text(5, 600)})
    waiting = _call("call_1")
    host.add(*msgs, waiting)
    assert pending_calls(host.messages) == ["call_1"]
    assert host.compress_once() and host.invalid == []
    assert host.messages[-1] == waiting and host.estimate() < host.engine.threshold_tokens
    store = e.store
    _, ctx = store.get_context("s")
    assert ctx[-1].kind == "m" and store.get_messages([ctx[-1].ref])[ctx[-1].ref].raw == waiting
    assert not store.message_summaries_many([ctx[-1].ref]).get(ctx[-1].ref)  # under no leaf
    # the results the host appends next pair with the call; the next pass keeps them
    host.add({"role": "tool", "tool_call_id": "call_1", "content": "the file's text"},
             {"role": "assistant", "content": "read it"}, {"role": "user", "content": "thanks " + _text(3, 600)})
    assert pairing_problems(host.messages) == []
    e.ingest(host.messages, session_id="s")
    _, ctx = store.get_context("s")
    assert [x.role for x in ctx[-4:]] == ["assistant", "tool", "assistant", "user"]
    assert host.compress_once(force=True) and host.invalid == [] and pairing_problems(host.messages) == []


def test_pairing_allows_only_the_inputs_own_waiting_call():
    call, result = _call("a"), {"role": "tool", "tool_call_id": "a", "content": "x"}
    assert pending_calls([{"role": "user", "content": "q"}, call]) == ["a"]
    assert pending_calls([call, result]) == [] and pending_calls([call, {"role": "user", "content": "q"}]) == []
    assert pairing_problems([call], ["a"]) == []
    assert pairing_problems([call]) and pairing_problems([call], ["b"])
    assert pairing_problems([call, {"role": "user", "content": "q"}], ["a"])  # answered by nothing: still wrong
