"""The model summariser path against an OpenAI-compatible server on 127.0.0.1."""

from __future__ import annotations

import json

import pytest

from lossless_context import LCMEngine
from lossless_context.config import LCMConfig
from lossless_context.summarizers.extractive import Source
from lossless_context.summarizers.summarize import CallGuard, Escalator, OpenAISummarizer, SummaryRequest
from lossless_context.demo.sessions import coding_session
from tests.support.fake_openai import Fail, FailureSequence, FakeOpenAI, SummariserResponder
from lossless_context.demo.host_driver import R19Host

SECRET = "sk-ant-api03-CANARYSECRETxyz0123456789abcdefABCDEF"


def _sources(n: int = 30) -> list[Source]:
    return [Source(f"m{i}", "user" if i % 2 else "assistant",
                   f"Step {i}: edited src/app/module_{i}.py and ran pytest; result code E{i:04d}. " * 4, None)
            for i in range(n)]


# The client timeout where a test counts on the server's answer: the fake server answers at
# once, so this only ends a hung test; a tight one would turn a busy machine into a "failure".
ANSWER_TIMEOUT = 60


def _esc(srv: FakeOpenAI, failures: int = 99) -> Escalator:
    model = OpenAISummarizer(srv.base_url, "summ", api_key="k", timeout=ANSWER_TIMEOUT)
    return Escalator(model, CallGuard(failures, 60, 1000, 3600))


def test_normal_level_uses_the_model():
    with FakeOpenAI(responder=SummariserResponder(max_chars=800)) as srv:
        res = _esc(srv).summarize(SummaryRequest(_sources(), 300))
    assert res.level == "normal" and res.summarizer.startswith("openai") and res.calls == 1
    assert "module_" in res.text
    body = srv.chat_requests[0].body if hasattr(srv.chat_requests[0], "body") else srv.chat_requests[0]["body"]
    prompt = json.dumps(body)
    assert "untrusted" in prompt and "<transcript>" in prompt


@pytest.mark.parametrize("bad", [
    Fail.refusal(), Fail.empty(), Fail.reasoning_only(), Fail.http(500), Fail.http(429), Fail.http(400),
    Fail.longer_than_input(3.0),
], ids=["refusal", "empty", "reasoning", "500", "429", "400", "longer"])
def test_escalates_to_aggressive_then_deterministic(bad):
    seq = FailureSequence([bad], base=SummariserResponder(max_chars=600))
    with FakeOpenAI(responder=seq) as srv:
        res = _esc(srv).summarize(SummaryRequest(_sources(), 300))
    assert res.level == "aggressive" and res.failures == 1 and res.calls == 2
    seq2 = FailureSequence([bad, bad])
    with FakeOpenAI(responder=seq2) as srv:
        res2 = _esc(srv).summarize(SummaryRequest(_sources(), 300))
    assert res2.level == "deterministic" and res2.failures == 2
    assert res2.text and len(res2.text) < sum(len(s.text) for s in _sources())


def test_dropped_connection_and_timeout():
    with FakeOpenAI(responder=FailureSequence([Fail.drop(), Fail.slow(3.0)])) as srv:
        model = OpenAISummarizer(srv.base_url, "summ", timeout=1.0)
        res = Escalator(model, CallGuard(99, 60, 1000, 3600)).summarize(SummaryRequest(_sources(), 300))
    assert res.level == "deterministic" and res.failures == 2


def test_circuit_breaker_and_spend_guard():
    with FakeOpenAI(responder=FailureSequence([Fail.http(500)], cycle=True)) as srv:
        guard = CallGuard(failures=3, cooldown=60, max_calls=1000, window=3600)
        esc = Escalator(OpenAISummarizer(srv.base_url, "m", timeout=ANSWER_TIMEOUT), guard)
        for _ in range(5):
            esc.summarize(SummaryRequest(_sources(), 300))
        assert guard.is_open
        assert len(srv.chat_requests) == 3, "breaker opened after 3 consecutive failures"
    with FakeOpenAI(responder=SummariserResponder(max_chars=500)) as srv:
        guard = CallGuard(failures=3, cooldown=60, max_calls=2, window=3600)
        esc = Escalator(OpenAISummarizer(srv.base_url, "m", timeout=ANSWER_TIMEOUT), guard)
        levels = [esc.summarize(SummaryRequest(_sources(), 300)).level for _ in range(4)]
        assert levels == ["normal", "normal", "deterministic", "deterministic"]
        assert len(srv.chat_requests) == 2


def test_secrets_never_reach_the_summariser_or_summaries(tmp_path, monkeypatch):
    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "h"))
    sess = coding_session(600, seed=11)
    msgs = [dict(m) for m in sess.messages]
    msgs[10] = {"role": "user", "content": f"my key is {SECRET} and password=hunter2hunter2 please keep it"}
    with FakeOpenAI(responder=SummariserResponder(max_chars=1200)) as srv:
        cfg = LCMConfig.load({"store": str(tmp_path / "lcm.db"), "summarizer": "openai",
                              "summary_base_url": srv.base_url, "summary_model": "summ"}, read_file=False)
        e = LCMEngine(config=cfg)
        host = R19Host(e)
        host.start(context_length=64_000)
        for i in range(0, len(msgs), 20):
            host.add(*msgs[i:i + 20])
            host.maybe_compress()
        host.end()
        assert host.compactions >= 1 and srv.chat_requests
        sent = json.dumps([r.body if hasattr(r, "body") else r for r in srv.chat_requests])
    assert SECRET not in sent and "hunter2hunter2" not in sent
    for s in e.store.get_summaries(range(1, 10_000), include_staged=True).values():
        assert SECRET not in s.text
    # the verbatim store keeps the original (that is the point of lossless)
    assert any(SECRET in json.dumps(m.raw) for m in e.store.iter_all_messages())
