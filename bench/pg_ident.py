"""PostgreSQL identifiers (issue 41): `lcm_grep` of snake_case / kebab-case identifiers before and
after migration 033 (identifiers indexed as whole lexemes), at 100k and 1M messages.

The stores are the backends bench's history (`bench.scale build`: mixed sessions, planted
identifiers and CJK), built once with the baseline commit's code and kept in a PostgreSQL
cluster of their own under ``$LCM_BENCH_DATA/pg-ident`` (default ``~/.cache/lcm-bench``): the
1M store is the 100k one grown by SQL replication (`bench/pg_grow.py`). Each run copies a kept
store twice (``CREATE DATABASE … TEMPLATE``): one copy is measured with the baseline's code
(*before*), the other is opened by this tree's code — which runs the new migration and then
indexes the identifier lexemes of the rows already there — and measured (*after*), by the scale
bench's `measure` worker in both cases (text / identifier / common identifier / CJK / expand).

Ingest: the same 20,000 messages appended to fresh databases by each code (all-new batches on
the commit path, and until indexed), and SQLite's all-new batch rate on this tree for the
commit path's ×0.5 goal; plus the indexer's own cost, `lcm_tsvector` over those texts in SQL.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from . import common
from .pass_cost import BASELINE, _baseline_code

SIZES = (100_000, 1_000_000)


def data_dir() -> Path:
    return Path(os.environ.get("LCM_BENCH_DATA") or Path.home() / ".cache" / "lcm-bench") / "pg-ident"


class KeptCluster:
    """A PostgreSQL cluster whose data directory stays across runs (tests/support/pg.py's
    PgServer, pointed at a directory of ours)."""

    def __init__(self, root: Path) -> None:
        from tests.support import pg as pgsupport

        bindir = pgsupport.find_bindir()
        if bindir is None:
            raise RuntimeError("PostgreSQL server binaries not found")
        self.srv = pgsupport.PgServer(bindir, shared_buffers="2GB")
        shutil.rmtree(self.srv.base, ignore_errors=True)
        self.srv.base, self.srv.data, self.srv.log = root, root / "data", root / "server.log"
        root.mkdir(parents=True, exist_ok=True)
        if self.srv.user:
            import pwd

            pw = pwd.getpwnam(self.srv.user)
            os.chown(root, pw.pw_uid, pw.pw_gid)
        os.chmod(root, 0o700)

    def start(self) -> None:
        import socket

        s = self.srv
        if not (s.data / "PG_VERSION").exists():
            s.start()
            atexit.unregister(s.stop)  # (the test suite's server deletes its directory at exit)
            return
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            s.port = int(sock.getsockname()[1])
        s._opts = (f"-c listen_addresses=127.0.0.1 -p {s.port} -k {s.base} -c fsync=off"
                   " -c synchronous_commit=off -c full_page_writes=off -c max_connections=300"
                   f" -c shared_buffers={s.shared_buffers}")
        s._run(str(s.bindir / "pg_ctl"), "-D", str(s.data), "-m", "immediate", "-w", "stop")
        s.resume()
        s.started = True

    def stop(self) -> None:
        s = self.srv
        if s.started:
            s.started = False
            s._run(str(s.bindir / "pg_ctl"), "-D", str(s.data), "-m", "fast", "-w", "stop", timeout=300)

    def exists(self, name: str) -> bool:
        import psycopg

        with psycopg.connect(self.srv.dsn("postgres"), autocommit=True, connect_timeout=10) as c:
            return c.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is not None

    def copy(self, src: str, dst: str) -> tuple[str, float]:
        """A fresh copy of database `src` named `dst` (its DSN, seconds)."""
        import psycopg

        t0 = time.perf_counter()
        with psycopg.connect(self.srv.dsn("postgres"), autocommit=True, connect_timeout=10) as c:
            c.execute(f"DROP DATABASE IF EXISTS {dst} WITH (FORCE)")
            c.execute(f"CREATE DATABASE {dst} TEMPLATE {src}")
        return self.srv.dsn(dst), time.perf_counter() - t0

    def drop(self, name: str) -> None:
        import psycopg

        with psycopg.connect(self.srv.dsn("postgres"), autocommit=True, connect_timeout=10) as c:
            c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def create(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.srv.dsn("postgres"), autocommit=True, connect_timeout=10) as c:
            c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            c.execute(f"CREATE DATABASE {name} TEMPLATE template0")
        return self.srv.dsn(name)


def _scale(code: Path | None, args: list[str], timeout: float = 7200) -> dict[str, Any]:
    """`bench.scale` as a child process on `code` (None: this tree)."""
    return _child(code, "bench.scale", args, timeout)


def _child(code: Path | None, module: str, args: list[str], timeout: float = 7200) -> dict[str, Any]:
    """`python -m module args` as a child process running `code`'s lossless_context (None: this tree)."""
    import subprocess
    import sys

    out = Path(common.isolate_env()) / f"pg-ident-{os.getpid()}-{time.time_ns()}.json"
    boot = ("import sys, runpy; import bench.common; "
            + (f"sys.path.insert(0, {str(code)!r}); " if code is not None else "")
            + f"sys.argv = ['{module}'] + sys.argv[1:]; runpy.run_module('{module}', run_name='__main__')")
    r = subprocess.run([sys.executable, "-c", boot, *args, "--out", str(out)], cwd=common.ROOT,
                       capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"scale {' '.join(args[:1])} failed ({r.returncode}):\n{r.stderr[-4000:]}")
    data = json.loads(out.read_text())
    out.unlink()
    return data


