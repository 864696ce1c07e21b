"""The host's flush of the list a pass just aligned is not aligned again (ingest_resume.PassEcho).

Hermes 0.19 hands the pre-pass list back in `on_session_end` before it commits a pass; the
engine knows it from what the pass's ingest was given and skips the walk. These tests check
that the skip changes nothing (a session played with and without it stores the same rows and
returns the same lists), that it happens, and that a flush that differs in anything the
alignment reads — a new message, a value changed in place inside a message the pass saw, a
context written since — is aligned as before.
"""

from __future__ import annotations

import copy
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from lossless_context import LCMEngine
from lossless_context.contract import ingestion as engine_module  # (the engine's ingestion)
from lossless_context.config import LCMConfig
from lossless_context.demo.host_driver import R19Host
from lossless_context.demo.sessions import coding_session
from lossless_context.messages import safe_json
from lossless_context.pipeline.ingest_resume import PassEcho
from lossless_context.pipeline.stub_prep import StubPreparer
from lossless_context.pipeline.stubs import stub_policy

SID = "echo"


def _engine(path: Path) -> LCMEngine:
    return LCMEngine(config=LCMConfig.load({"store": str(path), "summarizer": "extractive"}, read_file=False))


def _messages(n: int, seed: int = 3) -> list[dict[str, Any]]:
    msgs = copy.deepcopy(coding_session(n, seed=seed).messages)
    for i, m in enumerate(msgs):
        m["timestamp"] = 1_700_000_000 + 60 * i  # (summaries' times equal in both runs)
    return msgs


def _stored(path: Path) -> dict[str, list]:
    db = sqlite3.connect(path)
    try:
        q = {
            "messages": "SELECT id, session_id, seq, uid, ident, role, raw, text, tokens, supersedes, large, "
                        "exploration FROM messages ORDER BY id",
            "summaries": "SELECT id, session_id, kind, depth, text, tokens, state FROM summaries ORDER BY id",
            "summary_messages": "SELECT * FROM summary_messages ORDER BY 1, 2",
            "context": "SELECT session_id, pos, message_id, summary_id FROM context_items ORDER BY 1, 2",
            # (not the context's version: the walk the skip saves rewrote the very same entries,
            # a new version of an unchanged context)
            "sessions": "SELECT id, compactions FROM sessions ORDER BY id",
        }
        return {k: db.execute(sql).fetchall() for k, sql in q.items()}
    finally:
        db.close()


@pytest.fixture
def aligned(monkeypatch):
    """Count the engine's alignments."""
    calls: list[int] = []
    real = engine_module.align_fast

    def counted(*a: Any, **kw: Any) -> Any:
        calls.append(len(a[3]))
        return real(*a, **kw)

    monkeypatch.setattr(engine_module, "align_fast", counted)
    return calls


def _settle(eng: LCMEngine) -> None:
    assert StubPreparer.for_store(eng.store.location, eng.store, stub_policy(eng.config)).wait_idle(60)


def _play(path: Path, msgs: list[dict[str, Any]]) -> tuple[list[str], dict[str, list]]:
    eng = _engine(path)
    outputs: list[str] = []
    host = R19Host(eng, session_id=SID, context_length=16_000, model="test-model",
                   on_output=lambda out: outputs.append(safe_json(out)))
    try:
        host.start()
        host.feed(msgs)
        host.end()
        _settle(eng)
    finally:
        eng.store.close()
    return outputs, _stored(path)


def test_a_session_with_and_without_the_skip_is_the_same(tmp_path, monkeypatch, aligned):
    msgs = _messages(500)
    with_skip = _play(tmp_path / "skip.db", msgs)
    n_skip = len(aligned)
    aligned.clear()
    monkeypatch.setattr(PassEcho, "repeats", lambda self, *a, **k: False)
    without = _play(tmp_path / "walk.db", msgs)
    assert len(with_skip[0]) >= 3  # (passes adopted and committed: each followed by a flush)
    assert n_skip < len(aligned)  # the flushes were skipped ...
    assert with_skip == without  # ... and nothing differs: every output, every row


