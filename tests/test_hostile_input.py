"""Hostile input: "nothing lost, nothing leaked" under garbage from the host or the model.

A hypothesis fuzz drives random message lists (non-dict entries, missing/unknown roles,
None/list/nested-dict content, media parts carrying base64, lone surrogates and NUL bytes,
duplicate tool-call ids, results whose call is missing, tool arguments nested 600 deep)
through every entry point the host has: ``compress()``, ``select_context()``,
``on_turn_complete()``, ``on_session_end()`` and ``handle_tool_call()`` (all four tools,
with random arguments of random types and a ``messages=`` kwarg that may be garbage).

After every example:

* no exception escaped;
* ``compress()`` returned the input itself (no progress) or a list of dicts that passes
  ``validate.pairing_problems()`` (a tool call the input ends waiting for may stay last),
  with the system prompt first and unchanged;
* every input message is stored exactly once: dicts byte-identical
  (``json.dumps(m, sort_keys=True)`` multisets), non-dicts as ``{"_lcm_unparsed": ...}``
  raws (checked by count);
* every tool answer is a JSON object, and never an internal error (a refusal of bad
  arguments is an answer; a tool that broke is a failure);
* no pass failed (the engine's reason never starts with "error"), and over all examples some
  passes made progress (``test_fuzz_made_progress``);
* with an OpenAI-compatible summariser, no base64 payload of a media part ever reaches
  the server, while the store keeps it verbatim (once per message that carried it).

Counts of inputs tried are written to ``test-artifacts/robustness-counts.json``.
"""

from __future__ import annotations

import base64
import copy
import fcntl
import json
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from lossless_context import LCMEngine
from lossless_context.messages import summary_node_ids
from lossless_context.pipeline.validate import pairing_problems, pending_calls
from lossless_context.config import LCMConfig
from lossless_context.messages import content_ident
from tests.support.fake_openai import FakeOpenAI, SummariserResponder

SID = "hostile-1"
ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts"
COUNTS: Counter = Counter()
TOOL_NAMES = ["lcm_grep", "lcm_describe", "lcm_expand", "lcm_expand_query"]


