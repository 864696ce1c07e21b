"""Retention's store side for SQLite (a mixin of :class:`~.store.SQLiteStore`; the interface
is documented on :class:`~..base.Store`): how old and how large each session is, removing
messages and summaries in small transactions, the record of originals a prune removed under
the summaries it kept, the log of prunes, and giving the freed pages back to the file system.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from typing import Any, Callable, Iterator, Sequence

_CHUNK = 500
# The pages the first incremental-vacuum step moves (16 KB each); later steps are sized to
# take about VACUUM_STEP_SECONDS each: a step is one short write.
VACUUM_STEP_PAGES = 32
VACUUM_STEP_SECONDS = 0.03
# A step at most doubles the last one: one fast step (its pages in memory, nothing else
# running) made the next 1,024 pages at once, and such a step was measured at 0.47-0.6 s
# under a prune's host. A slow one shrinks the next at once.
VACUUM_STEP_GROWTH = 2
_clock = time.perf_counter  # (what the steps are timed by; tests inject one)


def _chunks(ids: Sequence[Any]) -> Iterator[list[Any]]:
    ids = list(ids)
    for k in range(0, len(ids), _CHUNK):
        yield ids[k:k + _CHUNK]


def _marks(n: int) -> str:
    return ",".join("?" * n)


class SQLiteLifecycle:
    location: str
    conn: Callable[[], sqlite3.Connection]
    tx: Callable[[], Any]
    _forget_in: Callable[..., dict[str, int]]  # (store/sqlite/records.py)

    # -- what there is ----------------------------------------------------------------------

    def session_activity(self) -> list[dict[str, Any]]:
        c = self.conn()
        rows = c.execute(
            "SELECT s.id, s.parent_id, s.conversation_id, s.boundary_reason, s.created_at, s.updated_at,"
            " (SELECT MAX(m.created_at) FROM messages m WHERE m.session_id = s.id) FROM sessions s").fetchall()
        # (the covering index of session, id and tokens: no message row is read)
        counts = {r[0]: (r[1], r[2] or 0) for r in c.execute(
            "SELECT session_id, COUNT(*), SUM(tokens) FROM messages INDEXED BY messages_session_id GROUP BY session_id")}
        sums = {r[0]: (r[1], r[2] or 0) for r in c.execute(
            "SELECT session_id, COUNT(*), SUM(tokens) FROM summaries WHERE state='published' GROUP BY session_id")}
        keys = ("id", "parent_id", "conversation_id", "boundary_reason", "created_at", "updated_at",
                "last_message_at")
        out = []
        for r in rows:
            d = dict(zip(keys, r))
            d["messages"], d["tokens"] = counts.get(r[0], (0, 0))
            d["summaries"], d["summary_tokens"] = sums.get(r[0], (0, 0))
            out.append(d)
        return out

    def messages_since(self, since: float) -> int:
        c = self.conn()
        recent = [r[0] for r in c.execute("SELECT id FROM sessions WHERE updated_at >= ?", (since,))]
        n = 0
        for part in _chunks(recent):  # (messages_created: one index range per session)
            n += c.execute(f"SELECT COUNT(*) FROM messages WHERE session_id IN ({_marks(len(part))})"
                           " AND created_at >= ?", (*part, since)).fetchone()[0]
        return n

    def originals_under_summaries(self, session_ids: Sequence[str]) -> list[int]:
        out: list[int] = []
        c = self.conn()
        for part in _chunks([str(s) for s in session_ids]):
            out.extend(r[0] for r in c.execute(
                "SELECT DISTINCT sm.message_id FROM summary_messages sm JOIN summaries s ON s.id = sm.summary_id"
                " JOIN messages m ON m.id = sm.message_id"
                f" WHERE s.session_id IN ({_marks(len(part))}) AND m.session_id IN ({_marks(len(part))})"
                " AND s.state = 'published'"
                " AND sm.message_id NOT IN (SELECT message_id FROM context_items WHERE message_id IS NOT NULL)"
                " ORDER BY sm.message_id", (*part, *part)))
        return out

    # -- what a prune removes --------------------------------------------------------------------

    def removal_tokens(self, message_ids: Sequence[int], summary_ids: Sequence[int]) -> dict[str, dict[int, int]]:
        c = self.conn()
        out: dict[str, dict[int, int]] = {"messages": {}, "summaries": {}}
        for part in _chunks([int(i) for i in message_ids]):
            out["messages"].update((int(r[0]), int(r[1] or 0)) for r in c.execute(
                f"SELECT id, tokens FROM messages WHERE id IN ({_marks(len(part))})", part))
        for part in _chunks([int(i) for i in summary_ids]):
            out["summaries"].update((int(r[0]), int(r[1] or 0)) for r in c.execute(
                f"SELECT id, tokens FROM summaries WHERE id IN ({_marks(len(part))})", part))
        return out

    @staticmethod
    def _record_pruned_in(c: sqlite3.Connection, ids: Sequence[int], pruned_at: float, reason: str) -> int:
        c.execute("CREATE TEMP TABLE IF NOT EXISTS lcm_pruned_m (id INTEGER PRIMARY KEY)")
        c.execute("DELETE FROM lcm_pruned_m")
        c.executemany("INSERT OR IGNORE INTO lcm_pruned_m(id) VALUES (?)", [(i,) for i in ids])
        n = c.execute(
            "INSERT INTO pruned_spans(summary_id, session_id, messages, tokens, first_id, last_id, pruned_at,"
            " reason) SELECT sm.summary_id, s.session_id, COUNT(*), COALESCE(SUM(x.tokens), 0), MIN(x.id),"
            " MAX(x.id), ?, ? FROM summary_messages sm JOIN summaries s ON s.id = sm.summary_id"
            " JOIN messages x ON x.id = sm.message_id WHERE sm.message_id IN (SELECT id FROM lcm_pruned_m)"
            " GROUP BY sm.summary_id"
            " ON CONFLICT(summary_id) DO UPDATE SET messages = messages + excluded.messages,"
            " tokens = tokens + excluded.tokens, first_id = MIN(first_id, excluded.first_id),"
            " last_id = MAX(last_id, excluded.last_id), pruned_at = excluded.pruned_at",
            (float(pruned_at), reason)).rowcount
        c.execute("DELETE FROM lcm_pruned_m")
        return n

    def remove_rows(self, kind: str, groups: Sequence[Sequence[int]], *, seconds: float,
                    clock: Callable[[], float] = time.perf_counter, pruned_at: float | None = None,
                    reason: str = "retention") -> tuple[int, int, float]:
        if kind not in ("messages", "summaries"):
            raise ValueError(f"remove_rows: not a kind of row: {kind!r}")
        done = removed = 0
        with self.tx() as c:
            t0 = clock()  # (from the moment the write lock is held)
            for group in groups:
                if done and clock() - t0 >= seconds:
                    break  # commit what is done: the rest goes to the next transaction
                ids = [int(i) for i in group]
                if pruned_at is not None and kind == "messages":
                    self._record_pruned_in(c, ids, pruned_at, reason)
                counts = self._forget_in(c, [], ids if kind == "messages" else [],
                                         ids if kind == "summaries" else [], {})
                removed += counts[kind]
                done += 1
        return done, removed, clock() - t0  # (the lock held: to the commit done)

    # -- what a prune left -------------------------------------------------------------------------

    def pruned_spans(self, summary_ids: Sequence[int]) -> dict[int, dict[str, Any]]:
        out: dict[int, dict[str, Any]] = {}
        c = self.conn()
        for part in _chunks([int(i) for i in summary_ids]):
            for r in c.execute("SELECT summary_id, messages, tokens, first_id, last_id, pruned_at, reason"
                               f" FROM pruned_spans WHERE summary_id IN ({_marks(len(part))})", part):
                out[r[0]] = {"messages": r[1], "tokens": r[2], "first_id": r[3], "last_id": r[4],
                             "pruned_at": r[5], "reason": r[6]}
        return out

    def pruned_message(self, message_id: int) -> dict[str, Any] | None:
        r = self.conn().execute(
            "SELECT summary_id, session_id, pruned_at, reason FROM pruned_spans WHERE first_id <= ? AND last_id >= ?"
            " ORDER BY first_id DESC LIMIT 1", (int(message_id), int(message_id))).fetchone()
        if r is None:
            return None
        return {"summary_id": r[0], "session_id": r[1], "pruned_at": r[2], "reason": r[3]}

    def pruned_totals(self) -> dict[str, Any]:
        r = self.conn().execute("SELECT COUNT(*), COALESCE(SUM(messages), 0), MAX(pruned_at) FROM pruned_spans").fetchone()
        return {"summaries": r[0], "messages": r[1], "last_pruned_at": r[2]}

    # -- the log of prunes ---------------------------------------------------------------------

    def retention_run_start(self, mode: str, trigger: str, plan: dict[str, Any], bytes_before: int | None) -> int:
        with self.tx() as c:
            return int(c.execute(
                "INSERT INTO retention_runs(started_at, mode, trigger, plan, bytes_before) VALUES (?,?,?,?,?)"
                " RETURNING id", (time.time(), mode, trigger, json.dumps(plan), bytes_before)).fetchone()[0])

    def retention_run_finish(self, run_id: int, sessions: int, messages: int, summaries: int,
                             bytes_after: int | None) -> None:
        with self.tx() as c:
            c.execute("UPDATE retention_runs SET finished_at=?, sessions=?, messages=?, summaries=?, bytes_after=?"
                      " WHERE id=?", (time.time(), sessions, messages, summaries, bytes_after, int(run_id)))

    def retention_runs(self, limit: int = 5) -> list[dict[str, Any]]:
        keys = ("id", "started_at", "finished_at", "mode", "trigger", "plan", "sessions", "messages", "summaries",
                "bytes_before", "bytes_after")
        rows = self.conn().execute(f"SELECT {', '.join(keys)} FROM retention_runs ORDER BY id DESC LIMIT ?",
                                   (int(limit),)).fetchall()
        out = []
        for r in rows:
            d = dict(zip(keys, r))
            d["plan"] = json.loads(d["plan"] or "{}")
            out.append(d)
        return out

    # -- space ------------------------------------------------------------------------------------

    def space(self) -> dict[str, Any]:
        c = self.conn()
        # (int(): SQLCipher's build answers some pragmas as text)
        page = int(c.execute("PRAGMA page_size").fetchone()[0])
        pages = int(c.execute("PRAGMA page_count").fetchone()[0])
        free = int(c.execute("PRAGMA freelist_count").fetchone()[0])
        mode = {0: "none", 1: "full", 2: "incremental"}.get(int(c.execute("PRAGMA auto_vacuum").fetchone()[0]), "?")
        files = 0
        for suf in ("", "-wal"):
            try:
                files += os.path.getsize(self.location + suf)
            except OSError:
                pass
        return {"file_bytes": files, "used_bytes": (pages - free) * page, "free_bytes": free * page,
                "auto_vacuum": mode, "measured": True}

    def reclaim_space(self, seconds: float = 60.0, pause: float = 0.05) -> int:
        """Give free pages back to the file system, one short incremental-vacuum step at a time
        (each its own write transaction, with a pause between so other writers get in), then
        truncate the WAL if no reader holds it. A store made without incremental auto-vacuum
        keeps its free pages (reused by new rows): only `lcm vacuum` can shrink it. Returns the
        bytes the database file gave back."""
        c = self.conn()
        before = self.space()
        if before["auto_vacuum"] != "incremental":
            return 0
        deadline = time.monotonic() + seconds
        step = VACUUM_STEP_PAGES
        while time.monotonic() < deadline:
            if not int(c.execute("PRAGMA freelist_count").fetchone()[0]):
                break
            t0 = _clock()
            # (executescript: the pragma frees one page per step, and execute() steps once)
            c.executescript(f"PRAGMA incremental_vacuum({step});")
            dt = _clock() - t0
            step = max(8, min(1024, step * VACUUM_STEP_GROWTH, int(step * VACUUM_STEP_SECONDS / max(dt, 1e-4))))
            time.sleep(pause)
        c.execute("PRAGMA busy_timeout=100")  # never make a host's writer wait for the truncation
        try:
            c.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        except sqlite3.Error:
            pass
        finally:
            c.execute("PRAGMA busy_timeout=30000")
        return max(0, before["file_bytes"] - self.space()["file_bytes"])

    def vacuum(self) -> None:
        """Rewrite the whole file (`lcm vacuum`): every free page goes, and the store turns on
        incremental auto-vacuum so later prunes shrink it in place. Holds the write lock for
        the whole rewrite."""
        c = self.conn()
        c.execute("PRAGMA auto_vacuum=INCREMENTAL")
        c.execute("VACUUM")
        c.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
