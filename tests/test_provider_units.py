"""Issue #39 item 2: the provider's count is authoritative when it is larger.

Our estimate is ~chars/4; a provider whose tokenizer is denser (one token per CJK character,
code's operators and brackets) reports more. The engine learns the session's ratio from the
figures the host hands it (`update_from_response`, `should_compress`, `compress(current_tokens=)`)
and plans its passes in the provider's units, so no request exceeds the window because of us.

Here the host is played by a loop that does what the hosts do (0.19.0: a rough chars/4
preflight figure, then the provider's count after each tool batch; 0.22: the provider's last
count plus a rough estimate of what came since), against a provider that counts with
``dense_tokens``. The real 0.19.0 agent loop, beside Hermes' own compressor:
``test_dense_tokenizer_through_the_real_agent_loop``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from lossless_context import LCMEngine
from lossless_context.config import LCMConfig
from lossless_context.pipeline.validate import pairing_problems
from lossless_context.tokens import estimate_messages_tokens, estimate_text_tokens
from tests.support.fake_openai import dense_tokens

WINDOW = 64_000
SYSTEM = ("You are a helpful coding agent. Follow the user's instructions carefully, use the tools, "
          "and keep answers short. ") * 60
TOOLS = json.dumps([{"type": "function", "function": {"name": f"tool_{i}", "description": "does things " * 20,
                                                       "parameters": {"type": "object", "properties": {}}}}
                    for i in range(20)])

JA = "東京の設定ファイルを確認しました。データベースの移行は明日の午前中に実行します。"
CODE = ("def handler(request: dict) -> dict:\n    if not request.get('id'):\n        raise ValueError"
        "(f\"bad {request!r}\")\n    return {'ok': True, 'n': len(request['items'][0:3])}\n")
EN = "The migration of the billing tables finished; the index on invoices was rebuilt overnight. "


def _texts(kind: str, i: int) -> tuple[str, str, str]:
    """(user, tool result, reply) of turn i."""
    if kind == "cjk":
        return f"質問{i}: " + JA * 12, f"結果{i}: " + JA * 70, f"回答{i}: " + JA * 30
    if kind == "code":
        return f"question {i}: fix the handler " + EN, f"# file {i}\n" + CODE * 30, f"answer {i}\n" + CODE * 12
    return (f"質問{i}: " + JA * 6 + EN * 3, f"# 結果 {i}\n" + CODE * 12 + JA * 30,
            f"answer {i}: " + EN * 8 + JA * 10)


def _provider(msgs: list[dict]) -> int:
    """What the dense provider reports for a request of these messages (+ system, tools)."""
    total = dense_tokens(SYSTEM) + dense_tokens(TOOLS)
    for m in msgs:
        text = m.get("content") or ""
        for tc in m.get("tool_calls") or []:
            text += tc["function"]["name"] + tc["function"]["arguments"]
        total += dense_tokens(text) + 4
    return total


def _rough(msgs: list[dict]) -> int:
    return estimate_messages_tokens(msgs) + estimate_text_tokens(SYSTEM) + estimate_text_tokens(TOOLS)


def _engine(tmp_path) -> LCMEngine:
    cfg = LCMConfig.load({"store": str(tmp_path / "lcm.db"), "summarizer": "extractive"}, read_file=False)
    e = LCMEngine(config=cfg)
    e.update_model("m", WINDOW)
    e.on_session_start("s1")
    return e


def drive(e: LCMEngine, kind: str, turns: int, host: str = "r19") -> dict[str, Any]:
    """Play the host's loop; the largest request the provider saw, and the passes."""
    msgs: list[dict] = []
    peak, passes, last_real = 0, 0, 0

    def figure() -> int:
        if host == "r19" or not last_real:
            return _rough(msgs)  # 0.19.0's preflight: chars/4 of the whole request
        return last_real + max(0, _rough(msgs) - anchor)  # 0.22: usage-anchored

    def call() -> None:
        nonlocal peak, last_real, anchor
        p = _provider(msgs)
        peak = max(peak, p)
        e.update_from_response({"prompt_tokens": p, "completion_tokens": 50, "total_tokens": p + 50})
        last_real, anchor = p, _rough(msgs)

    def maybe_compress(tokens: int) -> None:
        nonlocal msgs, passes
        if e.should_compress(tokens):
            out = e.compress(msgs, current_tokens=tokens)
            assert pairing_problems(out) == []
            passes += out != msgs
            msgs = out

    anchor = 0
    for i in range(turns):
        user, result, reply = _texts(kind, i)
        msgs.append({"role": "user", "content": user})
        maybe_compress(figure())
        call()
        msgs.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": "terminal", "arguments": "{}"}}]})
        msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": result})
        maybe_compress(e.last_prompt_tokens if host == "r19" else figure())
        call()
        msgs.append({"role": "assistant", "content": reply})
    return {"peak": peak, "passes": passes, "final": _provider(msgs)}


