"""Closing a store stops its stub preparer first (stub_prep.py).

The preparer's thread reads and writes through the store's connections; closing the store
closes them. A batch still under way on a connection closed beneath it crashed the whole
process (a segfault in the suite). The store's close now stops the preparer, waiting for the
batch under way, so nothing touches the store after its close begins.
"""

from __future__ import annotations

import json
import threading

from lossless_context import LCMEngine
from lossless_context.config import LCMConfig
from lossless_context.demo.host_driver import R19Host
from lossless_context.pipeline import stub_prep, stubs


def _turn(i: int) -> list[dict]:
    cid = f"call_{i}"
    out = "\n".join(f"{i:03d}-{n:04d} compiled pkg/mod_{n}.py" for n in range(200))
    return [
        {"role": "user", "content": f"Step {i}."},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": cid, "type": "function", "function": {"name": "terminal",
                                                          "arguments": json.dumps({"command": f"make {i}"})}}]},
        {"role": "tool", "tool_call_id": cid, "content": out},
        {"role": "assistant", "content": f"Built {i}."},
    ]


def test_closing_the_store_stops_its_preparer_before_the_connections_close(tmp_path):
    e = LCMEngine(config=LCMConfig.load({"store": str(tmp_path / "c.db"), "summarizer": "extractive"},
                                        read_file=False))
    host = R19Host(e, "close", context_length=64_000)
    host.start()
    prep = None
    with stub_prep.pass_running():  # a pass in flight: the preparer waits for it with its batch
        for i in range(4):
            host.add(*_turn(i))
        e.ingest(host.messages, "close")
        prep = stub_prep.StubPreparer.for_store(e.store.location, e.store, stubs.stub_policy(e.config))
        assert prep.backlog > 0
        closed = threading.Event()
        t = threading.Thread(target=lambda: (e.store.close(), closed.set()), daemon=True)
        t.start()
        assert closed.wait(60)  # the close does not wait for the pass, only for the batch to give up
    t.join(60)
    assert prep.stopped
    assert prep.wait_idle(60)
    assert prep.prepared == 0  # nothing read or written through the closed store
    # the next engine on this location gets a new preparer, not the stopped one
    assert stub_prep.StubPreparer.for_store(e.store.location, e.store, stubs.stub_policy(e.config)) is not prep
    e.store.close()
