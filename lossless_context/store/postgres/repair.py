"""PostgreSQL: the store methods of operations (ops/: export, import, viewer, doctor) —
portable SQL reads and one-transaction writes, `lcm doctor`'s checks of the full-text index and
of what the server lacks, and its repairs: kept apart from the store's hot paths."""

from __future__ import annotations

from typing import Any, Callable, Sequence, TypeVar

from ..base import Execute, StoreCheck
from .index import FILL_BATCH, PostgresIndexer

T = TypeVar("T")


def portable(sql: str) -> str:
    """Portable SQL (`?` placeholders) as psycopg reads it (`%s`; a literal `%` doubled)."""
    return sql.replace("%", "%%").replace("?", "%s")


class PostgresRepairs:
    """Mixed into PostgresStore: needs its `_read`, `_write`, `_lock_sessions` and `_indexer`."""

    _read: Callable[..., Any]
    _write: Callable[..., Any]
    _lock_sessions: Callable[..., dict[str, int]]
    _indexer: PostgresIndexer
    read_sql: Callable[..., Any]
    write_sql: Callable[..., Any]
    index_missing: Callable[[], int]
    repair_index: Callable[[], int]
    has_trigram_index: Callable[[], bool]
    applied_migrations: Callable[[], list[str]]

    def query_rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        q = portable(sql)
        return self.read_sql(lambda c: c.execute(q, tuple(params)).fetchall())

    def write_rows(self, fn: Callable[[Execute], T], explicit_ids: Sequence[str] = ()) -> T:
        def tx(c: Any) -> T:
            out = fn(lambda sql, params=(): c.execute(portable(sql), tuple(params)))
            for table in explicit_ids:  # (rows inserted with their own ids leave the sequence behind)
                c.execute(_SETVAL[table])
            return out

        return self.write_sql(tx)

    def messages_containing(self, needles: Sequence[str], roles: Sequence[str]) -> list[tuple[int, str]]:
        if not roles:
            return []
        where = " AND ".join(["role = ANY(%s)"] + ["strpos(text, %s) > 0"] * len(needles))
        return [(int(r[0]), str(r[1])) for r in self.read_sql(lambda c: c.execute(
            f"SELECT id, session_id FROM messages WHERE {where} ORDER BY id", (list(roles), *needles)).fetchall())]

    def self_checks(self, repair: bool = False) -> list[StoreCheck]:
        """The full-text index against the messages (``repair`` lists and indexes what it
        misses), rows indexed before migration 013 (``repair`` fills their session), and two
        notices of what the server lacks (pg_trgm, lz4)."""
        out: list[StoreCheck] = []
        missing = self.index_missing()
        chk = StoreCheck("full-text index message_index in sync", not missing,
                         f"{missing} messages neither indexed nor listed for indexing" if missing else "")
        if missing and repair:
            self.repair_index()
            chk.repaired = True
        out.append(chk)
        unscoped = self.index_unscoped()
        chk = StoreCheck("indexed messages carry their session", True,
                         f"notice: {unscoped} rows indexed before migration 013 have no session yet (the background"
                         " indexer fills them when idle; scoped searches look them up meanwhile)" if unscoped else "")
        if unscoped and repair:
            while self.fill_index_sessions():
                pass
            chk.repaired = True
        out.append(chk)
        out.append(StoreCheck("pg_trgm substring index", True, "" if self.has_trigram_index() else
                              "notice: pg_trgm is not installed (or may not be created by this role); substring"
                              " search over summaries scans instead of using a trigram index"))
        out.append(StoreCheck("lz4 compression of message text", True,
                              "" if "015_lz4_toast" in self.applied_migrations() else
                              "notice: this server has no lz4 (PostgreSQL before 14, or built without it): message"
                              " text is compressed with pglz, and appends cost about a third more"))
        return out

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


# The id counter of each table ops may insert into with explicit ids, moved past its largest id.
_SETVAL = {
    "messages": "SELECT setval(pg_get_serial_sequence('messages', 'id'),"
                " GREATEST((SELECT COALESCE(MAX(id), 0) FROM messages), 1))",
    "summaries": "SELECT setval(pg_get_serial_sequence('summaries', 'id'),"
                 " GREATEST((SELECT COALESCE(MAX(id), 0) FROM summaries), 1))",
}
