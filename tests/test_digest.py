"""Issue #19: what a summariser is sent of each message (lossless_context/pipeline/digest.py).

Unit tests of the digest, and an engine test through the fake OpenAI-compatible server: a leaf's
request carries the cut arguments and stubs, while `lcm_expand` still returns every original
byte for byte.
"""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from lossless_context import LCMEngine
from lossless_context.config import LCMConfig
from lossless_context.pipeline.digest import STRING_CHARS, digest, shorten_json, stub_digest
from lossless_context.pipeline.stubs import StubPolicy, make_stub
from tests.support.fake_openai import FakeOpenAI, SummariserResponder
from lossless_context.demo.host_driver import R19Host

ERROR = "E       KeyError: 'created_at'"


def _log(lines: int = 200) -> str:
    out = [f"step {n:04d} compiled pkg/mod_{n}.py in {n % 97} ms" for n in range(lines)]
    out.insert(lines // 2, ERROR)
    return "\n".join(out)


def test_stub_digest_keeps_header_errors_and_facts_and_drops_head_and_tail():
    stub = make_stub(_log(), ("terminal", '{"command": "make all"}'), StubPolicy())
    assert "head:" in stub and "tail:" in stub  # the stub the model sees has them
    d = stub_digest(stub)
    header = stub.split("\n")[0]
    assert header.startswith("[tool-output stub] tool: terminal({") and header.endswith("tokens · ERROR")
    # header: the tool, its size and ERROR; its arguments are in the call just before
    assert d.split("\n")[0] == header.split("(", 1)[0] + "(…) · " + header.split(") · ", 1)[1]
    assert ERROR in d
    assert "paths: " in d  # the facts lines stay
    assert "head:" not in d and "tail:" not in d and "step 0000" not in d
    assert len(d) < len(stub)
    assert stub_digest(stub) == d  # deterministic


def test_a_stub_without_head_or_tail_goes_in_whole():
    stub = "[tool-output stub] tool: (unknown call) · text, 900 chars, 3 lines, ~225 tokens\nerror lines (1):\n  L3 boom"
    assert stub_digest(stub) == stub


def test_long_json_strings_are_cut_in_the_middle_with_the_id_to_expand():
    body = "A" * 300 + "MIDDLE" * 200 + "Z" * 100
    args = json.dumps({"path": "src/app.py", "content": body, "n": 3})
    short = shorten_json(args, "m42")
    assert short is not None and len(short) < len(args)
    data = json.loads(short)
    assert data["path"] == "src/app.py" and data["n"] == 3
    assert data["content"].startswith("A" * 160) and data["content"].endswith("Z" * 60)
    assert "expand m42" in data["content"] and "MIDDLE" not in data["content"]


def test_short_or_non_json_text_is_left_alone():
    assert shorten_json('{"a": "short"}', "m1") is None
    assert shorten_json("plain output " * 100, "m1") is None
    assert shorten_json('{"broken": "' + "x" * 900, "m1") is None
    assert digest("user", {"role": "user", "content": "hi " * 500}, "hi " * 500, "m1") == "hi " * 500


def test_assistant_calls_keep_their_text_and_cut_long_arguments():
    new = "def f():\n    return 1\n" * 200
    raw = {"role": "assistant", "content": "Patching the guard.", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "patch", "arguments": json.dumps(
            {"path": "src/a.py", "old_string": "x = 1", "new_string": new})}},
        {"id": "c2", "type": "function", "function": {"name": "terminal", "arguments": "not json " * 400}}]}
    text = "Patching the guard.\n→ patch(...)\n→ terminal(...)" + new + "not json " * 400
    d = digest("assistant", raw, text, "m7")
    assert d.startswith("Patching the guard.\n→ patch(")
    assert '"path": "src/a.py"' in d and '"old_string": "x = 1"' in d
    assert "expand m7" in d and len(d) < 3000
    assert "→ terminal(not json" in d


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=900),
                    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
                    max_leaves=12))
def test_a_digest_is_never_longer_than_the_text_and_stays_json(value):
    text = json.dumps(value)
    short = shorten_json(text, "m1")
    if short is not None:
        assert len(short) < len(text)
        json.loads(short)
    d = digest("tool", {"role": "tool", "content": text}, text, "m1")
    assert len(d) <= len(text)


def test_a_leaf_request_is_sent_the_digest_and_expand_returns_the_originals(tmp_path):
    content = "\n".join(f"line {n}: value_{n} = compute({n})" for n in range(400))
    responder = SummariserResponder(max_chars=600)
    with FakeOpenAI(responder=responder) as srv:
        e = LCMEngine(config=LCMConfig.load({"store": str(tmp_path / "l.db"), "summarizer": "openai",
                                             "summary_base_url": srv.base_url}, read_file=False))
        host = R19Host(e, "dg")
        host.start(context_length=32_000)
        host.add({"role": "user", "content": "Objective: write the generated modules."})
        for i in range(24):
            cid = f"call_{i}"
            host.add({"role": "user", "content": f"Write module {i}."},
                     {"role": "assistant", "content": f"Writing gen/mod_{i}.py.", "tool_calls": [
                         {"id": cid, "type": "function", "function": {"name": "write_file", "arguments": json.dumps(
                             {"path": f"gen/mod_{i}.py", "content": f"# module {i}\n{content}"})}}]},
                     {"role": "tool", "tool_call_id": cid, "content": json.dumps({"bytes_written": 12000 + i})},
                     {"role": "assistant", "content": f"Module {i} written."})
        assert host.maybe_compress(force=True)
        sent = "\n".join(r.messages[-1]["content"] for r in srv.requests)
        assert srv.requests and "gen/mod_1.py" in sent
        assert "line 200: value_200" not in sent  # the middle of each file is not sent
        assert "line 399: value_399" in sent  # its end is
        assert "chars; expand m" in sent
        # and nothing is lost: lcm_expand returns every original call whole
        calls = [m for m in e.store.iter_all_messages() if m.role == "assistant" and m.raw.get("tool_calls")]
        assert len(calls) == 24
        for m in calls[:3]:
            got = json.loads(e.handle_tool_call("lcm_expand", {"id": f"m{m.id}"}))
            sent_args = got["message"]["tool_calls"][0]["function"]["arguments"]
            assert sent_args == m.raw["tool_calls"][0]["function"]["arguments"]
            assert "line 200: value_200 = compute(200)" in json.loads(sent_args)["content"]


def test_the_cut_threshold_is_exact():
    assert shorten_json(json.dumps({"c": "x" * STRING_CHARS}), "m1") is None
    assert "expand m1" in shorten_json(json.dumps({"c": "x" * (STRING_CHARS * 2)}), "m1")