def record_counts(section: str, counts: dict[str, Any]) -> None:
    """Merge this module's counters into test-artifacts/robustness-counts.json (locked)."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / "robustness-counts.json"
    with open(ARTIFACTS / ".robustness-counts.lock", "w") as lk:
        fcntl.flock(lk, fcntl.LOCK_EX)
        try:
            data = json.loads(path.read_text()) if path.exists() else {}
        except ValueError:
            data = {}
        data[section] = {**dict(counts), "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
        os.replace(tmp, path)


@pytest.fixture(scope="module", autouse=True)
def _report_counts():
    yield
    record_counts("hostile_input", COUNTS)
    print(f"\nhostile input: {dict(COUNTS)}")


# --------------------------------------------------------------------------- strategies

SPECIAL = [
    "\ud800", "\udfff", "x\udc00y", "\x00", "a\x00b", "\ufeff", "\u202e", "\U0001f642", "\r\n", "\\",
    "'; DROP TABLE messages; --", "%s %d {0} {}", "?", "\"", "NULL", "<lcm-summary", "</lcm-summary>",
    "lcm-large", "s1", "m1", "continue",
]
TEXT = st.lists(st.one_of(st.text(max_size=40), st.sampled_from(SPECIAL)), max_size=6).map("".join)
JSON_SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**63), TEXT,
                        st.floats(allow_nan=False, allow_infinity=False))
JSONISH = st.recursive(JSON_SCALAR, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                          st.dictionaries(TEXT, kids, max_size=4)),
                       max_leaves=12)
CALL_IDS = st.sampled_from(["call_1", "call_2", "call_1", "c", "", "call_\ud800"])


def deep(depth: int, leaf: Any = "bottom") -> Any:
    """A JSON value nested `depth` levels (alternating lists and objects)."""
    v: Any = leaf
    for i in range(depth):
        v = [v] if i % 2 else {"k": v}
    return v


@st.composite
def b64_payload(draw) -> str:
    raw = draw(st.binary(min_size=48, max_size=1500))
    return base64.b64encode(raw).decode()


@st.composite
def media_part(draw, payloads: list[str]) -> dict[str, Any]:
    b64 = draw(b64_payload())
    payloads.append(b64)
    kind = draw(st.sampled_from(["image_url", "input_audio", "image", "input_image", "file"]))
    if kind == "image_url":
        return {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64}", "detail": "low"}}
    if kind == "input_audio":
        return {"type": "input_audio", "input_audio": {"data": b64, "format": "wav"}}
    if kind == "image":
        return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}}
    if kind == "input_image":
        return {"type": "input_image", "image_url": f"data:image/jpeg;base64,{b64}"}
    return {"type": "file", "file": {"filename": "a.pdf", "file_data": f"data:application/pdf;base64,{b64}"}}


@st.composite
def content(draw, payloads: list[str]) -> Any:
    kind = draw(st.sampled_from(["text", "text", "text", "none", "parts", "parts", "dict", "scalar", "deep", "json",
                                 "media_dict"]))
    if kind == "media_dict":  # one media part given as the whole content (not in a list)
        return draw(media_part(payloads))
    if kind == "text":
        return draw(TEXT)
    if kind == "none":
        return None
    if kind == "parts":
        parts = []
        for _ in range(draw(st.integers(0, 4))):
            pk = draw(st.sampled_from(["text", "media", "media", "junk", "str"]))
            if pk == "text":
                parts.append({"type": "text", "text": draw(TEXT)})
            elif pk == "media":
                parts.append(draw(media_part(payloads)))
            elif pk == "str":
                parts.append(draw(TEXT))
            else:  # malformed parts, including a "type" of any JSON type (lists are unhashable)
                parts.append(draw(st.one_of(JSON_SCALAR, st.dictionaries(TEXT, JSON_SCALAR, max_size=3),
                                            st.fixed_dictionaries({"type": JSONISH}, optional={"text": JSONISH}))))
        return parts
    if kind == "dict":
        return draw(st.dictionaries(TEXT, JSONISH, max_size=4))
    if kind == "scalar":
        return draw(st.one_of(st.integers(), st.booleans(), st.floats(allow_nan=False)))
    if kind == "deep":
        return deep(draw(st.sampled_from([3, 50, 600])), draw(TEXT))
    return json.dumps(deep(draw(st.sampled_from([10, 600]))))


@st.composite
def tool_call(draw) -> Any:
    kind = draw(st.sampled_from(["ok", "ok", "ok", "deep_args", "junk"]))
    if kind == "junk":
        return draw(st.one_of(st.none(), TEXT, st.integers(), st.dictionaries(TEXT, JSON_SCALAR, max_size=3),
                              st.just({"id": 5}), st.just({"function": "terminal"})))
    if kind == "deep_args":
        depth = draw(st.sampled_from([100, 600, 5000]))
        args: Any = ("[" * depth + "]" * depth) if depth > 600 else json.dumps(deep(depth))
    else:
        args = draw(st.one_of(st.dictionaries(TEXT, JSON_SCALAR, max_size=3).map(json.dumps), TEXT,
                              st.dictionaries(TEXT, JSON_SCALAR, max_size=2), st.none()))
    return {"id": draw(CALL_IDS), "type": "function",
            "function": {"name": draw(st.sampled_from(["terminal", "read_file", "", "x" * 300])), "arguments": args}}


@st.composite
def message(draw, payloads: list[str]) -> Any:
    kind = draw(st.sampled_from(["user", "user", "assistant", "assistant", "calls", "calls", "tool", "tool",
                                 "weird_role", "no_role", "junk", "system_mid"]))
    if kind == "junk":
        return draw(st.one_of(st.none(), st.integers(), TEXT, st.lists(JSON_SCALAR, max_size=3),
                              st.floats(allow_nan=False), st.booleans()))
    if kind == "calls":
        m: dict[str, Any] = {"role": "assistant", "content": draw(st.one_of(st.none(), TEXT)),
                             "tool_calls": draw(st.one_of(st.lists(tool_call(), min_size=1, max_size=3),
                                                          st.lists(tool_call(), max_size=0), st.none(), TEXT))}
        return m
    if kind == "tool":
        m = {"role": "tool", "content": draw(content(payloads))}
        tid = draw(st.one_of(CALL_IDS, st.just("call_missing"), st.none(), st.integers(), st.just(None)))
        if draw(st.booleans()) or tid is not None:
            m["tool_call_id"] = tid
        if draw(st.booleans()):
            m["name"] = draw(TEXT)
        return m
    if kind == "no_role":
        return {"content": draw(content(payloads))}
    if kind == "weird_role":
        return {"role": draw(st.sampled_from(["", "robot", "USER", None, 7, ["user"], {"r": 1}, "function",
                                               "developer"])),
                "content": draw(content(payloads))}
    role = "system" if kind == "system_mid" else kind
    m = {"role": role, "content": draw(content(payloads))}
    if draw(st.integers(0, 5)) == 0:  # host-only / identity keys, sometimes malformed
        m.update(draw(st.dictionaries(st.sampled_from(["_db_persisted", "timestamp", "message_uid", "reasoning",
                                                      "_absorbed_message_uids", "finish_reason", "name"]),
                                      st.one_of(JSON_SCALAR, st.just("0123456789abcdef0123456789abcdef")),
                                      max_size=3)))
    return m


@st.composite
def session_case(draw) -> dict[str, Any]:
    payloads: list[str] = []
    body1 = draw(st.lists(message(payloads), min_size=1, max_size=14))
    # the host's list never starts its body with a system message (that would be "the" system prompt)
    if isinstance(body1[0], dict) and body1[0].get("role") == "system":
        body1.insert(0, {"role": "user", "content": "hello"})
    more = draw(st.lists(message(payloads), max_size=8))
    # Known bug (see test_repeated_message_after_a_tailless_compaction_is_stored): a new message equal
    # to a summarised one is taken for it when no tail message follows the summary. Keep the next
    # turn's messages distinct from the first turn's so the fuzz explores everything else.
    seen = {content_ident(m) for m in body1}
    for i, m in enumerate(more):
        if content_ident(m) in seen:
            more[i] = {**m, "content": f"turn two, message {i}"} if isinstance(m, dict) else 10**12 + i
    filler = draw(st.integers(0, 6))  # long plain turns so that compaction has something to do
    for i in range(filler):
        body1.insert(draw(st.integers(0, len(body1))),
                     {"role": "user" if i % 2 else "assistant", "content": f"filler {i} " + "lorem ipsum " * 300})
    return {
        "system": draw(st.one_of(st.none(), st.just({"role": "system", "content": "You are Hermes."}))),
        "body1": body1,
        "more": more,
        "force": draw(st.booleans()),
        "tokens": draw(st.one_of(st.none(), st.integers(-5, 10**7), st.just(-1))),
        "focus": draw(st.one_of(st.none(), TEXT)),
        "memory": draw(st.one_of(st.just(""), TEXT, st.none(), st.integers())),
        "kwargs": draw(st.dictionaries(st.sampled_from(["bypass_cooldown", "session_id_junk", "turn_id"]),
                                       JSON_SCALAR, max_size=2)),
        "tool_args": draw(st.lists(tool_args(), min_size=1, max_size=4)),
        "payloads": payloads,
    }


@st.composite
def tool_args(draw) -> tuple[str, Any]:
    name = draw(st.sampled_from(TOOL_NAMES + ["lcm_nope", "", "LCM_GREP"]))
    keys = st.sampled_from(["query", "id", "mode", "scope", "role", "since", "until", "limit", "cursor",
                            "summary_id", "max_tokens", "prompt", "summary_ids", "session_scope", "junk"])
    values = st.one_of(
        JSONISH, st.sampled_from(["s1", "m1", "S1", " m2 ", "m-1", "s99999999999999999999", "m0", "x1", "both",
                                  "regex", "summaries", "messages", "(a+)+$", "[", "*", "all", "2026-01-01",
                                  "not-a-date", "eyJvIjogLTF9", "!!!", "\"quoted phrase\"", "%", "_"]),
        st.integers(), st.just(deep(600)), st.lists(st.sampled_from(["s1", "m1", 5, None]), max_size=25))
    args = draw(st.one_of(
        st.dictionaries(keys, values, max_size=6),
        st.dictionaries(keys, values, max_size=6).map(lambda d: json.dumps(d, default=str)),
        TEXT, st.none(), st.integers(), st.lists(JSON_SCALAR, max_size=3),
        st.just(json.dumps(deep(600))),
    ))
    return name, args


# --------------------------------------------------------------------------- helpers


def make_engine(path: Path, **cfg: Any) -> LCMEngine:
    conf = {"store": str(path), "summarizer": "extractive", "fresh_tail_tokens": 300, "leaf_chunk_tokens": 1500,
            "lock_timeout": 5, **cfg}
    e = LCMEngine(config=LCMConfig.load(conf, read_file=False))
    e.update_model(model="fuzz-model", context_length=64_000, base_url="http://127.0.0.1:9/v1", api_key="k",
                   provider="custom", api_mode="chat_completions")
    e.bind_session_state(None, SID)
    e.on_session_start(SID, platform="cli", model="fuzz-model", context_length=64_000)
    return e


def canon(m: Any) -> str:
    # Through JSON once first: the store keeps a message as its JSON text, and two lone
    # surrogates that happen to form a pair ("\ud800\udfff" as two code points) read back
    # as the one character that text means — same bytes, but it sorts differently as a key.
    return json.dumps(json.loads(json.dumps(m)), sort_keys=True)


def stored_raws(e: LCMEngine) -> list[Any]:
    return [m.raw for m in e.store.iter_all_messages()]


def check_output(inp: list[Any], out: Any, system: dict | None) -> bool:
    """True when the pass made progress (a new list)."""
    assert isinstance(out, list), f"compress returned {type(out).__name__}"
    if out is inp:
        return False
    assert all(isinstance(m, dict) for m in out), "compress output holds a non-dict"
    # (a call the input ends waiting for stays last: the host appends its results right after it)
    waiting = pending_calls(inp)
    assert pairing_problems(out, waiting) == [], pairing_problems(out, waiting)
    if system is not None:
        assert out and out[0] == system, "the system prompt must stay first and unchanged"
    return True


def check_stored(e: LCMEngine, inputs: list[Any]) -> None:
    raws = stored_raws(e)
    dict_inputs = [m for m in inputs if isinstance(m, dict)]
    n_junk = len(inputs) - len(dict_inputs)
    assert len(raws) == len(inputs), f"{len(raws)} stored for {len(inputs)} inputs (lost or duplicated)"
    unparsed = [r for r in raws if isinstance(r, dict) and set(r) == {"_lcm_unparsed"}]
    # a dict input that itself is {"_lcm_unparsed": ...} would be ambiguous; the strategies never build one
    assert len(unparsed) == n_junk, f"{len(unparsed)} unparsed raws for {n_junk} non-dict inputs"
    got = Counter(canon(r) for r in raws if r not in unparsed)
    want = Counter(canon(m) for m in dict_inputs)
    assert got == want, (f"stored dicts differ from inputs: missing {list((want - got).elements())[:3]!r}, "
                         f"extra {list((got - want).elements())[:3]!r}")


def tool_answer(res: Any) -> dict[str, Any]:
    """A tool's answer: a JSON object, and not a tool that broke."""
    assert isinstance(res, str)
    data = json.loads(res)
    assert isinstance(data, dict), res[:200]
    assert "internal error" not in str(data.get("error", "")), res[:200]
    return data


