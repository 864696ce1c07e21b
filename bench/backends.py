"""SQLite vs PostgreSQL: the same build and measurement (`bench.scale` workers) on both backends.

Workload: the scale benchmark's history (N "mixed" messages; full: 100,000, quick: 5,000)
ingested through `engine.ingest()`, then compaction passes and `lcm_grep` with the live
session's lineage spanning the whole history. The PostgreSQL server is a throw-away cluster
started with `tests/support/pg.py` (`PgServer`, fsync off — as in the tests). Reported: each
backend's figures and the PostgreSQL/SQLite ratio (> 1 = PostgreSQL slower / bigger).

PostgreSQL's build runs under a time budget; if it stops early, SQLite is rebuilt on exactly
the same messages (the same deterministic stream, cut at the same count) so the comparison
stays like for like, and the report says so. When the scale benchmark already built SQLite at
N with the same stream, that point is reused instead of building it again.

Full runs then grow the PostgreSQL store to 1,000,000 messages by SQL replication
(`bench/pg_grow.py`: the real sessions copied, their index rows with them) and measure it
again: the large point of issue #21 (`lcm_grep` text p50 < 50 ms at 1M). Last, a gateway's
store on both backends (`bench/gateway.py`: many users' compacted histories, one user's
searches against that user's history alone).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from . import common
from . import gateway as gw
from .scale import worker

COMPARE = [
    ("ingest msgs/s", "build.ingest.msgs_per_s", "higher"),
    ("ingest, all-new batch msgs/s (p50)", "build.ingest.all_new_batch_msgs_per_s.p50", "higher"),
    ("re-align msgs/s", "build.ingest.realign_msgs_per_s", "higher"),
    ("compress() engine ms p50", "measure.compress.engine_ms.p50", "lower"),
    ("compress() engine ms p95", "measure.compress.engine_ms.p95", "lower"),
    ("compress() engine ms p50, compacting passes", "measure.compress.compacting_engine_ms.p50", "lower"),
    ("compress() wall ms p50", "measure.compress.wall_ms.p50", "lower"),
    ("lcm_grep text ms p50", "measure.lcm_grep.text.ms.p50", "lower"),
    ("lcm_grep identifier ms p50", "measure.lcm_grep.identifier.ms.p50", "lower"),
    ("lcm_grep CJK substring ms p50", "measure.lcm_grep.cjk_substring.ms.p50", "lower"),
    ("lcm_grep common identifier ms p50", "measure.lcm_grep.identifier_common.ms.p50", "lower"),
    ("lcm_expand ms p50", "measure.lcm_expand.ms.p50", "lower"),
    # (the row above mixes 30 messages and ~20 summaries: its p50 is a message's)
    ("lcm_expand message ms p50", "measure.lcm_expand.message_ms.p50", "lower"),
    ("lcm_expand summary ms p50", "measure.lcm_expand.summary_ms.p50", "lower"),
    ("select_context cached ms p50", "measure.select_context.cached_ms.p50", "lower"),
    ("store bytes per 1k messages", "build.bytes_per_1k_messages", "lower"),
]


SHARED_BUFFERS = "2GB"


def _pg_server() -> tuple[Any, str | None]:
    """(server, reason-if-unavailable). Reuses tests/support/pg.py without its pytest skips."""
    try:
        from tests.support import pg as pgsupport
    except Exception as exc:  # the fixture module is missing or broken
        return None, f"tests/support/pg.py not importable: {type(exc).__name__}: {exc}"
    if not hasattr(pgsupport, "PgServer") or not hasattr(pgsupport, "find_bindir"):
        return None, "tests/support/pg.py has no PgServer/find_bindir"
    bindir = pgsupport.find_bindir()
    if bindir is None:
        return None, "PostgreSQL server binaries not found (install postgresql or set LCM_PG_BINDIR)"
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError as exc:
        return None, f"psycopg 3 / psycopg-pool missing: {exc}"
    try:
        from lossless_context.store.postgres.store import PostgresStore  # noqa: F401
    except Exception as exc:
        return None, f"lossless_context.store.postgres.store not importable: {type(exc).__name__}: {exc}"
    # shared_buffers sized for the 1M-message store (~3 GB), as a gateway's server would be:
    # the test servers' 32 MB makes every search read the same pages from the OS again
    srv = pgsupport.PgServer(bindir, shared_buffers=SHARED_BUFFERS)
    try:
        srv.start()
    except Exception as exc:
        srv.stop()
        return None, f"could not start PostgreSQL from {bindir}: {exc}"
    return srv, None


def run(cfg: dict[str, Any], scale_result: dict[str, Any] | None = None) -> dict[str, Any]:
    quick = cfg["quick"]
    n = cfg.get("backend_messages") or (5_000 if quick else 100_000)
    budget = cfg.get("pg_budget") or (90.0 if quick else 420.0)
    passes = 10 if quick else 40
    reps = 5 if quick else 15
    srv, why = _pg_server()
    if srv is None:
        print(f"  backends: skipped — {why}", flush=True)
        return {"skipped": True, "reason": why, "n_requested": n}
    work = Path(common.isolate_env()) / "backends"
    work.mkdir(parents=True, exist_ok=True)
    try:
        dsn = srv.dsn(srv.create_database("bench"))
        t0 = time.perf_counter()
        pg_b = worker(["build", "--store", dsn, "--n", str(n), "--deadline", str(budget)], 7200)
        pg_b["wall_seconds"] = round(time.perf_counter() - t0, 1)
        # Measured on a settled store, as autovacuum leaves it a while after a large import
        # (otherwise its vacuum of the new rows may run during the measurement, on the same cores).
        pg_b["vacuum_analyze_seconds"] = common.settle_postgres(dsn)
        pg_m = worker(["measure", "--store", dsn, "--n", str(pg_b["n_stored"]), "--passes", str(passes),
                       "--reps", str(reps), "--identifier", pg_b["identifier"]], 3600)
        large = cfg.get("pg_large", 2 * n if quick else 1_000_000)  # quick: the path, not the size
        pg_large = None
        if large and large > pg_b["n_stored"] and not pg_b.get("stopped_early"):
            # the 1M point: the same store grown by SQL replication (index rows copied),
            # measured from a session of its own in the same conversation (the 100k measurement's
            # session id again would be a host replaying that session: ingest_replay.py)
            grown = _grow(dsn, large)
            pg_large = {"grow": grown, "measure": worker(
                ["measure", "--store", dsn, "--n", str(grown["n_stored"]), "--passes", str(max(5, passes // 4)),
                 "--reps", str(reps), "--identifier", pg_b["identifier"], "--session", "live-1m"], 3600)}
        # a gateway's store: many users' compacted histories, one user's searches (bench/gateway.py)
        gateway = {}
        try:
            gateway["postgresql"] = gw.run("postgresql", lambda name: srv.dsn(srv.create_database(f"gw_{name}")),
                                           quick=quick)
            gateway["sqlite"] = gw.run("sqlite", lambda name: str(work / f"gw-{name}.db"), quick=quick)
        except Exception as exc:  # reported, not fatal to the comparison above
            gateway["error"] = f"{type(exc).__name__}: {exc}"
        try:
            import psycopg

            with psycopg.connect(dsn, autocommit=True) as c:
                server_version = c.execute("SHOW server_version").fetchone()[0]
                # the floor under every PostgreSQL row: one statement's round trip on loopback
                trips = []
                for _ in range(500):
                    t0 = time.perf_counter()
                    c.execute("SELECT 1").fetchone()
                    trips.append((time.perf_counter() - t0) * 1000)
                round_trip = common.dist(trips, 4)
                # and after 2 ms idle, as a request pays it between tool calls: on a virtual
                # machine an idle core's wake-up makes this several times the back-to-back one
                trips = []
                for _ in range(300):
                    time.sleep(0.002)
                    t0 = time.perf_counter()
                    c.execute("SELECT 1").fetchone()
                    trips.append((time.perf_counter() - t0) * 1000)
                round_trip_idle = common.dist(trips, 4)
        except Exception:
            server_version = None
            round_trip = round_trip_idle = None
    finally:
        srv.stop()
    n_pg = pg_b["n_stored"]
    sqlite = None
    reused = False
    if scale_result and not pg_b.get("stopped_early"):
        for p in scale_result.get("points", []):
            if p["n"] == n and p["build"]["n_stored"] == n_pg and not p["build"]["n_replicated"]:
                sqlite, reused = {"build": p["build"], "measure": p["measure"]}, True
    if sqlite is None:
        store = str(work / "backends.db")
        sb = worker(["build", "--store", store, "--n", str(n), "--limit", str(n_pg)], 7200)
        sm = worker(["measure", "--store", store, "--n", str(sb["n_stored"]), "--passes", str(passes),
                     "--reps", str(reps), "--identifier", sb["identifier"]], 3600)
        sqlite = {"build": sb, "measure": sm}
        for suf in ("", "-wal", "-shm", ".meta.json"):
            Path(store + suf).unlink(missing_ok=True)
    pg = {"build": pg_b, "measure": pg_m}
    rows = []
    for label, path, better in COMPARE:
        a, b = common.get_path(sqlite, path), common.get_path(pg, path)
        ratio = round(b / a, 3) if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a else None
        rows.append({"metric": label, "sqlite": a, "postgresql": b, "ratio_pg_over_sqlite": ratio, "better": better})
    print(f"  backends: PostgreSQL {n_pg:,} messages (requested {n:,}); SQLite "
          f"{'reused from scale' if reused else 'built'}", flush=True)
    return {"skipped": False, "n_requested": n, "n_compared": n_pg, "pg_stopped_early": pg_b.get("stopped_early"),
            "pg_budget_seconds": budget, "sqlite_reused_from_scale": reused, "postgres_version": server_version,
            "shared_buffers": SHARED_BUFFERS, "round_trip_ms": round_trip, "round_trip_after_idle_ms": round_trip_idle,
            "rows": rows, "sqlite": sqlite, "postgresql": pg, "postgresql_large": pg_large, "gateway": gateway}


def _grow(dsn: str, n: int) -> dict[str, Any]:
    import json
    import subprocess
    import sys

    out = Path(common.isolate_env()) / f"pg-grow-{time.time_ns()}.json"
    r = subprocess.run([sys.executable, "-m", "bench.pg_grow", "--store", dsn, "--n", str(n), "--out", str(out)],
                       cwd=common.ROOT, capture_output=True, text=True, timeout=7200)
    if r.returncode != 0:
        raise RuntimeError(f"pg_grow failed ({r.returncode}):\n{r.stderr[-4000:]}")
    data = json.loads(out.read_text())
    out.unlink()
    return data
