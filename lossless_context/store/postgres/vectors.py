"""PostgreSQL: message vectors of the optional semantic arm (migration 019; retrieval/semantic.py).
Mixed into PostgresStore (its `_read` and `_write`)."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from .text import pg_text as _t


class PostgresVectors:
    """Store methods of the semantic arm; relies on PostgresStore's `_read` and `_write`."""

    _read: Callable[..., Any]
    _write: Callable[..., Any]

    def put_vectors(self, model: str, rows: Sequence[tuple[int, bytes]]) -> int:
        if not rows:
            return 0
        ids = [int(mid) for mid, _ in rows]
        vecs = [bytes(vec) for _, vec in rows]
        # the session is copied from the message; a message that is gone (forgotten
        # meanwhile) simply gets no vector
        return self._write(lambda c: c.execute(
            "INSERT INTO message_vectors(model, message_id, session_id, vec)"
            " SELECT %s, m.id, m.session_id, u.vec FROM unnest(%s::bigint[], %s::bytea[]) AS u(id, vec)"
            " JOIN messages m ON m.id = u.id ORDER BY m.id ON CONFLICT (model, message_id) DO NOTHING",
            (_t(model), ids, vecs)).rowcount)

    def vectors_after(self, model: str, session_ids: Sequence[str] | None, after: int,
                      limit: int) -> list[tuple[int, int, bytes]]:
        if session_ids is not None and not session_ids:
            return []
        scope = "" if session_ids is None else " AND session_id = ANY(%s::text[])"
        args: list[Any] = [_t(model)] + ([] if session_ids is None else [[_t(s) for s in session_ids]])
        rows = self._read(lambda c: c.execute(
            f"SELECT seq, message_id, vec FROM message_vectors WHERE model=%s{scope} AND seq>%s ORDER BY seq LIMIT %s",
            (*args, int(after), int(limit))).fetchall())
        return [(r[0], r[1], bytes(r[2])) for r in rows]

    def vector_counts(self) -> dict[str, int]:
        return {r[0]: r[1] for r in self._read(lambda c: c.execute(
            "SELECT model, COUNT(*) FROM message_vectors GROUP BY model ORDER BY model").fetchall())}

    def messages_to_embed(self, model: str, after_id: int, limit: int) -> list[tuple[int, str]]:
        rows = self._read(lambda c: c.execute(
            "SELECT m.id, m.text FROM messages m WHERE m.id > %s AND NOT EXISTS"
            " (SELECT 1 FROM message_vectors v WHERE v.model = %s AND v.message_id = m.id)"
            " ORDER BY m.id LIMIT %s", (int(after_id), _t(model), int(limit))).fetchall())
        return [(r[0], r[1]) for r in rows]
