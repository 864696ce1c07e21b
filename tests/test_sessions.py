"""Tests for lossless_context.demo.sessions: deterministic synthetic sessions and the sequence validator."""

from __future__ import annotations

import collections
import hashlib
import json
import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lossless_context.pipeline.validate import sequence_problems
from lossless_context.demo.sessions import (
    SYSTEM_PROMPT,
    Canary,
    Session,
    chat_session,
    check_canaries,
    coding_session,
    iter_coding_messages,
    iter_mixed_messages,
    make_session,
    mixed_session,
)

KINDS = ("coding", "chat", "mixed")
TOOLS = {"read_file", "terminal", "search_files", "patch", "write_file"}


def dump(messages: list[dict]) -> str:
    return json.dumps(messages, sort_keys=False)


def call_ids(messages: list[dict]) -> list[str]:
    return [tc["id"] for m in messages for tc in m.get("tool_calls") or ()]


# ----------------------------------------------------------------------------- determinism


@pytest.mark.parametrize("kind", KINDS)
def test_same_seed_gives_identical_json(kind):
    a, b = make_session(kind, 700, 42), make_session(kind, 700, 42)
    assert dump(a.messages) == dump(b.messages)
    assert a.canaries == b.canaries and a.final_question == b.final_question


@pytest.mark.parametrize("kind", KINDS)
def test_different_seeds_differ(kind):
    assert dump(make_session(kind, 300, 1).messages) != dump(make_session(kind, 300, 2).messages)


def test_identical_across_processes_with_different_hash_seeds():
    code = ("import hashlib, json; from lossless_context.demo.sessions import make_session; "
            "print(hashlib.sha256(''.join(json.dumps(make_session(k, 900, 5).messages) "
            "for k in ('coding', 'chat', 'mixed')).encode()).hexdigest())")
    here = hashlib.sha256("".join(dump(make_session(k, 900, 5).messages) for k in KINDS).encode()).hexdigest()
    for hash_seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == here


def test_does_not_touch_global_random():
    import random

    random.seed(123)
    expected = random.random()
    random.seed(123)
    coding_session(200, 3)
    assert random.random() == expected


# ----------------------------------------------------------------------------- shape


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 5, 7, 10, 33, 250, 301, 1000])
def test_exact_length_and_valid(kind, n):
    s = make_session(kind, n, 9)
    assert len(s.messages) == n
    assert sequence_problems(s.messages) == []
    assert check_canaries(s.messages, s.canaries) == []
    if n:
        assert s.messages[0]["role"] == "user"
    assert all(m["role"] != "system" for m in s.messages)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(KINDS), n=st.integers(0, 800), seed=st.integers(0, 2**32), repeat=st.booleans(),
       ask=st.booleans())
def test_property_valid_sequences(kind, n, seed, repeat, ask):
    s = make_session(kind, n, seed, repeat_tool_ids=repeat, final_question=ask)
    assert len(s.messages) == n
    assert sequence_problems(s.messages) == []
    assert check_canaries(s.messages, s.canaries) == []
    for m in s.messages:
        assert m["role"] in ("user", "assistant", "tool")
        assert (m.get("content") or "").isascii()
        for tc in m.get("tool_calls") or ():
            assert tc["function"]["name"] in TOOLS
            assert isinstance(json.loads(tc["function"]["arguments"]), dict)
    if not repeat:
        ids = call_ids(s.messages)
        assert len(ids) == len(set(ids))
    if kind == "chat":
        assert all(m["role"] == ("user" if i % 2 == 0 else "assistant") for i, m in enumerate(s.messages))
    if s.final_question is not None:
        assert ask and s.messages[-1]["role"] == "user"
        assert s.final_question.question in s.messages[-1]["content"]
        assert s.final_question in s.canaries


def test_chat_has_no_tools_and_alternates():
    s = chat_session(2001, 4)
    assert not any("tool_calls" in m or m["role"] == "tool" for m in s.messages)
    assert [m["role"] for m in s.messages[:4]] == ["user", "assistant", "user", "assistant"]
    assert s.messages[-1]["role"] == "user" and s.final_question is not None  # odd n: ends with the question


def test_chat_covers_many_topics():
    text = " ".join(m["content"] for m in chat_session(400, 1).messages)
    hits = [w for w in ("itinerary", "recipe", "book", "tax", "train", "water") if w in text.lower()]
    assert len(hits) >= 5