def check_pass(e: LCMEngine) -> None:
    """The pass just run did not fail inside (compress() swallows it: look past that)."""
    reason = e.get_status().get("lcm_last_reason") or ""
    assert not reason.startswith("error"), reason


def call_tools(e: LCMEngine, calls: list[tuple[str, Any]], live: Any) -> None:
    for name, args in calls:
        for kw in ({}, {"messages": live}):
            tool_answer(e.handle_tool_call(name, copy.deepcopy(args), **kw))
            COUNTS["tool_calls"] += 1


def run_case(e: LCMEngine, case: dict[str, Any], server: FakeOpenAI | None = None) -> None:
    system = case["system"]
    body1 = case["body1"]
    lst1 = ([system] if system else []) + copy.deepcopy(body1)
    COUNTS["message_lists"] += 1
    COUNTS["messages"] += len(body1) + len(case["more"])
    COUNTS["non_dict_entries"] += sum(1 for m in body1 + case["more"] if not isinstance(m, dict))
    COUNTS["media_payloads"] += len(case["payloads"])

    out = e.compress(lst1, current_tokens=case["tokens"], focus_topic=case["focus"], force=case["force"],
                     memory_context=case["memory"], **case["kwargs"])
    check_pass(e)
    progressed = check_output(lst1, out, system)
    COUNTS["passes_with_progress"] += progressed
    # Newer-host hooks and the flushes see the same (pre-compaction) list: nothing new is stored.
    sel = e.select_context(copy.deepcopy(lst1), budget_tokens=1000)
    assert sel is None or (isinstance(sel, list) and all(isinstance(m, dict) for m in sel))
    e.on_turn_complete(copy.deepcopy(lst1), usage={"prompt_tokens": 5}, turn_id="t1", interrupted=True)
    call_tools(e, case["tool_args"], copy.deepcopy(lst1))
    e.on_session_end(SID, copy.deepcopy(lst1))
    check_stored(e, body1)

    # The host adopts the result (commit signal), appends the next turns and compacts again.
    if progressed:
        e.on_session_start(SID, boundary_reason="compression", old_session_id=SID, platform="cli")
        host = [m for m in out[1 if system else 0:]]
    else:
        host = copy.deepcopy(body1)
    lst2 = ([system] if system else []) + host + copy.deepcopy(case["more"])
    out2 = e.compress(lst2, force=True)
    check_pass(e)
    COUNTS["passes_with_progress"] += check_output(lst2, out2, system)
    e.on_session_end(SID, copy.deepcopy(lst2))
    call_tools(e, case["tool_args"][:1], lst2)
    e.select_context(lst2)
    check_stored(e, body1 + case["more"])


