"""Grow a built PostgreSQL bench store to a large size with SQL replication (a bench worker).

`python -m bench.pg_grow --store DSN --n 1000000 --out F` copies the real history sessions
(`hist-*`, ingested through the engine by `bench.scale build`) into more sessions of the same
conversation until the store holds `n` messages, as `bench.scale` does for SQLite's 1M point.
Each copied message's full-text row (`message_index`: tsvector and CJK bigrams) is copied from
its source instead of computed again, and taken off the pending list, so the grown store is
fully indexed — what a store that ingested the same history would hold. Then `VACUUM ANALYZE`
(what autovacuum does to a table that grew over time), so the planner sees the grown tables. Writes the counts and timings as JSON to `--out`.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from . import common
from .scale import CONV

COLS = "seq, uid, ident, role, raw, text, tokens, created_at, supersedes, large, exploration"


def grow(dsn: str, n: int) -> dict[str, Any]:
    import psycopg

    t0 = time.perf_counter()
    done = 0
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SET jit = off")
        have = c.execute("SELECT count(*) FROM messages").fetchone()[0]
        extra = max(0, n - have)
        real = [r[0] for r in c.execute("SELECT id FROM sessions WHERE id LIKE 'hist-%%' ORDER BY id")]
        # a store grown before keeps its copies: number the new rounds after them
        k = max([int(r[0][3:].split("-", 1)[0]) for r in c.execute(
            "SELECT id FROM sessions WHERE id ~ '^rep[0-9]+-'")] or [0])
        now = time.time()
        while done < extra and real:
            k += 1
            for sid in real:
                if done >= extra:
                    break
                new = f"rep{k:02d}-{sid}"
                with c.transaction():
                    c.execute("INSERT INTO sessions(id, conversation_id, created_at, updated_at)"
                              " VALUES (%s, %s, %s, %s)", (new, CONV, now, now))
                    got = c.execute(
                        f"WITH copied AS (INSERT INTO messages(session_id, {COLS})"
                        f" SELECT %s, {COLS} FROM messages WHERE session_id = %s ORDER BY seq LIMIT %s"
                        " RETURNING id, seq),"
                        " indexed AS (INSERT INTO message_index(id, session_id, tsv, cjk)"
                        " SELECT copied.id, %s, x.tsv, x.cjk FROM copied"
                        " JOIN messages s ON s.session_id = %s AND s.seq = copied.seq"
                        " JOIN message_index x ON x.id = s.id RETURNING id)"
                        " SELECT (SELECT count(*) FROM copied), (SELECT count(*) FROM indexed)",
                        (new, sid, extra - done, new, sid)).fetchone()
                    c.execute("DELETE FROM message_index_pending p USING message_index x"
                              " WHERE x.id = p.message_id")
                    done += got[0]
        copy_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        # A store that grew to this size over time has been vacuumed by autovacuum many times;
        # right after a bulk copy the GIN index still holds its pending list, its pages are not
        # all-visible, and the planner costs an index scan high enough to pick a sequential
        # scan of the whole index table for a capped count that finds nothing (seen: 0.8 s).
        c.execute("VACUUM ANALYZE")
        analyze_s = time.perf_counter() - t1
        total = c.execute("SELECT count(*) FROM messages").fetchone()[0]
        pending = c.execute("SELECT count(*) FROM message_index_pending").fetchone()[0]
        size = c.execute("SELECT pg_database_size(current_database())").fetchone()[0]
    return {"n_stored": total, "n_replicated": done, "replicate_seconds": round(copy_s, 1),
            "vacuum_analyze_seconds": round(analyze_s, 1), "pending_after": pending, "store_bytes": size}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.pg_grow", description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", required=True, help="the PostgreSQL DSN of a store built by bench.scale")
    ap.add_argument("--n", type=int, required=True, help="messages the store should hold")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    common.isolate_env()
    common.quiet_logs()
    Path(a.out).write_text(json.dumps(grow(a.store, a.n)), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
