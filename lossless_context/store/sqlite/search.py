"""Search over the SQLite store: FTS5 full text, the CJK trigram index, LIKE, bounded regex.

A mixin of :class:`~lossless_context.store.sqlite.store.SQLiteStore` (it uses the store's
``conn``); kept apart so each module holds one job.
"""

from __future__ import annotations

import re
import sqlite3
from typing import Any, Callable, Sequence

from ...messages import CJK_CLASS

# Runs of the scripts indexed by the trigram table (CJK, kana, Hangul; messages.CJK_CLASS).
_CJK_RE = re.compile(CJK_CLASS + "+")
# A lineage's sessions fewer than this many ids apart are searched as one id range
# (_session_ranges), and so are its summaries fewer than NEAR_SUMMARY_IDS apart, in at most
# MAX_RANGES ranges (_summary_ranges).
NEAR_IDS = 10_000
NEAR_SUMMARY_IDS = 100
MAX_RANGES = 64
MAX_LISTED = 2_000  # a lineage of more summaries is searched as one range
SPARSE_SPAN = 4_096  # (see _session_ranges)
SPARSE_FACTOR = 4
# A lineage of at most this many sessions has its summaries searched through the index of
# summaries by session (migration 015), one phrase per session; a longer one by id ranges.
MAX_SCOPED_SESSIONS = 64


