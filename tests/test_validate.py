"""The one place that says what a valid chat-completions list is (pipeline/validate.py).

`sequence_problems` is the full check (a generated or imported session), `pairing_problems` what
every engine output guarantees; a list the full check accepts must pass the pairing check too.
"""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from lossless_context.demo.sessions import make_session
from lossless_context.pipeline.validate import pairing_problems, sequence_problems

U = {"role": "user", "content": "hi"}
A = {"role": "assistant", "content": "ok"}


def _call(*ids: str) -> dict:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": i, "type": "function", "function": {"name": "t", "arguments": json.dumps({"x": 1})}} for i in ids]}


def _result(i: str) -> dict:
    return {"role": "tool", "tool_call_id": i, "content": "r"}


def test_both_reject_broken_pairing():
    for broken in ([U, _call("a"), A], [U, _result("a")], [U, _call("a", "b"), _result("a"), A]):
        assert pairing_problems(broken) and sequence_problems(broken), broken


def test_only_the_full_check_rejects_bad_types():
    bad = [U, {"role": "assistant", "content": 42}, {"role": "robot", "content": "x"}]
    assert pairing_problems(bad) == []
    assert len(sequence_problems(bad)) == 2


def test_generated_sessions_pass_both():
    for kind in ("coding", "chat", "mixed"):
        msgs = make_session(kind, 300, seed=3).messages
        assert sequence_problems(msgs) == [] and pairing_problems(msgs) == []


_messages = st.lists(st.one_of(
    st.just(U), st.just(A), st.sampled_from(["a", "b", "c"]).map(_result),
    st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=3, unique=True).map(lambda ids: _call(*ids)),
    st.just({"role": "assistant", "content": 3}), st.just({"role": "tool", "content": "no id"})), max_size=12)


@settings(max_examples=400, deadline=None)
@given(_messages)
def test_what_the_full_check_accepts_is_paired(msgs):
    if sequence_problems(msgs) == []:
        assert pairing_problems(msgs) == []
