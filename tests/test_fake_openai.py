"""Tests of the fake OpenAI-compatible server used by the end-to-end tests."""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.fake_openai import (  # noqa: E402
    REFUSAL_TEXT,
    ChatResponder,
    Fail,
    FailureSequence,
    FakeOpenAI,
    Reply,
    Router,
    ScriptedResponder,
    SummariserResponder,
    ToolCall,
    estimate_tokens,
    looks_like_summary_request,
    summary_source_text,
)

openai = pytest.importorskip("openai")


def client(srv, **kw):
    kw.setdefault("max_retries", 0)
    kw.setdefault("timeout", 10)
    return openai.OpenAI(base_url=srv.base_url, api_key="sk-test", **kw)


def post(url, body, timeout=10):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "Authorization": "Bearer k"})
    return urllib.request.urlopen(req, timeout=timeout)


MSGS = [{"role": "system", "content": "You are a test."}, {"role": "user", "content": "hello 42"}]


# -- basics -------------------------------------------------------------------


def test_non_streaming_reply_usage_and_recording():
    with FakeOpenAI(responder=ChatResponder(reply_chars=800)) as srv:
        assert srv.base_url.startswith("http://127.0.0.1:") and srv.base_url.endswith("/v1")
        r = client(srv).chat.completions.create(model="fake-model", messages=MSGS)
        text = r.choices[0].message.content
        assert 700 <= len(text) <= 800
        assert r.choices[0].finish_reason == "stop"
        chars = sum(len(m["content"]) + 4 for m in MSGS)
        assert r.usage.prompt_tokens == estimate_tokens(chars)
        assert r.usage.completion_tokens == estimate_tokens(text)
        assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
        [rec] = srv.requests
        assert rec.method == "POST" and rec.path == "/v1/chat/completions" and rec.is_chat
        assert rec.headers.get("Authorization") == "Bearer sk-test"
        assert rec.body["messages"] == MSGS and rec.messages == MSGS
        assert not rec.stream


def test_chat_replies_are_deterministic():
    a = ChatResponder(reply_chars=500)({"messages": MSGS})
    b = ChatResponder(reply_chars=500)({"messages": MSGS})
    assert a.content == b.content and a.usage == b.usage
    c = ChatResponder(reply_chars=500, prompt_token_scale=3.0)({"messages": MSGS})
    assert c.usage["prompt_tokens"] == 3 * a.usage["prompt_tokens"]


def test_streaming_with_usage_chunk_matches_non_streaming():
    with FakeOpenAI(responder=ChatResponder(reply_chars=600)) as srv:
        c = client(srv)
        full = c.chat.completions.create(model="m", messages=MSGS).choices[0].message.content
        srv.set_responder(ChatResponder(reply_chars=600))  # same call number -> same text
        stream = c.chat.completions.create(model="m", messages=MSGS, stream=True,
                                           stream_options={"include_usage": True})
        parts, usage, finish = [], None, None
        for ch in stream:
            if ch.choices:
                parts.append(ch.choices[0].delta.content or "")
                finish = ch.choices[0].finish_reason or finish
            if ch.usage:
                usage = ch.usage
        assert "".join(parts) == full
        assert finish == "stop"
        assert usage is not None and usage.completion_tokens == estimate_tokens(full)
        assert srv.requests[-1].stream


def test_streaming_raw_sse_format_and_no_usage_without_include_usage():
    with FakeOpenAI(responder=ChatResponder(reply_chars=200)) as srv:
        resp = post(srv.base_url + "/chat/completions", {"model": "m", "messages": MSGS, "stream": True})
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        lines = [ln for ln in resp.read().decode().split("\n") if ln]
        assert all(ln.startswith("data: ") for ln in lines)
        assert lines[-1] == "data: [DONE]"
        chunks = [json.loads(ln[6:]) for ln in lines[:-1]]
        assert all(ch["object"] == "chat.completion.chunk" for ch in chunks)
        assert not any("usage" in ch for ch in chunks)
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"