class SQLiteSearch:
    """term_counts, max_row_id and search of the SQLite store."""

    conn: Callable[[], sqlite3.Connection]  # SQLiteStore's: the calling thread's connection
    _index_before_search: Callable[[], None]  # SQLiteStore's (store/sqlite/index.py)

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
        alias = "t"
        where: list[str] = []
        params: list[Any] = []
        with_sql = ""
        with_params: list[Any] = []
        if session_ids is not None:
            where.append(f"{alias}.session_id IN ({','.join('?' * len(session_ids))})")
            params.extend(session_ids)
        if not is_msg:
            where.append(f"{alias}.state='published'")
        if role and is_msg:
            where.append(f"{alias}.role=?")
            params.append(role)
        tcol = "created_at" if is_msg else "t_end"
        if since is not None:
            where.append(f"{alias}.{tcol} >= ?")
            params.append(since)
        if until is not None:
            where.append(f"{alias}.{tcol} <= ?")
            params.append(until)
        if under_summary is not None:
            ctes = ["sub(id) AS (SELECT ? UNION SELECT sp.child_id FROM summary_parents sp"
                    " JOIN sub ON sp.parent_id = sub.id)"]
            with_params.append(under_summary)
            if is_msg:
                # the first and last message under it bound the search (FTS5 seeks its index to
                # them): the search walked every newer match down to an old summary's
                ctes.append("span(lo, hi) AS (SELECT min(message_id), max(message_id) FROM summary_messages"
                            " WHERE summary_id IN sub)")
                where.append(f"{alias}.id IN (SELECT message_id FROM summary_messages WHERE summary_id IN sub)")
                where.append(f"{alias}.id BETWEEN (SELECT lo FROM span) AND (SELECT hi FROM span)")
            else:
                where.append(f"{alias}.id IN sub")
            with_sql = "WITH RECURSIVE " + ", ".join(ctes) + " "
        cols = (
            f"{alias}.id, {alias}.session_id, {'t.role' if is_msg else chr(39) + 'summary' + chr(39)},"
            f" {alias}.{tcol}, {alias}.text"
        )
        c = self.conn()
        rows: list[tuple] = []
        if mode == "fts":
            if not getattr(plan, "fts_match", None):
                return []
            if is_msg:
                self._index_before_search()  # a large append's rows may still be being indexed
            # bm25() first counts every match of every phrase in the whole index, whatever the
            # LIMIT: "recent" (newest matches first, stopping at the limit) leaves it out.
            # A lineage's newest summaries: one search of the index of summaries by session.
            # (Ranked searches keep summaries_fts: its bm25 is of the text alone - the session
            # column would lengthen every row's - and a ranked search is of rare terms.)
            scoped = (_scoped_match(plan.fts_match, session_ids)
                      if not is_msg and order != "rank" and under_summary is None else None)
            if scoped is not None:
                newest = self._search_scoped(c, scoped, cols, where, params, limit, offset)
                if newest is not None:
                    keys = ("id", "session_id", "role", "created_at", "text", "rank")
                    return [dict(zip(keys, r)) for r in newest]
            score = f"bm25({table}_fts)" if order == "rank" else "0.0"
            by_session = order != "rank" and bool(session_ids) and under_summary is None
            bound = (f"{table}_fts.rowid BETWEEN (SELECT lo FROM span) AND (SELECT hi FROM span)"
                     if is_msg and under_summary is not None else None)  # the span, given to FTS5 itself
            if order == "rank":
                rows = _ranked(c, table, with_sql, with_params, plan.fts_match, bound, cols, where, params,
                               limit, offset)
                keys = ("id", "session_id", "role", "created_at", "text", "rank")
                return [dict(zip(keys, r)) for r in rows]
            if by_session:  # a lineage's newest matches, one id range of it at a time
                where.append(f"{table}_fts.rowid BETWEEN ? AND ?")
            elif bound is not None:
                where.append(bound)
            sql = (
                f"{with_sql}SELECT {cols}, {score} AS rank FROM {table}_fts"
                f" JOIN {table} {alias} ON {alias}.id = {table}_fts.rowid WHERE {table}_fts MATCH ?"
                + "".join(f" AND {w}" for w in where)
                + (" ORDER BY rank" if order == "rank" else f" ORDER BY {table}_fts.rowid DESC")
                + " LIMIT ? OFFSET ?"
            )
            if by_session:
                ranges = (_session_ranges(c, session_ids or ()) if is_msg
                          else _summary_ranges(c, session_ids or ()))
                rows = _newest_in_ranges(c, sql, (plan.fts_match, *params), ranges, limit + offset)[offset:]
            else:
                rows = c.execute(sql, (*with_params, plan.fts_match, *params, limit, offset)).fetchall()
        elif mode == "substring":
            subs = list(getattr(plan, "substrings", ()) or ())
            if not subs:
                return []
            from ...search.query import like_pattern

            cjk = "messages_cjk" if is_msg else "summaries_cjk"
            if all(len(x) >= 3 and _CJK_RE.fullmatch(x) for x in subs) and (is_msg or _has_table(c, cjk)):
                # CJK runs of 3+ characters: the trigram index over messages holding CJK text
                # (migration 006) instead of a LIKE scan of the whole history. The index comes
                # first (CROSS JOIN), newest match first, then the rows by key: ordered by the
                # rows' id, a lone session's search was planned as a walk of its messages
                # newest first with one index probe each (a phrase said once, early: 154-340 ms
                # at 30,000 messages); a lineage is searched one id range of it at a time.
                # Summaries have their own trigram index (migration 018; before it, a LIKE scan).
                match = " OR ".join('"' + x.replace('"', '""') + '"' for x in subs)
                by_range = bool(session_ids) and under_summary is None
                if by_range:
                    where.append(f"{cjk}.rowid BETWEEN ? AND ?")
                elif under_summary is not None and is_msg:
                    where.append("messages_cjk.rowid BETWEEN (SELECT lo FROM span) AND (SELECT hi FROM span)")
                sql = (
                    f"{with_sql}SELECT {cols}, 0.0 FROM {cjk} CROSS JOIN {table} {alias}"
                    f" ON {alias}.id = {cjk}.rowid WHERE {cjk} MATCH ?"
                    + "".join(f" AND {w}" for w in where)
                    + f" ORDER BY {cjk}.rowid DESC LIMIT ? OFFSET ?"
                )
                if by_range:
                    ranges = (_session_ranges(c, session_ids or ()) if is_msg
                              else _summary_ranges(c, session_ids or ()))
                    rows = _newest_in_ranges(c, sql, (match, *params), ranges, limit + offset)[offset:]
                else:
                    rows = c.execute(sql, (*with_params, match, *params, limit, offset)).fetchall()
                keys = ("id", "session_id", "role", "created_at", "text", "rank")
                return [dict(zip(keys, r)) for r in rows]
            ors = " OR ".join(f"{alias}.text LIKE ? ESCAPE '\\'" for _ in subs)
            sql = (
                f"{with_sql}SELECT {cols}, 0.0 FROM {table} {alias} WHERE ({ors})"
                + "".join(f" AND {w}" for w in where)
                + f" ORDER BY {alias}.id DESC LIMIT ? OFFSET ?"
            )
            rows = c.execute(
                sql, (*with_params, *[like_pattern(s) for s in subs], *params, limit, offset)
            ).fetchall()
        elif mode == "regex" and regex is not None:
            from ...search.regex import SCAN_ROWS, scan

            sql = (
                f"{with_sql}SELECT {cols}, 0.0 FROM {table} {alias}"
                + (" WHERE " + " AND ".join(where) if where else "")
                + f" ORDER BY {alias}.id DESC LIMIT ?"
            )
            # matched in the matcher process, within the scan's time limit (search/regex.py)
            rows = [tuple(r) for r in scan(c.execute(sql, (*with_params, *params, SCAN_ROWS)), regex,
                                           offset=offset, limit=limit)]
        keys = ("id", "session_id", "role", "created_at", "text", "rank")
        return [dict(zip(keys, r)) for r in rows]

    def _search_scoped(self, c: sqlite3.Connection, match: str, cols: str, where: list[str], params: list[Any],
                       limit: int, offset: int) -> list[tuple] | None:
        """A lineage's newest summaries matching ``match`` (from _scoped_match) through the
        index of summaries by session (migration 015); None when FTS5 refuses the expression
        (the caller then searches as before)."""
        sql = (f"SELECT {cols}, 0.0 AS rank FROM summaries_scoped_fts JOIN summaries t"
               " ON t.id = summaries_scoped_fts.rowid WHERE summaries_scoped_fts MATCH ?"
               + "".join(f" AND {w}" for w in where)
               + " ORDER BY summaries_scoped_fts.rowid DESC LIMIT ? OFFSET ?")
        try:
            return c.execute(sql, (match, *params, limit, offset)).fetchall()
        except sqlite3.OperationalError:
            return None

    def term_counts(self, target: str, plans: Sequence[Any], cap: int, newest: int | None = None) -> list[int]:
        table = "messages" if target == "messages" else "summaries"
        if table == "messages":
            self._index_before_search()
        c = self.conn()
        window = ""
        args: tuple[Any, ...] = ()
        if newest is not None:
            window, args = " AND rowid > ?", (self.max_row_id(target) - newest,)
        sql = (f"SELECT count(*) FROM (SELECT rowid FROM {table}_fts WHERE {table}_fts MATCH ?{window}"
               " LIMIT ?)")
        out = []
        for plan in plans:
            item = getattr(plan, "fts_match", None)
            if not item:
                out.append(0)
                continue
            try:
                out.append(c.execute(sql, (item, *args, cap + 1)).fetchone()[0])
            except sqlite3.OperationalError:  # an item FTS5 refuses can only be expensive to guess
                out.append(cap + 1)
        return out

    def max_row_id(self, target: str) -> int:
        table = "messages" if target == "messages" else "summaries"
        return self.conn().execute(f"SELECT COALESCE(MAX(id), 0) FROM {table}").fetchone()[0]


