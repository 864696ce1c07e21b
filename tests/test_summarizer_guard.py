"""The summariser's process-wide guard (breaker, call budget) is shared per model, not per kind.

A gateway runs many sessions in one process, each on the model its user chose (`/model`). When
the host's model of one session fails until its breaker opens, the sessions of the same model
skip it for the cool-down (each would wait out the same failures) — but a session on another
model still summarises with its own. Before, every engine summarising through the host shared
one guard (`host@host`): one model's outage silenced them all (found as an order-dependent test
failure: a test whose host had no model left the breaker open for the next test's host).
"""

from __future__ import annotations

import pytest

from lossless_context import LCMEngine
from lossless_context.config import LCMConfig
from lossless_context.demo.host_driver import R19Host
from tests.support.fake_openai import FakeOpenAI, SummariserResponder
from tests.support.newhost import host_aux_client


def _engine(path) -> LCMEngine:
    cfg = LCMConfig.load({"store": str(path), "summarizer": "host", "background_compaction": "off",
                          "tool_stubs": False, "breaker_failures": 1, "breaker_cooldown_seconds": 600},
                         read_file=False)
    return LCMEngine(config=cfg)


def _chat(host: R19Host, n: int = 30) -> None:
    for i in range(n):
        host.add({"role": "user", "content": f"Question {i}: " + "context words " * 400},
                 {"role": "assistant", "content": f"Answer {i}: " + "reply words " * 400})


def _pass_calls(tmp_path, name: str, model: str) -> int:
    """Requests the host's model got during one forced pass of a new session on `model`."""
    with FakeOpenAI(responder=SummariserResponder(max_chars=400)) as srv:
        e = _engine(tmp_path / f"{name}.db")
        host = R19Host(e, name)
        host.start(context_length=64_000, model=model)
        _chat(host)
        with host_aux_client(srv.base_url):
            assert host.maybe_compress(force=True)
        return len(srv.chat_requests)


@pytest.mark.lcm_errors()  # (the failing model's calls are logged as they fail)
def test_one_models_open_breaker_leaves_another_models_summaries_alone(tmp_path, monkeypatch):
    import agent.auxiliary_client as aux

    failing = _engine(tmp_path / "down.db")
    host = R19Host(failing, "down")
    host.start(context_length=64_000, model="guard-model-down")
    _chat(host)

    def down(**kw):
        raise ConnectionError("the provider is down")

    monkeypatch.setattr(aux, "call_llm", down)
    assert host.maybe_compress(force=True)  # (committed on the extractive level)
    monkeypatch.undo()
    assert failing.get_status()["lcm_last_pass"]["failures"] >= 1

    # another model in the same process: its own guard, closed
    assert _pass_calls(tmp_path, "other", "guard-model-up") >= 1
    # the same model in another session: the open breaker is shared, no call is made
    assert _pass_calls(tmp_path, "same", "guard-model-down") == 0