def test_mixed_interleaves_coding_and_chat():
    s = mixed_session(1500, 2)
    kinds = ["coding" if any(m["role"] == "tool" for m in s.messages[a:b]) else "chat" for a, b in s.turns()]
    assert kinds.count("coding") > 10 and kinds.count("chat") > 10
    switches = sum(1 for x, y in zip(kinds, kinds[1:]) if x != y)
    assert switches > 10


def test_coding_session_looks_like_an_agent_at_work():
    s = coding_session(3000, 11)
    names = collections.Counter(tc["function"]["name"] for m in s.messages for tc in m.get("tool_calls") or ())
    assert set(names) == TOOLS
    widths = collections.Counter(len(m.get("tool_calls") or ()) for m in s.messages if m["role"] == "assistant")
    assert widths[2] > 0 and widths[3] > 0  # parallel calls
    tool_text = [m["content"] for m in s.messages if m["role"] == "tool"]
    assert any("Traceback" in t or "FAILURES" in t for t in tool_text)  # errors happen
    assert any('"success": false' in t for t in tool_text)  # and edits sometimes miss
    assert any("src/billing/invoice.py" in t for t in tool_text)  # consistent fictional tree
    assert any("Decision:" in (m.get("content") or "") for m in s.messages if m["role"] == "assistant")
    assert "pytest -q" in s.messages[0]["content"]  # facts stated early ...
    assert any("test command I gave you at the start" in (m.get("content") or "") for m in s.messages[1500:])
    sizes = sorted(len(m.get("content") or "") + sum(len(tc["function"]["arguments"])
                                                     for tc in m.get("tool_calls") or ()) for m in s.messages)
    assert 50 <= sizes[len(sizes) // 2] <= 2000
    assert sum(50 <= x <= 2000 for x in sizes) > 0.7 * len(sizes)


def test_turns_partition_the_session():
    s = mixed_session(600, 8)
    turns = s.turns()
    assert turns[0][0] == 0 and turns[-1][1] == len(s.messages)
    assert all(a < b for a, b in turns) and all(x[1] == y[0] for x, y in zip(turns, turns[1:]))
    assert all(s.messages[a]["role"] == "user" for a, _ in turns)
    assert all(m["role"] != "user" for a, b in turns for m in s.messages[a + 1:b])
    assert Session("coding", 0, [{"role": "assistant", "content": "hi"}], []).turns() == [(0, 1)]
    assert Session("coding", 0, [], []).turns() == []


def test_system_prompt_is_separate():
    assert isinstance(SYSTEM_PROMPT, str) and len(SYSTEM_PROMPT) > 100
    s = coding_session(50, 0)
    assert sequence_problems([{"role": "system", "content": SYSTEM_PROMPT}, *s.messages]) == []


# ----------------------------------------------------------------------------- tool ids


def test_tool_ids_unique_by_default():
    ids = call_ids(coding_session(5000, 3).messages)
    assert len(ids) > 1000 and len(ids) == len(set(ids))
    assert all(i.startswith("call_") and len(i) == 29 for i in ids)


def test_repeat_tool_ids_restart_per_message():
    s = coding_session(1500, 3, repeat_tool_ids=True)
    assert sequence_problems(s.messages) == []
    for m in s.messages:
        if m.get("tool_calls"):
            assert [tc["id"] for tc in m["tool_calls"]] == [f"call_{j}" for j in range(len(m["tool_calls"]))]
    counts = collections.Counter(call_ids(s.messages))
    assert counts["call_0"] > 100 and counts["call_1"] > 10


# ----------------------------------------------------------------------------- canaries


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", [1000, 3000])
def test_canaries_planted_unique_and_spread(kind, n):
    s = make_session(kind, n, 21)
    assert len(s.canaries) == max(4, n // 250)
    assert check_canaries(s.messages, s.canaries) == []
    idx = [c.message_index for c in s.canaries]
    assert idx == sorted(idx) and len(set(idx)) == len(idx)
    assert min(b - a for a, b in zip(idx, idx[1:])) > n / len(idx) / 4
    assert len({c.key for c in s.canaries}) == len(s.canaries)
    assert len({c.question for c in s.canaries}) == len(s.canaries)
    for c in s.canaries:
        assert c.question.endswith("?") and c.value not in c.question
        assert c.value in s.messages[c.message_index].get("content", "")


@pytest.mark.parametrize("kind,expected", [
    ("coding", {"number_in_tool_output", "path_in_decision", "error_string", "name_said_once", "ticket_id"}),
    ("chat", {"name_said_once", "number_in_chat", "ticket_id", "passphrase_in_chat"}),
])
def test_canary_kinds_varied_and_placed_by_role(kind, expected):
    s = make_session(kind, 5000, 5)
    assert {c.kind for c in s.canaries} == expected
    role = {"number_in_tool_output": "tool", "error_string": "tool", "path_in_decision": "assistant"}
    for c in s.canaries:
        m = s.messages[c.message_index]
        assert m["role"] == role.get(c.kind, "user")
        if c.kind == "error_string":
            assert c.value.startswith("ERR_")
        if c.kind == "path_in_decision":
            assert "Decision:" in m["content"] and "/" in c.value
        if c.kind in ("number_in_tool_output", "number_in_chat"):
            assert c.value.isdigit() and len(c.value) == 5


def test_final_question_asks_about_an_early_canary():
    s = coding_session(2000, 13)
    assert s.final_question is not None
    assert s.messages[-1] == {"role": "user", "content": s.messages[-1]["content"]}
    assert s.final_question.question in s.messages[-1]["content"]
    assert s.final_question.message_index < 1000
    assert make_session("coding", 2000, 13, final_question=False).final_question is None


def test_number_canaries_survive_digit_heavy_output():
    # Many sessions with large numeric dumps: number canaries must still occur exactly once.
    for seed in range(6):
        s = coding_session(1200, seed)
        assert check_canaries(s.messages, s.canaries) == []


def test_scrub_removes_accidental_number_canaries():
    import re

    from lossless_context.demo.sessions import SessionStream, _trie_regex

    stream = SessionStream("coding", 10, 0)
    stream._num_re = re.compile(_trie_regex(["12345", "23456"]))
    out = stream._scrub("id=9123456 port 12345, hex a12345b and 123")
    assert len(out) == len("id=9123456 port 12345, hex a12345b and 123")
    assert "12345" not in out and "23456" not in out and out.endswith(" and 123")
    dense = {str(v) for v in range(10000, 10100)} | {str(v) for v in range(60000, 65536)}  # many-canary path
    stream._num_re = re.compile(_trie_regex(sorted(dense)))
    text = "x 1000012 y 10050 z 99999 w 6123456123 v 1006000"
    out = stream._scrub(text)
    assert len(out) == len(text) and out.endswith(" v 9" + out[-6:]) and " z 99999 " in out
    assert not any(out[i:i + 5] in dense for i in range(len(out)))


def test_check_canaries_detects_duplicates():
    s = coding_session(600, 2)
    c = s.canaries[0]
    broken = [*s.messages, {"role": "user", "content": f"again: {c.value}"}]
    assert check_canaries(broken, s.canaries)
    moved = Canary(c.key, c.kind, c.value, c.message_index + 1, c.question)
    assert check_canaries(s.messages, [moved])


# ----------------------------------------------------------------------------- large outputs


def test_large_outputs_present_and_bounded():
    s = coding_session(300, 0)
    big = [len(m["content"]) for m in s.messages if m["role"] == "tool" and len(m["content"]) > 100_000]
    assert len(big) >= 1 and all(120_000 <= b <= 200_000 for b in big)
    s = mixed_session(4000, 1)
    big = [len(m["content"]) for m in s.messages if m["role"] == "tool" and len(m["content"]) > 100_000]
    assert 6 <= len(big) <= 14 and all(120_000 <= b <= 200_000 for b in big)
    assert not any(len(m["content"]) > 100_000 for m in chat_session(4000, 1).messages)
    assert not any(len(m.get("content") or "") > 100_000 for m in coding_session(299, 0).messages)


# ----------------------------------------------------------------------------- streaming


def test_stream_matches_list_and_collects_canaries():
    stream = iter_coding_messages(1500, 6)
    assert stream.canaries == []
    messages = list(stream)
    s = coding_session(1500, 6)
    assert dump(messages) == dump(s.messages)
    assert stream.canaries == s.canaries and stream.final_question == s.final_question
    assert stream.index == 1500


def test_stream_is_lazy_for_huge_sessions():
    import itertools

    stream = iter_mixed_messages(1_000_000, 1)
    first = list(itertools.islice(stream, 200))
    # Nothing is generated ahead of time, shown by what was produced rather than by a clock:
    # 200 messages yielded and only the canaries planted in them (a million messages carry
    # ~4,000, one every ~250; a stream that ran ahead would have planted them all).
    assert stream.index == 200 and all(m["role"] in ("user", "assistant", "tool") for m in first)
    assert 1 <= len(stream.canaries) <= 2 and all(c.message_index < 200 for c in stream.canaries)
    assert dump(first) == dump(list(itertools.islice(iter_mixed_messages(1_000_000, 1), 200)))


def test_bad_arguments():
    with pytest.raises(ValueError):
        make_session("poetry", 10)
    with pytest.raises(ValueError):
        coding_session(-1)


# ----------------------------------------------------------------------------- validator


def _call(cid: str, name: str = "terminal", args: str = '{"command": "ls"}') -> dict:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


def _asst(*ids: str, content: str | None = None) -> dict:
    return {"role": "assistant", "content": content, "tool_calls": [_call(i) for i in ids]}


def _tool(cid: str, content: str = "ok") -> dict:
    return {"role": "tool", "tool_call_id": cid, "content": content}


U = {"role": "user", "content": "hi"}
A = {"role": "assistant", "content": "hello"}


def test_validator_accepts_good_sequences():
    assert sequence_problems([]) == []
    assert sequence_problems([U, _asst("a", "b"), _tool("b"), _tool("a"), A]) == []  # any order
    assert sequence_problems([U, _asst("call_0"), _tool("call_0"), _asst("call_0"), _tool("call_0")]) == []
    parts = {"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "image_url", "image_url": {}}]}
    assert sequence_problems([{"role": "system", "content": "s"}, parts, A, U]) == []


@pytest.mark.parametrize("messages,needle", [
    ([U, _tool("x")], "orphan"),
    ([U, _asst("a"), _tool("a"), U, _tool("a")], "orphan"),
    ([U, _asst("a", "b"), _tool("a"), U], "no result"),
    ([U, _asst("a")], "no result"),
    ([U, _asst("a"), A, _tool("a")], "no result"),
    ([U, _asst("a"), _tool("a"), _tool("a")], "duplicate"),
    ([U, _asst("a"), _tool("zz")], "matches no call:"),
    ([U, {"role": "robot", "content": "beep"}], "unknown role"),
    ([U, {"content": "no role"}], "unknown role"),
    ([U, "not a dict"], "not a dict"),
    ([{"role": "user", "content": None}], "content is None"),
    ([{"role": "user"}], "no content"),
    ([{"role": "user", "content": 5}], "content has type int"),
    ([{"role": "user", "content": []}], "empty list"),
    ([{"role": "user", "content": [{"type": "text"}]}], "no string"),
    ([{"role": "tool", "content": "x"}], "tool_call_id"),
    ([U, {"role": "assistant", "content": None}], "neither content nor tool_calls"),
    ([U, {"role": "assistant", "content": None, "tool_calls": []}], "non-empty list"),
    ([U, _asst("a", "a"), _tool("a"), _tool("a")], "repeated within"),
    ([U, {"role": "assistant", "content": None, "tool_calls": [_call("a", args="{oops")]}, _tool("a")], "JSON"),
    ([U, {"role": "assistant", "content": None, "tool_calls": [_call("a", args="[1]")]}, _tool("a")], "JSON"),
    ([U, {"role": "assistant", "content": None, "tool_calls": [_call("a", name="")]}, _tool("a")], "function name"),
    ([U, {"role": "assistant", "content": None, "tool_calls": [{**_call("a"), "type": "x"}]}, _tool("a")], "type"),
    ([U, {"role": "assistant", "content": None, "tool_calls": [{"type": "function"}]}], "has no id"),
    ([{"role": "user", "content": "x", "tool_calls": [_call("a")]}], "tool_calls on a user"),
    ([U, _asst("a"), {"role": "tool", "tool_call_id": "a", "content": None}], "content is None"),
])
def test_validator_catches_broken_sequences(messages, needle):
    problems = sequence_problems(messages)
    assert problems, messages
    assert any(needle in p for p in problems), problems


def test_validator_reports_positions():
    problems = sequence_problems([U, _asst("a", "b"), _tool("a"), U, _tool("q")])
    assert problems == [
        "message 1: no result for tool call(s) ['b'] before message 3",
        "message 4: orphan tool result 'q' (no preceding assistant tool call)",
    ]


def test_validator_catches_truncation_of_generated_session():
    s = coding_session(400, 1)
    i = next(i for i, m in enumerate(s.messages) if len(m.get("tool_calls") or ()) >= 2)
    assert sequence_problems(s.messages[: i + 2])  # cut between a call's results
    assert sequence_problems(s.messages[:i] + s.messages[i + 1:])  # dropped the assistant message
