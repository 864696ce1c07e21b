"""Summariser costs per node, earlier texts of re-summarised nodes, and each session's continuity
state, on PostgreSQL (migration 009): the bookkeeping of issue #19, apart from the hot paths."""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

from ..base import cost_totals
from .text import pg_text as _t


class PostgresCosts:
    """Mixed into PostgresStore: needs its `_read` and `_write`."""

    _read: Callable[..., Any]
    _write: Callable[..., Any]

    def put_summary_costs(self, rows: Sequence[tuple[int, str, int, int, int, float]]) -> None:
        if not rows:
            return
        data = [(int(r[0]), _t(r[1]), int(r[2]), int(r[3]), int(r[4]), float(r[5])) for r in rows]

        def tx(c: Any) -> None:
            with c.cursor() as cur:
                cur.executemany(
                    "INSERT INTO summary_costs(summary_id, model, calls, input_tokens, output_tokens, ms)"
                    " VALUES (%s,%s,%s,%s,%s,%s) ON CONFLICT (summary_id) DO UPDATE SET model=EXCLUDED.model,"
                    " calls=EXCLUDED.calls, input_tokens=EXCLUDED.input_tokens,"
                    " output_tokens=EXCLUDED.output_tokens, ms=EXCLUDED.ms", data)

        self._write(tx)

    def get_summary_costs(self, ids: Sequence[int]) -> dict[int, dict[str, Any]]:
        ids = list(dict.fromkeys(int(i) for i in ids))
        if not ids:
            return {}
        rows = self._read(lambda c: c.execute(
            "SELECT summary_id, model, calls, input_tokens, output_tokens, ms FROM summary_costs"
            " WHERE summary_id = ANY(%s::bigint[])", (ids,)).fetchall())
        return {r[0]: {"model": r[1], "calls": r[2], "input_tokens": r[3], "output_tokens": r[4], "ms": r[5]}
                for r in rows}

    def summary_cost_totals(self, session_id: str | None = None) -> dict[str, Any]:
        w, p = ("", ()) if session_id is None else (" AND s.session_id=%s", (_t(session_id),))
        rows = self._read(lambda c: c.execute(
            "SELECT c.model, COUNT(*), SUM(c.calls), SUM(c.input_tokens), SUM(c.output_tokens), SUM(c.ms)"
            " FROM summary_costs c JOIN summaries s ON s.id = c.summary_id WHERE s.state='published'"
            f"{w} GROUP BY c.model ORDER BY c.model", p).fetchall())
        return cost_totals(rows)

    def replace_summary(self, summary_id: int, text: str, tokens: int, level: str, summarizer: str) -> None:
        def tx(c: Any) -> None:
            c.execute("INSERT INTO summary_history(summary_id, text, tokens, level, summarizer, replaced_at)"
                      " SELECT id, text, tokens, level, summarizer, %s FROM summaries WHERE id=%s",
                      (time.time(), summary_id))
            c.execute("UPDATE summaries SET text=%s, tokens=%s, level=%s, summarizer=%s WHERE id=%s",
                      (_t(text), tokens, _t(level), _t(summarizer), summary_id))

        self._write(tx)

    def summary_history(self, summary_id: int) -> list[dict[str, Any]]:
        rows = self._read(lambda c: c.execute(
            "SELECT text, tokens, level, summarizer, replaced_at FROM summary_history WHERE summary_id=%s"
            " ORDER BY replaced_at", (summary_id,)).fetchall())
        return [{"text": r[0], "tokens": r[1], "level": r[2], "summarizer": r[3], "replaced_at": r[4]} for r in rows]

    def get_continuity(self, session_id: str) -> str | None:
        row = self._read(lambda c: c.execute(
            "SELECT state FROM session_continuity WHERE session_id=%s", (_t(session_id),)).fetchone())
        return row[0] if row else None

    def set_continuity(self, session_id: str, state: str) -> None:
        def tx(c: Any) -> None:
            c.execute("INSERT INTO session_continuity(session_id, state, updated_at) VALUES (%s,%s,%s)"
                      " ON CONFLICT (session_id) DO UPDATE SET state=EXCLUDED.state, updated_at=EXCLUDED.updated_at",
                      (_t(session_id), _t(state), time.time()))

        self._write(tx)
