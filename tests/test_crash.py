"""SIGKILL at random moments: the store survives every crash, nothing lost, nothing leaked.

A child process (tests/support/engine_worker.py crash) replays a long generated coding
session into an engine with host-style compactions (64K window, small fresh tail, so a
pass runs every few turns). The parent kills it with SIGKILL after a random number of its
turns (1-12; one run in six in its start-up) and a random moment of up to 30 ms more, so
the number of kills a session allows does not depend on the machine's speed — at
least 50 times in a row on the SAME store file; each new child continues the same
session from the host's own records and re-feeds everything it may not have handed over
(which must not duplicate anything). After every kill:

* the database opens and ``PRAGMA integrity_check`` is ``ok``;
* ``lcm doctor`` finds nothing wrong except staged leftovers ("no stale staged work":
  staged work is invisible until committed, and the next pass drops it). Every stored
  message is reachable from a context or the DAG after every kill: new rows and the active
  context that names them are one transaction (tested alone at the end of this file);
* no published summary without sources;
* the stored messages are exactly the session's first N messages, byte-identical and in
  order (nothing corrupted, nothing duplicated), with N between what the host recorded
  as handed over and what it was about to hand over;
* no staged summary is visible to the tools (``lcm_grep`` over summaries,
  ``lcm_describe``).

Kills survived (and how many landed inside ``compress()`` or the start-up resync) are
written to ``test-artifacts/robustness-counts.json``.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import select
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from lossless_context import LCMEngine
from lossless_context.ops.doctor import run_doctor
from lossless_context.messages import safe_json
from lossless_context.demo.sessions import coding_session
from lossless_context.store import open_store
from tests.support.engine_worker import CRASH_SID, crash_config, host_state, last_attempted, resync
from tests.test_hostile_input import record_counts

WORKER = Path(__file__).resolve().parent / "support" / "engine_worker.py"
N_KILLS = 50
MAX_TURNS_PER_RUN = 12  # a child is killed after 1..12 turns of its own
SEED = int(os.environ.get("LCM_CRASH_SEED", "20261130"))
ALLOWED_DOCTOR_FAILURES = {"no stale staged work"}
REACHABILITY = "every message reachable from a context or the DAG"


def canon(m) -> str:
    return json.dumps(m, sort_keys=True)


def check_after_kill(workdir: Path, sess_json: list[str], stats: Counter) -> int:
    db = workdir / "lcm" / "lcm.db"
    con = sqlite3.connect(db)
    try:
        assert con.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        orphan_published = con.execute(
            "SELECT s.id FROM summaries s WHERE s.state='published'"
            " AND NOT EXISTS (SELECT 1 FROM summary_messages m WHERE m.summary_id=s.id)"
            " AND NOT EXISTS (SELECT 1 FROM summary_parents p WHERE p.parent_id=s.id)").fetchall()
        assert not orphan_published, f"published summaries without sources: {orphan_published[:5]}"
        staged = con.execute("SELECT id, text FROM summaries WHERE state='staged' ORDER BY id DESC LIMIT 4").fetchall()
    finally:
        con.close()

    store = open_store(str(db))
    try:
        rep = run_doctor(store)
        failed = {c.name: c for c in rep.checks if not c.ok}
        assert REACHABILITY not in failed, f"a kill left stored messages unreachable: {failed[REACHABILITY].detail}"
        bad = [c for c in failed.values() if c.name not in ALLOWED_DOCTOR_FAILURES]
        assert not bad, "doctor after a kill: " + "; ".join(f"{c.name}: {c.detail}" for c in bad)
        if failed:
            stats["kills_leaving_staged_work"] += 1

        rows = store.conn().execute("SELECT session_id, raw FROM messages ORDER BY id").fetchall()
    finally:
        store.close()
    assert {r[0] for r in rows} <= {CRASH_SID}
    n = len(rows)
    done, attempted = host_state(workdir)["fed"], last_attempted(workdir)
    assert done <= n <= max(attempted, done), f"{n} stored; host handed over {done}, was handing {attempted}"
    # Byte-identical and in order. The stored text is the engine's JSON of the message; when it
    # is not the exact string expected, compare canonically before calling it a mismatch.
    for i, (row, want) in enumerate(zip(rows, sess_json)):
        if row[1] != want:
            assert canon(json.loads(row[1])) == canon(json.loads(want)), (
                f"stored message {i} differs from the session's message {i}")

    # Staged summaries are invisible to the tools.
    if staged:
        stats["kills_with_staged_summaries"] += 1
        e = LCMEngine(config=crash_config(workdir))
        e.bind_session_state(None, CRASH_SID)
        try:
            for sid, text in staged:
                d = json.loads(e.handle_tool_call("lcm_describe", {"id": f"s{sid}"}))
                assert d.get("error", "").startswith("unknown id"), f"staged s{sid} visible: {d}"
                words = [w for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]{5,}", text)][:3]
                for w in words:
                    g = json.loads(e.handle_tool_call("lcm_grep", {"query": w, "scope": "summaries", "limit": 100}))
                    ids = {h["id"] for grp in g.get("groups", []) for h in grp["hits"]}
                    assert f"s{sid}" not in ids, f"lcm_grep returned staged summary s{sid}"
                    stats["staged_probes"] += 1
        finally:
            e.store.close()
    return n


def _turns_logged(workdir: Path) -> int:
    """Turns the children have started handing over so far (one "A" line each)."""
    try:
        return (workdir / "progress.log").read_bytes().count(b"A ")
    except FileNotFoundError:
        return 0


def test_sigkill_at_random_moments_on_one_store(tmp_path):
    rng = random.Random(SEED)
    workdir = tmp_path / "crash"
    workdir.mkdir()
    sess = coding_session(30_000, seed=77).messages
    turns = sum(1 for m in sess if m.get("role") == "user")
    # every kill uses at most MAX_TURNS_PER_RUN turns plus the ones run within `delay`
    assert turns > N_KILLS * (MAX_TURNS_PER_RUN + 15), turns
    with open(workdir / "session.pkl", "wb") as f:
        pickle.dump(sess, f)
    sess_json = [safe_json(m) for m in sess]
    stats: Counter = Counter()
    err = open(workdir / "child.err", "ab")
    t0 = time.monotonic()
    stored = 0
    try:
        while stats["kills"] < N_KILLS:
            proc = subprocess.Popen([sys.executable, str(WORKER), "crash", str(workdir)],
                                    stdout=subprocess.PIPE, stderr=err, cwd=str(Path(__file__).resolve().parents[1]))
            ready, _, _ = select.select([proc.stdout], [], [], 60)
            assert ready and proc.stdout.readline().strip() == b"READY", "child did not start"
            # Kill after a random number of the child's turns (and then a random moment
            # within the next one or so), not after a random time: how many kills a session
            # allows must not depend on how fast the machine replays it.
            base = _turns_logged(workdir)
            # (one run in six is killed in its start-up: the resync that re-feeds the host's list)
            target = base + (0 if rng.random() < 1 / 6 else rng.randint(1, MAX_TURNS_PER_RUN))
            delay = rng.uniform(0.0, 0.03)
            while proc.poll() is None and _turns_logged(workdir) < target:
                time.sleep(0.002)
            try:
                rc = proc.wait(timeout=delay)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
                stats["kills"] += 1
                last = (workdir / "status.log").read_bytes()[-1:] if (workdir / "status.log").exists() else b""
                stats["kills_inside_compress"] += last == b"C"
                stats["kills_inside_resync"] += last == b"R"
            else:
                out = proc.stdout.read().decode()
                assert rc == 0, f"child failed (rc={rc}): {(workdir / 'child.err').read_text()[-3000:]}"
                assert "DONE" in out
                stats["children_finished"] += 1
                break
            finally:
                proc.stdout.close()
            stored = check_after_kill(workdir, sess_json, stats)
            stats["compress_calls_started"] = (workdir / "status.log").read_text().count("C")
    finally:
        err.close()
    elapsed = time.monotonic() - t0
    # A last start-up, in-process and not killed: after its resync everything the host handed
    # over (or was about to) is stored exactly once and reachable.
    attempted = max(last_attempted(workdir), host_state(workdir)["fed"])
    engine, _host, _ = resync(workdir, sess)
    engine.store.close()
    final = check_after_kill(workdir, sess_json, stats)
    assert final == attempted, "the resync stores everything the previous children may not have, once"

    record_counts("crash", {**dict(stats), "messages_stored": final, "seconds": round(elapsed, 1), "seed": SEED})
    print(f"\ncrash: {dict(stats)}, {final} messages stored, {elapsed:.1f}s")
    assert stats["kills"] >= N_KILLS, "the session ended before enough kills; make it longer"
    assert stats["kills_inside_compress"] >= 3, "some kills must land inside a compaction"
    assert stored > 0


class _Killed(BaseException):
    """Stands for SIGKILL arriving at one exact point (not an Exception: nothing catches it)."""


def test_crash_between_storing_and_context_update_leaves_nothing_unreachable(tmp_path):
    from lossless_context.config import LCMConfig

    e = LCMEngine(config=LCMConfig.load({"store": str(tmp_path / "lcm.db"), "summarizer": "extractive"},
                                        read_file=False))
    e.on_session_start("s1")
    msgs = coding_session(40, seed=1).messages
    e.on_session_end("s1", msgs[:20])

    # New rows and the new active context are written in ONE transaction: a process that
    # dies right after that commit leaves nothing unreachable.
    real_append = e.store.append_messages

    def append_then_die(*a, **kw):
        real_append(*a, **kw)
        raise _Killed()

    e.store.append_messages = append_then_die
    with pytest.raises(_Killed):
        e.on_session_end("s1", msgs[:30])
    rep = run_doctor(open_store(str(tmp_path / "lcm.db")))
    assert all(c.ok for c in rep.checks if c.name == REACHABILITY), rep.render_text()
