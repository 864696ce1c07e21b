"""`lcm doctor --repair`'s writes on a PostgreSQL store (the SQLite store does them in its
transaction, see doctor.py): kept apart from the store's hot paths."""

from __future__ import annotations

from typing import Any, Callable

from .index import FILL_BATCH, PostgresIndexer


class PostgresRepairs:
    """Mixed into PostgresStore: needs its `_read`, `_write`, `_lock_sessions` and `_indexer`."""

    _read: Callable[..., Any]
    _write: Callable[..., Any]
    _lock_sessions: Callable[..., dict[str, int]]
    _indexer: PostgresIndexer

    def fill_index_sessions(self, batch: int = FILL_BATCH) -> int:
        """Give up to ``batch`` rows indexed before migration 013 their session (searches look
        it up meanwhile); how many. (The background indexer does this when idle.)"""
        return self._indexer.fill_sessions(batch)

    def index_unscoped(self) -> int:
        """Indexed rows still without their session (migration 013's backlog)."""
        return self._read(lambda c: c.execute(
            "SELECT count(*) FROM message_index WHERE session_id IS NULL").fetchone()[0])

    def delete_orphan_staged(self) -> None:
        """Drop staged summaries whose pass is gone (`lcm doctor --repair`)."""
        self._write(lambda w: w.execute(
            "DELETE FROM summaries WHERE state='staged' AND pass_id NOT IN (SELECT pass_id FROM staged_passes)"))

    def reattach_messages(self, by_session: dict[str, list[int]]) -> None:
        """Append stored messages that nothing reaches to their session's active context
        (`lcm doctor --repair`); each session's context version moves on."""
        def reattach(w: Any) -> None:
            for sid, mids in sorted(by_session.items()):
                self._lock_sessions(w, sid)
                top = w.execute("SELECT COALESCE(MAX(pos), -1) FROM context_items WHERE session_id=%s",
                                (sid,)).fetchone()[0]
                with w.cursor() as cur:
                    cur.executemany(
                        "INSERT INTO context_items(session_id, pos, message_id) VALUES (%s,%s,%s)",
                        [(sid, top + 1 + i, mid) for i, mid in enumerate(sorted(mids))])
                w.execute("UPDATE sessions SET context_version = context_version + 1 WHERE id=%s", (sid,))

        self._write(reattach)
