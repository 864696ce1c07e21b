"""Retention's store side for PostgreSQL (a mixin of :class:`~.store.PostgresStore`; the
interface is documented on :class:`~..base.Store`): the same operations as the SQLite
mixin. Rows are deleted in the caller's small batches; the server's autovacuum (or a
``VACUUM`` the doctor advises) makes their space reusable — the files do not shrink on
their own — so ``reclaim_space`` gives nothing back here.
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable, Sequence
from urllib.parse import parse_qs, urlparse

from .text import pg_text as _t

# Every table of the store (what `space` adds up; a missing one counts 0).
STORE_TABLES = ("sessions", "messages", "message_absorbed", "message_aliases", "message_index",
                "message_index_pending", "message_retractions", "message_vectors", "summaries",
                "summary_messages", "summary_parents", "summary_costs", "summary_history", "context_items",
                "staged_passes", "presummaries", "session_continuity", "pruned_spans", "retention_runs",
                "lcm_migrations")
# Tables whose dead rows a prune leaves (the doctor's VACUUM advice names them).
PRUNED_TABLES = ("messages", "message_index", "summaries", "summary_messages", "summary_parents",
                 "context_items", "message_vectors")

class PostgresLifecycle:
    location: str
    _read: Callable[..., Any]
    _write: Callable[..., Any]
    _forget_in: Callable[..., dict[str, int]]  # (store/postgres/records.py)

    def session_activity(self) -> list[dict[str, Any]]:
        def run(c: Any) -> list[dict[str, Any]]:
            rows = c.execute(
                "SELECT s.id, s.parent_id, s.conversation_id, s.boundary_reason, s.created_at, s.updated_at,"
                " m.last, COALESCE(m.n, 0), COALESCE(m.tokens, 0), COALESCE(x.n, 0), COALESCE(x.tokens, 0)"
                " FROM sessions s"
                " LEFT JOIN (SELECT session_id, MAX(created_at) AS last, COUNT(*) AS n, SUM(tokens) AS tokens"
                "            FROM messages GROUP BY session_id) m ON m.session_id = s.id"
                " LEFT JOIN (SELECT session_id, COUNT(*) AS n, SUM(tokens) AS tokens FROM summaries"
                "            WHERE state = 'published' GROUP BY session_id) x ON x.session_id = s.id").fetchall()
            keys = ("id", "parent_id", "conversation_id", "boundary_reason", "created_at", "updated_at",
                    "last_message_at", "messages", "tokens", "summaries", "summary_tokens")
            return [dict(zip(keys, (*r[:7], int(r[7]), int(r[8]), int(r[9]), int(r[10])))) for r in rows]

        return self._read(run)

    def messages_since(self, since: float) -> int:
        return int(self._read(lambda c: c.execute(
            "SELECT COUNT(*) FROM messages m JOIN sessions s ON s.id = m.session_id"
            " WHERE s.updated_at >= %s AND m.created_at >= %s", (since, since)).fetchone()[0]))

    def originals_under_summaries(self, session_ids: Sequence[str]) -> list[int]:
        x = [_t(s) for s in session_ids]
        return [int(r[0]) for r in self._read(lambda c: c.execute(
            "SELECT DISTINCT sm.message_id FROM summary_messages sm JOIN summaries s ON s.id = sm.summary_id"
            " JOIN messages m ON m.id = sm.message_id"
            " WHERE s.session_id = ANY(%s) AND m.session_id = ANY(%s) AND s.state = 'published'"
            " AND NOT EXISTS (SELECT 1 FROM context_items ci WHERE ci.message_id = sm.message_id)"
            " ORDER BY sm.message_id", (x, x)).fetchall())]

    def removal_tokens(self, message_ids: Sequence[int], summary_ids: Sequence[int]) -> dict[str, dict[int, int]]:
        m, s = [int(i) for i in message_ids], [int(i) for i in summary_ids]

        def run(c: Any) -> dict[str, dict[int, int]]:
            return {"messages": {int(r[0]): int(r[1] or 0) for r in c.execute(
                        "SELECT id, tokens FROM messages WHERE id = ANY(%s)", (m,)).fetchall()},
                    "summaries": {int(r[0]): int(r[1] or 0) for r in c.execute(
                        "SELECT id, tokens FROM summaries WHERE id = ANY(%s)", (s,)).fetchall()}}

        return dict(self._read(run))

    @staticmethod
    def _record_pruned_in(c: Any, m: Sequence[int], pruned_at: float, reason: str) -> int:
        return int(c.execute(
            "INSERT INTO pruned_spans(summary_id, session_id, messages, tokens, first_id, last_id, pruned_at,"
            " reason) SELECT sm.summary_id, MIN(s.session_id), COUNT(*), COALESCE(SUM(x.tokens), 0),"
            " MIN(x.id), MAX(x.id), %s, %s FROM summary_messages sm JOIN summaries s ON s.id = sm.summary_id"
            " JOIN messages x ON x.id = sm.message_id WHERE sm.message_id = ANY(%s) GROUP BY sm.summary_id"
            " ON CONFLICT (summary_id) DO UPDATE SET messages = pruned_spans.messages + excluded.messages,"
            " tokens = pruned_spans.tokens + excluded.tokens,"
            " first_id = LEAST(pruned_spans.first_id, excluded.first_id),"
            " last_id = GREATEST(pruned_spans.last_id, excluded.last_id), pruned_at = excluded.pruned_at",
            (float(pruned_at), reason, list(m))).rowcount)

    def remove_rows(self, kind: str, groups: Sequence[Sequence[int]], *, seconds: float,
                    clock: Callable[[], float] = time.perf_counter, pruned_at: float | None = None,
                    reason: str = "retention") -> tuple[int, int, float]:
        if kind not in ("messages", "summaries"):
            raise ValueError(f"remove_rows: not a kind of row: {kind!r}")
        began = [0.0]

        def tx(c: Any) -> tuple[int, int]:
            done = removed = 0
            t0 = began[0] = clock()  # (in the transaction: a retried one starts counting again)
            for group in groups:
                if done and clock() - t0 >= seconds:
                    break  # commit what is done: the rest goes to the next transaction
                ids = sorted({int(i) for i in group})
                if pruned_at is not None and kind == "messages":
                    self._record_pruned_in(c, ids, pruned_at, reason)
                counts = self._forget_in(c, [], ids if kind == "messages" else [],
                                         ids if kind == "summaries" else [], {})
                removed += counts[kind]
                done += 1
            return done, removed

        done, removed = self._write(tx)
        # (PostgreSQL locks rows, not the store: the time from the transaction's first
        # statement to its commit, the waits for a connection before it not counted)
        return int(done), int(removed), clock() - began[0]

    def pruned_spans(self, summary_ids: Sequence[int]) -> dict[int, dict[str, Any]]:
        ids = [int(i) for i in summary_ids]
        if not ids:
            return {}
        rows = self._read(lambda c: c.execute(
            "SELECT summary_id, messages, tokens, first_id, last_id, pruned_at, reason FROM pruned_spans"
            " WHERE summary_id = ANY(%s)", (ids,)).fetchall())
        return {int(r[0]): {"messages": int(r[1]), "tokens": int(r[2]), "first_id": int(r[3]), "last_id": int(r[4]),
                            "pruned_at": r[5], "reason": r[6]} for r in rows}

    def pruned_message(self, message_id: int) -> dict[str, Any] | None:
        r = self._read(lambda c: c.execute(
            "SELECT summary_id, session_id, pruned_at, reason FROM pruned_spans WHERE first_id <= %s AND last_id >= %s"
            " ORDER BY first_id DESC LIMIT 1", (int(message_id), int(message_id))).fetchone())
        if r is None:
            return None
        return {"summary_id": int(r[0]), "session_id": r[1], "pruned_at": r[2], "reason": r[3]}

    def pruned_totals(self) -> dict[str, Any]:
        r = self._read(lambda c: c.execute(
            "SELECT COUNT(*), COALESCE(SUM(messages), 0), MAX(pruned_at) FROM pruned_spans").fetchone())
        return {"summaries": int(r[0]), "messages": int(r[1]), "last_pruned_at": r[2]}

    def retention_run_start(self, mode: str, trigger: str, plan: dict[str, Any], bytes_before: int | None) -> int:
        return int(self._write(lambda c: c.execute(
            "INSERT INTO retention_runs(started_at, mode, trigger, plan, bytes_before) VALUES (%s,%s,%s,%s,%s)"
            " RETURNING id", (time.time(), mode, trigger, json.dumps(plan), bytes_before)).fetchone()[0]))

    def retention_run_finish(self, run_id: int, sessions: int, messages: int, summaries: int,
                             bytes_after: int | None) -> None:
        self._write(lambda c: c.execute(
            "UPDATE retention_runs SET finished_at=%s, sessions=%s, messages=%s, summaries=%s, bytes_after=%s"
            " WHERE id=%s", (time.time(), sessions, messages, summaries, bytes_after, int(run_id))))

    def retention_runs(self, limit: int = 5) -> list[dict[str, Any]]:
        keys = ("id", "started_at", "finished_at", "mode", "trigger", "plan", "sessions", "messages", "summaries",
                "bytes_before", "bytes_after")
        rows = self._read(lambda c: c.execute(
            f"SELECT {', '.join(keys)} FROM retention_runs ORDER BY id DESC LIMIT %s", (int(limit),)).fetchall())
        out = []
        for r in rows:
            d = dict(zip(keys, r))
            d["plan"] = json.loads(d["plan"] or "{}")
            out.append(d)
        return out

    def space(self) -> dict[str, Any]:
        def run(c: Any) -> dict[str, Any]:
            total = c.execute(
                "SELECT COALESCE(SUM(pg_total_relation_size(to_regclass(n))), 0)::bigint FROM unnest(%s::text[]) AS n",
                (list(STORE_TABLES),)).fetchone()[0]
            dead = c.execute(
                "SELECT relname, n_live_tup, n_dead_tup, last_autovacuum, last_vacuum FROM pg_stat_user_tables"
                " WHERE relid = ANY(ARRAY(SELECT to_regclass(n) FROM unnest(%s::text[]) AS n))",
                (list(PRUNED_TABLES),)).fetchall()
            # (deleted rows keep their space until VACUUM: what is in use is not measured here)
            return {"file_bytes": int(total), "used_bytes": int(total), "free_bytes": 0, "auto_vacuum": "server",
                    "measured": False,
                    "dead_rows": {r[0]: {"live": int(r[1]), "dead": int(r[2]),
                                         "vacuumed_at": max((t for t in r[3:5] if t is not None), default=None)}
                                  for r in dead}}

        return self._read(run)

    def reclaim_space(self, seconds: float = 60.0, pause: float = 0.05) -> int:
        return 0  # autovacuum makes the space reusable; VACUUM FULL / pg_repack shrink (the doctor says)

    def ssl_in_use(self) -> bool | None:
        """Whether this connection to the server is encrypted (TLS), None when unknown."""
        r = self._read(lambda c: c.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone())
        return bool(r[0]) if r is not None else None

    def encryption(self) -> str:
        """"local" for a server on this machine (its disk encryption protects the data), else
        whether the connection to it uses TLS: "tls" or "unencrypted"."""
        loc = self.location
        host = urlparse(loc).hostname or (parse_qs(urlparse(loc).query).get("host") or [""])[0]
        if not host or host.startswith("/") or host in ("localhost", "127.0.0.1", "::1"):
            return "local"
        return "tls" if self.ssl_in_use() else "unencrypted"
