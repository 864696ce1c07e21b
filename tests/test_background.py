"""Zero-wait compaction: the background worker summarises ahead; compress() only assembles."""

from __future__ import annotations

import sqlite3
import threading
import time

import pytest

from lossless_context import LCMEngine
from lossless_context.pipeline.background import BackgroundWorker
from lossless_context.pipeline.compaction import span_key
from lossless_context.config import LCMConfig
from lossless_context.demo.sessions import coding_session, turn_ranges
from tests.support.fake_openai import Delay, FailureSequence, FakeOpenAI, SummariserResponder
from lossless_context.demo.host_driver import R19Host
from tests.support.newhost import NewHost


def _engine(path, url, **kw):
    return LCMEngine(config=LCMConfig.load(
        {"store": str(path), "summarizer": "openai", "summary_base_url": url, "background_compaction": True,
         "soft_threshold": 0.45, "leaf_chunk_tokens": 4000, **kw}, read_file=False))


def _small(msgs):
    """Without the session's huge tool outputs: a single 50k-token result jumps straight past
    the hard threshold, where blocking is the intended behaviour."""
    return [dict(m, content=m["content"][:8000]) if isinstance(m.get("content"), str) else m for m in msgs]


def _turns(msgs):
    msgs = _small(msgs)
    return [msgs[a:b] for a, b in turn_ranges(msgs)]


def slow(seconds):
    return FailureSequence([Delay(seconds)], base=SummariserResponder(max_chars=900), cycle=True)


def test_worker_keeps_up_and_compress_only_assembles(tmp_path):
    """Once the worker has run, compress() makes no model call: it adopts the summaries
    prepared for exactly these messages (the time it takes is measured in bench/, not here)."""
    with FakeOpenAI(responder=slow(2.0)) as srv:
        e = _engine(tmp_path / "l.db", srv.base_url)
        host = NewHost(e, "bg-1")
        host.start(context_length=64_000)
        done = False
        for turn in _turns(coding_session(700, seed=1).messages):
            host.turn(*turn)
            if e.should_compress(host.estimate()):
                assert BackgroundWorker.for_store(e.store.location, 2).wait_idle(120)
                assert host.compress()
                # (the worker's calls count in the status too: read the pass's own)
                st = e.get_status()
                assert st["lcm_last_pass"]["calls"] == 0, "compress() waited on the model"
                assert st["lcm_summarizer_calls"] == st["lcm_background_calls"]
                done = True
                break
        assert done, "compaction never triggered"
        # the provider gets model summaries (the same quality as the blocking path)
        leaves = [s for s in e.store.get_summaries(range(1, 1000)).values() if s.kind == "leaf"]
        assert leaves and sum(s.level == "normal" for s in leaves) >= len(leaves) - 1
        assert e.get_status()["lcm_presummaries"] >= 1


class Gated:
    """A summariser that answers only once `opened` is set. Whatever returns while it is
    closed did not wait for a model reply: that, not a stopwatch, shows compress() did not
    block on the model."""

    def __init__(self) -> None:
        self.opened = threading.Event()
        self.base = SummariserResponder(max_chars=900)

    def __call__(self, req):
        self.opened.wait(120)
        return self.base(req)


def test_r19_path_returns_at_once_and_upgrades_later(tmp_path):
    gate = Gated()
    with FakeOpenAI(responder=gate) as srv:
        try:
            # (summary_timeout above the bound below: a compress() that waited for the model
            # could not come back with a fallback in time either)
            e = _engine(tmp_path / "l.db", srv.base_url, summary_timeout=600)
            host = R19Host(e)
            host.start(context_length=64_000)
            compacted = False
            for turn in _turns(coding_session(700, seed=3).messages):
                host.add(*turn)
                box: dict = {}
                t = threading.Thread(target=lambda: box.update(did=host.maybe_compress()), daemon=True)
                t.start()
                t.join(60)  # a hang guard only: with the model closed, waiting would never end
                assert not t.is_alive(), "compress() waited on the model"
                assert not gate.opened.is_set()
                if box["did"]:
                    compacted = True
                    break
            assert compacted, "compaction never triggered"
        finally:
            gate.opened.set()  # now the worker's calls are answered: it upgrades the nodes
        worker = BackgroundWorker.for_store(e.store.location, 2)
        assert worker.wait_idle(120)
        nodes = list(e.store.get_summaries(range(1, 1000)).values())
        # every node is upgraded, except one whose source is too small for the fake's replies to
        # be shorter than half of it (≤ 900 chars ≈ 225 tokens): with tier 0 a leaf can be a
        # single stubbed tool result, and a summary no smaller than its source is refused
        assert nodes and sum(n.level in ("normal", "aggressive") for n in nodes) >= 3
        assert all(n.level in ("normal", "aggressive") or n.source_tokens < 450 for n in nodes), \
            [(n.id, n.kind, n.level, n.source_tokens) for n in nodes]