def test_paths_without_v1_and_models_endpoint():
    with FakeOpenAI(context_length=128000, models=["a", "b"]) as srv:
        r = post(srv.root_url + "/chat/completions", {"model": "a", "messages": MSGS})
        assert json.loads(r.read())["object"] == "chat.completion"
        for path in ("/v1/models", "/models"):
            data = json.loads(urllib.request.urlopen(srv.root_url + path, timeout=5).read())
            assert [m["id"] for m in data["data"]] == ["a", "b"]
            assert all(m["context_length"] == 128000 for m in data["data"])
        one = json.loads(urllib.request.urlopen(srv.base_url + "/models/b", timeout=5).read())
        assert one["id"] == "b" and one["max_model_len"] == 128000
        assert [m.id for m in client(srv).models.list().data] == ["a", "b"]
        with pytest.raises(urllib.error.HTTPError) as ei:
            urllib.request.urlopen(srv.root_url + "/api/tags", timeout=5)
        assert ei.value.code == 404
        paths = [(r.method, r.path) for r in srv.requests]
        assert ("POST", "/chat/completions") in paths and ("GET", "/api/tags") in paths
        assert len(srv.chat_requests) == 1


def test_context_manager_stops_server():
    with FakeOpenAI() as srv:
        port = srv.port
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_concurrent_requests_are_all_recorded():
    with FakeOpenAI(responder=ChatResponder(reply_chars=100)) as srv:
        errors = []

        def go(i):
            try:
                client(srv).chat.completions.create(
                    model="m", messages=[{"role": "user", "content": f"q{i}"}], stream=bool(i % 2))
            except Exception as exc:  # pragma: no cover
                errors.append(exc)

        ts = [threading.Thread(target=go, args=(i,)) for i in range(12)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert not errors
        reqs = srv.requests
        assert len(reqs) == 12
        assert sorted(r.index for r in reqs) == list(range(12))
        assert {r.messages[0]["content"] for r in reqs} == {f"q{i}" for i in range(12)}


def test_broken_responder_gives_500_and_is_reported():
    def bad(req):
        raise ValueError("oops")

    with FakeOpenAI(responder=bad) as srv:
        with pytest.raises(openai.InternalServerError):
            client(srv).chat.completions.create(model="m", messages=MSGS)
        assert srv.errors and "oops" in srv.errors[0]


# -- tool calls ----------------------------------------------------------------

TOOLS = [{"type": "function", "function": {"name": "lcm_grep", "description": "search",
                                           "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}]


@pytest.mark.parametrize("stream", [False, True])
def test_scripted_tool_call_then_answer(stream):
    script = ScriptedResponder({2: ToolCall("lcm_grep", {"q": "needle"}),
                                "multi": [[ToolCall("a", {}), ToolCall("b", {"x": 1})], ToolCall("c", "{}")]})
    with FakeOpenAI(responder=script) as srv:
        c = client(srv)

        def ask(msgs):
            if not stream:
                return c.chat.completions.create(model="m", messages=msgs, tools=TOOLS).choices[0].message
            s = c.chat.completions.create(model="m", messages=msgs, tools=TOOLS, stream=True,
                                          stream_options={"include_usage": True})
            content, calls = "", {}
            for ch in s:
                if not ch.choices:
                    continue
                d = ch.choices[0].delta
                content += d.content or ""
                for tc in d.tool_calls or []:
                    slot = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                    slot["id"] = tc.id or slot["id"]
                    if tc.function and tc.function.name:
                        slot["name"] = tc.function.name
                    if tc.function and tc.function.arguments:
                        slot["arguments"] += tc.function.arguments
            return {"content": content, "tool_calls": [calls[i] for i in sorted(calls)]}

        def calls_of(m):
            if isinstance(m, dict):
                return [(t["name"], json.loads(t["arguments"]), t["id"]) for t in m["tool_calls"]]
            return [(t.function.name, json.loads(t.function.arguments), t.id) for t in (m.tool_calls or [])]

        msgs = [{"role": "user", "content": "turn one"}]
        m1 = ask(msgs)
        assert calls_of(m1) == []
        msgs += [{"role": "assistant", "content": "x"}, {"role": "user", "content": "turn two"}]
        m2 = ask(msgs)
        [(name, args, cid)] = calls_of(m2)
        assert (name, args) == ("lcm_grep", {"q": "needle"}) and cid
        msgs += [{"role": "assistant", "content": None,
                  "tool_calls": [{"id": cid, "type": "function", "function": {"name": name, "arguments": "{}"}}]},
                 {"role": "tool", "tool_call_id": cid, "content": "found it"}]
        m3 = ask(msgs)
        assert calls_of(m3) == []
        assert script.tool_results[-1]["content"] == "found it"
        # a str key matches a substring of the user message; rounds run in order
        msgs += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "please multi"}]
        r1 = calls_of(ask(msgs))
        assert [n for n, _, _ in r1] == ["a", "b"]
        msgs += [{"role": "tool", "tool_call_id": r1[0][2], "content": "1"},
                 {"role": "tool", "tool_call_id": r1[1][2], "content": "2"}]
        r2 = calls_of(ask(msgs))
        assert [n for n, _, _ in r2] == ["c"]
        msgs += [{"role": "tool", "tool_call_id": r2[0][2], "content": "3"}]
        assert calls_of(ask(msgs)) == []
        if not stream:
            rec = srv.chat_requests[1]
            assert rec.tool_names == ["lcm_grep"]


def test_tool_call_reply_finish_reason():
    with FakeOpenAI(responder=lambda req: Reply(content="", tool_calls=[ToolCall("t", {"a": 1})])) as srv:
        ch = client(srv).chat.completions.create(model="m", messages=MSGS).choices[0]
        assert ch.finish_reason == "tool_calls"
        assert json.loads(ch.message.tool_calls[0].function.arguments) == {"a": 1}


# -- summariser ------------------------------------------------------------------


def _summary_req(body):
    return {"messages": [{"role": "system", "content": "Summarise the conversation below. Keep it short 123."},
                         {"role": "user", "content": body}]}


def test_summariser_keeps_identifier_lines_and_is_bounded():
    body = "\n".join([
        "just chatting here",
        "edited src/app/main.py to fix it",
        "the value was 4242",
        "call parse_config_file before boot",
        "nothing special",
    ] + [f"line {i} with number {i * 7}" for i in range(200)])
    s = SummariserResponder(max_chars=400)
    r = s(_summary_req(body))
    assert r.content == s(_summary_req(body)).content  # deterministic
    assert len(r.content) <= 400
    assert "src/app/main.py" in r.content and "4242" in r.content and "parse_config_file" in r.content
    assert "just chatting" not in r.content and "nothing special" not in r.content
    assert "123" not in r.content  # the system instructions are not summarised
    assert r.usage["completion_tokens"] == estimate_tokens(r.content)
    assert s.calls == 2


def test_summary_source_markers():
    prompt = ("You are a summarization agent. Target ~3200 tokens.\n\nTURNS TO SUMMARIZE:\n"
              "[USER]: fix bug 17 in a/b.py\n[ASSISTANT]: done\n\nUse this exact structure:\n## Goal 2026")
    req = {"messages": [{"role": "user", "content": prompt}]}
    src = summary_source_text(req)
    assert "bug 17" in src and "3200" not in src and "2026" not in src
    out = SummariserResponder()(req).content
    assert "bug 17" in out and "3200" not in out
    tagged = {"messages": [{"role": "user", "content": "Summarize 99:\n<conversation>\nuser: id_7\n</conversation>\nbe brief 5"}]}
    assert summary_source_text(tagged).strip() == "user: id_7"


def test_router_and_summary_detection():
    hermes_main = {"messages": [{"role": "system", "content": "You are Hermes Agent, an intelligent AI assistant"},
                                {"role": "user", "content": "please summarize my day"}]}
    assert not looks_like_summary_request(hermes_main)
    assert not looks_like_summary_request({"messages": [{"role": "user", "content": "summarize"}], "tools": TOOLS})
    builtin = {"messages": [{"role": "user", "content": "You are a summarization agent creating a context checkpoint."}]}
    assert looks_like_summary_request(builtin)
    assert looks_like_summary_request(_summary_req("x"))
    router = Router(chat=ChatResponder(reply_chars=50), summariser=SummariserResponder())
    assert router(hermes_main).content.startswith("Answer #1")
    assert router(builtin).content.startswith("Summary of earlier conversation:")
    assert (router.chat_calls, router.summary_calls) == (1, 1)


# -- failure injection -------------------------------------------------------------


def test_failure_sequence_http_errors_then_base():
    seq = FailureSequence([Fail.http(429, retry_after=0), Fail.http(500), Fail.http(400), None],
                          base=SummariserResponder())
    with FakeOpenAI(responder=seq) as srv:
        c = client(srv)
        req = _summary_req("fix 12 in x/y.py")["messages"]
        with pytest.raises(openai.RateLimitError):
            c.chat.completions.create(model="m", messages=req)
        with pytest.raises(openai.InternalServerError):
            c.chat.completions.create(model="m", messages=req)
        with pytest.raises(openai.BadRequestError):
            c.chat.completions.create(model="m", messages=req)
        for _ in range(2):  # the explicit None step, then steps exhausted -> base
            out = c.chat.completions.create(model="m", messages=req).choices[0].message.content
            assert "x/y.py" in out
        assert seq.calls == 5
        assert seq.log == ["reply:429", "reply:500", "reply:400", "base", "base"]
        assert len(srv.chat_requests) == 5


def test_http_error_body_and_retry_after_header():
    with FakeOpenAI(responder=lambda r: Fail.rate_limit(retry_after=7)) as srv:
        with pytest.raises(urllib.error.HTTPError) as ei:
            post(srv.base_url + "/chat/completions", {"model": "m", "messages": MSGS})
        assert ei.value.code == 429 and ei.value.headers["Retry-After"] == "7"
        err = json.loads(ei.value.read())["error"]
        assert err["type"] == "rate_limit_error" and err["message"]


def test_openai_client_retries_consume_steps():
    seq = FailureSequence([Fail.http(500), Fail.http(500)], base=ChatResponder(reply_chars=50))
    with FakeOpenAI(responder=seq) as srv:
        out = client(srv, max_retries=2).chat.completions.create(model="m", messages=MSGS)
        assert out.choices[0].message.content.startswith("Answer")
        assert len(srv.chat_requests) == 3


def test_delay_and_client_timeout():
    seq = FailureSequence([Fail.slow(0.6), Fail.slow(1.5)], base=ChatResponder(reply_chars=50))
    with FakeOpenAI(responder=seq) as srv:
        t0 = time.monotonic()
        out = client(srv).chat.completions.create(model="m", messages=MSGS)
        # A lower bound only (the server slept 0.6 s before answering): no machine is too fast.
        assert time.monotonic() - t0 >= 0.55 and out.choices[0].message.content
        with pytest.raises(openai.APITimeoutError):
            client(srv, timeout=0.3).chat.completions.create(model="m", messages=MSGS)


@pytest.mark.parametrize("stream", [False, True])
def test_degenerate_replies(stream):
    seq = FailureSequence([Fail.empty(), Fail.refusal(), Fail.reasoning_only("thinking about 42"),
                           Fail.longer_than_input(3.0)])
    with FakeOpenAI(responder=seq) as srv:
        c = client(srv)

        def get(msgs):
            if not stream:
                m = c.chat.completions.create(model="m", messages=msgs).choices[0].message
                return m.content, (m.model_extra or {}).get("reasoning_content")
            text, reasoning = "", ""
            for ch in c.chat.completions.create(model="m", messages=msgs, stream=True):
                if ch.choices:
                    d = ch.choices[0].delta
                    text += d.content or ""
                    reasoning += (d.model_extra or {}).get("reasoning_content") or ""
            return text, reasoning

        content, _ = get(MSGS)
        assert not content
        content, _ = get(MSGS)
        assert content == REFUSAL_TEXT
        content, reasoning = get(MSGS)
        assert not content and reasoning == "thinking about 42"
        body = "summarise this: " + "abc 1 " * 50
        content, _ = get([{"role": "user", "content": body}])
        assert len(content) > 2 * len(body)


def test_dropped_connection_non_streaming():
    with FakeOpenAI(responder=FailureSequence([Fail.drop(after_bytes=30)], base=ChatResponder(50))) as srv:
        c = client(srv)
        with pytest.raises(openai.APIConnectionError):
            c.chat.completions.create(model="m", messages=MSGS)
        assert c.chat.completions.create(model="m", messages=MSGS).choices[0].message.content


def test_dropped_connection_streaming_has_no_done():
    with FakeOpenAI(responder=lambda r: Fail.drop(after_bytes=300)) as srv:
        resp = post(srv.base_url + "/chat/completions", {"model": "m", "messages": MSGS, "stream": True})
        try:
            raw = resp.read()
        except Exception:  # http.client.IncompleteRead and friends are fine too
            raw = b""
        assert b"[DONE]" not in raw
        assert len(raw) <= 300


def test_cycle_and_callable_steps():
    calls = []

    def step(req):
        calls.append(req)
        return Reply(content="from callable")

    seq = FailureSequence([step, Fail.http(503)], cycle=True)
    with FakeOpenAI(responder=seq) as srv:
        c = client(srv)
        assert c.chat.completions.create(model="m", messages=MSGS).choices[0].message.content == "from callable"
        with pytest.raises(openai.InternalServerError):
            c.chat.completions.create(model="m", messages=MSGS)
        assert c.chat.completions.create(model="m", messages=MSGS).choices[0].message.content == "from callable"
        assert len(calls) == 2
