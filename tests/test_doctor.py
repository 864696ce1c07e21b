"""`lcm doctor` on both backends: a healthy store passes; an unreachable message and stale
staged work are found and repaired without deleting user data."""

from __future__ import annotations

import pytest

from lossless_context import LCMEngine
from lossless_context.config import LCMConfig
from lossless_context.doctor import run_doctor
from lossless_context.ingest import new_message
from lossless_context.records import NewSummary
from lossless_context.sessions import coding_session, turn_ranges
from tests.support.hostsim import HostSim


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_doctor_finds_and_repairs(tmp_path, request, backend):
    location = request.getfixturevalue("pg_fresh_dsn") if backend == "postgres" else str(tmp_path / "l.db")
    e = LCMEngine(config=LCMConfig.load({"store": location, "summarizer": "extractive"}, read_file=False))
    host = HostSim(e)
    host.start(context_length=64_000)
    msgs = coding_session(600, seed=8).messages
    for a, b in turn_ranges(msgs):
        host.add(*msgs[a:b])
        host.maybe_compress()
    host.end()
    assert host.compactions >= 1
    rep = run_doctor(e.store)
    assert rep.ok, rep.render_text()

    # a stored message outside every context and summary, and a stage left by a dead process
    [orphan] = e.store.append_messages(host.session_id, [new_message({"role": "user", "content": "stray"}, 25_000, 600)])
    version, ctx = e.store.get_context(host.session_id)
    e.store.stage_pass(host.session_id, "dead-pass", [NewSummary("k", "leaf", 0, "x", 1, 1, "deterministic",
                       "extractive", None, None, 1, message_ids=[orphan])], [("s", "k")], version, len(ctx))
    # a fresh stage covers the orphan: reachable (its pass may still be committed)
    assert run_doctor(e.store).ok
    e.store.discard_pass("dead-pass")
    rep = run_doctor(e.store)
    assert not rep.ok and "unreachable" in rep.render_text()
    rep = run_doctor(e.store, repair=True)
    assert rep.ok, rep.render_text()
    assert run_doctor(e.store).ok
    assert e.store.get_messages([orphan])[orphan].raw == {"role": "user", "content": "stray"}