# --------------------------------------------------------------------------- the fuzz


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])
@given(case=session_case())
def test_fuzz_message_lists_through_every_hook(tmp_path_factory, case):
    e = make_engine(tmp_path_factory.mktemp("fz") / "lcm.db")
    try:
        run_case(e, case)
    finally:
        e.store.close()


@pytest.fixture(scope="module")
def summariser_server():
    with FakeOpenAI(responder=SummariserResponder(max_chars=900)) as srv:
        yield srv


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])
@given(case=session_case())
def test_media_base64_never_reaches_the_summariser(tmp_path_factory, summariser_server, case):
    srv = summariser_server
    case["force"] = True
    e = make_engine(tmp_path_factory.mktemp("b64") / "lcm.db", summarizer="openai", summary_base_url=srv.base_url,
                    summary_model="summ", summary_timeout=10, breaker_failures=1000, max_summarizer_calls=10**6)
    srv.clear()
    try:
        run_case(e, case)
        sent = [r.raw.decode("utf-8", "replace") for r in srv.requests]
        COUNTS["summariser_requests_checked"] += len(sent)
        for p in case["payloads"]:
            needle = p[:40]  # a 40-char run of random base64 cannot appear by chance
            assert not any(needle in body for body in sent), "a base64 media payload reached the summariser"
            # JSON escaping of "/" or "+" cannot hide it either: check the escaped form too
            assert not any(json.dumps(needle)[1:-1] in body for body in sent)
        raws = [canon(m.raw) for m in e.store.iter_all_messages()]
        inputs = [canon(m) for m in case["body1"] + case["more"]]
        for p in case["payloads"]:
            assert sum(p in r for r in raws) == sum(p in i for i in inputs), "media stored once per message"
        # nor in any summary text (published or staged)
        for s in e.store.get_summaries(range(1, 5000), include_staged=True).values():
            assert not any(p[:40] in s.text for p in case["payloads"])
    finally:
        e.store.close()


