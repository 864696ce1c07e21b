"""Issue #41: background compaction is on by default when a model summarises (`auto`), off with
the extractive summariser; summarising ahead is bounded to sessions that grow towards their
threshold. Model calls go to the fake OpenAI-compatible server on 127.0.0.1; real SQLite."""

from __future__ import annotations

import copy
import threading

import pytest

from lossless_context import LCMEngine
from lossless_context.config import LCMConfig
from lossless_context.pipeline.background import BackgroundWorker, SessionGrowth, leftover_outlines
from lossless_context.demo.sessions import chat_session, coding_session, turn_ranges
from lossless_context.tokens import estimate_messages_tokens
from tests.support.fake_openai import FakeOpenAI, SummariserResponder

WINDOW = 64_000


def _engine(store: str, **kw) -> LCMEngine:
    e = LCMEngine(config=LCMConfig.load({"store": store, **kw}, read_file=False))
    e.update_model(model="m", context_length=WINDOW, base_url="", api_key="", provider="custom")
    return e


@pytest.mark.parametrize("raw, want", [(True, "on"), ("yes", "on"), (False, "off"), ("0", "off"),
                                       ("AUTO", "auto"), ("sometimes", "auto")])
def test_the_setting_reads_auto_on_off(raw, want):
    cfg = LCMConfig.load({"background_compaction": raw}, read_file=False)
    assert cfg.background_compaction == want
    assert bool(cfg.warnings) == (raw == "sometimes")  # a bad value is reported, the default kept


def test_auto_is_on_with_a_model_and_off_without(tmp_path):
    with FakeOpenAI(responder=SummariserResponder(max_chars=600)) as srv:
        assert _engine(str(tmp_path / "m.db"), summarizer="openai", summary_base_url=srv.base_url)._background_on()
    assert not _engine(str(tmp_path / "x.db"), summarizer="extractive")._background_on()
    assert _engine(str(tmp_path / "o.db"), summarizer="extractive", background_compaction="on")._background_on()


def test_by_default_a_pass_below_the_hard_threshold_waits_for_no_model(tmp_path):
    """The default with a model: the pass summarises deterministically and the worker upgrades
    the nodes with the model afterwards (the host's turn does not wait for it)."""
    with FakeOpenAI(responder=SummariserResponder(max_chars=600)) as srv:
        e = _engine(str(tmp_path / "d.db"), summarizer="openai", summary_base_url=srv.base_url)
        sid = "bg-default"
        e.on_session_start(sid, platform="cli")
        history: list[dict] = []
        msgs = chat_session(1200, seed=5).messages  # (small turns: one lands between the thresholds)
        passed = False
        for a, b in turn_ranges(msgs):
            history.extend(copy.deepcopy(msgs[a:b]))
            tokens = estimate_messages_tokens(history)
            if not e.should_compress(tokens) or tokens >= 0.9 * WINDOW:
                continue
            before = len(srv.chat_requests)
            out = e.compress(history, current_tokens=tokens, session_id=sid)
            assert out != history
            assert len(srv.chat_requests) == before, "the pass called the model on the host's time"
            e.on_session_end(sid, history)
            history = [m for m in out if m.get("role") != "system"]
            e.on_session_start(sid, boundary_reason="compression", old_session_id=sid)
            passed = True
            break
        assert passed
        assert BackgroundWorker.for_store(e.store.location, 2).wait_idle(60)
        assert len(srv.chat_requests) > 0  # the worker upgraded the pass's nodes with the model
        levels = {s.level for s in e.store.get_summaries(range(1, 1000), include_staged=True).values()}
        assert "normal" in levels


