"""Search over the PostgreSQL store: tsvector full text, ILIKE substrings, bounded regex.

A mixin of :class:`~lossless_context.store.postgres.PostgresStore` (it uses the store's
``_read``); kept apart so each module holds one job.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

from .base import StoreError
from .pgtext import pg_text as _t

try:  # optional dependency: `pip install lossless-context[postgres]`
    import psycopg
except ImportError:  # pragma: no cover - reported when the store is first used
    psycopg = None  # type: ignore[assignment]


class PostgresSearch:
    """term_counts, max_row_id and search of the PostgreSQL store."""

    _read: Callable[[Callable[[Any], Any]], Any]  # PostgresStore's: run fn(conn) on a pooled connection

    def term_counts(self, target: str, plans: Sequence[Any], cap: int, newest: int | None = None) -> list[int]:
        table = "messages" if target == "messages" else "summaries"
        window = " AND t.id > %s" if newest is not None else ""
        sql = (f"SELECT count(*) FROM (SELECT 1 FROM {table} t WHERE t.tsv @@ to_tsquery('english', %s)"
               f"{window} LIMIT %s) x")
        floor = (self.max_row_id(target) - newest,) if newest is not None else ()

        def count(c: Any) -> list[int]:
            out = []
            for plan in plans:
                item = getattr(plan, "pg_tsquery", None)
                if not item:
                    out.append(0)
                    continue
                try:
                    with c.transaction():  # a refused operand must not abort the others
                        out.append(c.execute(sql, (_t(item), *floor, cap + 1)).fetchone()[0])
                except (psycopg.DataError, psycopg.ProgrammingError):
                    out.append(cap + 1)
            return out

        return self._read(count)

    def max_row_id(self, target: str) -> int:
        table = "messages" if target == "messages" else "summaries"
        return self._read(lambda c: c.execute(f"SELECT COALESCE(MAX(id), 0) FROM {table}").fetchone()[0])

    def search(
        self,
        target: str,
        session_ids: Sequence[str] | None,
        plan: Any,
        *,
        mode: str = "fts",
        regex: Any = None,
        role: str | None = None,
        since: float | None = None,
        until: float | None = None,
        under_summary: int | None = None,
        limit: int = 10,
        offset: int = 0,
        order: str = "rank",
    ) -> list[dict[str, Any]]:
        is_msg = target == "messages"
        table = "messages" if is_msg else "summaries"
        where: list[str] = []
        params: list[Any] = []
        with_sql = ""
        with_params: list[Any] = []
        if session_ids is not None:
            where.append("t.session_id = ANY(%s::text[])")
            params.append([_t(s) for s in session_ids])
        if not is_msg:
            where.append("t.state='published'")
        if role and is_msg:
            where.append("t.role=%s")
            params.append(_t(role))
        tcol = "created_at" if is_msg else "t_end"
        if since is not None:
            where.append(f"t.{tcol} >= %s")
            params.append(since)
        if until is not None:
            where.append(f"t.{tcol} <= %s")
            params.append(until)
        if under_summary is not None:
            with_sql = (
                "WITH RECURSIVE sub(id) AS (SELECT %s::bigint UNION SELECT sp.child_id FROM summary_parents sp"
                " JOIN sub ON sp.parent_id = sub.id) "
            )
            with_params.append(int(under_summary))
            if is_msg:
                where.append("t.id IN (SELECT message_id FROM summary_messages WHERE summary_id IN (SELECT id FROM sub))")
            else:
                where.append("t.id IN (SELECT id FROM sub)")
        cols = f"t.id, t.session_id, {'t.role' if is_msg else chr(39) + 'summary' + chr(39)}, t.{tcol}, t.text"
        and_where = "".join(f" AND {w}" for w in where)
        keys = ("id", "session_id", "role", "created_at", "text", "rank")

        if mode == "fts":
            tsq = getattr(plan, "pg_tsquery", None)
            if not tsq:
                return []

            def fts(c: Any) -> list[tuple]:
                # The english configuration drops stop words; a query made only of them (the
                # plan keeps them when nothing else is left) is matched word for word instead,
                # as SQLite's FTS5 (which keeps every word) would.
                useful = c.execute("SELECT numnode(to_tsquery('english', %s))", (tsq,)).fetchone()[0]
                if useful:
                    vec, cfg = "t.tsv", "english"
                else:
                    vec, cfg = "to_tsvector('simple', t.text)", "simple"
                score = f"-ts_rank_cd({vec}, q.q, 1)::float8" if order == "rank" else "0.0::float8"
                sql = (
                    f"{with_sql}SELECT {cols}, {score} AS rank"
                    f" FROM {table} t, to_tsquery('{cfg}', %s) AS q(q) WHERE {vec} @@ q.q{and_where}"
                    + (" ORDER BY rank, t.id DESC" if order == "rank" else " ORDER BY t.id DESC")
                    + " LIMIT %s OFFSET %s"
                )
                return c.execute(sql, (*with_params, tsq, *params, limit, offset)).fetchall()

            try:
                rows = self._read(fts)
            except (psycopg.DataError, psycopg.ProgrammingError) as exc:  # a tsquery the server refuses
                raise StoreError(f"search failed: {exc}") from exc
        elif mode == "substring":
            subs = [_t(s) for s in (getattr(plan, "substrings", ()) or ()) if _t(s)]
            if not subs:
                return []
            from ..query import like_pattern

            ors = " OR ".join("t.text ILIKE %s ESCAPE '\\'" for _ in subs)
            sql = (
                f"{with_sql}SELECT {cols}, 0.0::float8 FROM {table} t WHERE ({ors}){and_where}"
                " ORDER BY t.id DESC LIMIT %s OFFSET %s"
            )
            rows = self._read(lambda c: c.execute(
                sql, (*with_params, *[like_pattern(s) for s in subs], *params, limit, offset)).fetchall())
        elif mode == "regex" and regex is not None:
            from ..query import regex_search_bounded

            sql = (
                f"{with_sql}SELECT {cols}, 0.0::float8 FROM {table} t"
                + (" WHERE " + " AND ".join(where) if where else "")
                + " ORDER BY t.id DESC LIMIT %s"
            )

            def scan(c: Any) -> list[tuple]:
                out: list[tuple] = []
                found = 0
                deadline = time.monotonic() + 2.0  # regex search is bounded in time
                with c.transaction():  # a server-side cursor streams rows instead of loading all
                    with c.cursor(name="lcm_regex_scan") as cur:
                        cur.itersize = 256
                        cur.execute(sql, (*with_params, *params, 200_000))
                        for row in cur:
                            if time.monotonic() > deadline:
                                break
                            if regex_search_bounded(regex, row[4]) is not None:
                                if found >= offset:
                                    out.append(row)
                                found += 1
                                if len(out) >= limit:
                                    break
                return out

            rows = self._read(scan)
        else:
            rows = []
        return [dict(zip(keys, r)) for r in rows]
