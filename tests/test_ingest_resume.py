"""Re-sent lists resume where the last alignment ended (ingest_resume.Resume) — and only when safe.

Every check compares an engine that resumes ("warm") with a fresh clone on the same store
that aligns the whole list from the stored context ("cold"): both must map every message
to the same stored row, and nothing may be stored twice or missed."""

from __future__ import annotations

import copy
import json
import random

import pytest

from lossless_context import LCMEngine
from lossless_context.pipeline import ingest_resume
from lossless_context.config import LCMConfig
from lossless_context.demo.sessions import coding_session


@pytest.fixture
def resumed(monkeypatch):
    """The verdicts of ingest_resume.resumable, in call order."""
    seen: list[bool] = []
    real = ingest_resume.resumable

    def spy(*a, **k):
        seen.append(real(*a, **k))
        return seen[-1]

    monkeypatch.setattr(ingest_resume, "resumable", spy)
    return seen


@pytest.fixture(params=["sqlite", "postgres"])
def engine(request, tmp_path):
    if request.param == "postgres":
        location = request.getfixturevalue("pg_fresh_dsn")
    else:
        location = str(tmp_path / "lcm.db")
    e = LCMEngine(config=LCMConfig.load({"store": location, "summarizer": "extractive"}, read_file=False))
    e.on_session_start("r", platform="cli")
    yield e
    e.store.close()


def refs(slots) -> list[tuple[str, list[int]]]:
    return [(s.kind, list(s.refs)) for s in slots]


def stored(e) -> list[str]:
    return [json.dumps(r.raw, sort_keys=True) for r in e.store.session_messages("r", limit=100_000)]


def fresh_ingest(e, msgs) -> list:
    """What an engine that never saw this list makes of it (its own store handle, closed after)."""
    clone = e.clone_for_agent()
    try:
        return clone.ingest(msgs, session_id="r")
    finally:
        clone.store.close()


def check_same_as_cold(e, msgs) -> list:
    warm = e.ingest(msgs, session_id="r")
    assert refs(warm) == refs(fresh_ingest(e, msgs))
    return warm


def test_growing_list_resumes_and_stores_each_message_once(engine, resumed):
    msgs = coding_session(600, seed=3).messages
    for end in range(50, len(msgs) + 1, 50):
        check_same_as_cold(engine, msgs[:end])
    assert resumed.count(True) == 600 // 50 - 1, resumed  # every warm call after the first
    assert engine.ingestion.aligned["r"][2].objs[-1] is msgs[-1], "the last alignment is kept for the next call"
    assert stored(engine) == [json.dumps(m, sort_keys=True) for m in msgs]  # each once, verbatim, in order


@pytest.mark.parametrize("change", ["content", "tool_args", "tool_list", "role", "new_object"])
def test_a_changed_message_in_the_resumed_prefix_is_noticed(engine, change, resumed):
    msgs = copy.deepcopy(coding_session(200, seed=5).messages)
    engine.ingest(msgs[:150], session_id="r")
    n = len(stored(engine))
    k = next(i for i, m in enumerate(msgs[:150]) if m.get("tool_calls")) if change.startswith("tool") else 40
    m = msgs[k]
    if change == "content":
        m["content"] = (m.get("content") or "") + " (edited in place)"
    elif change == "tool_args":
        m["tool_calls"][0]["function"]["arguments"] = '{"edited": true}'  # mutated inside the list
    elif change == "tool_list":
        m["tool_calls"].append(copy.deepcopy(m["tool_calls"][0]) | {"id": "call_extra"})
    elif change == "role":
        m["role"] = "user" if m.get("role") != "user" else "assistant"
    else:
        msgs[k] = copy.deepcopy(m)  # an equal copy: same content, same row
    slots = check_same_as_cold(engine, msgs[:180])
    assert resumed == [False], "the changed prefix must not be resumed"
    added = len(stored(engine)) - n
    expect_new = 30 + (0 if change == "new_object" else 1)
    assert added == expect_new, f"{change}: {added} rows added, expected {expect_new}"
    assert len(slots) == 180


def test_a_content_part_changed_in_place_is_noticed(engine, resumed):
    """A list content (multimodal parts) is not a string: the snapshot cannot vouch for it by
    identity, its identity is recomputed."""
    msgs = copy.deepcopy(coding_session(200, seed=7).messages)
    msgs[40] = {"role": "user", "content": [{"type": "text", "text": "look at this"},
                                            {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}
    engine.ingest(msgs[:150], session_id="r")
    engine.ingest(msgs[:160], session_id="r")
    assert resumed[-1] is True
    n = len(stored(engine))
    msgs[40]["content"][0]["text"] = "look at this instead"  # the same list, edited in place
    check_same_as_cold(engine, msgs[:170])
    assert resumed[-1] is False, "an edited part list must not be resumed"
    assert len(stored(engine)) - n == 10 + 1  # the ten new ones and the edited message's new version


def test_context_written_by_someone_else_is_read_afresh(engine):
    msgs = coding_session(300, seed=9).messages
    engine.ingest(msgs[:200], session_id="r")
    fresh_ingest(engine, msgs[:120])  # a second host on the same session replaces the context
    slots = check_same_as_cold(engine, msgs[:260])
    assert [s.refs[0] for s in slots if s.kind == "m"][:200] == [
        s.refs[0] for s in fresh_ingest(engine, msgs[:200]) if s.kind == "m"]
    assert len(stored(engine)) == 260


def test_shorter_or_reordered_list_does_not_resume(engine):
    msgs = coding_session(300, seed=11).messages
    engine.ingest(msgs[:250], session_id="r")
    rng = random.Random(1)
    dropped = msgs[:100] + msgs[101:250]  # the host dropped one message in the middle
    check_same_as_cold(engine, dropped)
    check_same_as_cold(engine, msgs[:120])  # shorter
    shuffled = msgs[:250]
    i = rng.randrange(10, 240)
    shuffled = shuffled[:i] + [shuffled[i + 1], shuffled[i]] + shuffled[i + 2:]
    check_same_as_cold(engine, shuffled + msgs[250:])
    assert len(stored(engine)) == 300 + 1  # the swapped pair: one of them is now a new occurrence


def test_tool_call_arguments_object_changed_in_place_is_noticed(engine, resumed):
    """Tool call arguments that are not a string (a dict some hosts keep) cannot be copied
    into the snapshot as immutable values: that message's identity is recomputed each time."""
    msgs = copy.deepcopy(coding_session(200, seed=9).messages)
    k = next(i for i, m in enumerate(msgs[:100]) if m.get("tool_calls"))
    msgs[k]["tool_calls"][0]["function"]["arguments"] = {"path": "a.py"}
    engine.ingest(msgs[:150], session_id="r")
    engine.ingest(msgs[:160], session_id="r")
    assert resumed[-1] is True
    n = len(stored(engine))
    msgs[k]["tool_calls"][0]["function"]["arguments"]["path"] = "b.py"  # the same dict, edited
    check_same_as_cold(engine, msgs[:170])
    assert resumed[-1] is False, "edited tool call arguments must not be resumed"
    assert len(stored(engine)) - n == 10 + 1