def _ranked(c: sqlite3.Connection, table: str, with_sql: str, with_params: list[Any], match: str,
            bound: str | None, cols: str, where: list[str], params: list[Any], limit: int,
            offset: int) -> list[tuple]:
    """The page ``offset``..``offset + limit`` of the rows of ``table`` matching ``match`` and
    ``where``, best BM25 score first, each with its score.

    Ranked in the full-text index alone (its postings and document sizes), then the rows read
    by key in rank order until the page is full: one statement joining the rows to the matches
    read every match's row (its text, for the sort) before keeping the best ``limit``. On an
    encrypted store each row's page read from the file is decrypted and checked: a ranked step
    of up to 2,000 matches spent ~13 ms more on it than on a plaintext store (100k messages, the
    question's first search in a process) on rows a page of 200 then dropped."""
    fts = f"{table}_fts"
    scored = c.execute(f"{with_sql}SELECT rowid, bm25({fts}) FROM {fts} WHERE {fts} MATCH ?"
                       + (f" AND {bound}" if bound else ""), (*with_params, match)).fetchall()
    scored.sort(key=lambda r: r[1])  # (stable: ties keep the index's order, as the one statement's sort did)
    need = limit + offset
    filt = "".join(f" AND {w}" for w in where)
    got: list[tuple] = []
    k, step = 0, max(need, 1)
    while k < len(scored) and len(got) < need:
        part = scored[k:k + step]
        k += len(part)
        step = min(step * 2, 4_096)
        # NOT INDEXED: the rows by key (rowid), whatever the filter. Given 100+ ids and a
        # lineage's sessions, the planner chose the (session_id, id) index instead: a probe per
        # session and id (24 sessions x 200 ids: 4,800 probes, ~20 index pages read from the
        # file per search) to find the same rows.
        found = {r[0]: r for r in c.execute(
            f"{with_sql}SELECT {cols} FROM {table} t NOT INDEXED WHERE t.id IN ({','.join('?' * len(part))}){filt}",
            (*with_params, *(r[0] for r in part), *params))}
        got += [(*found[rid], score) for rid, score in part if rid in found]
    return got[offset:need]