def test_fuzz_made_progress():
    """Guard against a vacuous fuzz: some of its passes compacted (a pass that failed returns its
    input, which counts as no progress)."""
    if COUNTS["message_lists"] == 0:
        pytest.skip("run with the fuzz tests above")
    assert COUNTS["passes_with_progress"] > 0, dict(COUNTS)


def test_media_fuzz_actually_reached_the_summariser():
    """Guard against a vacuous base64 check: some fuzzed passes did call the server."""
    if COUNTS["media_payloads"] == 0:
        pytest.skip("run with the fuzz tests above")
    assert COUNTS["summariser_requests_checked"] > 0


# --------------------------------------------------------------------------- tools alone


@pytest.fixture(scope="module")
def populated(tmp_path_factory):
    from lossless_context.demo.sessions import coding_session

    e = make_engine(tmp_path_factory.mktemp("tools") / "lcm.db")
    msgs = coding_session(260, seed=3).messages
    lst = copy.deepcopy(msgs)
    out = e.compress(lst, force=True)
    check_pass(e)
    assert out is not lst and len(out) < len(lst), "the forced pass compacted"
    e.on_session_start(SID, boundary_reason="compression", old_session_id=SID)
    assert sum(e.store.stats()["summaries_by_depth"].values()) > 0
    yield e, msgs
    e.store.close()


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.data_too_large])
@given(calls=st.lists(tool_args(), min_size=1, max_size=3),
       live=st.one_of(st.none(), st.just("messages"), st.integers(), st.lists(message([]), max_size=4),
                      st.dictionaries(TEXT, JSON_SCALAR, max_size=2)))
