"""SQLite: per-node summariser costs, a node's earlier texts, per-session continuity state and
tier-0 representations (migration 013). Mixed into SQLiteStore (its `tx()` and `conn()`)."""

from __future__ import annotations

import sqlite3
import time
from typing import Any, Callable, Sequence

from ...messages import clean_text
from ..base import cost_totals


class SQLiteCosts:
    """Store methods of issue #19; relies on SQLiteStore's `tx()` and `conn()`."""

    conn: Callable[[], sqlite3.Connection]
    tx: Callable[[], Any]

    def put_summary_costs(self, rows: Sequence[tuple[int, str, int, int, int, float]]) -> None:
        if rows:
            with self.tx() as c:
                c.executemany("INSERT OR REPLACE INTO summary_costs(summary_id, model, calls, input_tokens,"
                              " output_tokens, ms) VALUES (?,?,?,?,?,?)", [tuple(r) for r in rows])

    def get_summary_costs(self, ids: Sequence[int]) -> dict[int, dict[str, Any]]:
        out: dict[int, dict[str, Any]] = {}
        ids = list(dict.fromkeys(int(i) for i in ids))
        for i in range(0, len(ids), 500):
            chunk = ids[i: i + 500]
            q = ("SELECT summary_id, model, calls, input_tokens, output_tokens, ms FROM summary_costs"
                 f" WHERE summary_id IN ({','.join('?' * len(chunk))})")
            for r in self.conn().execute(q, chunk):
                out[r[0]] = {"model": r[1], "calls": r[2], "input_tokens": r[3], "output_tokens": r[4], "ms": r[5]}
        return out

    def summary_cost_totals(self, session_id: str | None = None) -> dict[str, Any]:
        w, p = ("", ()) if session_id is None else (" AND s.session_id=?", (session_id,))
        rows = self.conn().execute(
            "SELECT c.model, COUNT(*), SUM(c.calls), SUM(c.input_tokens), SUM(c.output_tokens), SUM(c.ms)"
            " FROM summary_costs c JOIN summaries s ON s.id = c.summary_id WHERE s.state='published'"
            f"{w} GROUP BY c.model ORDER BY c.model", p).fetchall()
        return cost_totals(rows)

    def replace_summary(self, summary_id: int, text: str, tokens: int, level: str, summarizer: str) -> None:
        with self.tx() as c:
            c.execute("INSERT INTO summary_history(summary_id, text, tokens, level, summarizer, replaced_at)"
                      " SELECT id, text, tokens, level, summarizer, ? FROM summaries WHERE id=?",
                      (time.time(), summary_id))
            c.execute("UPDATE summaries SET text=?, tokens=?, level=?, summarizer=? WHERE id=?",
                      (clean_text(text), tokens, level, summarizer, summary_id))

    def summary_history(self, summary_id: int) -> list[dict[str, Any]]:
        return [{"text": r[0], "tokens": r[1], "level": r[2], "summarizer": r[3], "replaced_at": r[4]}
                for r in self.conn().execute(
                    "SELECT text, tokens, level, summarizer, replaced_at FROM summary_history WHERE summary_id=?"
                    " ORDER BY rowid", (summary_id,))]

    def get_continuity(self, session_id: str) -> str | None:
        row = self.conn().execute("SELECT state FROM session_continuity WHERE session_id=?", (session_id,)).fetchone()
        return row[0] if row else None

    def set_continuity(self, session_id: str, state: str) -> None:
        with self.tx() as c:
            c.execute("INSERT OR REPLACE INTO session_continuity(session_id, state, updated_at) VALUES (?,?,?)",
                      (session_id, clean_text(state), time.time()))

    def set_representations(self, pairs: Sequence[tuple[int, str]]) -> set[int]:
        done: set[int] = set()
        if not pairs:
            return done
        with self.tx() as c:
            for mid, text in pairs:
                cur = c.execute("UPDATE messages SET large=1, exploration=? WHERE id=? AND large=0",
                                (clean_text(text), int(mid)))
                if cur.rowcount:
                    done.add(int(mid))
        return done

    def prepare_representations(self, pairs: Sequence[tuple[int, str]]) -> None:
        if not pairs:
            return
        with self.tx() as c:
            c.executemany("UPDATE messages SET exploration=? WHERE id=? AND large=0",
                          [(clean_text(text), int(mid)) for mid, text in pairs])
