"""Retracted messages, fork points, forgetting (and the marks of forgotten messages), summary outlines and the leaves over messages,
for the SQLite store (a mixin of :class:`~.sqlite.SQLiteStore`; the interface is documented on
:class:`~.base.Store`)."""

from __future__ import annotations

import contextlib

import secrets
import sqlite3
import time
from typing import Any, Callable, Iterator, Sequence

from ...records import SummaryRecord
from ..rows import SUM_COLS, outline_items, summary_record

_CHUNK = 500
# A summary's children in order (published child summaries first, then messages), each with
# its size (PostgreSQL's lcm_summary_outline, migration 022, is the same statement)
_OUTLINE = ("SELECT 0, sp.ord, sp.child_id, s.tokens FROM summary_parents sp JOIN summaries s ON s.id = sp.child_id"
            " WHERE sp.parent_id = ? AND s.state = 'published'"
            " UNION ALL SELECT 1, sm.ord, sm.message_id, m.tokens FROM summary_messages sm"
            " JOIN messages m ON m.id = sm.message_id WHERE sm.summary_id = ? ORDER BY 1, 2")


def _chunks(ids: Sequence[int]) -> Iterator[list[int]]:
    ids = [int(i) for i in ids]
    for k in range(0, len(ids), _CHUNK):
        yield ids[k:k + _CHUNK]


SCRUB_STEP_PAGES = 64  # pages one step of a scrub's index merge writes (a few ms of the write lock)
SCRUB_PAUSE = 0.02  # between two steps: other writers get the lock
SCRUB_MAX_STEPS = 100_000  # (a bound per index, never reached: a merge into one segment ends)
_sleep = time.sleep  # (the pause between two steps; tests look into it)


@contextlib.contextmanager
def _secure_delete(c: sqlite3.Connection) -> Iterator[None]:
    """``secure_delete`` on for what runs inside (deleted content is overwritten with zeros:
    cells, freed pages, overflow pages), then back to what it was."""
    was = int(c.execute("PRAGMA secure_delete").fetchone()[0])
    c.execute("PRAGMA secure_delete=1")
    try:
        yield
    finally:
        c.execute(f"PRAGMA secure_delete={was}")