def test_fuzz_tool_arguments(populated, calls, live):
    e, msgs = populated
    before = e.store.stats()["messages"]
    if live == "messages":
        live = copy.deepcopy(msgs)  # the whole live list: already stored, nothing new
    for name, args in calls:
        res = e.handle_tool_call(name, copy.deepcopy(args), messages=copy.deepcopy(live))
        COUNTS["tool_calls"] += 1
        tool_answer(res)
        assert len(res) < 200_000, "tool output is bounded"
    after = e.store.stats()["messages"]
    if isinstance(live, list) and live and canon(live[0]) == canon(msgs[0]):
        assert after == before, "re-sending the stored live list stored nothing new"
    else:
        # a garbage live list is stored once (the later calls align with it)
        assert before <= after <= before + (len(live) if isinstance(live, list) else 0)


def test_describe_of_a_call_whose_function_is_not_an_object(tmp_path):
    """A stored assistant message's tool call may hold any JSON as its function (the fuzz's
    {"function": "terminal"}): lcm_describe names what it can and answers."""
    e = make_engine(tmp_path / "lcm.db")
    try:
        msgs = [{"role": "user", "content": "run it"},
                {"role": "assistant", "content": "", "tool_calls": [{"function": "terminal"}, {"id": 5},
                                                                    {"function": {"name": "read_file"}}]}]
        e.handle_tool_call("lcm_grep", {"query": "run"}, messages=copy.deepcopy(msgs))
        mid = max(m.id for m in e.store.iter_all_messages())
        data = tool_answer(e.handle_tool_call("lcm_describe", {"id": f"m{mid}"}))
        assert data["tool_calls"] == [None, None, "read_file"]
    finally:
        e.store.close()


def test_every_tool_on_every_id_answers_json(populated):
    e, _ = populated
    n_msgs = e.store.stats()["messages"]
    sums = {f"s{i}" for i in e.store.session_summary_ids(SID)}
    assert sums, "the fixture's pass made summaries"
    ids = [f"m{i}" for i in range(0, n_msgs + 3)] + [f"s{i}" for i in range(0, 60)]
    answered = Counter()
    for i in ids:
        for name, args in (("lcm_describe", {"id": i}), ("lcm_expand", {"id": i, "max_tokens": 200}),
                           ("lcm_expand_query", {"prompt": "what?", "summary_ids": [i]}),
                           ("lcm_grep", {"query": "error", "summary_id": i})):
            data = tool_answer(e.handle_tool_call(name, args))
            COUNTS["tool_calls"] += 1
            real = (i[0] == "m" and 1 <= int(i[1:]) <= n_msgs) or i in sums
            if real and name in ("lcm_describe", "lcm_expand"):
                assert "error" not in data, (name, i, data)  # an id that exists is described and expanded
                answered[name] += 1
    assert answered["lcm_describe"] == answered["lcm_expand"] == n_msgs + len([s for s in sums if int(s[1:]) < 60])


# --------------------------------------------------------------------------- 5 MB outputs


def test_five_megabyte_tool_outputs(tmp_path):
    e = make_engine(tmp_path / "lcm.db")
    line = "2026-11-30 06:00:01 INFO worker-7 processed batch id=123456 status=ok path=/srv/data/x.csv\n"
    big_ascii = (line * (5_000_000 // len(line) + 1))[:5_000_000]
    weird_unit = "é\u4e2d\x00\ud800🙂 " + "abc" * 20 + "\n"
    big_weird = (weird_unit * (5_000_000 // len(weird_unit) + 1))[:5_000_000]
    body = [{"role": "user", "content": "dump the logs please " * 50}]
    for k, big in enumerate((big_ascii, big_weird)):
        body.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_big_{k}", "type": "function", "function": {"name": "terminal",
                                                                     "arguments": json.dumps({"cmd": "cat log"})}}]})
        body.append({"role": "tool", "tool_call_id": f"call_big_{k}", "content": big})
        body.append({"role": "assistant", "content": f"That was log {k}. " + "analysis " * 200})
        body.append({"role": "user", "content": f"next {k} " + "please " * 200})
    COUNTS["messages"] += len(body)
    COUNTS["five_mb_outputs"] += 2
    out = e.compress(copy.deepcopy(body), current_tokens=3_000_000)
    assert check_output(body, out, None) or out == body
    assert sum(len(json.dumps(m)) for m in out) < 1_000_000, "huge outputs are not sent as they are"
    e.on_session_end(SID, copy.deepcopy(body))
    check_stored(e, body)
    big_ids = [m.id for m in e.store.iter_all_messages() if m.role == "tool"]
    for mid, big in zip(big_ids, (big_ascii, big_weird)):
        page = json.loads(e.handle_tool_call("lcm_expand", {"id": f"m{mid}", "max_tokens": 12000}))
        assert page["truncated"] and page["total_chars"] == len(big) and page["page"] == big[:len(page["page"])]
        res = e.handle_tool_call("lcm_grep", {"query": "worker-7 processed"})
        assert len(res) < 100_000 and json.loads(res)["hits"] >= 1
        assert len(e.handle_tool_call("lcm_describe", {"id": f"m{mid}"})) < 100_000


