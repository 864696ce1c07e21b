"""A host that replays originals our active context already summarises (pipeline/ingest_replay.py).

A host that lost our compacted list (it crashed between our commit and its own, or rebuilt the
conversation from a transcript of the originals) sends the originals again. They must keep the
summaries they already have: nothing summarised twice, no message under two leaves.
"""

from __future__ import annotations

import pytest

from lossless_context import LCMEngine
from lossless_context.config import LCMConfig
from lossless_context.demo.host_driver import R19Host
from lossless_context.demo.sessions import coding_session, turn_ranges
from lossless_context.ops.doctor import run_doctor
from lossless_context.pipeline.validate import pairing_problems
from tests.support.dagcheck import assert_connected

SID = "s-replay"
WINDOW = 16_000


def _engine(location) -> LCMEngine:
    return LCMEngine(config=LCMConfig.load({"store": str(location), "summarizer": "extractive"}, read_file=False))


def _location(request, tmp_path, backend):
    return request.getfixturevalue("pg_fresh_dsn") if backend == "postgres" else tmp_path / "l.db"


def _turns(n: int, seed: int) -> list[list[dict]]:
    msgs = coding_session(n, seed=seed).messages
    return [msgs[a:b] for a, b in turn_ranges(msgs)]


def _leaves(store) -> dict[int, list[int]]:
    """Every published leaf of the session and its messages."""
    recs = store.get_summaries(store.session_summary_ids(SID))
    return {sid: store.summary_children(sid)[1] for sid, r in recs.items() if r.kind == "leaf"}


def _host(location, turns=()) -> R19Host:
    """A host (a new process: a new engine on the store) that plays ``turns``."""
    host = R19Host(_engine(location), session_id=SID)
    host.start(context_length=WINDOW)
    for t in turns:
        host.add(*t)
        host.maybe_compress()
    return host


def _first_process(location, turns) -> tuple[dict[int, list[int]], list[int]]:
    host = _host(location, turns)
    assert host.compactions >= 2 and host.invalid == []
    _, ctx = host.engine.store.get_context(SID)
    return _leaves(host.engine.store), [e.ref for e in ctx if e.kind == "s"]


def _summarised_twice(store, before: dict[int, list[int]]) -> list[int]:
    """The leaves made since ``before`` over a message one of those leaves covers."""
    covered = {m for mids in before.values() for m in mids}
    return [sid for sid, mids in _leaves(store).items() if sid not in before and covered & set(mids)]


def _one_leaf_each(store) -> None:
    rep = run_doctor(store)
    [check] = [c for c in rep.checks if c.name == "each message under at most one leaf"]
    assert check.ok, check.detail


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_replayed_history_keeps_its_summaries(tmp_path, request, backend):
    location = _location(request, tmp_path, backend)
    turns = _turns(700, seed=6)
    cut = len(turns) * 4 // 5
    before, kept = _first_process(location, turns[:cut])

    # A new process whose host lost the compacted list: every original again, and a new turn.
    host = _host(location)
    engine = host.engine
    host.add(*[m for t in turns[:cut] for m in t], *turns[cut])
    engine.ingest(host.messages, session_id=SID)
    # the stored context keeps its summaries (the originals stand for them again)
    _, ctx = engine.store.get_context(SID)
    assert [e.ref for e in ctx if e.kind == "s"] == kept
    assert host.maybe_compress(force=True)
    out = host.messages
    assert pairing_problems(out) == [] and host.invalid == []
    assert not _summarised_twice(engine.store, before)
    _one_leaf_each(engine.store)
    assert_connected(engine.store, SID)
    for t in turns[cut + 1:]:  # and the session goes on as usual
        host.add(*t)
        host.maybe_compress()
    _one_leaf_each(engine.store)
    assert_connected(engine.store, SID)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_replay_in_parts_keeps_its_summaries(tmp_path, request, backend):
    """A host that rebuilds the list a turn at a time: the first calls see only part of a
    summary's span (the context loses it then); the pass that would summarise it finds it."""
    location = _location(request, tmp_path, backend)
    turns = _turns(700, seed=8)
    before, _ = _first_process(location, turns)
    host = _host(location, turns)
    assert host.compactions >= 1 and host.invalid == []
    assert not _summarised_twice(host.engine.store, before)
    _one_leaf_each(host.engine.store)


