"""SQLite: the store methods of operations (ops/: export, import, viewer, doctor) — portable
SQL reads and one-transaction writes, the doctor's repairs, and the checks only SQLite can
make (its integrity check, foreign keys, its full-text indexes). Mixed into SQLiteStore."""

from __future__ import annotations

import sqlite3
from typing import Any, Callable, Sequence, TypeVar

from ..base import Execute, StoreCheck

T = TypeVar("T")

FTS_TABLES = ("messages_fts", "summaries_fts", "summaries_scoped_fts")


class SQLiteMaintenance:
    """Relies on SQLiteStore's `tx()`, `conn()`, `read_only` and `wait_indexed()`."""

    conn: Callable[[], sqlite3.Connection]
    tx: Callable[[], Any]
    read_only: bool

    def query_rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self.conn().execute(sql, tuple(params)).fetchall()

    def write_rows(self, fn: Callable[[Execute], T], explicit_ids: Sequence[str] = ()) -> T:
        # (an INTEGER PRIMARY KEY goes on from the largest id: explicit ids need nothing more)
        with self.tx() as c:
            return fn(lambda sql, params=(): c.execute(sql, tuple(params)))

    def messages_containing(self, needles: Sequence[str], roles: Sequence[str]) -> list[tuple[int, str]]:
        if not roles:
            return []
        where = " AND ".join(["role IN (" + ",".join("?" * len(roles)) + ")"] + ["instr(text, ?) > 0"] * len(needles))
        return [(int(r[0]), str(r[1])) for r in self.conn().execute(
            f"SELECT id, session_id FROM messages WHERE {where} ORDER BY id", (*roles, *needles)).fetchall()]

    def delete_orphan_staged(self) -> None:
        with self.tx() as w:
            w.execute("DELETE FROM summaries WHERE state='staged' AND pass_id NOT IN (SELECT pass_id FROM staged_passes)")

    def reattach_messages(self, by_session: dict[str, list[int]]) -> None:
        with self.tx() as w:
            for sid, mids in sorted(by_session.items()):
                top = w.execute("SELECT COALESCE(MAX(pos), -1) FROM context_items WHERE session_id=?", (sid,)).fetchone()[0]
                # Re-attached in front would reorder; append keeps them reachable and ordered.
                w.executemany("INSERT INTO context_items(session_id, pos, message_id) VALUES (?,?,?)",
                              [(sid, top + 1 + i, mid) for i, mid in enumerate(sorted(mids))])
                w.execute("UPDATE sessions SET context_version = context_version + 1 WHERE id=?", (sid,))

    def self_checks(self, repair: bool = False) -> list[StoreCheck]:
        """SQLite's integrity check, its foreign keys, and each full-text index against its
        table (the caller indexed any backlog first: `wait_indexed`); ``repair`` rebuilds an
        index out of step. FTS5's own check is issued as an INSERT: not run read-only."""
        c = self.conn()
        out: list[StoreCheck] = []
        integ = c.execute("PRAGMA integrity_check").fetchall()
        out.append(StoreCheck("sqlite integrity_check", integ == [("ok",)],
                              "; ".join(r[0] for r in integ[:5]) if integ != [("ok",)] else ""))
        fk = c.execute("PRAGMA foreign_key_check").fetchall()
        out.append(StoreCheck("foreign keys", not fk, f"{len(fk)} violations" if fk else ""))
        for fts in FTS_TABLES:
            name = f"full-text index {fts} in sync"
            if self.read_only:
                out.append(StoreCheck(name, True, "not checked: the store is open read-only", info=True))
                continue
            try:
                c.execute(f"INSERT INTO {fts}({fts}, rank) VALUES ('integrity-check', 1)")
            except Exception as exc:
                chk = StoreCheck(name, False, str(exc))
            else:
                chk = StoreCheck(name, True)
            if not chk.ok and repair:
                with self.tx() as w:
                    w.execute(f"INSERT INTO {fts}({fts}) VALUES ('rebuild')")
                    if fts == "messages_fts":  # the rebuild indexed every row, listed or not
                        w.execute("DELETE FROM lcm_index_pending")
                chk.repaired = True
            out.append(chk)
        return out