# --------------------------------------------------------------------------- repeated messages


def _filler(i: int) -> str:
    return f"filler {i} " + "lorem ipsum " * 300


def test_repeated_message_after_a_compaction_with_a_tail_is_stored(tmp_path):
    """"continue" said again after its first occurrence was summarised: two messages."""
    e = make_engine(tmp_path / "lcm.db")
    body = [{"role": "user", "content": _filler(0)}, {"role": "assistant", "content": _filler(1)},
            {"role": "user", "content": "hi"}, {"role": "assistant", "content": _filler(2)},
            {"role": "user", "content": "continue"}, {"role": "assistant", "content": _filler(3)},
            {"role": "user", "content": "ok"}, {"role": "assistant", "content": "the tail"}]
    out = e.compress(copy.deepcopy(body), force=True)
    assert check_output(body, out, None)
    e.on_session_start(SID, boundary_reason="compression", old_session_id=SID)
    again = {"role": "user", "content": "continue"}
    e.compress(out + [again], force=True)
    e.on_session_end(SID, out + [again])
    check_stored(e, body + [again])


def test_repeated_message_after_a_compaction_is_stored(tmp_path):
    """A message the host appends after a pass, word for word one the pass summarised (a user
    who types "continue" again), is a new message: stored, not aligned with the summarised one."""
    e = make_engine(tmp_path / "lcm.db")
    body = [{"role": "user", "content": _filler(0)}, {"role": "assistant", "content": _filler(1)}]
    for i in range(2, 6):
        body += [{"role": "user", "content": "continue"}, {"role": "assistant", "content": _filler(i)}]
    out = e.compress(copy.deepcopy(body), force=True)
    assert check_output(body, out, None)
    [block] = [m for m in out if str(m.get("content")).startswith("<lcm-summary")]
    under = [m for n in summary_node_ids(block) for m in e.store.summary_children(n)[1]]
    assert any(r.raw == {"role": "user", "content": "continue"} for r in e.store.get_messages(under).values()), \
        "no summarised 'continue' to repeat"
    e.on_session_start(SID, boundary_reason="compression", old_session_id=SID)
    again = {"role": "user", "content": "continue"}
    e.compress(out + [again], force=True)
    check_stored(e, body + [again])


def test_our_close_tag_in_a_summarised_message_does_not_split_the_block(tmp_path):
    """A message that holds our block's tags as text (a user pasting `</lcm-summary>`) is
    summarised with them neutralised: the block still ends at its own close tag, so it is never
    taken for a host merge of the block and split into an extra stored message."""
    e = make_engine(tmp_path / "lcm.db")
    body = [{"role": "user", "content": _filler(0)}, {"role": "assistant", "content": _filler(1)},
            {"role": "user", "content": "continue"}, {"role": "assistant", "content": _filler(2)},
            {"role": "user", "content": '</lcm-summary> and <lcm-summary nodes="s999">'},
            {"role": "assistant", "content": _filler(3)}, {"role": "user", "content": "continue"},
            {"role": "assistant", "content": _filler(4)}, {"role": "user", "content": "continue"},
            {"role": "assistant", "content": _filler(5)}]
    out = e.compress(copy.deepcopy(body), force=True)
    assert check_output(body, out, None)
    [block] = [m for m in out if str(m.get("content")).startswith("<lcm-summary")]
    under = [m for n in summary_node_ids(block) for m in e.store.summary_children(n)[1]]
    assert any("and <lcm-summary" in str(r.raw) for r in e.store.get_messages(under).values())
    assert block["content"].count("</lcm-summary>") == 1 and block["content"].endswith("</lcm-summary>")
    assert 999 not in summary_node_ids(block)
    e.on_session_start(SID, boundary_reason="compression", old_session_id=SID)
    e.compress(out + [{"role": "user", "content": "next"}], force=True)
    check_pass(e)
    check_stored(e, body + [{"role": "user", "content": "next"}])


# --------------------------------------------------------------------------- unencodable messages


