"""gcpause: the collector is paused while any bulk append runs and restored after the last."""

from __future__ import annotations

import gc
import threading

import pytest

from lossless_context import LCMEngine
from lossless_context.pipeline import gcpause, ingest_fast
from lossless_context.config import LCMConfig
from lossless_context.demo.sessions import coding_session


@pytest.fixture(autouse=True)
def restore_gc():
    was = gc.isenabled()
    yield
    gc.enable() if was else gc.disable()


def test_nested_and_concurrent_pauses_restore_the_collector_once():
    gc.enable()
    inside = threading.Event()
    release = threading.Event()

    def other():
        with gcpause.paused():
            inside.set()
            release.wait(10)

    t = threading.Thread(target=other)
    with gcpause.paused():
        assert not gc.isenabled()
        t.start()
        assert inside.wait(10)
    assert not gc.isenabled(), "another thread's append is still running"
    release.set()
    t.join(10)
    assert gc.isenabled()


def test_a_collector_the_host_disabled_stays_disabled():
    gc.disable()
    with gcpause.paused():
        pass
    assert not gc.isenabled()


def test_failing_work_still_restores_the_collector():
    gc.enable()
    with pytest.raises(RuntimeError):
        with gcpause.paused():
            raise RuntimeError("boom")
    assert gc.isenabled()


def test_a_bulk_ingest_runs_with_the_collector_paused_and_ends_with_it_on(tmp_path, monkeypatch):
    gc.enable()
    seen: list[bool] = []
    real = ingest_fast.new_message

    def spy(*a, **k):
        seen.append(gc.isenabled())
        return real(*a, **k)

    monkeypatch.setattr(ingest_fast, "new_message", spy)
    e = LCMEngine(config=LCMConfig.load({"store": str(tmp_path / "lcm.db"), "summarizer": "extractive"},
                                        read_file=False))
    e.on_session_start("g", platform="cli")
    msgs = coding_session(ingest_fast.LAZY_ROWS * 3, seed=2).messages
    e.ingest(msgs[:10], session_id="g")  # a small append: the collector is left alone
    assert seen and all(seen)
    seen.clear()
    e.ingest(msgs, session_id="g")
    assert len(seen) == len(msgs) - 10 and not any(seen)
    assert gc.isenabled()
    e.store.close()


def test_settle_collects_the_young_generation_only_during_a_pause():
    gc.enable()
    keep = []
    gc.collect()
    with gcpause.paused():
        keep.extend([{}] for _ in range(5 * gc.get_threshold()[0]))  # young, tracked, alive
        assert gc.get_count()[0] > gc.get_threshold()[0]
        gcpause.settle()
        assert gc.get_count()[0] < gc.get_threshold()[0], "the young generation was collected"
        assert not gc.isenabled()
    keep.extend([{}] for _ in range(50))
    before = gc.get_count()[0]
    gcpause.settle()  # not paused: the collector's own business
    assert gc.get_count()[0] >= before