@pytest.mark.parametrize("host", ["r19", "anchored"])
@pytest.mark.parametrize("kind", ["cjk", "code", "mixed"])
def test_no_request_exceeds_the_window_with_a_dense_tokenizer(tmp_path, kind, host):
    e = _engine(tmp_path)
    res = drive(e, kind, turns=40, host=host)
    assert res["passes"] >= 2, res  # the session really did outgrow the window several times
    assert res["peak"] <= WINDOW, res


def test_an_ordinary_provider_leaves_the_ratio_at_one(tmp_path):
    """A provider that counts like our estimate (plus the host's system prompt and tools):
    nothing is learned, the passes plan exactly as before."""
    e = _engine(tmp_path)
    msgs: list[dict] = []
    passes = 0
    for i in range(70):
        msgs += [{"role": "user", "content": f"question {i}: " + EN * 20},
                 {"role": "assistant", "content": f"answer {i}: " + EN * 60}]
        p = _rough(msgs)
        e.update_from_response({"prompt_tokens": p, "completion_tokens": 10, "total_tokens": p + 10})
        if e.should_compress(p):
            out = e.compress(msgs, current_tokens=p)
            passes += out != msgs
            msgs = out
    assert passes >= 2
    assert e.provider_ratio() == 1.0 and e.get_status()["lcm_provider_ratio"] == 1.0


class _JapaneseChat:
    """Long Japanese replies; usage counted by the dense tokenizer (as the provider would)."""

    def __init__(self, reply_chars: int) -> None:
        self.reply_chars = reply_chars
        self.calls = 0

    def __call__(self, req: dict):
        from tests.support.fake_openai import Reply, prompt_tokens_for

        self.calls += 1
        text = f"回答{self.calls}: " + (JA * (self.reply_chars // len(JA) + 1))[: self.reply_chars]
        pt = prompt_tokens_for(req, tokenizer=dense_tokens)
        return Reply(content=text, usage={"prompt_tokens": pt, "completion_tokens": len(text),
                                          "total_tokens": pt + len(text)})


def test_dense_tokenizer_through_the_real_agent_loop(tmp_path):
    """The issue's run through the real 0.19.0 AIAgent: Japanese turns with a tool call each,
    a provider counting ~1 token per CJK character. The largest request stays within the
    window with LCM, and with Hermes' own compressor beside it on the same plan."""
    from tests.support.fake_openai import (FakeOpenAI, Router, ScriptedResponder, ToolCall, looks_like_summary_request,
                                           prompt_tokens_for)
    from tests.support.hermes_host import hermes_available, run_hermes

    if not hermes_available():
        pytest.skip("hermes-agent is not installed")
    turns = [f"質問{i}: " + JA * 20 for i in range(14)]
    peaks: dict[str, int] = {}
    for engine in ("lcm", "compressor"):
        script = {i + 1: ToolCall("lcm_grep", {"query": "東京"}, f"call_ja_{i}") for i in range(len(turns))}
        chat = ScriptedResponder(script, then=_JapaneseChat(reply_chars=3_000), tokenizer=dense_tokens)
        (tmp_path / engine).mkdir()
        with FakeOpenAI(responder=Router(chat=chat)) as srv:
            run = run_hermes(srv, turns, engine=engine, plugin_mode="entrypoint" if engine == "lcm" else "none",
                             workdir=tmp_path / engine, extra_config={"lcm": {"summarizer": "extractive"}},
                             timeout=600)
            assert run.ok, run.describe()
            sizes = [prompt_tokens_for(r.json, tokenizer=dense_tokens) for r in srv.chat_requests
                     if not looks_like_summary_request(r.json)]
            peaks[engine] = max(sizes)
            if engine == "lcm":
                assert any("<lcm-summary" in str(m.get("content")) for m in srv.chat_requests[-1].messages)
                assert any(c["method"] == "compress" for c in run.engine_calls)
    print("peak prompt tokens on a 64,000 window:", peaks)
    assert peaks["lcm"] <= WINDOW, peaks
    assert peaks["compressor"] <= WINDOW, peaks