def test_changed_span_is_not_adopted(tmp_path):
    """A summary prepared for a span is adopted only for exactly those stored messages: after an
    edit (a new version under the same uid) the prepared summary of the old span is not used."""
    responder = SummariserResponder(max_chars=900)
    with FakeOpenAI(responder=responder) as srv:
        # (tier 0 off: which results a pass stubs moves chunk boundaries, and this test needs
        # the pass to plan the very span the worker prepared, so that adopting it is possible)
        e = _engine(tmp_path / "l.db", srv.base_url, tool_stubs=False)
        host = NewHost(e, "bg-3")
        host.start(context_length=64_000)
        for turn in list(_turns(coding_session(700, seed=5).messages)):
            host.turn(*turn)
            if host.estimate() > 0.6 * 64_000:
                break
        worker = BackgroundWorker.for_store(e.store.location, 2)
        assert worker.wait_idle(60)
        assert e.store.count_presummaries("bg-3") >= 1
        with sqlite3.connect(tmp_path / "l.db") as c:
            prepared = dict(c.execute("SELECT span_key, text FROM presummaries WHERE session_id='bg-3'"))
        # edit an early message under its uid: the span it belonged to is no longer the same
        # (a plain-text message: appending to a JSON tool result would change its digest's size
        # and so move the chunk's boundaries, and this test needs the very same span)
        target = next(m for m in host.history[3:] if m.get("role") == "assistant" and not m.get("tool_calls"))
        target["content"] = (target.get("content") or "") + " (edited)"
        calls_before = len(responder.inputs)
        host.request()
        assert host.compress(force=True)
        edited = [m for m in e.store.iter_all_messages() if m.uid == target["message_uid"]]
        assert len(edited) == 2, "the edit is a new version"
        old_id, new_id = edited[0].id, edited[-1].id
        leaf_ids = e.store.message_summaries(new_id)
        assert leaf_ids, "the new version is covered by a published leaf"
        leaf = e.store.get_summaries(leaf_ids[:1])[leaf_ids[0]]
        _, span = e.store.summary_children(leaf.id)
        assert new_id in span and old_id not in span
        old_key = span_key([old_id if m == new_id else m for m in span])
        assert old_key in prepared, "the worker had prepared this very span before the edit"
        # adopting the old span's summary would give a model-level leaf although no call saw the edit
        asked_with_edit = any("(edited)" in x for x in responder.inputs[calls_before:])
        assert leaf.level != "normal" or asked_with_edit
        assert asked_with_edit or leaf.text != prepared[old_key]


def test_bounded_concurrency_and_prompt_shutdown():
    """Decided, not raced: the first jobs hold until released, so which jobs are running or
    still queued at each check is known; the long job ends because it saw the stop flag."""
    w = BackgroundWorker(concurrency=2)
    lock = threading.Lock()
    running = [0]
    peak = [0]
    two_running = threading.Event()
    release = threading.Event()
    ran: list[str] = []

    def job(stop):
        with lock:
            ran.append(threading.current_thread().name)
            running[0] += 1
            peak[0] = max(peak[0], running[0])
            if running[0] == 2:
                two_running.set()
        release.wait(30)
        with lock:
            running[0] -= 1

    for i in range(8):
        assert w.submit(f"s{i}", job)
    assert two_running.wait(30)  # the two threads both run a job ...
    assert not w.submit("s7", job)  # ... so s7 is still queued: a second job for it is coalesced
    release.set()
    assert w.wait_idle(30)
    assert peak[0] == 2 and w.max_parallel == 2 and len(ran) == 8
    # shutdown: a long job sees the stop flag at once
    w2 = BackgroundWorker(concurrency=1)
    started = threading.Event()
    finished = threading.Event()
    seen = []

    def long_job(stop):
        started.set()
        deadline = time.monotonic() + 60  # (its own bound, far beyond the wait below)
        while not stop() and time.monotonic() < deadline:
            time.sleep(0.01)
        seen.append(stop())
        finished.set()

    w2.submit("x", long_job)
    assert started.wait(30)  # (shut down while the job runs, not before it started)
    w2.shutdown()
    assert finished.wait(30)
    assert seen == [True], "the job ended by the stop flag, not by its own bound"
    assert not w2.submit("y", long_job)


@pytest.mark.lcm_errors("background job for s\\d+ failed: boom")  # the failing jobs are the test's own
def test_job_counters_count_every_job(lcm_errors):
    """jobs_done / jobs_failed are exact with several threads finishing jobs at once."""
    w = BackgroundWorker(concurrency=4)
    try:
        def ok(stop):
            pass

        def bad(stop):
            raise RuntimeError("boom")

        for i in range(200):  # distinct sessions: a session's second queued job would coalesce
            assert w.submit(f"s{i}", bad if i % 5 == 0 else ok)
        assert w.wait_idle(60)
        assert (w.jobs_done, w.jobs_failed) == (160, 40)
        assert len(lcm_errors.records) == 40  # each failure logged once, with its traceback
    finally:
        w.shutdown()