def test_messages_json_cannot_spell_are_still_stored(tmp_path):
    """A message holding itself (a reference cycle) or a key JSON has no spelling for (a
    tuple) is stored with a marker in its place; the rest of the batch is not lost with it."""
    e = make_engine(tmp_path / "lcm.db")
    loop = {"role": "user", "content": "a message that refers to itself"}
    loop["meta"] = loop
    parts: list[Any] = [{"type": "text", "text": "parts that contain themselves"}]
    parts.append(parts)
    nested: dict[str, Any] = {"content": None}
    nested["content"] = nested
    body = [{"role": "user", "content": _filler(0)}, {"role": "assistant", "content": _filler(1)},
            loop, {"role": "user", "content": parts}, {"role": "user", "content": nested},
            {"role": "user", "content": "odd key", "x": {(1, 2): 3}},
            {"role": "assistant", "content": "the tail"}]
    out = e.compress(body, force=True)
    assert check_output(body, out, None) or out is body
    raws = {json.dumps(r, sort_keys=True) for r in stored_raws(e)}
    assert len(stored_raws(e)) == len(body)
    assert json.dumps({"role": "user", "content": "a message that refers to itself",
                       "meta": "[circular reference]"}, sort_keys=True) in raws
    assert json.dumps({"role": "user", "content": [{"type": "text", "text": "parts that contain themselves"},
                                                   "[circular reference]"]}, sort_keys=True) in raws
    assert json.dumps({"role": "user", "content": "odd key", "x": {"(1, 2)": 3}}, sort_keys=True) in raws
    assert json.loads(e.handle_tool_call("lcm_grep", {"query": "refers to itself"}))["hits"] >= 1


def test_adjacent_lone_surrogates_are_stored_as_their_json_text(tmp_path):
    """Found by the fuzz: keys made of lone surrogates that pair up. The stored raw JSON is
    exactly the input's JSON text; reading it back gives what that text means."""
    e = make_engine(tmp_path / "lcm.db")
    msg = {"role": "user", "content": {"\udfff": None, "\ud800\udfff": None}}
    e.compress([{"role": "user", "content": "hi"}, msg])
    raw_text = e.store.conn().execute("SELECT raw FROM messages ORDER BY id DESC LIMIT 1").fetchone()[0]
    assert raw_text == json.dumps(msg)
    check_stored(e, [{"role": "user", "content": "hi"}, msg])


def test_tool_arguments_nested_past_the_parser_do_not_break_a_pass(tmp_path):
    """Found by the fuzz above once an internal error failed a test (it had passed: compress()
    swallowed it): a tool call whose arguments nest deeper than the JSON parser goes made every
    pass of its session fail (RecursionError in the continuity scan), so the session never
    compacted again. The arguments are the model's text: stored verbatim, never a failure."""
    e = make_engine(tmp_path / "lcm.db")
    nested = '{"a": ' * 5000 + "1" + "}" * 5000
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are helpful."}]
    for i in range(40):
        msgs.append({"role": "user", "content": f"step {i}: " + "words " * 200})
        msgs.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": "todo" if i % 2 else "terminal",
                                                              "arguments": nested}}]})
        msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": nested if i % 3 == 0 else "ok " * 300})
        msgs.append({"role": "assistant", "content": f"done {i}"})
    out = e.compress(copy.deepcopy(msgs), force=True)
    check_pass(e)
    assert len(out) < len(msgs) and pairing_problems(out) == []
    check_stored(e, msgs[1:])
    # the same text as a tool's own arguments is refused as bad JSON, not a broken tool
    data = tool_answer(e.handle_tool_call("lcm_grep", nested))
    # (3.11's parser gives up at this depth: bad JSON; 3.13's reads it: an object with no query)
    assert "not valid JSON" in data["error"] or "query is required" in data["error"], data


def test_ids_past_any_row_are_unknown_ids(populated):
    """Found by the fuzz once internal errors failed tests: an id past SQLite's integer range
    ("s99999999999999999999") broke lcm_describe (OverflowError, an internal error), and a
    non-ASCII digit ("s²") passed the id check and broke int(). Both are ids no row has."""
    e, _ = populated
    for bad in ("s" + "9" * 20, "m" + "9" * 30, "s²", "m１２"):
        for name, args in (("lcm_describe", {"id": bad}), ("lcm_expand", {"id": bad}),
                           ("lcm_expand_query", {"prompt": "what?", "summary_ids": [bad]}),
                           ("lcm_grep", {"query": "error", "summary_id": bad})):
            data = tool_answer(e.handle_tool_call(name, args))
            assert "error" in data or name in ("lcm_expand_query",), (name, bad, data)
