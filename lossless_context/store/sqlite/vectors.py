"""SQLite: message vectors of the optional semantic arm (migration 014; retrieval/semantic.py).
Mixed into SQLiteStore (its `tx()` and `conn()`)."""

from __future__ import annotations

import sqlite3
from typing import Any, Callable, Sequence


class SQLiteVectors:
    """Store methods of the semantic arm; relies on SQLiteStore's `tx()` and `conn()`."""

    conn: Callable[[], sqlite3.Connection]
    tx: Callable[[], Any]

    def put_vectors(self, model: str, rows: Sequence[tuple[int, bytes]]) -> int:
        if not rows:
            return 0
        with self.tx() as c:
            before = c.total_changes
            # the session is copied from the message; a message that is gone (forgotten
            # meanwhile) simply gets no vector
            c.executemany(
                "INSERT OR IGNORE INTO message_vectors(model, message_id, session_id, vec)"
                " SELECT ?, id, session_id, ? FROM messages WHERE id = ?",
                [(model, bytes(vec), int(mid)) for mid, vec in rows])
            return c.total_changes - before

    def vectors_after(self, model: str, session_ids: Sequence[str] | None, after: int,
                      limit: int) -> list[tuple[int, int, bytes]]:
        if session_ids is None:
            return [tuple(r) for r in self.conn().execute(
                "SELECT seq, message_id, vec FROM message_vectors WHERE model=? AND seq>? ORDER BY seq LIMIT ?",
                (model, int(after), int(limit)))]
        sids = list(dict.fromkeys(session_ids))
        if not sids:
            return []
        marks = ",".join("?" * len(sids))
        return [tuple(r) for r in self.conn().execute(
            f"SELECT seq, message_id, vec FROM message_vectors WHERE model=? AND session_id IN ({marks})"
            " AND seq>? ORDER BY seq LIMIT ?", (model, *sids, int(after), int(limit)))]

    def vector_counts(self) -> dict[str, int]:
        return {r[0]: r[1] for r in self.conn().execute(
            "SELECT model, COUNT(*) FROM message_vectors GROUP BY model ORDER BY model")}

    def messages_to_embed(self, model: str, after_id: int, limit: int) -> list[tuple[int, str]]:
        return [tuple(r) for r in self.conn().execute(
            "SELECT m.id, m.text FROM messages m WHERE m.id > ? AND NOT EXISTS"
            " (SELECT 1 FROM message_vectors v WHERE v.model = ? AND v.message_id = m.id)"
            " ORDER BY m.id LIMIT ?", (int(after_id), model, int(limit)))]