@pytest.mark.parametrize("fill", [0.95, 1.15])
def test_a_pass_above_the_hard_threshold_waits_for_no_model_either(tmp_path, fill):
    """One tool batch can take the list from under the threshold past hard_threshold, or past
    the window (the host asks after each batch). With the worker on that pass waits for no model
    either: its new leaves get the extractive summary (not an outline: the agent's next request
    follows at once), and the worker replaces them with the model's right after. A manual
    /compress (force) still waits for the model."""
    with FakeOpenAI(responder=SummariserResponder(max_chars=600)) as srv:
        e = _engine(str(tmp_path / "h.db"), summarizer="openai", summary_base_url=srv.base_url)
        sid = "hard"
        e.on_session_start(sid, platform="cli")
        msgs = chat_session(2400, seed=9).messages
        history: list[dict] = []
        for a, b in turn_ranges(msgs):
            history.extend(copy.deepcopy(msgs[a:b]))
            if estimate_messages_tokens(history) >= fill * WINDOW:
                break
        tokens = estimate_messages_tokens(history)
        assert tokens >= fill * WINDOW and e.should_compress(tokens)
        out = e.compress(history, current_tokens=tokens, session_id=sid)
        assert out != history and estimate_messages_tokens(out) < 0.9 * WINDOW
        assert srv.chat_requests == [], "the pass called the model on the host's time"
        staged = e.store.get_summaries(range(1, 1000), include_staged=True).values()
        leaves = [s for s in staged if s.kind == "leaf"]
        assert leaves and {(s.level, s.summarizer) for s in leaves} == {("deterministic", "extractive")}
        e.on_session_end(sid, history)
        e.on_session_start(sid, boundary_reason="compression", old_session_id=sid)
        assert e.wait_background(60)
        assert srv.chat_requests, "the worker never summarised the pass's leaves"
        after = e.store.get_summaries([s.id for s in leaves], include_staged=True).values()
        assert {s.level for s in after} == {"normal"}
        history = [m for m in out if m.get("role") != "system"] + copy.deepcopy(msgs[b:b + 40])
        before = len(srv.chat_requests)
        e.compress(history, current_tokens=estimate_messages_tokens(history), session_id=sid, force=True)
        assert len(srv.chat_requests) > before  # /compress: the user asked, the pass summarises now


def test_summarising_ahead_needs_a_growing_session_near_its_threshold():
    g = SessionGrowth()
    threshold = 48_000
    # three turns of steady growth, 4 turns (of 2,000 tokens) from the threshold: ahead pays
    for tokens in (36_000, 38_000, 40_000):
        pays = g.note("s", tokens)
    assert pays(threshold)
    # the same size again (a re-sent list, a session left open): no
    assert not g.note("s", 40_000)(threshold)
    # far from its threshold at this pace: no
    h = SessionGrowth()
    for tokens in (20_000, 20_500, 21_000):
        far = h.note("t", tokens)
    assert not far(threshold)
    # fewer than three turns seen (a new process, as `hermes chat -q` makes one per turn): no
    assert not SessionGrowth().note("u", 47_000)(threshold)


def test_a_session_that_stopped_growing_is_not_summarised_ahead(tmp_path):
    """Above the soft threshold, on_turn_complete submits a presummary only while the session
    grows towards its threshold; re-sent unchanged, it does not (no spend for a pass that may
    never come)."""
    with FakeOpenAI(responder=SummariserResponder(max_chars=600)) as srv:
        e = _engine(str(tmp_path / "b.db"), summarizer="openai", summary_base_url=srv.base_url)
        sid = "idle"
        e.on_session_start(sid, platform="cli")
        msgs = coding_session(400, seed=8).messages
        history: list[dict] = []
        submitted = []
        last: list[dict] = []
        for a, b in turn_ranges(msgs):
            history.extend(copy.deepcopy(msgs[a:b]))
            if estimate_messages_tokens(history) > 0.7 * WINDOW:
                break
            last = copy.deepcopy(history)
            submitted.append(e.maybe_presummarize(last, session_id=sid))
        assert any(submitted), "a growing session near its threshold was never summarised ahead"
        BackgroundWorker.for_store(e.store.location, 2).wait_idle(60)
        assert not any(e.maybe_presummarize(copy.deepcopy(last), session_id=sid) for _ in range(3))


def _one_fast_pass(e: LCMEngine, sid: str, before_commit=None) -> None:
    """Drive turns until one pass lands between the thresholds (the fast path: outlines, no
    model call), then commit it as the released host does."""
    e.on_session_start(sid, platform="cli")
    history: list[dict] = []
    msgs = chat_session(1200, seed=5).messages
    for a, b in turn_ranges(msgs):
        history.extend(copy.deepcopy(msgs[a:b]))
        tokens = estimate_messages_tokens(history)
        if not e.should_compress(tokens) or tokens >= 0.9 * WINDOW:
            continue
        out = e.compress(history, current_tokens=tokens, session_id=sid)
        assert out != history
        e.on_session_end(sid, history)
        if before_commit is not None:
            before_commit()
        e.on_session_start(sid, boundary_reason="compression", old_session_id=sid)
        return
    raise AssertionError("no pass landed between the thresholds")