def _pass(eng: LCMEngine, msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = eng.compress(msgs, current_tokens=20_000, force=True, session_id=SID)
    assert out and out != msgs
    return out


def _setup(tmp_path: Path) -> tuple[LCMEngine, list[dict[str, Any]]]:
    eng = _engine(tmp_path / "e.db")
    eng.update_model(model="test-model", context_length=16_000)
    eng.on_session_start(SID)
    return eng, _messages(160)


def test_the_flush_of_the_passs_list_is_not_aligned(tmp_path, aligned):
    eng, msgs = _setup(tmp_path)
    try:
        _pass(eng, msgs)
        _settle(eng)  # (the stub preparer writes its verdicts after the pass)
        before = _stored(tmp_path / "e.db")
        aligned.clear()
        eng.on_session_end(SID, copy.deepcopy(msgs))  # the host's flush: a copy of what the pass got
        assert aligned == []
        _settle(eng)
        assert _stored(tmp_path / "e.db") == before
    finally:
        eng.store.close()


def test_a_flush_with_a_new_message_is_aligned_and_stored(tmp_path, aligned):
    eng, msgs = _setup(tmp_path)
    try:
        _pass(eng, msgs)
        n = eng.store.stats()["messages"]
        aligned.clear()
        eng.on_session_end(SID, copy.deepcopy(msgs) + [{"role": "user", "content": "one more thing"}])
        assert aligned and eng.store.stats()["messages"] == n + 1
    finally:
        eng.store.close()


@pytest.mark.parametrize("change", ["content", "tool_arguments", "nested_extra"])
def test_a_message_changed_in_place_after_the_pass_is_aligned(tmp_path, aligned, change):
    """The host's own dicts changed after the pass (the flush hands those very objects): the
    values the pass saw were copied, so the change is seen and the list aligned."""
    eng, msgs = _setup(tmp_path)
    try:
        k = next(i for i, m in enumerate(msgs) if m.get("tool_calls"))
        msgs[k]["reasoning_details"] = [{"text": "thinking"}]
        _pass(eng, msgs)
        if change == "content":
            msgs[k + 1]["content"] = "changed in place"
        elif change == "tool_arguments":
            msgs[k]["tool_calls"][0]["function"]["arguments"] = '{"path": "elsewhere.py"}'
        else:
            msgs[k]["reasoning_details"][0]["text"] = "thought again"
        aligned.clear()
        eng.on_session_end(SID, msgs)
        assert aligned
    finally:
        eng.store.close()


def test_a_flush_after_the_context_was_written_is_aligned(tmp_path, aligned):
    eng, msgs = _setup(tmp_path)
    try:
        _pass(eng, msgs)
        eng.ingest(msgs + [{"role": "user", "content": "said in between"}], session_id=SID)  # writes the context
        aligned.clear()
        eng.on_session_end(SID, copy.deepcopy(msgs))
        assert aligned
    finally:
        eng.store.close()


def test_the_echo_keeps_a_few_sessions():
    echo = PassEcho()
    for i in range(PassEcho.SESSIONS + 3):
        echo.remember(f"s{i}", [{"role": "user", "content": f"hi {i}"}], 1)
    assert len(echo._by_session) == PassEcho.SESSIONS  # noqa: SLF001 - the bound itself is the point
    assert echo.repeats(f"s{PassEcho.SESSIONS + 2}", [{"role": "user", "content": f"hi {PassEcho.SESSIONS + 2}"}],
                        lambda: 1)
    assert not echo.repeats("s0", [{"role": "user", "content": "hi 0"}], lambda: 1)


def test_an_unchanged_list_leaves_the_context_and_its_version_alone(tmp_path):
    """The host re-sends the list it holds (every request goes through ingest): nothing new,
    the same entries — so no write and no new context version, even where one summary block
    stands for several nodes (a slot with several refs: the slot and entry counts differ)."""
    e = _engine(tmp_path / "v.db")
    host = R19Host(e, session_id=SID, overhead_tokens=500)
    host.start(context_length=16_000)
    msgs = _messages(400)
    for a in range(0, len(msgs), 20):
        host.add(*msgs[a:a + 20])
        host.maybe_compress()
    assert host.compactions >= 2
    host.end()
    _settle(e)
    live = copy.deepcopy(host.messages)
    e.ingest(copy.deepcopy(live), session_id=SID)
    version, ctx = e.store.get_context(SID)
    assert any(len(s.refs) > 1 for s in e.ingest(copy.deepcopy(live), session_id=SID) if s.kind == "s"), \
        "no block of several nodes: the case is not exercised"
    for _ in range(3):
        e.ingest(copy.deepcopy(live), session_id=SID)
        assert e.store.get_context(SID) == (version, ctx)