def test_a_summary_whose_span_is_not_there_whole_is_not_folded(tmp_path):
    location = tmp_path / "l.db"
    turns = _turns(700, seed=6)
    cut = len(turns) * 4 // 5
    before, kept = _first_process(location, turns[:cut])
    engine = _engine(location)
    replay = [m for t in turns[:cut] for m in t]
    # the host dropped one message from the middle of the first leaf's span
    first = min(before)
    ids = before[first]
    by_id = {m.id: m.raw for m in engine.store.iter_all_messages() if m.session_id == SID}
    gone = ids[len(ids) // 2]
    at = next(i for i, m in enumerate(replay) if m == by_id[gone])
    engine.on_session_start(SID, platform="cli")
    engine.ingest(replay[:at] + replay[at + 1:], session_id=SID)
    _, ctx = engine.store.get_context(SID)
    shown = [e.ref for e in ctx if e.kind == "s"]
    assert first not in shown and shown, shown  # the others still fold
    # the context stands for exactly the list it was handed: every message once
    listed = [e.ref for e in ctx if e.kind == "m"] + [m for s in shown for m in _span(engine.store, s)]
    assert len(listed) == len(set(listed)) and set(listed) == set(by_id) - {gone}


def _span(store, sid: int) -> list[int]:
    kids, mids = store.summary_children(sid)
    return [m for k in kids for m in _span(store, k)] + mids


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_doctor_repairs_what_an_earlier_engine_summarised_twice(tmp_path, request, backend, monkeypatch):
    """A store an earlier engine wrote: a replayed history summarised a second time (the
    replay's handling switched off here to make one). `lcm doctor --repair` deletes the
    copies no context reaches and nothing else."""
    import lossless_context.contract.ingestion as engine_mod  # (the engine's ingestion)
    import lossless_context.pipeline.ingest as ingest_mod

    location = _location(request, tmp_path, backend)
    turns = _turns(700, seed=6)
    cut = len(turns) * 4 // 5
    _first_process(location, turns[:cut])
    with monkeypatch.context() as m:
        m.setattr(engine_mod, "fold_replayed", lambda *a, **k: (None, None))
        m.setattr(ingest_mod, "opened", lambda *a, **k: (None, []))
        host = _host(location, turns)
    store = host.engine.store
    messages = store.stats()["messages"]
    _, ctx = store.get_context(SID)
    shown = [(e.kind, e.ref) for e in ctx]
    rep = run_doctor(store)
    [check] = [c for c in rep.checks if c.name == "each message under at most one leaf"]
    assert not check.ok and "--repair" in check.detail
    fixed = run_doctor(store, repair=True)
    [check] = [c for c in fixed.checks if c.name == "each message under at most one leaf"]
    assert check.repaired and "deleted" in check.detail and fixed.ok, check.detail
    _one_leaf_each(store)
    assert run_doctor(store).ok
    # nothing a context shows, and no message, went with them
    assert store.stats()["messages"] == messages
    assert [(e.kind, e.ref) for e in store.get_context(SID)[1]] == shown
    assert_connected(store, SID)


def test_a_replay_missing_a_message_still_compacts(tmp_path):
    """A leaf whose span the list has with a message missing (the host dropped it) is not held
    out of the passes (only a list that ends inside a span is): the session keeps compacting."""
    location = tmp_path / "l.db"
    turns = _turns(900, seed=6)
    cut = len(turns) // 2
    before, _ = _first_process(location, turns[:cut])
    host = _host(location)
    by_id = {m.id: m.raw for m in host.engine.store.iter_all_messages() if m.session_id == SID}
    first = before[min(before)]
    gone = by_id[first[len(first) // 2]]
    replay = [m for t in turns[:cut] for m in t]
    host.add(*[m for m in replay if m != gone])
    host.maybe_compress()
    for t in turns[cut:]:
        host.add(*t)
        host.maybe_compress()
    assert host.compactions >= 2 and host.invalid == []
    assert host.estimate() < host.engine.threshold_tokens


def test_a_call_the_list_ends_waiting_for_is_the_tails_and_a_replay_summarises_nothing_twice(tmp_path):
    """A pass over a list that ends in an assistant tool call without its results (the host
    appends them right after it: a prefix handed to a manual /compress, a pass in the tool
    loop). The call is the fresh tail's: last in the output as the host holds it, its row in
    the context under no leaf. It used to be held back from the output and put under the
    newest leaf with the span before it: the results the host appended next were orphans,
    and a replay of the originals (with those results) no longer held that leaf's span as one
    run, so it was not folded back and the next pass summarised its messages a second time."""
    location = tmp_path / "l.db"
    turns = _turns(700, seed=6)
    cut = len(turns) // 2
    host = _host(location, turns[:cut])
    assert host.compactions >= 1 and host.invalid == []
    store = host.engine.store
    # the next turn up to its first tool call, without the call's results
    turn = turns[cut]
    k = next(i for i, m in enumerate(turn) if m.get("role") == "assistant" and m.get("tool_calls"))
    call = turn[k]
    assert turn[k + 1].get("role") == "tool"
    host.add(*turn[:k + 1])
    before = _leaves(store)
    assert host.compress_once(force=True) and host.invalid == []
    assert host.messages[-1] == call  # verbatim: its results come next
    _, ctx = store.get_context(SID)
    assert ctx[-1].kind == "m"
    row = ctx[-1].ref
    assert store.get_messages([row])[row].raw == call
    assert not store.message_summaries_many([row]).get(row)  # under no leaf
    assert pairing_problems(host.messages[:-1]) == []
    # the host appends the results right after the call: no orphan, nothing held back
    host.add(*turn[k + 1:])
    assert pairing_problems(host.messages) == []
    host.engine.ingest(host.messages, session_id=SID)
    assert not _summarised_twice(store, before)
    # a new process whose host lost the compacted list replays the originals, results included
    leaves = _leaves(store)
    replay = _host(location)
    replay.add(*[m for t in turns[:cut + 1] for m in t])
    assert replay.compress_once(force=True) and replay.invalid == []
    assert not _summarised_twice(replay.engine.store, leaves)
    for t in turns[cut + 1:cut + 4]:
        replay.add(*t)
        replay.maybe_compress()
    assert not _summarised_twice(replay.engine.store, leaves) and replay.invalid == []
    _one_leaf_each(replay.engine.store)
    assert_connected(replay.engine.store, SID)


@pytest.mark.parametrize("stray", [False, True])
def test_a_replay_after_a_pass_that_pinned_the_reply_summarises_nothing_twice(tmp_path, stray):
    """A pass in the middle of a turn pins the reply the host just delivered right after the
    head (a 0.22 host checks it survived). Its leaves used to span that reply (the messages
    before and after it in one leaf), and one held-back message (a stray tool result in the
    tail) joined the newest leaf: either span is no longer one run of the host's list, so a
    replay of the originals did not fold it back and the next pass summarised ~280 messages a
    second time. Now no leaf spans the pinned reply and held-back messages get leaves of their
    own (one per run)."""
    location = tmp_path / "l.db"
    msgs = coding_session(700, seed=6).messages
    first = msgs[:300] + [{"role": "tool", "tool_call_id": "nobody", "content": "stray output"}] + msgs[300:305] \
        if stray else msgs[:305]
    host = _host(location)
    host.add(*first)
    assert host.compress_once(force=True)
    store = host.engine.store
    _, ctx = store.get_context(SID)
    kinds = [e.kind for e in ctx]
    first_s = kinds.index("s")
    # the pinned reply: a message after the head, before the block
    assert kinds[first_s - 1] == "m" and ctx[first_s - 1].ref > ctx[first_s - 2].ref + 1
    before = _leaves(store)
    replay = _host(location)
    replay.add(*first, *msgs[305:330])
    assert replay.compress_once(force=True) and replay.invalid == []
    assert not _summarised_twice(replay.engine.store, before)
    _one_leaf_each(replay.engine.store)
    assert_connected(replay.engine.store, SID)