def _has_table(c: sqlite3.Connection, name: str) -> bool:
    """Whether the store has this table (a store opened read-only may predate its migration)."""
    return c.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (name,)).fetchone() is not None


def _scoped_match(fts_match: str | None, session_ids: Sequence[str] | None) -> str | None:
    """The FTS5 expression of ``fts_match`` among the summaries of these sessions (the text
    column matched, each session id a phrase of the session column), or None when the
    sessions cannot be named that way: none given, more than ``MAX_SCOPED_SESSIONS``, or an id
    without a letter or digit (its phrase would be empty). A phrase can also match a longer
    id holding it; the search's own session filter keeps only the lineage's rows."""
    if not fts_match or not session_ids:
        return None
    sids = list(dict.fromkeys(session_ids))
    if len(sids) > MAX_SCOPED_SESSIONS or not all(any(ch.isalnum() for ch in sid) for sid in sids):
        return None
    phrases = " OR ".join('"' + sid.replace('"', '""') + '"' for sid in sids)
    return f"{{text}} : ({fts_match}) AND {{session_id}} : ({phrases})"


def _session_ranges(c: sqlite3.Connection, session_ids: Sequence[str]) -> list[list[int]]:
    """The id ranges of a lineage's messages, newest first: each session's first and last id,
    sessions fewer than ``NEAR_IDS`` ids apart as one range (a conversation's, one after
    another: a search per session cost more than the few rows between them). A session whose
    messages are sparse in its span (fewer than 1 in ``SPARSE_FACTOR`` ids of a span over
    ``SPARSE_SPAN``: a gateway's user, whose turns lie between everyone else's) gives the
    runs of its newest ``MAX_LISTED`` ids instead (and its older part as one range): its span
    is the whole store's, and its newest matches were found by walking every user's."""
    # each session's first and last id (two index seeks: a GROUP BY read every row of it),
    # and how many messages lie between them (its seq numbers count its messages)
    one = ("SELECT ?, lo, hi, (SELECT seq FROM messages WHERE id = hi) - (SELECT seq FROM messages WHERE id = lo)"
           " FROM (SELECT (SELECT min(id) FROM messages WHERE session_id = ?) AS lo,"
           " (SELECT max(id) FROM messages WHERE session_id = ?) AS hi)")
    sids = list(dict.fromkeys(session_ids))
    spans = []
    for k in range(0, len(sids), 200):
        part = sids[k:k + 200]
        found = c.execute(" UNION ALL ".join([one] * len(part)), [x for sid in part for x in (sid, sid, sid)])
        spans += [r for r in found if r[2] is not None]
    ranges: list[list[int]] = []
    runs: list[list[int]] = []
    for sid, lo, hi, between in sorted(spans, key=lambda r: -r[2]):
        if hi - lo + 1 > SPARSE_SPAN and hi - lo + 1 > SPARSE_FACTOR * (max(0, between or 0) + 1):
            runs += _runs(c, sid, lo)
        elif ranges and ranges[-1][0] - hi <= NEAR_IDS:
            ranges[-1][0] = min(ranges[-1][0], lo)
        else:
            ranges.append([lo, hi])
    if not runs:
        return ranges
    return _joined(ranges + runs, 0)