def _kept(cl: KeptCluster, base: Path, n: int, meta: Path) -> dict[str, Any]:
    """The kept store of `n` messages (built now, with the baseline's code, when missing)."""
    name = f"ident_{n // 1000}k"
    if cl.exists(name) and meta.exists():
        return json.loads(meta.read_text())
    if n <= SIZES[0]:
        dsn = cl.create(name)
        info = _scale(base, ["build", "--store", dsn, "--n", str(n)])
    else:
        small = _kept(cl, base, SIZES[0], meta.with_name(f"ident_{SIZES[0] // 1000}k.json"))
        dsn, _ = cl.copy(f"ident_{SIZES[0] // 1000}k", name)
        # (grown by the baseline's code too: the kept store never sees this tree's migrations)
        info = dict(small, grow=_child(base, "bench.pg_grow", ["--store", dsn, "--n", str(n)]))
    common.settle_postgres(dsn)
    meta.write_text(json.dumps(info))
    return info


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    if cfg.get("quick"):
        return {"skipped": True, "reason": "full runs only (kept stores of 100k and 1M messages)"}
    sizes = cfg.get("pg_ident_sizes") or list(SIZES)
    work = Path(common.isolate_env()) / "pg_ident"
    work.mkdir(parents=True, exist_ok=True)
    base = _baseline_code(cfg.get("baseline", BASELINE), work)
    if base is None:
        return {"skipped": True, "reason": "git cannot extract the baseline code"}
    root = data_dir()
    cl = KeptCluster(root)
    cl.start()
    out: dict[str, Any] = {"baseline": cfg.get("baseline", BASELINE), "data": str(root), "points": []}
    try:
        for n in sizes:
            info = _kept(cl, base, n, root / f"ident_{n // 1000}k.json")
            point: dict[str, Any] = {"n": n, "identifier": info["identifier"]}
            for label, code in (("before", base), ("after", None)):
                dsn, copy_s = cl.copy(f"ident_{n // 1000}k", f"ident_run_{label}")
                point[f"{label}_open"] = _child(code, "bench.pg_ident", ["open", "--store", dsn])
                common.settle_postgres(dsn)
                point[label] = _scale(code, ["measure", "--store", dsn, "--n", str(n), "--passes", "8",
                                             "--reps", "15", "--identifier", info["identifier"],
                                             "--session", f"ident-{label}"])
                point[label]["copy_seconds"] = round(copy_s, 1)
                cl.drop(f"ident_run_{label}")
                print(f"  pg_ident n={n:,} {label}: identifier p50 "
                      f"{common.get_path(point[label], 'lcm_grep.identifier.ms.p50')} ms", flush=True)
            out["points"].append(point)
            if cfg.get("checkpoint"):  # (a long part: what is measured is kept if a later step fails)
                Path(cfg["checkpoint"]).write_text(json.dumps(out, default=str), encoding="utf-8")
        out["ingest"] = _ingest(cl, base, work)
    finally:
        cl.stop()
    return out


def _ingest(cl: KeptCluster, base: Path, work: Path, n: int = 20_000) -> dict[str, Any]:
    """The same n messages appended by each code to a fresh database (and SQLite, this tree)."""
    res: dict[str, Any] = {"messages": n}
    for label, code in (("before", base), ("after", None)):
        dsn = cl.create(f"ident_ingest_{label}")
        b = _scale(code, ["build", "--store", dsn, "--n", str(n)])
        res[label] = {"msgs_per_s": b["ingest"]["msgs_per_s"],
                      "all_new_batch_msgs_per_s": b["ingest"]["all_new_batch_msgs_per_s"]["p50"],
                      "tsvector": _tsvector_cost(dsn)}
        cl.drop(f"ident_ingest_{label}")
    store = str(work / "ingest.db")
    b = _scale(None, ["build", "--store", store, "--n", str(n)])
    res["sqlite"] = {"msgs_per_s": b["ingest"]["msgs_per_s"],
                     "all_new_batch_msgs_per_s": b["ingest"]["all_new_batch_msgs_per_s"]["p50"]}
    for suf in ("", "-wal", "-shm", ".meta.json"):
        Path(store + suf).unlink(missing_ok=True)
    return res


def _tsvector_cost(dsn: str) -> dict[str, Any]:
    """Seconds for the store's own lcm_tsvector over every message text (best of 3), and bytes."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as c:
        # (serial: lcm_tsvector's EXCEPTION block, which cuts an over-long text, cannot run in a
        # parallel worker, though the function is declared PARALLEL SAFE)
        c.execute("SET max_parallel_workers_per_gather = 0")
        best = None
        for _ in range(3):
            t0 = time.perf_counter()
            size = c.execute("SELECT sum(pg_column_size(lcm_tsvector(text))) FROM messages").fetchone()[0]
            dt = time.perf_counter() - t0
            best = dt if best is None else min(best, dt)
    return {"seconds": round(best or 0.0, 3), "bytes": int(size or 0)}


def open_store(dsn: str) -> dict[str, Any]:
    """Open the store as a process of the code under test would (its migrations run), then
    finish its deferred work: the index backlog and, where the code has it, the identifier
    backfill of migration 033. Seconds of each."""
    from lossless_context.store import open_store as opener

    t0 = time.perf_counter()
    st = opener(dsn)
    out: dict[str, Any] = {"open_seconds": round(time.perf_counter() - t0, 2)}
    try:
        t0 = time.perf_counter()
        st.wait_indexed()
        out["indexed_seconds"] = round(time.perf_counter() - t0, 2)
        if hasattr(st, "backfill_identifiers"):
            t0 = time.perf_counter()
            st.backfill_identifiers()
            out["identifier_backfill_seconds"] = round(time.perf_counter() - t0, 2)
    finally:
        st.close()
    return out


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["open"])
    ap.add_argument("--store", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    common.isolate_env()
    common.quiet_logs()
    Path(a.out).write_text(json.dumps(open_store(a.store)), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
