"""PostgreSQL store: the same behaviour as :class:`~.sqlite.SQLiteStore`, for shared or
multi-host deployments (``lcm.store: postgresql://user@host/db``).

* Connections, migrations and the compaction lock live in :mod:`.conn`, search in
  :mod:`.search`.
* psycopg 3 with a small :class:`psycopg_pool.ConnectionPool` (1–4 connections, autocommit),
  opened on first use, never at construction; migrations run then, once per process,
  serialised across processes and hosts by ``pg_advisory_xact_lock``.
* Every write method is one transaction (``with conn.transaction()``): a crashed host
  leaves nothing half-written. Writes that touch a session first lock its ``sessions``
  row (``FOR NO KEY UPDATE``), which serialises writers per session exactly as SQLite's
  single writer does globally (``seq`` allocation, context versions, publish), and keeps
  message ids increasing in commit order within a session. Deadlocks are retried.
* ``raw`` is TEXT holding the JSON string byte for byte (never JSONB). PostgreSQL rejects
  NUL characters and unpaired surrogates in text: other text values are cleaned exactly
  like :func:`~lossless_context.messages.clean_text` (which SQLite applies to message and
  summary text); JSON escapes both, so ``raw`` needs nothing.
* Full-text search: a generated ``tsv`` column (``to_tsvector('english', text)``) with a GIN
  index, queried with ``to_tsquery('english', plan.pg_tsquery)`` and ranked with
  ``ts_rank_cd``; ``rank`` is the negated score so SMALLER is better, like SQLite's bm25.
  Substring search uses ``ILIKE … ESCAPE '\\'`` (trigram-indexed when ``pg_trgm`` exists).
* ``compaction_lock`` is a session-level advisory lock held on a dedicated connection from
  a separate small pool (so lock holders never starve the data pool); the server drops it
  if the holder's connection dies.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Any, Callable, Iterable, Iterator, Sequence

from .. import passes
from ...records import ContextEntry, MessageRecord, NewMessage, NewSummary, StagedPass, SummaryRecord
from ..base import Store, StoreError, resolve_keys, resolve_new_refs
from .append import Replay, send_messages
from .text import pg_text as _t
from .conn import WRITE_RETRIES, PostgresConnections
from .costs import PostgresCosts
from .index import PostgresIndexer
from .records import PostgresRecords
from .lifecycle import PostgresLifecycle
from ..rows import MSG_COLS, SUM_COLS, message_record, summary_record
from .repair import PostgresRepairs, portable
from .search import PostgresSearch
from .vectors import PostgresVectors
from .versions import VersionCache, cache_for, peek, take_touched, touch_scopes


log = logging.getLogger("lossless_context.store")

# A session's last seq. ORDER BY ... LIMIT 1, not MAX(seq): planned with the statistics of a
# session that was new, MAX went through the (session_id, id) index and read every row of the
# session (1 ms at 1,000 messages, growing with it) on every append; this is one index step.
# An append's first read, once the session's row is locked: its context version and its last
# seq (one index step: ORDER BY seq DESC LIMIT 1 on (session_id, seq), not MAX(seq), which a
# session new to the planner's statistics planned through (session_id, id) and read whole).
APPEND_HEAD = (
    "SELECT s.context_version,"
    " COALESCE((SELECT m.seq FROM messages m WHERE m.session_id = s.id ORDER BY m.seq DESC LIMIT 1), -1)"
    " FROM sessions s WHERE s.id = %s"
)
_TABLES = ("sessions", "messages", "message_absorbed", "message_aliases", "summaries", "summary_messages",
           "summary_parents", "context_items", "staged_passes", "presummaries", "lcm_migrations")


_TOUCHED = threading.local()  # sessions whose context version this thread's transaction bumped


def _touched() -> list[str]:
    t = getattr(_TOUCHED, "sids", None)
    if t is None:
        t = _TOUCHED.sids = []
    return t


class PostgresStore(PostgresRecords, PostgresLifecycle, PostgresSearch, PostgresCosts, PostgresVectors,
                    PostgresRepairs,
                    PostgresConnections, Store):
    kind = "postgresql"
    # (row locks: a prune's transaction does not hold up other sessions' writes, and each group
    # costs a round trip and its statements' planning — measured: 8 groups made a prune ~10x slower)
    removal_groups = 2

    def __init__(self, location: str, *, background_index: bool = True, **kwargs: Any) -> None:
        """``background_index=False``: this store never indexes by itself (tools and tests
        index with :meth:`index_pending_batch` / :meth:`wait_indexed`; searches still see
        every committed message)."""
        super().__init__(location, **kwargs)
        self._indexer = PostgresIndexer(self._write, self._read, self.location)
        self._background_index = bool(background_index)
        self._version_cache: tuple[int, VersionCache] | None = None

    def _write(self, fn: Callable[[Any], Any], seconds: float | None = None, *, pipeline: bool = False) -> Any:
        touched = _touched()
        mark = len(touched)
        try:
            return super()._write(fn, seconds, pipeline=pipeline)  # (write_sql passes its own bound)
        finally:
            # After the commit (or the rollback): this process's next read sees the new version.
            sids, touched[mark:] = touched[mark:], []
            scopes = take_touched()
            cache = peek(self._dsn) if sids or scopes else None
            for sid in sids:
                if cache is not None:
                    cache.forget(sid)
            if scopes and cache is not None:
                cache.scopes_changed()

    def _scoped(self, key: tuple[Any, ...], read: Callable[[], Any]) -> Any:
        """A session's scope (lineage, ancestry) from the listener's cache when this store
        runs the listener (select_context starts it) and nothing changed since it was read."""
        held = self._version_cache
        cache = held[1] if held is not None and held[0] == os.getpid() else None
        generation = cache.scope_generation() if cache is not None else None
        if cache is None or generation is None:
            return read()
        hit = cache.scope_get(key)
        if hit is not None:
            return list(hit)
        value = read()
        cache.scope_put(key, generation, tuple(value))
        return value

    def ancestry(self, session_id: str, limit: int = 256) -> list[tuple[str, str | None, tuple[int, int] | None]]:
        return self._scoped(("ancestry", _t(session_id), limit), lambda: super(PostgresStore, self).ancestry(
            session_id, limit))

    def _versions(self) -> VersionCache:
        held = self._version_cache
        if held is None or held[0] != os.getpid():
            cache = cache_for(self._dsn, self._conn_kwargs())
            cache.acquire()
            held = self._version_cache = (os.getpid(), cache)
        return held[1]

    def version_listener_ready(self, timeout: float = 0.0) -> bool:
        """Whether context versions are being kept by LISTEN/NOTIFY (starts the listener)."""
        return self._versions().wait_ready(timeout)

    def cached_context_version(self, session_id: str) -> int:
        """The context version, from the LISTEN/NOTIFY cache when it has it (no query)."""
        cache = self._versions()
        sid = _t(session_id)
        v = cache.get(sid)
        if v is None:
            v = self.context_version(session_id)
            cache.note(sid, v)
        return v

    def _on_open(self) -> None:
        if self._background_index:
            self._indexer.kick()  # a backlog another process left behind

    def index_missing(self) -> int:
        """Messages neither in the full-text index nor listed for it (0 unless damaged)."""
        return self._read(lambda c: c.execute(
            "SELECT count(*) FROM messages m WHERE NOT EXISTS (SELECT 1 FROM message_index x WHERE x.id = m.id)"
            " AND NOT EXISTS (SELECT 1 FROM message_index_pending p WHERE p.message_id = m.id)").fetchone()[0])

    def repair_index(self) -> int:
        """List every message missing from the full-text index and index them; how many."""
        n = self._write(lambda c: c.execute(
            "INSERT INTO message_index_pending(message_id) SELECT m.id FROM messages m"
            " WHERE NOT EXISTS (SELECT 1 FROM message_index x WHERE x.id = m.id)"
            " ON CONFLICT DO NOTHING").rowcount)
        self._indexer.wait_indexed()
        return n

    def has_trigram_index(self) -> bool:
        """Whether the optional pg_trgm migration is applied (substring search over
        summaries uses it; without it that search scans)."""
        return "002_trigram" in self.applied_migrations()

    def wait_indexed(self) -> None:
        self._indexer.wait_indexed()

    def backfill_identifiers(self) -> None:
        """Finish now the identifier lexemes of rows indexed before migration 033 (idents.py),
        which the indexer thread otherwise adds when idle; searches use them from then on."""
        self._indexer.backfill_identifiers()
        self.__dict__.pop("_idents_state", None)

    def index_pending_batch(self, batch: int = 256) -> list[int]:
        """Index one batch of committed, not yet indexed messages; the ids this call indexed.
        (The background indexer does this by itself; for tools and tests.)"""
        return self._indexer.index_batch(batch)

    def close(self) -> None:
        self._indexer.close()
        held, self._version_cache = self._version_cache, None
        if held is not None and held[0] == os.getpid():
            held[1].release()
        super().close()

    @staticmethod
    def _lock_sessions(c: Any, *session_ids: str | None) -> dict[str, int]:
        """Lock these sessions' rows (sorted, so concurrent writers never deadlock);
        returns id → context_version of the rows that exist."""
        ids = sorted({_t(s) for s in session_ids if s is not None})
        rows = c.execute(
            "SELECT id, context_version FROM sessions WHERE id = ANY(%s::text[]) ORDER BY id FOR NO KEY UPDATE",
            (ids,),
        ).fetchall()
        return {r[0]: r[1] for r in rows}

    @staticmethod
    def _lock_sessions_unread(c: Any, session_id: str) -> None:
        """Lock one session's row without reading the answer now (in a pipeline: no wait)."""
        c.execute("SELECT 1 FROM sessions WHERE id = %s FOR NO KEY UPDATE", (session_id,))

    # -- sessions ----------------------------------------------------------------------

    def ensure_session(
        self,
        session_id: str,
        *,
        parent_id: str | None = None,
        conversation_id: str | None = None,
        platform: str | None = None,
        model: str | None = None,
        boundary_reason: str | None = None,
    ) -> None:
        now = time.time()
        sid = _t(session_id)
        pid = _t(parent_id) if parent_id and parent_id != session_id else None
        if pid == sid:
            pid = None

        def tx(c: Any) -> None:
            touch_scopes()
            if pid:
                c.execute(
                    "INSERT INTO sessions(id, created_at, updated_at) VALUES (%s, %s, %s) ON CONFLICT (id) DO NOTHING",
                    (pid, now, now),
                )
            c.execute(
                "INSERT INTO sessions(id, parent_id, conversation_id, platform, model, created_at, updated_at,"
                " boundary_reason) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
                " ON CONFLICT (id) DO UPDATE SET"
                " parent_id = COALESCE(sessions.parent_id, EXCLUDED.parent_id),"
                " conversation_id = COALESCE(sessions.conversation_id, EXCLUDED.conversation_id),"
                " platform = COALESCE(EXCLUDED.platform, sessions.platform),"
                " model = COALESCE(EXCLUDED.model, sessions.model),"
                " updated_at = EXCLUDED.updated_at,"
                " boundary_reason = COALESCE(EXCLUDED.boundary_reason, sessions.boundary_reason)",
                (sid, pid, _t(conversation_id), _t(platform), _t(model), now, now, _t(boundary_reason)),
            )

        self._write(tx)

    def get_session(self, session_id: str) -> dict[str, Any] | None:
        row = self._read(lambda c: c.execute(
            "SELECT id, parent_id, conversation_id, platform, model, created_at, updated_at,"
            " context_version, compactions, last_compaction_at, boundary_reason FROM sessions WHERE id=%s",
            (_t(session_id),),
        ).fetchone())
        if row is None:
            return None
        keys = ("id", "parent_id", "conversation_id", "platform", "model", "created_at", "updated_at",
                "context_version", "compactions", "last_compaction_at", "boundary_reason")
        return dict(zip(keys, row))

    def list_sessions(self) -> list[dict[str, Any]]:
        rows = self._read(lambda c: c.execute(
            "SELECT s.id, s.parent_id, s.conversation_id, s.created_at, s.updated_at, s.compactions,"
            " s.last_compaction_at,"
            " (SELECT COUNT(*) FROM messages m WHERE m.session_id = s.id),"
            " (SELECT COUNT(*) FROM summaries x WHERE x.session_id = s.id AND x.state='published'),"
            " s.boundary_reason FROM sessions s ORDER BY s.created_at, s.id"
        ).fetchall())
        keys = ("id", "parent_id", "conversation_id", "created_at", "updated_at", "compactions",
                "last_compaction_at", "messages", "summaries", "boundary_reason")
        return [dict(zip(keys, r)) for r in rows]

    def lineage(self, session_id: str) -> list[str]:
        return self._scoped(("lineage", _t(session_id)), lambda: self.read_lineage(session_id))

    # -- messages -------------------------------------------------------------------------

    def append_messages(self, session_id: str, rows: Iterable[NewMessage],
                        context: Sequence[tuple[str, int]] | None = None,
                        context_known: tuple[int, int] | None = None,
                        on_ids: Callable[[list[int]], None] | None = None) -> list[int]:
        with self._indexer.appending():  # (the background indexer gives way meanwhile: index.py)
            return self._append_messages(session_id, rows, context, context_known, on_ids)

    def _append_messages(self, session_id: str, rows: Iterable[NewMessage],
                         context: Sequence[tuple[str, int]] | None,
                         context_known: tuple[int, int] | None,
                         on_ids: Callable[[list[int]], None] | None) -> list[int]:
        source = Replay(rows)  # (may be lazy; a retried transaction needs them again)
        if source.empty():
            if on_ids is not None:
                on_ids([])
            return []
        sid = _t(session_id)

        def tx(c: Any) -> list[int]:
            # Two round trips in pipeline mode (conn.py): everything up to the inserts' ids,
            # then the rest with the commit. The session's row locked first (one writer per
            # session: seq and id order are safe), then its version and last seq, then the
            # inserts, each sent as soon as its rows are built (append.py): the server works
            # on one chunk while this thread builds the next.
            # (separate statements sent in order: each one's snapshot is taken once the lock is
            # held, so they see the seq a concurrent append just committed; a subquery in the
            # locking statement would read its snapshot from before the lock wait)
            self._lock_sessions_unread(c, sid)
            head_cur = c.execute(APPEND_HEAD, (sid,))
            read_ids = send_messages(c, sid, source)
            head = head_cur.fetchone()
            version, seq = head if head is not None else (None, -1)  # (no session: the insert's FK says so)
            first = seq + 1
            rows = source.rows
            by_seq = read_ids()
            ids: list[int] = [by_seq[first + i] for i in range(len(rows))]
            absorbed = [(mid, _t(u)) for mid, r in zip(ids, rows) for u in r.absorbed]
            if absorbed:
                with c.cursor() as cur:
                    cur.executemany(
                        "INSERT INTO message_absorbed(message_id, uid) VALUES (%s, %s) ON CONFLICT DO NOTHING",
                        absorbed,
                    )
            if context is None:
                c.execute("UPDATE sessions SET updated_at=%s WHERE id=%s", (time.time(), sid))
            else:  # (_write_context's version bump sets updated_at too)
                known = context_known[1] if context_known is not None and version == context_known[0] else 0
                self._write_context(c, sid, resolve_new_refs(context, ids, known), known)
            return ids

        ids = self._write(tx, pipeline=True)
        self.forget_max_row_id()
        if self._background_index:
            self._indexer.kick()  # full-text index them off the commit path (index.py)
        if on_ids is not None:
            on_ids(ids)  # (after the commit: a retried transaction may give other ids)
        return ids

    def get_messages(self, ids: Sequence[int]) -> dict[int, MessageRecord]:
        ids = list(dict.fromkeys(int(i) for i in ids))
        if not ids:
            return {}
        # One id (an expand, a describe) is a primary-key equality, not ANY(array): the array's
        # adaptation and the ANY plan cost more than reading the row (0.23 vs 0.16 ms). Rows
        # come back in binary: no text parsing of the numbers and timestamps.
        args: tuple[Any, ...]
        if len(ids) == 1:
            sql, args = f"SELECT {MSG_COLS} FROM messages WHERE id = %s", (ids[0],)
        else:
            sql, args = f"SELECT {MSG_COLS} FROM messages WHERE id = ANY(%s::bigint[])", (ids,)
        rows = self._read(lambda c: c.cursor(binary=True).execute(sql, args).fetchall())
        return {r[0]: message_record(r) for r in rows}

    def log_after(self, session_ids: Sequence[str], after_id: int, limit: int) -> list[tuple[int, str, str | None]]:
        if not session_ids:
            return []
        rows = self._read(lambda c: c.execute(
            "SELECT id, ident, uid FROM messages WHERE session_id = ANY(%s::text[]) AND id > %s ORDER BY id LIMIT %s",
            ([_t(s) for s in session_ids], after_id, limit),
        ).fetchall())
        return [tuple(r) for r in rows]

    def find_uid(self, session_ids: Sequence[str], uid: str) -> tuple[int, str] | None:
        row = self._read(lambda c: c.execute(
            "SELECT id, ident FROM messages WHERE uid=%s AND session_id = ANY(%s::text[]) ORDER BY id DESC LIMIT 1",
            (_t(uid), [_t(s) for s in session_ids]),
        ).fetchone())
        return (row[0], row[1]) if row else None

    def find_ident(self, session_id: str, ident: str, after_id: int) -> tuple[int, str | None] | None:
        row = self._read(lambda c: c.execute(
            "SELECT id, uid FROM messages WHERE session_id=%s AND ident=%s AND id>%s ORDER BY id LIMIT 1",
            (_t(session_id), _t(ident), int(after_id)),
        ).fetchone())
        return (row[0], row[1]) if row else None

    def add_aliases(self, pairs: Sequence[tuple[str, int]]) -> None:
        if not pairs:
            return
        rows = [(_t(ident), int(mid)) for ident, mid in pairs]

        def tx(c: Any) -> None:
            with c.cursor() as cur:
                cur.executemany(
                    "INSERT INTO message_aliases(ident, message_id) VALUES (%s, %s) ON CONFLICT DO NOTHING", rows)

        self._write(tx)

    def set_representations(self, pairs: Sequence[tuple[int, str]]) -> set[int]:
        if not pairs:
            return set()
        first: dict[int, str] = {}
        for mid, text in pairs:  # a message given twice keeps its first text, as one by one would
            first.setdefault(int(mid), _t(text))

        def tx(c: Any) -> set[int]:
            # one statement for the pass (was one UPDATE per message, ~8 per compaction pass)
            return {r[0] for r in c.execute(
                "UPDATE messages m SET large=TRUE, exploration=u.t FROM unnest(%s::bigint[], %s::text[]) AS u(id, t)"
                " WHERE m.id = u.id AND NOT m.large RETURNING m.id", (list(first), list(first.values())))}

        return self._write(tx)

    def prepare_representations(self, pairs: Sequence[tuple[int, str]]) -> None:
        if not pairs:
            return
        first: dict[int, str] = {}
        for mid, text in pairs:
            first.setdefault(int(mid), _t(text))
        self._write(lambda c: c.execute(
            "UPDATE messages m SET exploration=u.t FROM unnest(%s::bigint[], %s::text[]) AS u(id, t)"
            " WHERE m.id = u.id AND NOT m.large", (list(first), list(first.values()))))

    def aliases_for(self, message_ids: Sequence[int]) -> dict[str, int]:
        ids = list(dict.fromkeys(int(i) for i in message_ids))
        if not ids:
            return {}
        rows = self._read(lambda c: c.execute(
            "SELECT ident, message_id FROM message_aliases WHERE message_id = ANY(%s::bigint[])"
            " ORDER BY message_id, ident", (ids,)).fetchall())
        return {r[0]: r[1] for r in rows}

    def session_messages(self, session_id: str, after_seq: int = -1, limit: int = 1000) -> list[MessageRecord]:
        rows = self._read(lambda c: c.execute(
            f"SELECT {MSG_COLS} FROM messages WHERE session_id=%s AND seq>%s ORDER BY seq LIMIT %s",
            (_t(session_id), after_seq, limit),
        ).fetchall())
        return [message_record(r) for r in rows]

    def session_messages_in(self, session_id: str, ranges: Sequence[tuple[int, int]]) -> list[MessageRecord]:
        return self.messages_in([(session_id, lo, hi) for lo, hi in ranges])

    def messages_in(self, spans: Sequence[tuple[str, int, int]]) -> list[MessageRecord]:
        spans = [(sid, lo, hi) for sid, lo, hi in spans if hi >= lo]
        if not spans:
            return []
        cols = ", ".join(f"m.{c.strip()}" for c in MSG_COLS.split(","))
        rows = self._read(lambda c: c.execute(
            f"SELECT DISTINCT ON (m.session_id, m.seq) {cols} FROM unnest(%s::text[], %s::bigint[], %s::bigint[])"
            " AS r(sid, lo, n) CROSS JOIN LATERAL (SELECT * FROM messages WHERE session_id=r.sid AND seq >= r.lo"
            " ORDER BY seq LIMIT r.n) m ORDER BY m.session_id, m.seq",
            ([_t(sid) for sid, _, _ in spans], [lo for _, lo, _ in spans], [hi - lo + 1 for _, lo, hi in spans]),
        ).fetchall())
        return [message_record(r) for r in rows]

    def iter_all_messages(self, batch: int = 1000) -> Iterator[MessageRecord]:
        last = 0
        while True:
            rows = self._read(lambda c, after=last: c.execute(
                f"SELECT {MSG_COLS} FROM messages WHERE id>%s ORDER BY id LIMIT %s", (after, batch)).fetchall())
            if not rows:
                return
            for r in rows:
                yield message_record(r)
            last = rows[-1][0]

    # -- active context -----------------------------------------------------------------------

    def context_version(self, session_id: str) -> int:
        row = self._read(lambda c: c.execute(
            "SELECT context_version FROM sessions WHERE id=%s", (_t(session_id),)).fetchone())
        return row[0] if row else 0

    def get_context(self, session_id: str) -> tuple[int, list[ContextEntry]]:
        # One statement, so the version and the items come from the same snapshot.
        rows = self._read(lambda c: c.execute(
            "SELECT s.context_version, ci.pos, ci.message_id, ci.summary_id, m.ident, m.role, m.tokens, x.tokens"
            " FROM sessions s LEFT JOIN context_items ci ON ci.session_id = s.id"
            " LEFT JOIN messages m ON m.id = ci.message_id"
            " LEFT JOIN summaries x ON x.id = ci.summary_id WHERE s.id=%s ORDER BY ci.pos",
            (_t(session_id),),
        ).fetchall())
        if not rows:
            return 0, []
        entries = []
        for _v, pos, mid, sid, m_ident, m_role, m_tokens, s_tokens in rows:
            if pos is None:
                continue
            if mid is not None:
                entries.append(ContextEntry("m", mid, m_ident, m_role, m_tokens))
            else:
                entries.append(ContextEntry("s", sid, "", "summary", s_tokens or 0))
        return rows[0][0], entries

    def set_context(self, session_id: str, entries: Sequence[ContextEntry], expected_version: int | None = None) -> int:
        sid = _t(session_id)

        def tx(c: Any) -> int:
            versions = self._lock_sessions(c, sid)
            if sid not in versions:
                raise StoreError(f"unknown session {session_id}")
            if expected_version is not None and versions[sid] != expected_version:
                raise StoreError("context changed concurrently")
            self._write_context(c, sid, [(e.kind, e.ref) for e in entries])
            return versions[sid] + 1

        return self._write(tx)

    @staticmethod
    def _write_context(c: Any, session_id: str, items: Sequence[tuple[str, int]], known: int = 0) -> None:
        # `known`: the caller checked the version, the stored context is items[:known].
        _touched().append(session_id)
        c.execute("DELETE FROM context_items WHERE session_id=%s AND pos>=%s", (session_id, known))
        tail = items[known:]
        if tail:
            c.execute(
                "INSERT INTO context_items(session_id, pos, message_id, summary_id)"
                " SELECT %s, u.ord - 1 + %s, u.m, u.s FROM unnest(%s::bigint[], %s::bigint[]) WITH ORDINALITY AS u(m, s, ord)",
                (session_id, known,
                 [int(ref) if kind == "m" else None for kind, ref in tail],
                 [int(ref) if kind == "s" else None for kind, ref in tail]),
            )
        c.execute(
            "UPDATE sessions SET context_version = context_version + 1, updated_at=%s WHERE id=%s",
            (time.time(), session_id),
        )

    # -- staged passes ------------------------------------------------------------------------

    def stage_pass(
        self,
        session_id: str,
        pass_id: str,
        summaries: Sequence[NewSummary],
        items: Sequence[tuple[str, Any]],
        base_version: int,
        base_len: int,
    ) -> tuple[dict[str, int], list[tuple[str, int]]]:
        now = time.time()
        sid, pid = _t(session_id), _t(pass_id)

        def tx(c: Any) -> tuple[dict[str, int], list[tuple[str, int]]]:
            self._lock_sessions(c, sid)
            keymap: dict[str, int] = {}
            for s in summaries:
                new_id = c.execute(
                    "INSERT INTO summaries(session_id, kind, depth, text, tokens, source_tokens, level,"
                    " summarizer, t_start, t_end, n_messages, state, pass_id, created_at)"
                    " VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,'staged',%s,%s) RETURNING id",
                    (sid, _t(s.kind), s.depth, _t(resolve_keys(s.text, keymap)), s.tokens, s.source_tokens, _t(s.level),
                     _t(s.summarizer), s.t_start, s.t_end, s.n_messages, pid, now),
                ).fetchone()[0]
                keymap[s.key] = new_id
                if s.message_ids:
                    c.execute(
                        "INSERT INTO summary_messages(summary_id, message_id, ord)"
                        " SELECT %s, u.m, u.ord - 1 FROM unnest(%s::bigint[]) WITH ORDINALITY AS u(m, ord)",
                        (new_id, [int(m) for m in s.message_ids]),
                    )
                if s.child_keys:
                    c.execute(
                        "INSERT INTO summary_parents(parent_id, child_id, ord)"
                        " SELECT %s, u.k, u.ord - 1 FROM unnest(%s::bigint[]) WITH ORDINALITY AS u(k, ord)",
                        (new_id, [keymap[k] if isinstance(k, str) else int(k) for k in s.child_keys]),
                    )
            resolved = [(k, keymap[r] if isinstance(r, str) else int(r)) for k, r in items]
            top = [r for k, r in resolved if k == "s"]
            c.execute(
                "INSERT INTO staged_passes(pass_id, session_id, base_version, base_len, items, top_nodes,"
                " created_at) VALUES (%s,%s,%s,%s,%s,%s,%s)",
                (pid, sid, base_version, base_len, json.dumps(resolved), json.dumps(top), now),
            )
            return keymap, resolved

        try:
            return self._write(tx)
        finally:
            self.forget_max_row_id()

    def staged_passes(self, session_id: str) -> list[StagedPass]:
        rows = self._read(lambda c: c.execute(
            "SELECT pass_id, session_id, base_version, base_len, items, top_nodes, created_at"
            " FROM staged_passes WHERE session_id=%s ORDER BY created_at DESC, rid DESC",
            (_t(session_id),),
        ).fetchall())
        return [StagedPass(r[0], r[1], r[2], r[3], [tuple(x) for x in json.loads(r[4])], json.loads(r[5]), r[6])
                for r in rows]

    def publish_pass(self, pass_id: str, into_session: str | None = None) -> bool:
        pid = _t(pass_id)
        into = _t(into_session) if into_session else None
        for _ in range(WRITE_RETRIES):  # (a concurrent publish of the same pass consumed it meanwhile)
            try:
                return self._write(lambda c: passes.publish(self._pass_writes(c), pid, into))
            except _Retry:
                continue
        return self._write(lambda c: passes.publish(self._pass_writes(c), pid, into))

    def _pass_writes(self, c: Any) -> _PostgresPassWrites:
        return _PostgresPassWrites(c, self._lock_sessions, self._write_context)

    def discard_pass(self, pass_id: str) -> None:
        pid = _t(pass_id)

        def tx(c: Any) -> None:
            owners = [r[0] for r in c.execute(
                "SELECT session_id FROM staged_passes WHERE pass_id=%s"
                " UNION SELECT session_id FROM summaries WHERE pass_id=%s AND state='staged'",
                (pid, pid),
            )]
            self._lock_sessions(c, *owners)
            self._pass_writes(c).delete_passes([pid])

        self._write(tx)

    def discard_stale(self, session_id: str, keep: str | None = None) -> int:
        sid = _t(session_id)

        def tx(c: Any) -> int:
            self._lock_sessions(c, sid)
            return passes.discard_stale(self._pass_writes(c), sid, _t(keep))

        return self._write(tx)

    # -- summaries ------------------------------------------------------------------------------

    def get_summaries(self, ids: Sequence[int], include_staged: bool = False) -> dict[int, SummaryRecord]:
        ids = list(dict.fromkeys(int(i) for i in ids))
        if not ids:
            return {}
        state = "" if include_staged else " AND state='published'"
        rows = self._read(lambda c: c.execute(
            f"SELECT {SUM_COLS} FROM summaries WHERE id = ANY(%s::bigint[]){state}", (ids,)).fetchall())
        return {r[0]: summary_record(r) for r in rows}

    def summary_children(self, summary_id: int) -> tuple[list[int], list[int]]:
        rows = self._read(lambda c: c.execute(  # both lists in one round trip
            "SELECT 0, ord, child_id FROM summary_parents WHERE parent_id=%s"
            " UNION ALL SELECT 1, ord, message_id FROM summary_messages WHERE summary_id=%s ORDER BY 1, 2",
            (summary_id, summary_id)).fetchall())
        return [r[2] for r in rows if r[0] == 0], [r[2] for r in rows if r[0] == 1]

    def summary_parents(self, summary_id: int) -> list[int]:
        return self._read(lambda c: [r[0] for r in c.execute(
            "SELECT sp.parent_id FROM summary_parents sp JOIN summaries s ON s.id = sp.parent_id"
            " WHERE sp.child_id=%s AND s.state='published' ORDER BY sp.parent_id", (summary_id,))])

    def message_summaries(self, message_id: int) -> list[int]:
        return self._read(lambda c: [r[0] for r in c.execute(
            "SELECT sm.summary_id FROM summary_messages sm JOIN summaries s ON s.id = sm.summary_id"
            " WHERE sm.message_id=%s AND s.state='published' ORDER BY sm.summary_id", (message_id,))])

    def update_summary_text(self, summary_id: int, text: str, tokens: int, level: str, summarizer: str) -> None:
        self._write(lambda c: c.execute(
            "UPDATE summaries SET text=%s, tokens=%s, level=%s, summarizer=%s WHERE id=%s",
            (_t(text), tokens, _t(level), _t(summarizer), summary_id),
        ))

    def rebalance_summary(self, summary_id: int, summaries: Sequence[NewSummary],
                          child_keys: Sequence[str | int], depth: int) -> dict[str, int]:
        now = time.time()

        def tx(c: Any) -> dict[str, int]:
            session_id = c.execute("SELECT session_id FROM summaries WHERE id=%s", (summary_id,)).fetchone()[0]
            self._lock_sessions(c, session_id)
            keymap: dict[str, int] = {}

            def link(parent: int, keys: Sequence[str | int]) -> None:
                if keys:
                    c.execute(
                        "INSERT INTO summary_parents(parent_id, child_id, ord)"
                        " SELECT %s, u.k, u.ord - 1 FROM unnest(%s::bigint[]) WITH ORDINALITY AS u(k, ord)",
                        (parent, [keymap[k] if isinstance(k, str) else int(k) for k in keys]))

            for s in summaries:
                new_id = c.execute(
                    "INSERT INTO summaries(session_id, kind, depth, text, tokens, source_tokens, level,"
                    " summarizer, t_start, t_end, n_messages, state, pass_id, created_at)"
                    " VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,'published',NULL,%s) RETURNING id",
                    (session_id, _t(s.kind), s.depth, _t(s.text), s.tokens, s.source_tokens, _t(s.level),
                     _t(s.summarizer), s.t_start, s.t_end, s.n_messages, now)).fetchone()[0]
                keymap[s.key] = new_id
                link(new_id, s.child_keys)
            c.execute("DELETE FROM summary_parents WHERE parent_id=%s", (summary_id,))
            link(summary_id, child_keys)
            c.execute("UPDATE summaries SET depth=%s WHERE id=%s", (depth, summary_id))
            return keymap

        return self._write(tx)

    # -- summaries prepared ahead of a pass (background compaction) ----------------------------

    def put_presummary(self, session_id: str, span_key: str, text: str, tokens: int, source_tokens: int,
                       level: str, summarizer: str) -> None:
        self._write(lambda c: c.execute(
            "INSERT INTO presummaries(session_id, span_key, text, tokens, source_tokens, level, summarizer,"
            " created_at) VALUES (%s,%s,%s,%s,%s,%s,%s,%s)"
            " ON CONFLICT (session_id, span_key) DO UPDATE SET text=EXCLUDED.text, tokens=EXCLUDED.tokens,"
            " source_tokens=EXCLUDED.source_tokens, level=EXCLUDED.level, summarizer=EXCLUDED.summarizer,"
            " created_at=EXCLUDED.created_at",
            (_t(session_id), _t(span_key), _t(text), tokens, source_tokens, _t(level), _t(summarizer), time.time()),
        ))

    def get_presummary(self, session_id: str, span_key: str) -> dict[str, Any] | None:
        row = self._read(lambda c: c.execute(
            "SELECT text, tokens, source_tokens, level, summarizer FROM presummaries WHERE session_id=%s AND span_key=%s",
            (_t(session_id), _t(span_key)),
        ).fetchone())
        if row is None:
            return None
        return dict(zip(("text", "tokens", "source_tokens", "level", "summarizer"), row))

    def count_presummaries(self, session_id: str | None = None) -> int:
        if session_id is None:
            return self._read(lambda c: c.execute("SELECT COUNT(*) FROM presummaries").fetchone()[0])
        return self._read(lambda c: c.execute(
            "SELECT COUNT(*) FROM presummaries WHERE session_id=%s", (_t(session_id),)).fetchone()[0])

    # -- maintenance ------------------------------------------------------------------------------

    def stats(self, session_id: str | None = None) -> dict[str, Any]:
        w, p = ("", ()) if session_id is None else (" WHERE session_id=%s", (_t(session_id),))

        def run(c: Any) -> dict[str, Any]:
            msgs = c.execute(f"SELECT COUNT(*), COALESCE(SUM(tokens),0)::bigint FROM messages{w}", p).fetchone()
            by_depth = {
                int(d): n
                for d, n in c.execute(
                    f"SELECT depth, COUNT(*) FROM summaries{w}{' AND' if w else ' WHERE'} state='published'"
                    " GROUP BY depth ORDER BY depth", p)
            }
            staged = c.execute(
                f"SELECT COUNT(*) FROM summaries{w}{' AND' if w else ' WHERE'} state='staged'", p).fetchone()[0]
            sess = c.execute(
                "SELECT COUNT(*), COALESCE(SUM(compactions),0)::bigint, MAX(last_compaction_at) FROM sessions"
                + ("" if session_id is None else " WHERE id=%s"), p).fetchone()
            size = c.execute(
                "SELECT COALESCE(SUM(pg_total_relation_size(to_regclass(n))),0)::bigint FROM unnest(%s::text[]) AS n",
                (list(_TABLES),)).fetchone()[0]
            return {
                "backend": "postgresql",
                "location": self.location,
                "bytes": size,
                "sessions": sess[0],
                "messages": msgs[0],
                "message_tokens": msgs[1],
                "summaries_by_depth": by_depth,
                "staged_summaries": staged,
                "compactions": sess[1],
                "last_compaction_at": sess[2],
                "unindexed_messages": c.execute("SELECT count(*) FROM message_index_pending").fetchone()[0],
            }

        return self._read(run)

