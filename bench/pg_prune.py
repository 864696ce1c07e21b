"""Issue 43 on PostgreSQL: how long a host's calls wait while a large store is pruned — the
shape of `bench/lifecycle.py`'s prune part (SQLite), on a throw-away PostgreSQL server.

1. **The store** — `bench.scale build` of ``--engine-size`` messages through the engine on a
   server started with `tests/support/pg.py` (`PgServer`, fsync off as in the tests), then
   copied with SQL into sessions of their own lineage until it holds ``--prune-size``
   messages, each session given an age (400, 200, 120 or 30 days; `bench/lifecycle.py` AGES)
   and its messages' full-text rows copied with them (as `bench/pg_grow.py` does), then
   ``VACUUM ANALYZE``. That database is the template: every run prunes a fresh copy of it
   (``CREATE DATABASE … TEMPLATE``).
2. **A run** — one process plays the host on a live session (`bench.lifecycle host`: a turn
   stored and an `lcm_grep` every ~20 ms, each timed); after a baseline another process
   prunes with `lcm prune --older-than 90` semantics, timing each of the store's write
   transactions (from the pooled connection's checkout to the COMMIT done); the same
   baseline again after it.
3. **Before / after** — with ``--before-code`` (a checkout of the code before a change), runs
   alternate before, after, after, before… (ABBA); the prune process imports that checkout's
   ``lossless_context``, the host is this checkout's either way.

Reported per run, as for SQLite: the transactions' length p50 / p95 / max and how many went
over 100 ms, the host's write and grep p50 / p95 / p99 / max before, during and after the prune,
the prune's messages, seconds and throughput.

`python -m bench.pg_prune run --prune-size 100000 --engine-size 10000 --rounds 2
--before-code DIR --out F`
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

OLDER_THAN = 90
AGES = (400, 200, 120, 30)  # (bench/lifecycle.py's)
COLS = "seq, uid, ident, role, raw, text, tokens, created_at, supersedes, large, exploration"


def _server() -> Any:
    from tests.support.pg import PgServer, find_bindir

    bindir = find_bindir()
    if bindir is None:
        raise SystemExit("PostgreSQL server binaries not found (install postgresql or set LCM_PG_BINDIR)")
    srv = PgServer(bindir, shared_buffers="256MB")
    srv.start()
    return srv


def aged_copies(dsn: str, extra: int) -> dict[str, Any]:
    """Copy the engine-built sessions' messages (and their full-text rows) into new sessions,
    each a lineage of its own aged by one of AGES days."""
    import psycopg

    t0 = time.perf_counter()
    now, done, k, by_age = time.time(), 0, 0, {a: 0 for a in AGES}
    with psycopg.connect(dsn, autocommit=True) as c:
        real = [r[0] for r in c.execute("SELECT id FROM sessions WHERE id LIKE 'hist-%%' ORDER BY id")]
        while done < extra and real:
            for sid in real:
                if done >= extra:
                    break
                age = AGES[k % len(AGES)]
                k += 1
                new, shift = f"aged{k:04d}-{age}d", age * 86_400.0
                with c.transaction():
                    c.execute("INSERT INTO sessions(id, conversation_id, created_at, updated_at)"
                              " VALUES (%s, %s, %s, %s)", (new, new, now - shift, now - shift))
                    got = c.execute(
                        f"WITH copied AS (INSERT INTO messages(session_id, {COLS})"
                        f" SELECT %s, {COLS.replace('created_at', 'LEAST(created_at, %s) - %s')} FROM messages"
                        " WHERE session_id = %s ORDER BY seq LIMIT %s RETURNING id, seq),"
                        " indexed AS (INSERT INTO message_index(id, session_id, tsv, cjk)"
                        " SELECT copied.id, %s, x.tsv, x.cjk FROM copied"
                        " JOIN messages s ON s.session_id = %s AND s.seq = copied.seq"
                        " JOIN message_index x ON x.id = s.id RETURNING id)"
                        " SELECT (SELECT count(*) FROM copied), (SELECT count(*) FROM indexed)",
                        (new, now, shift, sid, extra - done, new, sid)).fetchone()
                    c.execute("DELETE FROM message_index_pending p USING message_index x WHERE x.id = p.message_id")
                done += got[0]
                by_age[age] += got[0]
        c.execute("VACUUM ANALYZE")
        total = c.execute("SELECT count(*) FROM messages").fetchone()[0]
    return {"copied": done, "sessions": k, "messages_by_age_days": by_age, "n_stored": total,
            "seconds": round(time.perf_counter() - t0, 1)}


def prune_worker(dsn: str, out: str) -> None:
    """The prune, each of the store's write transactions timed (run in a process of its own:
    ``lossless_context`` may come from another checkout)."""
    import lossless_context
    from lossless_context.ops import retention
    from lossless_context.store import open_store

    st = open_store(dsn)
    held: list[float] = []
    real = st._write  # type: ignore[attr-defined]

    def timed(fn: Any, seconds: float | None = None) -> Any:
        t = time.perf_counter()
        try:
            return real(fn, seconds)
        finally:
            held.append((time.perf_counter() - t) * 1000)

    st._write = timed  # type: ignore[attr-defined]
    t0 = time.perf_counter()
    plan = retention.plan_prune(st, older_than_days=OLDER_THAN)
    plan_s = time.perf_counter() - t0
    t1 = time.time()
    rep = retention.prune(st, plan, trigger="bench")
    ended = time.time()
    st.close()
    from bench import common

    log = getattr(rep, "batch_log", None)
    Path(out).write_text(json.dumps({
        "code": str(Path(lossless_context.__file__).parent.parent), "plan_seconds": round(plan_s, 2),
        "started": t1, "ended": ended,
        "tx_ms": {**common.dist(held, 1), "p95": round(common.percentile(held, 95) or 0, 1),
                  "max": round(max(held), 1) if held else None, "over_100ms": sum(1 for h in held if h > 100),
                  "count": len(held)},
        "stopped_at_deadline": getattr(log, "stopped", None),
        "slowest_batches": sorted(getattr(log, "batches", []), key=lambda b: -b[2])[:6],
        "messages": rep.messages, "sessions": rep.sessions, "seconds": round(rep.seconds, 1),
        "msgs_per_s": round(rep.messages / max(rep.seconds, 1e-9)),
    }, default=str), encoding="utf-8")


def _dist(rows: list[tuple[float, str, float]], op: str, lo: float, hi: float) -> dict[str, Any]:
    from bench import common

    vals = [ms for t, o, ms in rows if o == op and lo <= t <= hi]
    d = common.dist(vals, 1)
    for q in (95, 99):
        d[f"p{q}"] = round(common.percentile(vals, q), 1) if vals else None
    d["max"] = round(max(vals), 1) if vals else None
    d["over_100ms"] = sum(1 for v in vals if v > 100)
    d["n"] = len(vals)
    return d


def one_run(srv: Any, template: str, code: str | None, baseline_s: float, work: Path) -> dict[str, Any]:
    name = f"prune_{uuid.uuid4().hex[:12]}"
    srv.admin(f"CREATE DATABASE {name} TEMPLATE {template} STRATEGY = FILE_COPY")
    dsn = srv.dsn(name)
    tag = f"{name}-{os.getpid()}"
    host_out, prune_out, stop = work / f"{tag}.host.json", work / f"{tag}.prune.json", work / f"{tag}.stop"
    root = Path(__file__).resolve().parent.parent
    host = subprocess.Popen([sys.executable, "-m", "bench.lifecycle", "host", "--store", dsn, "--out", str(host_out),
                             "--stop", str(stop), "--seconds", "7200"], cwd=root)
    try:
        time.sleep(5)  # (its engine open, its first turns stored)
        t_base = time.time()
        time.sleep(baseline_s)
        t_prune = time.time()
        cmd = [sys.executable, "-m", "bench.pg_prune", "prune", "--store", dsn, "--out", str(prune_out)]
        r = subprocess.run(cmd + (["--code", code] if code else []), cwd=root, capture_output=True, text=True,
                           timeout=7200)
        t_end = time.time()
        time.sleep(baseline_s)
        t_after = time.time()
    finally:
        stop.write_text("stop")
        host.wait(timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"prune failed: {r.stderr[-3000:]}")
    rows = [tuple(x) for x in json.loads(host_out.read_text())]
    pr = json.loads(prune_out.read_text())
    for p in (host_out, prune_out, stop):
        p.unlink(missing_ok=True)
    srv.drop_database(name)
    return {"prune": pr, "host": {
        "before": {op: _dist(rows, op, t_base, t_prune) for op in ("write", "grep")},  # type: ignore[arg-type]
        "during": {op: _dist(rows, op, pr["started"], pr["ended"]) for op in ("write", "grep")},  # type: ignore[arg-type]
        "after": {op: _dist(rows, op, t_end, t_after) for op in ("write", "grep")}}}  # type: ignore[arg-type]


def run(n: int, engine_n: int, before_code: str | None, rounds: int, baseline_s: float) -> dict[str, Any]:
    from bench import common
    from bench.scale import worker

    work = Path(common.isolate_env()) / "pg_prune"
    work.mkdir(parents=True, exist_ok=True)
    srv = _server()
    try:
        template = srv.create_database("base")
        dsn = srv.dsn(template)
        b = worker(["build", "--store", dsn, "--n", str(engine_n)], 7200)
        copies = aged_copies(dsn, max(0, n - int(b["n_stored"])))
        print(json.dumps({"built": b.get("n_stored"), "copies": copies}), flush=True)
        order: list[tuple[str, str | None]] = [("before", before_code), ("after", None)] if before_code else [
            ("after", None)]
        runs = []
        for k in range(rounds):
            for label, code in (order if k % 2 == 0 else order[::-1]):
                r = one_run(srv, template, code, baseline_s, work)
                r["code"] = label
                runs.append(r)
                print(json.dumps(r, default=str), flush=True)
        return {"n": copies["n_stored"], "engine_built": b.get("n_stored"), "copies": copies, "runs": runs,
                "machine": common.machine_info()}
    finally:
        srv.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.pg_prune")
    ap.add_argument("mode", choices=["run", "prune"])
    ap.add_argument("--store")
    ap.add_argument("--out", required=True)
    ap.add_argument("--code", help="prune: import lossless_context from this checkout")
    ap.add_argument("--before-code", help="run: a checkout of the code before the change (ABBA)")
    ap.add_argument("--prune-size", type=int, default=100_000)
    ap.add_argument("--engine-size", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--baseline-seconds", type=float, default=20.0)
    a = ap.parse_args(argv)
    if a.code:  # (before anything imports lossless_context)
        sys.path.insert(0, os.path.abspath(a.code))
    from bench import common

    common.isolate_env()
    common.quiet_logs()
    if a.mode == "prune":
        prune_worker(a.store, a.out)
    else:
        res = run(a.prune_size, a.engine_size, a.before_code, a.rounds, a.baseline_seconds)
        Path(a.out).write_text(json.dumps({"pg_prune": res}, indent=1, default=str), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
