"""Taking SQLite's write lock (BEGIN IMMEDIATE) so that a waiting writer gets it soon after
it is released.

SQLite's own busy handler (``PRAGMA busy_timeout``) sleeps between its attempts in growing
steps — 1, 2, 5, 10 … 50 ms, then 100 ms at a time once ~0.3 s have passed. Behind a
writer that works in short transactions with short pauses between them (a prune:
ops/retention.py, ~100 ms under the lock, then 50 ms without), a waiter sleeping 100 ms at a
time keeps missing the pauses and waits seconds (measured: 2.4 s at 1M messages). So BEGIN
IMMEDIATE is tried with no busy handler and retried every POLL seconds up to the caller's
bound: a released lock is noticed within a few ms, at the cost of one failed BEGIN per poll
(measured in bench/RESULTS.md §11). The connection's busy timeout is put back for its other
statements (a checkpoint, an autocommit pragma), which keep SQLite's handler.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Callable

POLL = 0.002  # seconds between two attempts at the lock

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
        deadline = clock() + bound
        while True:
            try:
                c.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if not is_busy(exc) or clock() >= deadline:
                    raise
            sleep(POLL)
    finally:
        c.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
