"""Issue #21: a gateway under load on one PostgreSQL server, and a server restart mid-session.

Load: 4 processes × 8 threads, 64 sessions in all, every session compacting in a small window
(tests/support/gateway_worker.py); then the store is checked against what each session sent:
no error reached the host, every message stored exactly once and byte for byte, every lineage
isolated. Restart: the test's own server is stopped under a live engine and started again.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path


from lossless_context import LCMEngine
from lossless_context.pipeline.validate import pairing_problems
from lossless_context.config import LCMConfig
from lossless_context.store import open_store
from tests.support.pg import start_server

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "support" / "gateway_worker.py"
PROCS, THREADS, PER_THREAD, TURNS = 4, 8, 2, 24
MARK = re.compile(r"^MK-(\S+)-(\d{4}) ")


def test_gateway_four_processes_eight_threads_sixty_four_sessions(pg_fresh_dsn, tmp_path):
    open_store(pg_fresh_dsn).close()  # migrate once (the workers would race to, harmlessly)
    procs = [subprocess.Popen([sys.executable, str(WORKER), pg_fresh_dsn, str(p), str(THREADS), str(PER_THREAD),
                               str(TURNS), str(tmp_path / f"w{p}.json")], cwd=str(ROOT),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for p in range(PROCS)]
    results = {}
    for p, proc in enumerate(procs):
        out, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, err[-3000:]
        data = json.loads((tmp_path / f"w{p}.json").read_text())
        assert data["failures"] == [], data["failures"]
        results.update(data["sessions"])
    assert len(results) == PROCS * THREADS * PER_THREAD == 64

    errors = {sid: r["errors"] for sid, r in results.items() if r["errors"]}
    assert errors == {}, errors  # nothing reached the host
    assert all(r["passes"] >= 1 for r in results.values()), "every session compacted"

    store = open_store(pg_fresh_dsn)
    try:
        stored: dict[str, Counter] = {sid: Counter() for sid in results}
        texts: dict[str, str] = {}
        for sid in results:
            after = -1
            while True:
                batch = store.session_messages(sid, after_seq=after, limit=1000)
                if not batch:
                    break
                for m in batch:
                    found = MARK.match(m.raw.get("content") or "")
                    assert found, m.raw  # only what the host sent: no summary block, no stub
                    assert found.group(1) == sid, (sid, found.group(1))  # never in another session
                    stored[sid][found.group(0).strip()] += 1
                    texts[found.group(0).strip()] = m.raw["content"]
                after = batch[-1].seq
        for sid, r in results.items():
            sent = Counter(r["sent"])
            assert stored[sid] == sent, (sid, sent - stored[sid], stored[sid] - sent)  # none lost, none twice
        # byte for byte: the text is what the worker built
        from tests.support.gateway_worker import FILLER

        for mk, text in list(texts.items())[:500]:
            assert text.endswith(FILLER) and text.startswith(mk + " ")

        # every lineage isolated: a session's search never finds another session's messages
        sids = sorted(results)
        for a, b in [(sids[0], sids[-1]), (sids[5], sids[40]), (sids[63], sids[1])]:
            e = LCMEngine(config=LCMConfig.load({"store": pg_fresh_dsn}, read_file=False))
            e.bind_session_state(None, a)
            own = json.loads(e.handle_tool_call("lcm_grep", {"query": f"MK-{a}-0001"}))
            other = json.loads(e.handle_tool_call("lcm_grep", {"query": f"MK-{b}-0001"}))
            assert own.get("groups"), own
            assert not other.get("groups"), other
    finally:
        store.close()


def _turn(host: list, n: int) -> None:
    host.append({"role": "user", "content": f"RS-{n:03d} question " + "about the restart " * 60})
    host.append({"role": "assistant", "content": f"RS-{n:03d} answer " + "noted and done " * 60})


def test_server_restart_mid_session(tmp_path, caplog):
    server = start_server()  # its own server: the shared one must keep running for other tests
    try:
        dsn = server.dsn(server.create_database("restart"))
        e = LCMEngine(config=LCMConfig.load({"store": dsn, "store_retry_seconds": 0}, read_file=False))
        e.update_model(model="m", context_length=16_000, base_url="http://127.0.0.1:9/v1", api_key="k",
                       provider="custom", api_mode="chat_completions")
        e.bind_session_state(None, "rs")
        e.on_session_start("rs", platform="cli", model="m", context_length=16_000)
        host: list = []
        n = 0
        while not e.should_compress(sum(len(str(m)) for m in host) // 4):
            _turn(host, n)
            n += 1
        out = e.compress(list(host))
        assert out != host and not pairing_problems(out)
        e.on_session_end("rs", host)
        e.on_session_start("rs", boundary_reason="compression", old_session_id="rs", platform="cli")
        host = [m for m in out if m.get("role") != "system"]
        acknowledged = n  # every RS- marker so far was stored by a committed pass
        # (the background worker has upgraded the pass's outlines: no job of it meets the outage,
        # whose one line the passes below must say)
        assert e.wait_background(60)

        server.pause()  # pg_ctl stop -m fast: connections are cut
        caplog.set_level(logging.WARNING, logger="lossless_context")
        caplog.clear()
        for _ in range(3):  # passes while the server is down fail open: the host's list back unchanged
            _turn(host, n)
            n += 1
            got = e.compress(list(host))
            assert got == host, "while the store is down the host's list comes back unchanged" \
                if not pairing_problems(got) else pairing_problems(got)
        # our log says it once, not once per call (store_retry_seconds 0 makes every call probe
        # the server here; psycopg's pool logs each of those connection attempts itself)
        ours = [r.getMessage() for r in caplog.records if r.name.startswith("lossless_context")]
        assert len([m for m in ours if "unavailable" in m]) == 1, ours

        server.resume()  # same port, same data directory
        _turn(host, n)
        n += 1
        again = e.compress(list(host))  # the engine reconnects by itself
        assert not pairing_problems(again)
        e.on_session_end("rs", host)
        st = e.get_status()
        assert not st.get("lcm_store_error"), st.get("lcm_store_error")
        ours = [r.getMessage() for r in caplog.records if r.name.startswith("lossless_context")]
        assert len([m for m in ours if "usable again" in m]) == 1, ours
        s = open_store(dsn)
        try:
            seen = {re.match(r"RS-(\d{3})", m.raw.get("content") or "").group(1)
                    for m in s.session_messages("rs", limit=10_000)}
        finally:
            s.close()
        assert {f"{i:03d}" for i in range(acknowledged)} <= seen  # nothing acknowledged was lost
        assert {f"{i:03d}" for i in range(n)} == seen  # and the turns said while it was down came back
    finally:
        server.stop()