def _runs(c: sqlite3.Connection, session_id: str, lo: int) -> list[list[int]]:
    """A sparse session's newest ``MAX_LISTED`` ids as runs (ids fewer than ``NEAR_SUMMARY_IDS``
    apart: an append's rows are consecutive), and the rest of its span as one range."""
    ids = [r[0] for r in c.execute("SELECT id FROM messages WHERE session_id = ? ORDER BY id DESC LIMIT ?",
                                   (session_id, MAX_LISTED))]
    out = _joined([[i, i] for i in ids], NEAR_SUMMARY_IDS)
    if len(ids) == MAX_LISTED and lo < ids[-1]:
        out.append([lo, ids[-1] - 1])
    return out


def _joined(ranges: list[list[int]], near: int) -> list[list[int]]:
    """Ranges sorted newest first, overlapping ones (and those ``near`` ids apart) joined;
    wider gaps joined too until at most ``MAX_RANGES`` remain."""
    todo = sorted(ranges, key=lambda r: -r[1])
    while True:
        out: list[list[int]] = []
        for lo, hi in todo:
            if out and out[-1][0] - hi <= near:
                out[-1][0] = min(out[-1][0], lo)
            else:
                out.append([lo, hi])
        if len(out) <= MAX_RANGES:
            return out
        near = max(1, near) * 4


def _summary_ranges(c: sqlite3.Connection, session_ids: Sequence[str]) -> list[list[int]]:
    """The id ranges of a lineage's published summaries, newest first: its summaries' ids (the
    session index holds them) in runs of ids fewer than ``NEAR_SUMMARY_IDS`` apart (a
    compaction pass writes its summaries together; a gateway's users' passes interleave), the
    closest runs joined until at most ``MAX_RANGES`` remain; a lineage of more than
    ``MAX_LISTED`` summaries as one range."""
    sids = list(dict.fromkeys(session_ids))
    ids: list[int] = []
    for k in range(0, len(sids), 500):
        part = sids[k:k + 500]
        ids += [r[0] for r in c.execute(f"SELECT id FROM summaries WHERE session_id IN ({','.join('?' * len(part))})"
                                        " AND state = 'published' LIMIT ?", (*part, MAX_LISTED + 1 - len(ids)))]
        if len(ids) > MAX_LISTED:
            # a lineage of this many summaries is most of the store's: one range, as the
            # statement alone would walk it (listing them would cost more than the walk)
            return [[0, 2**63 - 1]]
    return _joined([[i, i] for i in ids], NEAR_SUMMARY_IDS)


def _newest_in_ranges(c: sqlite3.Connection, sql: str, args: tuple, ranges: list[list[int]],
                      top: int) -> list[tuple]:
    """The ``top`` newest matches of ``sql`` (a newest-first full-text search in a lineage
    whose last terms bound the id; ``args``: its parameters before those bounds), one id range
    of the lineage at a time (FTS5 seeks its index there), newest first, until the page is
    full. One statement over the lineage walked every newer match in the store down to the
    lineage's: an old lineage's search for "retry" took 21.5 ms at 100k messages (0.3 ms
    now), growing with the store; a lineage's summaries among a gateway's 46,000, 45 ms."""
    got: list[tuple] = []
    for lo, hi in ranges:
        # A range's search is of the whole lineage within it, and the ranges are disjoint and
        # newest first: once the page is full, nothing older can belong to it.
        if len(got) >= top:
            break
        got += c.execute(sql, (*args, lo, hi, top - len(got), 0)).fetchall()
    return got