class SQLiteRecords:
    conn: Callable[[], sqlite3.Connection]
    tx: Callable[[], Any]
    _write_context: Callable[..., None]
    reclaim_space: Callable[..., int]  # (store/sqlite/lifecycle.py)

    def summary_outline(self, summary_id: int) -> tuple[SummaryRecord | None, list[tuple[str, int, int]]]:
        c = self.conn()
        row = c.execute(f"SELECT {SUM_COLS} FROM summaries WHERE id=? AND state='published'",
                        (summary_id,)).fetchone()
        if row is None:
            return None, []
        return summary_record(row), outline_items(c.execute(_OUTLINE, (summary_id, summary_id)).fetchall())

    def forget_salt(self) -> bytes:
        salt = getattr(self, "_forget_salt", None)
        if salt is None:
            row = self.conn().execute("SELECT salt FROM forget_salt WHERE id = 1").fetchone()
            if row is None:
                with self.tx() as c:  # (two processes at once: the first one's salt stays)
                    c.execute("INSERT OR IGNORE INTO forget_salt(id, salt) VALUES (1, ?)", (secrets.token_bytes(32),))
                    row = c.execute("SELECT salt FROM forget_salt WHERE id = 1").fetchone()
            salt = self._forget_salt = bytes(row[0])
        return salt

    def forget_marks(self, scope: Sequence[str]) -> dict[int, set[str]]:
        out: dict[int, set[str]] = {}
        sessions = [str(s) for s in scope]
        for k in range(0, len(sessions), _CHUNK):
            part = sessions[k:k + _CHUNK]
            for anchor, digest in self.conn().execute(
                    f"SELECT anchor, digest FROM forget_marks WHERE session_id IN ({','.join('?' * len(part))})", part):
                out.setdefault(int(anchor), set()).add(digest)
        return out

    def add_forget_marks(self, marks: Sequence[tuple[str, int, str]], moved: dict[int, int]) -> None:
        now = time.time()
        with self.tx() as c:
            for old, new in moved.items():
                c.execute("UPDATE OR IGNORE forget_marks SET anchor = ? WHERE anchor = ?", (int(new), int(old)))
                c.execute("DELETE FROM forget_marks WHERE anchor = ?", (int(old),))  # (a duplicate of a moved one)
            c.executemany("INSERT OR IGNORE INTO forget_marks(session_id, anchor, digest, forgotten_at)"
                          " VALUES (?, ?, ?, ?)", [(str(s), int(a), str(d), now) for s, a, d in marks])

    def retract_messages(self, message_ids: Sequence[int]) -> int:
        if not message_ids:
            return 0
        now = time.time()
        with self.tx() as c:
            before = c.total_changes
            c.executemany("INSERT OR IGNORE INTO message_retractions(message_id, retracted_at) VALUES (?, ?)",
                          [(int(i), now) for i in message_ids])
            return c.total_changes - before

    def restore_messages(self, message_ids: Sequence[int]) -> int:
        if not message_ids:
            return 0
        with self.tx() as c:
            n = 0
            for part in _chunks(message_ids):
                n += c.execute(f"DELETE FROM message_retractions WHERE message_id IN ({','.join('?' * len(part))})",
                               part).rowcount
            return n

    def retracted(self, message_ids: Sequence[int]) -> set[int]:
        out: set[int] = set()
        c = self.conn()
        for part in _chunks(message_ids):
            out.update(r[0] for r in c.execute(
                f"SELECT message_id FROM message_retractions WHERE message_id IN ({','.join('?' * len(part))})", part))
        return out

    def set_fork_point(self, session_id: str) -> None:
        with self.tx() as c:
            c.execute("UPDATE sessions SET fork_message_id=(SELECT COALESCE(MAX(id), 0) FROM messages),"
                      " fork_summary_id=(SELECT COALESCE(MAX(id), 0) FROM summaries)"
                      " WHERE id=? AND fork_message_id IS NULL", (session_id,))

    def fork_point(self, session_id: str) -> tuple[int, int] | None:
        row = self.conn().execute("SELECT fork_message_id, fork_summary_id FROM sessions WHERE id=?",
                                  (session_id,)).fetchone()
        return (int(row[0]), int(row[1] or 0)) if row and row[0] is not None else None

    def session_message_ids(self, session_id: str) -> list[int]:
        return [r[0] for r in self.conn().execute("SELECT id FROM messages WHERE session_id=? ORDER BY id",
                                                  (session_id,))]

    def session_summary_ids(self, session_id: str) -> list[int]:
        return [r[0] for r in self.conn().execute("SELECT id FROM summaries WHERE session_id=? ORDER BY id",
                                                  (session_id,))]

    def message_summaries_many(self, message_ids: Sequence[int]) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {int(m): [] for m in message_ids}
        c = self.conn()
        for part in _chunks(list(out)):
            for mid, sid in c.execute(
                    "SELECT sm.message_id, sm.summary_id FROM summary_messages sm JOIN summaries s ON s.id = sm.summary_id"
                    f" WHERE sm.message_id IN ({','.join('?' * len(part))}) AND s.state='published'"
                    " ORDER BY sm.message_id, sm.summary_id", part):
                out[mid].append(sid)
        return out

    def summaries_over(self, message_ids: Sequence[int], summary_ids: Sequence[int]) -> set[int]:
        out: set[int] = set()
        c = self.conn()
        for part in _chunks(message_ids):
            out.update(r[0] for r in c.execute(
                f"SELECT DISTINCT summary_id FROM summary_messages WHERE message_id IN ({','.join('?' * len(part))})",
                part))
        for part in _chunks(summary_ids):
            out.update(r[0] for r in c.execute(
                f"SELECT DISTINCT parent_id FROM summary_parents WHERE child_id IN ({','.join('?' * len(part))})",
                part))
        return out

    def set_message_times(self, pairs: Sequence[tuple[int, float]]) -> None:
        if pairs:
            with self.tx() as c:
                c.executemany("UPDATE messages SET created_at=? WHERE id=?", [(float(t), int(i)) for i, t in pairs])

    def rewrite_summaries(self, rows: Sequence[tuple[int, str, int, int]], sessions: Sequence[str]) -> None:
        from ...messages import clean_text

        with self.tx() as c, _secure_delete(c):
            for sid, text, tokens, n in rows:
                c.execute("UPDATE summaries SET text=?, tokens=?, n_messages=?, level='deterministic',"
                          " summarizer='extractive' WHERE id=?", (clean_text(text), tokens, n, sid))
            for part in _chunks([r[0] for r in rows]):
                c.execute(f"DELETE FROM summary_history WHERE summary_id IN ({','.join('?' * len(part))})", part)
            for sess in dict.fromkeys(str(x) for x in sessions):
                c.execute("DELETE FROM presummaries WHERE session_id=?", (sess,))
                c.execute("DELETE FROM session_continuity WHERE session_id=?", (sess,))

    def scrub(self) -> dict[str, Any]:
        """Leave nothing of the rows ``lcm forget`` deleted on disk, in short steps — never a
        rewrite of the file under the write lock (a VACUUM held it for seconds to minutes on a
        large store). The rows went with ``secure_delete`` on (``forget_records``,
        ``rewrite_summaries``): their bytes were zeroed where they lay, cells and freed pages
        alike. What is left are the full-text indexes' old entries (FTS5 keeps a deleted row's
        terms in its segments until they merge): each index is merged into one segment in
        steps of SCRUB_STEP_PAGES (each its own write transaction, secure_delete on, a pause
        between), then free pages go back to the file system in incremental-vacuum steps (a
        store with incremental auto-vacuum; in another they stay free, zeroed, for reuse), and
        the WAL, which may hold the old pages, is checkpointed and truncated."""
        from .merge import TABLES

        steps = 0
        for t in TABLES:
            for _ in range(SCRUB_MAX_STEPS):
                with self.tx() as w, _secure_delete(w):
                    before = w.total_changes
                    # (negative: every segment, whatever its level, is merged into one — the
                    # deleted entries go with the old segments)
                    w.execute(f"INSERT INTO {t}({t}, rank) VALUES ('merge', ?)", (-SCRUB_STEP_PAGES,))
                    worked = w.total_changes - before >= 2  # (FTS5: fewer means nothing left to merge)
                steps += 1
                if not worked:
                    break
                _sleep(SCRUB_PAUSE)
        returned = self.reclaim_space(600.0, SCRUB_PAUSE)
        c = self.conn()
        c.execute("PRAGMA busy_timeout=1000")  # (a reader holding the WAL: truncated next time)
        try:
            busy, _log, _done = c.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        except sqlite3.Error:
            busy = 1
        finally:
            c.execute("PRAGMA busy_timeout=30000")
        return {"indexes_merged": list(TABLES), "merge_steps": steps, "bytes_returned": returned,
                "vacuumed": False, "wal_truncated": not busy}

    def forget_records(self, session_ids: Sequence[str], message_ids: Sequence[int], summary_ids: Sequence[int],
                       contexts: dict[str, list[tuple[str, int]]]) -> dict[str, int]:
        with self.tx() as c, _secure_delete(c):
            return self._forget_in(c, session_ids, message_ids, summary_ids, contexts)

    def _forget_in(self, c: sqlite3.Connection, session_ids: Sequence[str], message_ids: Sequence[int],
                   summary_ids: Sequence[int], contexts: dict[str, list[tuple[str, int]]]) -> dict[str, int]:
        """forget_records' statements inside the caller's write transaction (also
        remove_rows': store/sqlite/lifecycle.py)."""
        sessions = [str(s) for s in session_ids]
        c.execute("CREATE TEMP TABLE IF NOT EXISTS lcm_forget_m (id INTEGER PRIMARY KEY)")
        c.execute("CREATE TEMP TABLE IF NOT EXISTS lcm_forget_s (id INTEGER PRIMARY KEY)")
        c.execute("CREATE TEMP TABLE IF NOT EXISTS lcm_forget_x (id TEXT PRIMARY KEY)")
        for t in ("lcm_forget_m", "lcm_forget_s", "lcm_forget_x"):
            c.execute(f"DELETE FROM {t}")
        c.executemany("INSERT OR IGNORE INTO lcm_forget_m(id) VALUES (?)", [(int(i),) for i in message_ids])
        c.executemany("INSERT OR IGNORE INTO lcm_forget_s(id) VALUES (?)", [(int(i),) for i in summary_ids])
        c.executemany("INSERT OR IGNORE INTO lcm_forget_x(id) VALUES (?)", [(s,) for s in sessions])
        for sid, items in contexts.items():
            if sid not in sessions:
                self._write_context(c, sid, items)
        m = "SELECT id FROM lcm_forget_m"
        sq = "SELECT id FROM lcm_forget_s"
        x = "SELECT id FROM lcm_forget_x"
        # (any reference left over, e.g. from a session the caller did not repair; one
        # statement per key, each by its index: an OR of them scanned the table; only the
        # statements with keys to look up — a prune's small groups run many of them)
        n_s = n_m = 0
        if sessions:
            c.execute(f"DELETE FROM context_items WHERE session_id IN ({x})")
            c.execute(f"DELETE FROM staged_passes WHERE session_id IN ({x})")
            c.execute(f"DELETE FROM presummaries WHERE session_id IN ({x})")
        if message_ids:
            c.execute(f"DELETE FROM context_items WHERE message_id IN ({m})")
        if summary_ids:
            c.execute(f"DELETE FROM context_items WHERE summary_id IN ({sq})")
            c.execute(f"DELETE FROM summary_parents WHERE parent_id IN ({sq}) OR child_id IN ({sq})")
        if summary_ids or message_ids:
            c.execute(f"DELETE FROM summary_messages WHERE summary_id IN ({sq}) OR message_id IN ({m})")
        if summary_ids:
            # (a node's earlier texts and costs carry its words too; pruned_spans: ON DELETE CASCADE)
            c.execute(f"DELETE FROM summary_history WHERE summary_id IN ({sq})")
            c.execute(f"DELETE FROM summary_costs WHERE summary_id IN ({sq})")
            n_s = c.execute(f"DELETE FROM summaries WHERE id IN ({sq})").rowcount
        if message_ids:
            c.execute(f"DELETE FROM message_aliases WHERE message_id IN ({m})")
            c.execute(f"DELETE FROM message_absorbed WHERE message_id IN ({m})")
            c.execute(f"DELETE FROM message_retractions WHERE message_id IN ({m})")
            c.execute(f"DELETE FROM message_vectors WHERE message_id IN ({m})")
        if sessions:
            c.execute(f"DELETE FROM message_vectors WHERE session_id IN ({x})")
        if message_ids:
            c.execute(f"UPDATE messages SET supersedes=NULL WHERE supersedes IN ({m})")
            n_m = c.execute(f"DELETE FROM messages WHERE id IN ({m})").rowcount
        n_x = 0
        if sessions:
            # A forgotten session's children keep their own history: they hang from its parent.
            for _ in range(len(sessions) + 1):
                if not c.execute(f"UPDATE sessions SET parent_id=(SELECT p.parent_id FROM sessions p"
                                 f" WHERE p.id=sessions.parent_id) WHERE parent_id IN ({x})"
                                 f" AND id NOT IN ({x})").rowcount:
                    break
            c.execute(f"UPDATE sessions SET parent_id=NULL WHERE parent_id IN ({x})")
            n_x = c.execute(f"DELETE FROM sessions WHERE id IN ({x})").rowcount
        for t in ("lcm_forget_m", "lcm_forget_s", "lcm_forget_x"):
            c.execute(f"DELETE FROM {t}")
        return {"sessions": n_x, "messages": n_m, "summaries": n_s}