class _PostgresPassWrites(passes.PortablePassWrites):
    """PostgreSQL's own statements of a publish or a discard (store/passes.py): its row locks,
    and deletes over arrays; the rest is the portable SQL."""

    def __init__(self, c: Any, lock: Callable[..., dict[str, int]],
                 write_context: Callable[[Any, str, Sequence[tuple[str, int]]], None]) -> None:
        super().__init__(lambda sql, params=(): c.execute(portable(sql), tuple(params)),
                         lambda sid, items: write_context(c, sid, items))
        self.c, self._lock = c, lock

    def locked_stage(self, pass_id: str, into_session: str | None) -> passes.Stage | None:
        first = self.c.execute("SELECT session_id FROM staged_passes WHERE pass_id=%s", (pass_id,)).fetchone()
        if first is None:
            return None
        session_id = first[0]
        # Lock the sessions first (the order every writer uses), then re-read the stage: a
        # concurrent publish of the same pass may have consumed it meanwhile.
        versions = self._lock(self.c, session_id, into_session)
        row = self.c.execute("SELECT session_id, base_version, base_len, items FROM staged_passes WHERE pass_id=%s"
                             " FOR UPDATE", (pass_id,)).fetchone()
        if row is None or row[0] != session_id:
            raise _Retry()
        return passes.Stage(row[0], row[1], row[2], row[3], versions.get(session_id))

    def delete_passes(self, pass_ids: Sequence[str]) -> None:
        self.c.execute("DELETE FROM summaries WHERE pass_id = ANY(%s::text[]) AND state='staged'", (list(pass_ids),))
        self.c.execute("DELETE FROM staged_passes WHERE pass_id = ANY(%s::text[])", (list(pass_ids),))


class _Retry(Exception):
    """The row read before locking changed meanwhile: run the transaction again."""
