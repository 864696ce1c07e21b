"""PostgreSQL's commit path against SQLite's (issue 41 item 3): all-new ingest batches, ABBA rounds.

The scale bench's build (`bench.scale build`: mixed sessions, `engine.ingest()` of the growing list
every 2,000 messages) with sessions of 4,000 messages, so half the batches are all-new: each such
batch is one append with nothing to re-align, the host's commit path. Each round builds the same
messages with the baseline commit's code and with this tree on PostgreSQL (fresh databases in one
throw-away server; the order alternates between rounds: ABBA) and with this tree on SQLite, so the
ratio PostgreSQL / SQLite is taken within one round. Reported: the all-new batch rate (p50 of the
build) per round, the ratio's median over rounds, and ingest until indexed.

Run on request: ``python -m bench.pg_commit --baseline REV --rounds 4 --out FILE``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from . import common
from .pass_cost import _baseline_code
from .pg_ident import _scale

MESSAGES = 24_000
SESSION = 4_000


def _build(code: Path | None, store: str, n: int) -> dict[str, Any]:
    b = _scale(code, ["build", "--store", store, "--n", str(n), "--session-msgs", str(SESSION)])
    ing = b["ingest"]
    return {"all_new_msgs_per_s": ing["all_new_batch_msgs_per_s"]["p50"],
            "until_indexed_msgs_per_s": ing["msgs_per_s"]}


def run(baseline: str, rounds: int, n: int = MESSAGES) -> dict[str, Any]:
    from tests.support import pg as pgsupport

    work = Path(common.isolate_env()) / "pg_commit"
    work.mkdir(parents=True, exist_ok=True)
    base = _baseline_code(baseline, work)
    if base is None:
        return {"skipped": True, "reason": "git cannot extract the baseline code"}
    bindir = pgsupport.find_bindir()
    if bindir is None:
        return {"skipped": True, "reason": "PostgreSQL server binaries not found"}
    srv = pgsupport.PgServer(bindir, shared_buffers="256MB")
    srv.start()
    out: dict[str, Any] = {"baseline": baseline, "messages": n, "session_messages": SESSION, "rounds": []}
    try:
        for r in range(rounds):
            order = [("before", base), ("after", None)]
            if r % 2:
                order.reverse()
            row: dict[str, Any] = {"order": [label for label, _ in order]}
            for label, code in order:
                name = srv.create_database(f"commit_{label}")
                row[label] = _build(code, srv.dsn(name), n)
                srv.drop_database(name)
            store = str(work / f"sqlite-{r}.db")
            row["sqlite"] = _build(None, store, n)
            for suf in ("", "-wal", "-shm", ".meta.json"):
                Path(store + suf).unlink(missing_ok=True)
            sq = row["sqlite"]["all_new_msgs_per_s"]
            row["ratio_before"] = round(row["before"]["all_new_msgs_per_s"] / sq, 3)
            row["ratio_after"] = round(row["after"]["all_new_msgs_per_s"] / sq, 3)
            row["load"] = round(os.getloadavg()[0], 1)
            out["rounds"].append(row)
            print(json.dumps(row), flush=True)
    finally:
        srv.stop()
    for label in ("before", "after"):
        out[f"ratio_{label}_median"] = round(statistics.median(x[f"ratio_{label}"] for x in out["rounds"]), 3)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.pg_commit")
    ap.add_argument("--baseline", required=True)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--n", type=int, default=MESSAGES)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    res = run(a.baseline, a.rounds, a.n)
    res["seconds"] = round(time.perf_counter() - t0, 1)
    Path(a.out).write_text(json.dumps(res, indent=1), encoding="utf-8")
    print(json.dumps({k: v for k, v in res.items() if k != "rounds"}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
