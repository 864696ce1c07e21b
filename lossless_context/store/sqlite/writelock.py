"""Taking SQLite's write lock (BEGIN IMMEDIATE) so that a waiting writer gets it soon after
it is released.

SQLite's own busy handler (``PRAGMA busy_timeout``) sleeps between its attempts in growing
steps — 1, 2, 5, 10 … 50 ms, then 100 ms at a time once ~0.3 s have passed. Behind a
writer that works in short transactions with short pauses between them (a prune:
ops/retention.py, ~100 ms under the lock, then 50 ms without), a waiter sleeping 100 ms at a
time keeps missing the pauses and waits seconds (measured: 2.4 s at 1M messages). So BEGIN
IMMEDIATE is tried with no busy handler and retried every POLL seconds up to the caller's
bound: a released lock is noticed within a few ms, at the cost of one failed BEGIN and one
wake-up per poll (measured in bench/RESULTS.md §11). The connection's busy timeout is put back for its other
statements (a checkpoint, an autocommit pragma), which keep SQLite's handler.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Callable

POLL = 0.002  # seconds between two attempts at the lock
# After LONG_AFTER seconds of waiting (a long holder, not a prune's ~100 ms), attempts are
# POLL_LONG apart: still well inside a prune's 50 ms pause, at less CPU (each wake-up costs
# ~25 us of CPU, a failed BEGIN ~3 us).
POLL_LONG = 0.005
LONG_AFTER = 1.0

# (module attributes so a test can drive the wait without sleeping)
sleep: Callable[[float], None] = time.sleep
clock: Callable[[], float] = time.monotonic


def is_busy(exc: sqlite3.OperationalError) -> bool:
    """SQLite refused for another connection's lock (SQLITE_BUSY / SQLITE_LOCKED)."""
    text = str(exc)
    return "locked" in text or "busy" in text


def begin_immediate(c: sqlite3.Connection, bound: float, busy_timeout_ms: int | None = None) -> None:
    """BEGIN IMMEDIATE on ``c``, waiting at most ``bound`` seconds for another writer; on
    return or failure ``c``'s busy timeout is ``busy_timeout_ms`` (None: what it was — one
    statement more). Raises the last ``sqlite3.OperationalError`` (busy) when the bound
    has passed."""
    if busy_timeout_ms is None:
        busy_timeout_ms = int(c.execute("PRAGMA busy_timeout").fetchone()[0])
    c.execute("PRAGMA busy_timeout=0")
    try:
        start = clock()
        deadline, slower = start + bound, start + LONG_AFTER
        while True:
            try:
                c.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                now = clock()
                if not is_busy(exc) or now >= deadline:
                    raise
            sleep(POLL if now < slower else POLL_LONG)
    finally:
        c.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