def test_the_workers_model_calls_are_counted_in_status_and_spend(tmp_path):
    """/lcm status and the session's spend count the summaries the worker makes after a pass
    (they are the model calls the user pays for), apart from the passes' own."""
    with FakeOpenAI(responder=SummariserResponder(max_chars=600)) as srv:
        e = _engine(str(tmp_path / "c.db"), summarizer="openai", summary_base_url=srv.base_url)
        _one_fast_pass(e, "counted")
        assert e.wait_background(60)
        st = e.get_status()
        assert st["lcm_background_calls"] >= 1, st
        assert st["lcm_summarizer_calls"] >= st["lcm_background_calls"] == len(srv.chat_requests)
        assert st["lcm_cost_session"]["calls"] == len(srv.chat_requests)


def test_outlines_left_by_a_process_that_ended_are_summarised_by_the_next(tmp_path):
    """A `hermes chat -q` process ends right after its reply, before its worker summarised the
    pass's outlines (daemon threads never hold a process): the next engine to start the session
    queues them, and none stays an outline."""
    store = str(tmp_path / "l.db")
    with FakeOpenAI(responder=SummariserResponder(max_chars=600)) as srv:
        e = _engine(store, summarizer="openai", summary_base_url=srv.base_url)
        sid = "left"
        gate = threading.Event()
        worker = e._worker()
        # the session's upgrade job waits behind a running one, and the process "exits" first
        worker.submit(f"{sid}#upgrade", lambda stop: gate.wait(30))
        _one_fast_pass(e, sid)
        worker.shutdown()
        gate.set()
        assert leftover_outlines(e.store, sid), "the pass left no outline to upgrade"
        assert not srv.chat_requests
        later = _engine(store, summarizer="openai", summary_base_url=srv.base_url)
        later.on_session_start(sid, platform="cli")
        assert later.wait_background(60)
        assert srv.chat_requests
        assert leftover_outlines(later.store, sid) == []


def test_closing_the_store_stops_the_workers_job_on_it_first(tmp_path):
    """The worker's upgrade job reads and writes through the engine's store; closing the store
    closes its connections (a job writing on one closed beneath it crashed the process: a
    segfault in the suite). The close drops the store's queued jobs and waits, bounded, for a
    running one: it sees its stop flag after its model call and writes nothing more."""
    from tests.test_background import Gated

    gated = Gated()
    with FakeOpenAI(responder=gated) as srv:
        e = _engine(str(tmp_path / "x.db"), summarizer="openai", summary_base_url=srv.base_url)
        worker = e._worker()
        _one_fast_pass(e, "closing")
        for _ in range(1200):  # (a hang guard: the job's model call reaches the server)
            if srv.requests:
                break
            threading.Event().wait(0.05)
        assert srv.requests, "the worker never called the model"
        outlines = leftover_outlines(e.store, "closing")
        assert outlines
        closed = threading.Event()
        t = threading.Thread(target=lambda: (e.store.close(), closed.set()), daemon=True)
        t.start()
        for _ in range(1200):
            if worker.released(e.store):
                break
            threading.Event().wait(0.05)
        assert worker.released(e.store) and not closed.is_set()  # the close waits for the running job
        gated.opened.set()
        assert closed.wait(60)
        t.join(60)
        assert worker.wait_idle(60)
        assert not worker.submit("closing#upgrade", lambda stop: None, e.store)  # a closed store takes none
    reopened = _engine(str(tmp_path / "x.db"), summarizer="extractive")
    assert leftover_outlines(reopened.store, "closing") == outlines  # nothing written after the close began
    reopened.store.close()


def test_shutdown_waits_for_the_running_job_to_reach_its_stop_check():
    """At exit (atexit) the worker stops and waits, bounded, for a running job: the interpreter
    must not tear the sqlite3 module down under a thread still inside a store call."""
    w = BackgroundWorker(concurrency=1)
    inside, release = threading.Event(), threading.Event()
    seen: list[bool] = []

    def job(stop):
        inside.set()
        release.wait(60)  # (a model call)
        seen.append(stop())  # the job's check after it: stop, write nothing

    assert w.submit("s", job)
    assert inside.wait(60)
    result: list[bool] = []
    t = threading.Thread(target=lambda: result.append(w.shutdown(wait=60)), daemon=True)
    t.start()
    t.join(0.2)
    assert not result  # still waiting for the job
    release.set()
    t.join(60)
    assert result == [True] and seen == [True]
