"""Search over the PostgreSQL store: tsvector full text, CJK bigrams, ILIKE substrings, bounded regex.

A mixin of :class:`~lossless_context.store.postgres.store.PostgresStore` (it uses the store's
``_read``); kept apart so each module holds one job.

Messages are full-text indexed after their commit (``index.py``): every message
search reads ``message_index`` and, in the same statement, the rows still listed in
``message_index_pending`` with their tsvector computed on the fly, so it sees every committed
message whatever the indexer is doing. Summaries keep a generated ``tsv`` column.
"""

from __future__ import annotations

import re
import time
from typing import Any, Callable, Sequence

from ...messages import CJK_CLASS
from ...search.query import QueryPlan
from ..base import StoreError
from .idents import IdentifierQueries
from .text import pg_text as _t

try:  # optional dependency: `pip install lossless-context[postgres]`
    import psycopg
except ImportError:  # pragma: no cover - reported when the store is first used
    psycopg = None  # type: ignore[assignment]  # without psycopg the store reports the install hint

# The scripts the CJK bigram index holds (the ranges of migration 008's lcm_cjk_grams).
_QUOTED = re.compile(r"'((?:[^']|'')*)'")  # a lexeme in a tsquery's text
_CJK_RE = re.compile(CJK_CLASS + "+")  # messages.CJK_CLASS: the ranges lcm_cjk_grams indexes
# A pending row's tsvector: the stored one of a row from before migration 008, else computed.
_PENDING_TSV = "COALESCE(t.tsv, lcm_tsvector(t.text))"
# A listed row, looked up by id for each listed id (OFFSET 0 keeps the planner from pushing the
# tsvector test down into a scan of every message: only listed rows are ever computed).
_PENDING_ROW = "(SELECT * FROM messages m WHERE m.id = p.message_id OFFSET 0) t"
STATS_FLOOR = 1000  # a term estimated above this many matches is counted from the statistics
STATS_SECONDS = 60.0  # how long the statistics read are reused
MAX_ID_SECONDS = 2.0  # how long max_row_id's answer is reused
# A CJK needle expected in at most this many messages takes lcm_cjk_messages (migration 020):
# its kept plan reads each candidate by primary key, ~2 us a row; above it the statement is
# planned per call and its plan walks ids backwards until the page is full.
CJK_RARE_ROWS = 1000
_CJK_DEFAULT_FREQ = 0.005  # PostgreSQL's DEFAULT_CONTAIN_SEL: an element the statistics omit


def cjk_bigrams(s: str) -> list[str]:
    """The bigrams of a CJK run, as lcm_cjk_grams stores them (a lone character as itself)."""
    return sorted({s[i:i + 2] for i in range(max(1, len(s) - 1))})


class PostgresSearch(IdentifierQueries):
    """term_counts, max_row_id and search of the PostgreSQL store."""

    _read: Callable[[Callable[[Any], Any]], Any]  # PostgresStore's: run fn(conn) on a pooled connection

    # (tsquery input → whether the english configuration keeps any of its words)
    _useful_cache: dict[str, bool]

    def term_counts(self, target: str, plans: Sequence[Any], cap: int, newest: int | None = None) -> list[int]:
        items = [getattr(p, "pg_tsquery", None) for p in plans]
        todo = [(k, self._tsq(s)) for k, s in enumerate(items) if s]
        out = [0] * len(items)
        if not todo:
            return out
        total = self.max_row_id(target)
        floor = total - newest if newest is not None else None
        todo = self._counts_from_stats(todo, out, cap, total, newest, target)
        if not todo:
            return out
        sql = ("SELECT lcm_term_counts(%s, ARRAY(SELECT to_tsquery('english', s) FROM unnest(%s::text[])"
               " WITH ORDINALITY AS u(s, i) ORDER BY i), %s, %s)")

        def run(c: Any) -> None:
            try:  # all plans in one call, planned without sequential scans (migration 017)
                got = c.execute(sql, (target, [s for _, s in todo], cap, floor)).fetchone()[0]
                for (k, _), n in zip(todo, got):
                    out[k] = n
                return
            except (psycopg.DataError, psycopg.ProgrammingError):
                pass
            for k, s in todo:  # an operand the server refuses (rare: plan_query quotes them) alone
                try:
                    out[k] = c.execute(sql, (target, [s], cap, floor)).fetchone()[0][0]
                except (psycopg.DataError, psycopg.ProgrammingError):
                    out[k] = cap + 1

        self._read(run)
        return out

    def term_counts_many(self, asks: Sequence[tuple[str, Sequence[QueryPlan]]], cap: int) -> list[list[int]]:
        # every target's counts in one statement (one lcm_term_counts call each); the
        # statistics shortcut first, as term_counts does; a refusal falls back to it
        outs: list[list[int]] = []
        calls: list[tuple[str, list[tuple[int, str]]]] = []
        for target, plans in asks:
            items = [getattr(p, "pg_tsquery", None) for p in plans]
            todo = [(k, self._tsq(s)) for k, s in enumerate(items) if s]
            out = [0] * len(items)
            if todo:
                todo = self._counts_from_stats(todo, out, cap, self.max_row_id(target), None, target)
            outs.append(out)
            calls.append((target, todo))
        asked = [(n, target, todo) for n, (target, todo) in enumerate(calls) if todo]
        if not asked:
            return outs
        one = ("lcm_term_counts(%s, ARRAY(SELECT to_tsquery('english', s) FROM unnest(%s::text[])"
               " WITH ORDINALITY AS u(s, i) ORDER BY i), %s, NULL)")
        sql = "SELECT " + ", ".join([one] * len(asked))
        args = [a for _, target, todo in asked for a in (target, [s for _, s in todo], cap)]

        def run(c: Any) -> tuple | None:
            try:
                return c.execute(sql, args).fetchone()
            except (psycopg.DataError, psycopg.ProgrammingError):
                return None  # an operand the server refuses: term_counts copes with it

        got = self._read(run)
        if got is None:
            return [self.term_counts(target, plans, cap) for target, plans in asks]
        for (n, _, todo), counts in zip(asked, got):
            for (k, _), c in zip(todo, counts):
                outs[n][k] = c
        return outs

    def search_substrings(self, asks: Sequence[tuple[str, dict[str, Any]]]) -> list[list[dict[str, Any]]]:
        # every target's substring search sent together (pipeline mode): one round trip
        sqls: list[str | None] = []
        argss: list[tuple] = []
        walked: dict[int, list[tuple]] = {}
        for target, kw in asks:
            subs = _substrings(kw["plan"])
            where, with_sql, cols = _filter_sql(
                target, kw.get("session_ids") is not None, bool(kw.get("role")), kw.get("since") is not None,
                kw.get("until") is not None, kw.get("under_summary") is not None)
            params, with_params = _filter_args(target, kw.get("session_ids"), kw.get("role"), kw.get("since"),
                                               kw.get("until"), kw.get("under_summary"))
            kept = self._cjk_kept_plan(target, subs, where, with_sql)
            if (not kept and _scoped(where) and self._cjk_common(target, subs, where, with_sql)
                    and len(set(kw["session_ids"])) <= CJK_WALK_SESSIONS):
                rows = self._cjk_newest([_t(x) for x in dict.fromkeys(kw["session_ids"])], subs[0],
                                        int(kw.get("limit", 10)) + int(kw.get("offset", 0)))
                if rows is not None:
                    walked[len(sqls)] = rows[int(kw.get("offset", 0)):]
                    sqls.append(None)
                    argss.append(())
                    continue
            sqls.append(_substring_sql(target, len(subs), _cjk_only(subs), where, with_sql, cols, kept)
                        if subs else None)
            argss.append(_substring_args(target, subs, params, with_params, kw.get("limit", 10),
                                         kw.get("offset", 0), kept, _scoped(where)))

        def run(c: Any) -> list[list[tuple]]:
            with c.pipeline():
                curs = [c.execute(sql, argss[k], prepare=_prepare(sql, asks[k][0])) if sql is not None else None
                        for k, sql in enumerate(sqls)]
            return [cur.fetchall() if cur is not None else walked.get(k, []) for k, cur in enumerate(curs)]

        return [[dict(zip(_KEYS, r)) for r in rows] for rows in self._read(run)]

    def _cjk_common(self, target: str, subs: list[str], where: list[str], with_sql: str) -> bool:
        """Whether this is one CJK run in messages, filtered by scope alone, whose bigrams the
        statistics say are common (the opposite of :meth:`_cjk_kept_plan`'s rare)."""
        if target != "messages" or len(subs) != 1 or not _cjk_only(subs) or not _scope_only(where, with_sql):
            return False
        return self._cjk_share(subs[0]) is not None

    def _cjk_share(self, sub: str) -> float | None:
        """The share of CJK rows holding ``sub``'s rarest bigram, when the statistics say more
        than CJK_RARE_ROWS rows hold it; None otherwise."""
        stats = self._cjk_stats()
        if stats is None:
            return None
        rows, freqs, absent = stats
        share = min(freqs.get(g, absent) for g in cjk_bigrams(sub))
        return share if rows * share > CJK_RARE_ROWS else None

    def _cjk_newest(self, sessions: list[str], sub: str, need: int) -> list[tuple] | None:
        """The ``need`` newest messages of these sessions holding ``sub``, a common CJK run:
        each session's CJK rows walked newest first through message_index(session_id, id),
        a chunk at a time, their bigrams and text tested, until enough are found; the rows
        still listed for the indexer tested directly. None once CJK_WALK_ROWS rows were read
        without filling the page (a phrase common elsewhere, rare here: the planned statement
        then reads its few matches from the bigram index). The planner estimates a phrase's
        bigrams as independent and read every match of a common one from the index (20,000
        at 1M messages: 480 ms) to keep 50."""
        grams = cjk_bigrams(sub)
        # the first chunk sized to hold the page at the share the statistics give
        first = int(min(8 * CJK_WALK_CHUNK, max(CJK_WALK_CHUNK, 1.5 * need / max(self._cjk_share(sub) or 1.0, 1e-6))))

        def run(c: Any) -> list[tuple] | None:
            got = list(c.execute(_CJK_PENDING, (sub, sessions, need), prepare=False).fetchall())
            read = 0
            for sid in sessions:
                before, size, found = 2**62, first, 0
                while found < need:
                    if read >= CJK_WALK_ROWS:
                        return None
                    rows = c.execute(_CJK_WALK, (sid, before, size, grams, sub), prepare=False).fetchall()
                    lowest, scanned = rows[0][0], rows[0][1]
                    hits = [r[2:] for r in rows if r[2] is not None]
                    got += hits
                    found += len(hits)
                    read += scanned
                    if scanned < size or lowest is None:
                        break
                    before, size = lowest, min(size * 2, 8 * CJK_WALK_CHUNK)
            got.sort(key=lambda r: -r[0])
            return got[:need]

        return self._read(run)

    def search_under_summaries(self, session_ids: Sequence[str] | None, asks: Sequence[tuple[int, QueryPlan]], *,
                               role: str | None = None, since: float | None = None, until: float | None = None,
                               limit: int = 10) -> list[list[dict[str, Any]]]:
        # The summaries asked with the same query are searched together (lcm_fts_under_many,
        # migration 026: their messages listed once, the index read once when that is
        # cheaper), each query's statement sent in one pipeline: one round trip for the up to
        # 30 a grep folds. A query the english configuration reduces to nothing (stop words
        # only) is searched alone, word for word, as search() does.
        scope = None if session_ids is None else [_t(s) for s in session_ids]
        want = [(k, int(sid), self._tsq(getattr(plan, "pg_tsquery", None) or "")) for k, (sid, plan) in enumerate(asks)]
        out: list[list[dict[str, Any]]] = [[] for _ in asks]
        groups: dict[str, list[tuple[int, int]]] = {}
        for k, sid, tsq in want:
            if tsq:
                groups.setdefault(tsq, []).append((k, sid))

        ests = {tsq: self._index_rows(tsq) for tsq in groups}  # (before: it may use a connection)

        def run(c: Any) -> list[tuple[int, list[tuple]]]:
            todo = [(tsq, group, ests[tsq]) for tsq, group in groups.items() if self._useful(c, tsq)]
            with c.pipeline():
                curs = [(group, c.execute(_UNDER_MANY_SQL, (list(dict.fromkeys(sid for _, sid in group)), tsq, scope,
                                                            _t(role) if role else None, since, until, limit,
                                                            UNDER_PROBE_ROWS, est, UNDER_INDEX_WEIGHT)))
                        for tsq, group, est in todo]
            answered = []
            for group, cur in curs:
                by_root: dict[int, list[tuple]] = {}
                for row in cur.fetchall():
                    by_root.setdefault(row[0], []).append(row[1:])
                answered += [(k, by_root.get(sid, [])) for k, sid in group]
            return answered

        try:
            answered = self._read(run)
        except (psycopg.DataError, psycopg.ProgrammingError) as exc:  # a tsquery the server refuses
            raise StoreError(f"search failed: {exc}") from exc
        for k, rows in answered:
            out[k] = [dict(zip(_KEYS, r)) for r in rows]
        done = {k for k, _ in answered}
        for k, sid, tsq in want:
            if tsq and k not in done:  # stop words only
                out[k] = self.search("messages", session_ids, asks[k][1], mode="fts", order="recent", role=role,
                                     since=since, until=until, under_summary=sid, limit=limit)
        return out

    def any_match(self, target: str, plans: Sequence[QueryPlan], seconds: float) -> list[bool | None]:
        out: list[bool | None] = [False] * len(plans)
        todo = [(k, self._tsq(s)) for k, s in enumerate(getattr(p, "pg_tsquery", None) for p in plans) if s]
        if not todo:
            return out

        def run(c: Any) -> list[Any] | None:
            try:  # one round trip: lcm_any_match (migration 012) tests them in order
                return c.execute(
                    "SELECT lcm_any_match(%s, ARRAY(SELECT to_tsquery('english', s) FROM unnest(%s::text[])"
                    " WITH ORDINALITY AS u(s, i) ORDER BY i), make_interval(secs => %s))",
                    ("summaries" if target == "summaries" else "messages", [s for _, s in todo],
                     seconds)).fetchone()[0]
            except (psycopg.DataError, psycopg.ProgrammingError):
                return None  # an operand the server refuses (rare: plan_query quotes them)

        res = self._read(run)
        if res is None:
            return super().any_match(target, plans, seconds)  # type: ignore[misc]  # Store's, after this mixin in PostgresStore's MRO
        for (k, _), hit in zip(todo, res):
            out[k] = hit
        return out

    def _counts_from_stats(self, todo: list[tuple[int, str]], out: list[int], cap: int, total: int,
                           newest: int | None, target: str = "messages") -> list[tuple[int, str]]:
        """Fill ``out`` for the single-lexeme queries the planner statistics know to be common
        (counting them would walk thousands of matches; a capped count of a common term is
        ``cap + 1``, and a windowed one the term's frequency times the window). The rest.
        Summaries too: a gateway's tens of thousands, each vector read from its row (a windowed
        count of four common words among 46,000 summaries took 250 ms)."""
        freqs = self._lexeme_freqs(target)
        if not freqs:
            return todo
        span = newest if newest is not None else total
        rest = []
        for k, s in todo:
            lex = self._single_lexeme(s)
            f = freqs.get(lex) if lex is not None else None
            est = f * span if f is not None else 0.0
            # (a windowed count is only asked for terms known to be common: the estimate is it)
            if f is not None and (newest is not None or est > min(cap, STATS_FLOOR)):
                out[k] = min(cap + 1, max(1, round(est)))
            else:
                rest.append((k, s))
        return rest

    def _planner_stats(self, key: str, read: Callable[[], Any]) -> Any:
        """``read()``'s answer (from the planner's statistics), read again once a minute."""
        cached = self.__dict__.get(key)
        now = time.monotonic()
        if cached is not None and now - cached[0] < STATS_SECONDS:
            return cached[1]
        value = read()
        self.__dict__[key] = (now, value)
        return value

    def _lexeme_freqs(self, target: str = "messages") -> dict[str, float]:
        """lexeme → fraction of indexed messages (or of summaries) holding it, for the most
        common lexemes (ANALYZE's statistics of message_index.tsv or summaries.tsv; refreshed
        once a minute)."""
        table = "message_index" if target == "messages" else "summaries"

        def read() -> dict[str, float]:
            row = self._read(lambda c: c.execute(
                "SELECT most_common_elems::text::text[], most_common_elem_freqs FROM pg_catalog.pg_stats"
                " WHERE schemaname = current_schema() AND tablename = %s AND attname = 'tsv'", (table,)).fetchone())
            if row and row[0] and row[1]:
                return dict(zip(row[0], row[1]))  # (the frequencies carry 3 trailing summary values)
            return {}

        return self._planner_stats("_freqs" if target == "messages" else "_summary_freqs", read)

    def _cjk_kept_plan(self, target: str, subs: list[str], where: list[str], with_sql: str) -> bool:
        """Whether this substring search is lcm_cjk_messages' (migration 020): one CJK run in
        messages, filtered by scope alone, whose bigrams the statistics say are rare."""
        if target != "messages" or len(subs) != 1 or not _cjk_only(subs) or not _scope_only(where, with_sql):
            return False
        stats = self._cjk_stats()
        if stats is None:  # never analysed: the planner, which knows the table's size, decides
            return False
        rows, freqs, absent = stats
        # Bounded by its rarest bigram, not the product of their frequencies: the bigrams of a
        # word occur together (a common 4-character word, 30% of the rows, had a product of
        # 2.7% and its search read every match in the store). The bound also bounds what the
        # function can read: the candidates are at most that bigram's rows.
        est = rows * min(freqs.get(g, absent) for g in cjk_bigrams(subs[0]))
        return est <= CJK_RARE_ROWS

    def _cjk_stats(self) -> tuple[float, dict[str, float], float] | None:
        """(messages holding CJK text, bigram -> fraction of them, the fraction assumed for a
        bigram the statistics omit) from ANALYZE's statistics of message_index.cjk; None
        before any. Refreshed once a minute."""
        def read() -> tuple[float, dict[str, float], float] | None:
            row = self._read(lambda c: c.execute(
                "SELECT c.reltuples, s.null_frac, s.most_common_elems::text::text[], s.most_common_elem_freqs"
                " FROM pg_catalog.pg_class c JOIN pg_catalog.pg_stats s ON s.schemaname = current_schema()"
                " AND s.tablename = 'message_index' AND s.attname = 'cjk'"
                " WHERE c.oid = to_regclass('message_index')").fetchone())
            if row is None or row[0] is None or row[0] < 0:
                return None
            elems, nums = row[2] or [], row[3] or []
            # as the planner: an omitted element is taken as half the rarest one kept (the
            # frequencies carry the minimum after the elements), at most the default
            least = nums[len(elems)] if len(nums) > len(elems) else 2 * _CJK_DEFAULT_FREQ
            return (float(row[0]) * (1.0 - float(row[1] or 0.0)), dict(zip(elems, nums)),
                    min(_CJK_DEFAULT_FREQ, least / 2))

        return self._planner_stats("_cjk_freqs", read)

    def _single_lexeme(self, tsq: str) -> str | None:
        """The lexeme a one-operand tsquery input parses to (None for anything else); cached."""
        cache = self.__dict__.setdefault("_lexeme_cache", {})
        if tsq not in cache:
            try:
                n, text = self._read(lambda c: c.execute(
                    "SELECT numnode(q), q::text FROM to_tsquery('english', %s) AS q", (tsq,)).fetchone())
            except (psycopg.DataError, psycopg.ProgrammingError):
                n, text = 0, ""
            if len(cache) > 4096:
                cache.clear()
            cache[tsq] = text[1:-1].replace("''", "'") if n == 1 and text.startswith("'") and text.endswith("'") else None
        return cache[tsq]

    def max_row_id(self, target: str) -> int:
        # A size estimate read several times per search: reused for MAX_ID_SECONDS (this
        # process's own appends refresh it at once: forget_max_row_id).
        table = "messages" if target == "messages" else "summaries"
        cache = self.__dict__.setdefault("_max_ids", {})
        hit = cache.get(table)
        now = time.monotonic()
        if hit is not None and now - hit[0] < MAX_ID_SECONDS:
            return hit[1]
        n = self._read(lambda c: c.execute(f"SELECT COALESCE(MAX(id), 0) FROM {table}").fetchone()[0])
        cache[table] = (now, n)
        return n

    def forget_max_row_id(self) -> None:
        self.__dict__.pop("_max_ids", None)

    def _index_rows(self, tsq: str) -> float | None:
        """About how many full-text index rows a search for ``tsq`` reads: the fewest matches
        of any of its lexemes (an AND reads the rarest one's list and skips through the
        others'), their sum for an OR; a lexeme the statistics omit counts as the least
        common they keep. None when unknown (no statistics; a prefix or a negation)."""
        freqs = self._lexeme_freqs()
        parsed = self._tsquery_lexemes(tsq)
        if not freqs or not parsed:
            return None
        lexemes, ops = parsed
        if "!" in ops or ":" in ops:
            return None
        floor = min(freqs.values())
        fs = [freqs.get(lex, floor) for lex in lexemes]
        return max(1, self.max_row_id("messages")) * (sum(fs) if "|" in ops else min(fs))

    def _tsquery_lexemes(self, tsq: str) -> tuple[list[str], str] | None:
        """The lexemes ``to_tsquery('english', tsq)`` holds and its operators (the text
        outside them); None when it holds none. Cached."""
        cache = self.__dict__.setdefault("_lexemes_cache", {})
        if tsq not in cache:
            try:
                text = self._read(lambda c: c.execute("SELECT to_tsquery('english', %s)::text", (tsq,)).fetchone()[0])
            except (psycopg.DataError, psycopg.ProgrammingError):
                return None  # refused: not cached (_useful reads this cache as "no lexemes")
            if len(cache) > 4096:
                cache.clear()
            lexemes = [m.replace("''", "'") for m in _QUOTED.findall(text or "")]
            cache[tsq] = (lexemes, _QUOTED.sub("", text)) if lexemes else None
        return cache[tsq]

    def _useful(self, c: Any, tsq: str) -> bool:
        cache = self.__dict__.setdefault("_useful_cache", {})
        hit = cache.get(tsq)
        if hit is None and tsq in self.__dict__.get("_lexemes_cache", {}):
            hit = cache[tsq] = self.__dict__["_lexemes_cache"][tsq] is not None
        if hit is None:
            hit = bool(c.execute("SELECT numnode(to_tsquery('english', %s))", (tsq,)).fetchone()[0])
            if len(cache) > 4096:
                cache.clear()
            cache[tsq] = hit
        return hit

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
        where, with_sql, cols = _filter_sql(target, session_ids is not None, bool(role), since is not None,
                                            until is not None, under_summary is not None)
        params, with_params = _filter_args(target, session_ids, role, since, until, under_summary)
        and_where = "".join(f" AND {w}" for w in where)
        keys = _KEYS
        top = int(limit) + int(offset)

        if mode == "fts":
            tsq = getattr(plan, "pg_tsquery", None)
            if not tsq:
                return []
            tsq = self._tsq(tsq)

            def fts(c: Any) -> list[tuple]:
                # The english configuration drops stop words; a query made only of them (the
                # plan keeps them when nothing else is left) is matched word for word instead,
                # as SQLite's FTS5 (which keeps every word) would. That scan reads the text of
                # every row, so it sees unindexed rows too.
                if not self._useful(c, tsq):
                    vec = "to_tsvector('simple', t.text)"
                    score = f"-ts_rank_cd({vec}, q.q, 1)::float8" if order == "rank" else "0.0::float8"
                    sql = (
                        f"{with_sql}SELECT {cols}, {score} AS rank FROM {table} t,"
                        f" to_tsquery('simple', %s) AS q(q) WHERE {vec} @@ q.q{and_where}"
                        + (" ORDER BY rank, t.id DESC" if order == "rank" else " ORDER BY t.id DESC")
                        + " LIMIT %s OFFSET %s"
                    )
                    return c.execute(sql, (*with_params, tsq, *params, limit, offset), prepare=False).fetchall()
                if not is_msg and session_ids is not None and not with_sql and len(where) == 2:
                    # a lineage's summaries, filtered by nothing else: lcm_fts_summaries (029)
                    return c.execute("SELECT * FROM lcm_fts_summaries(%s::text[], to_tsquery('english', %s), %s, %s,"
                                     " %s, %s)", (params[0], tsq, order == "rank", limit, offset,
                                                  SUMMARY_PROBE_ROWS)).fetchall()
                if not is_msg:
                    score = "-ts_rank_cd(t.tsv, q.q, 1)::float8" if order == "rank" else "0.0::float8"
                    sql = (
                        f"{with_sql}SELECT {cols}, {score} AS rank FROM summaries t,"
                        f" to_tsquery('english', %s) AS q(q) WHERE t.tsv @@ q.q{and_where}"
                        + (" ORDER BY rank, t.id DESC" if order == "rank" else " ORDER BY t.id DESC")
                        + " LIMIT %s OFFSET %s"
                    )
                    return c.execute(sql, (*with_params, tsq, *params, limit, offset), prepare=False).fetchall()
                ranked = order == "rank"
                if under_summary is not None:  # the messages under one summary: lcm_fts_under (024)
                    scope = None if session_ids is None else [_t(s) for s in session_ids]
                    return c.execute(_UNDER_SQL, (int(under_summary), tsq, scope, _t(role) if role else None, since,
                                                  until, ranked, top, limit, offset, UNDER_PROBE_ROWS)).fetchall()
                main_score = "-ts_rank_cd(x.tsv, q.q, 1)::float8" if ranked else "0.0::float8"
                pend_score = "-ts_rank_cd(v.tsv, q.q, 1)::float8" if ranked else "0.0::float8"
                main_order = " ORDER BY rank, x.id DESC" if ranked else " ORDER BY x.id DESC"
                if ranked and _scope_only(where, with_sql):
                    # scope only, ranked: lcm_fts_messages_ranked (migration 021), planned once
                    # per connection (every match is scored: the GIN plan is right for any query)
                    return c.execute(
                        "SELECT * FROM lcm_fts_messages_ranked(%s::text[], to_tsquery('english', %s), %s, %s, %s)",
                        (params[0] if params else None, tsq, top, limit, offset)).fetchall()
                if _scope_only(where, with_sql) and session_ids is not None:
                    # a lineage's newest matches of a term too common to rank every match: each
                    # of its sessions walked newest first (lcm_fts_newest, migration 025); only
                    # the rows returned are read from messages
                    head, head_args = "", []
                    main = (f"SELECT {cols}, 0.0::float8 AS rank FROM lcm_fts_newest(%s::text[],"
                            " to_tsquery('english', %s), %s, %s, %s) k"
                            " CROSS JOIN LATERAL (SELECT * FROM messages m WHERE m.id = k.id OFFSET 0) t")
                    main_args = [params[0], tsq, top, NEWEST_BUDGET_ROWS, NEWEST_CHUNK_ROWS]
                elif _scope_only(where, with_sql):  # the whole store, newest first
                    head, main = _newest_first(cols)
                    head_args = [NEWEST_WALK_ROWS, tsq, top]
                    main_args = [tsq, top, NEWEST_WALK_ROWS - 1, top]
                else:
                    head, head_args = with_sql, with_params
                    main = (f"SELECT {cols}, {main_score} AS rank FROM message_index x JOIN messages t ON t.id = x.id,"
                            f" to_tsquery('english', %s) AS q(q) WHERE x.tsv @@ q.q{and_where}{main_order} LIMIT %s")
                    main_args = [tsq, *params, top]
                sql = (
                    f"{head}SELECT * FROM (({main}"
                    f") UNION ALL ("
                    f"SELECT {cols}, {pend_score} AS rank FROM message_index_pending p"
                    f" CROSS JOIN LATERAL {_PENDING_ROW}"
                    f" CROSS JOIN LATERAL (SELECT {_PENDING_TSV} AS tsv OFFSET 0) v,"
                    f" to_tsquery('english', %s) AS q(q) WHERE v.tsv @@ q.q{and_where}"
                    + (" ORDER BY rank, t.id DESC" if ranked else " ORDER BY t.id DESC") + " LIMIT %s"
                    ")) u" + (" ORDER BY rank, id DESC" if ranked else " ORDER BY id DESC") + " LIMIT %s OFFSET %s"
                )
                return c.execute(sql, (*head_args, *main_args, tsq, *params, top, limit, offset),
                                 prepare=False).fetchall()

            try:
                rows = self._read(fts)
            except (psycopg.DataError, psycopg.ProgrammingError) as exc:  # a tsquery the server refuses
                raise StoreError(f"search failed: {exc}") from exc
        elif mode == "substring":
            subs = _substrings(plan)
            if not subs:
                return []
            kept = self._cjk_kept_plan(target, subs, where, with_sql)
            sql = _substring_sql(target, len(subs), _cjk_only(subs), where, with_sql, cols, kept)
            args = _substring_args(target, subs, params, with_params, limit, offset, kept, _scoped(where))
            rows = self._read(lambda c: c.execute(sql, args, prepare=_prepare(sql, target)).fetchall())
        elif mode == "regex" and regex is not None:
            from ...search.regex import SCAN_ROWS, scan

            sql = (
                f"{with_sql}SELECT {cols}, 0.0::float8 FROM {table} t"
                + (" WHERE " + " AND ".join(where) if where else "")
                + " ORDER BY t.id DESC LIMIT %s"
            )

            def scanned(c: Any) -> list[tuple]:
                with c.transaction():  # a server-side cursor streams rows instead of loading all
                    with c.cursor(name="lcm_regex_scan") as cur:
                        cur.itersize = 256
                        cur.execute(sql, (*with_params, *params, SCAN_ROWS))
                        # matched in the matcher process, within the scan's time limit (search/regex.py)
                        return [tuple(r) for r in scan(cur, regex, offset=offset, limit=limit)]

            rows = self._read(scanned)
        else:
            rows = []
        return [dict(zip(keys, r)) for r in rows]


_KEYS = ("id", "session_id", "role", "created_at", "text", "rank")

# A common CJK run's newest matches (PostgresSearch._cjk_newest): one chunk of a session's CJK
# rows, newest first below an id (how many were read and the lowest id come with every row,
# and with the one row of NULLs a chunk without a match gives); and the rows still listed.
CJK_WALK_CHUNK = 512
CJK_WALK_ROWS = 16_384
CJK_WALK_SESSIONS = 8
_CJK_WALK = (
    "WITH w AS (SELECT x.id, x.cjk FROM message_index x WHERE x.session_id = %s AND x.cjk IS NOT NULL"
    " AND x.id < %s ORDER BY x.id DESC LIMIT %s),"
    " m AS (SELECT t.id, t.session_id, t.role, t.created_at, t.text, 0.0::float8 AS rank FROM w"
    " JOIN messages t ON t.id = w.id WHERE w.cjk @> %s::text[] AND strpos(t.text, %s) > 0)"
    " SELECT (SELECT min(id) FROM w), (SELECT count(*) FROM w), m.* FROM (SELECT 1) one LEFT JOIN m ON true"
    " ORDER BY m.id DESC")
_CJK_PENDING = (
    "SELECT t.id, t.session_id, t.role, t.created_at, t.text, 0.0::float8 FROM message_index_pending p"
    f" CROSS JOIN LATERAL {_PENDING_ROW} WHERE strpos(t.text, %s) > 0 AND t.session_id = ANY(%s::text[])"
    " ORDER BY t.id DESC LIMIT %s")

# Messages under a summary up to this many are each read by key and tested (lcm_fts_under,
# migration 024: ~2 us a row); a larger summary's matches come from the full-text index.
UNDER_PROBE_ROWS = 2000
# A lineage of up to this many summaries has each tested by key (lcm_fts_summaries, migration
# 029), not the query's matches among every user's summaries read.
SUMMARY_PROBE_ROWS = 2000
# The newest rows a search for the newest matches of a common term tests one by one before it
# turns to the full-text index for the older ones (_newest_first): ~0.6 us a row.
NEWEST_WALK_ROWS = 4000
# lcm_fts_newest (migration 025) walks a lineage's sessions in chunks of NEWEST_CHUNK_ROWS; a
# lineage of more than 4 x NEWEST_BUDGET_ROWS rows stops once the page would take more than
# NEWEST_BUDGET_ROWS rows to fill at the rate matches were found (~0.6 us a row).
NEWEST_BUDGET_ROWS = 4000
NEWEST_CHUNK_ROWS = 256
# Summaries searched together (lcm_fts_under_many, migration 026) read the full-text index
# once when the index rows the query reads are estimated below this many times their distinct
# messages (an index row ~0.25 us, a message probed by key ~4 us); otherwise each is probed.
UNDER_INDEX_WEIGHT = 16.0
_UNDER_MANY_SQL = ("SELECT * FROM lcm_fts_under_many(%s::bigint[], to_tsquery('english', %s), %s::text[], %s, %s,"
                   " %s, %s, %s, %s, %s)")
_UNDER_SQL = ("SELECT * FROM lcm_fts_under(%s, to_tsquery('english', %s), %s::text[], %s, %s, %s, %s, %s, %s, %s,"
              " %s)")


def _prepare(sql: str, target: str = "messages") -> bool | None:
    """psycopg's ``prepare`` for a search statement. A search's best plan depends on its
    parameters (a rare term or a narrow scope: an index; a common one: the newest rows until
    the page is full), and a statement psycopg prepares (after 5 runs on a connection) may be
    switched by the server to one generic plan for all of them: at 60,000 CJK messages one
    user's scoped search read 101 index rows, then 59,730 from its 11th call on. So searches
    of messages are never prepared (planned with their parameters each time); the functions
    whose plans are kept on purpose (migrations 020-022) are, and so are searches of the
    summaries (a leaf covers tens of messages: far fewer rows; their generic plan, seen for
    most CJK searches of them, saved 0.1 ms of planning a call)."""
    return None if target != "messages" or sql.startswith("SELECT * FROM lcm_") else False


def _newest_first(cols: str) -> tuple[str, str]:
    """The WITH clause and the main branch of a search of the whole store for the newest
    messages matching a common term (``order="recent"``; a lineage's: lcm_fts_newest). A
    planner that estimates such a term's matches (a phrase above all: ``reconcile_day``) ten
    times too few reads every one from the index, each rechecked on its row, to keep the
    newest: 25,756 rows, 57 ms at 1M messages. Walking the newest rows and testing each finds
    the page in a few thousand (0.6 us a row); past ``NEWEST_WALK_ROWS`` the index below them
    is read instead."""
    # (the walk is a subquery, not a CTE: its order is known, so the page stops it early)
    with_sql = (
        "WITH hit AS MATERIALIZED (SELECT x.id FROM (SELECT x.id, x.tsv FROM message_index x"
        " ORDER BY x.id DESC LIMIT %s) x, to_tsquery('english', %s) AS q(q)"
        " WHERE x.tsv @@ q.q ORDER BY x.id DESC LIMIT %s) ")
    main = (
        f"SELECT * FROM ((SELECT {cols}, 0.0::float8 AS rank FROM hit k"
        " CROSS JOIN LATERAL (SELECT * FROM messages m WHERE m.id = k.id OFFSET 0) t"
        f") UNION ALL (SELECT {cols}, 0.0::float8 AS rank FROM (SELECT x.id FROM message_index x,"
        " to_tsquery('english', %s) AS q(q) WHERE (SELECT count(*) FROM hit) < %s"
        " AND x.id < COALESCE((SELECT w.id FROM message_index w ORDER BY w.id DESC OFFSET %s LIMIT 1), 0)"
        " AND x.tsv @@ q.q ORDER BY x.id DESC LIMIT %s) k JOIN messages t ON t.id = k.id)) n")
    return with_sql, main


def _filter_sql(target: str, scoped: bool, role: bool, since: bool, until: bool,
                under: bool) -> tuple[list[str], str, str]:
    """A search's WHERE terms, its WITH clause (rows under a summary) and the columns it
    selects, for ``target`` and the filters given (their values: :func:`_filter_args`)."""
    is_msg = target == "messages"
    tcol = "created_at" if is_msg else "t_end"
    where: list[str] = []
    if scoped:
        where.append("t.session_id = ANY(%s::text[])")
    if not is_msg:
        where.append("t.state='published'")
    if role and is_msg:
        where.append("t.role=%s")
    if since:
        where.append(f"t.{tcol} >= %s")
    if until:
        where.append(f"t.{tcol} <= %s")
    with_sql = ""
    if under:
        with_sql = ("WITH RECURSIVE sub(id) AS (SELECT %s::bigint UNION SELECT sp.child_id FROM summary_parents sp"
                    " JOIN sub ON sp.parent_id = sub.id) ")
        where.append("t.id IN (SELECT message_id FROM summary_messages WHERE summary_id IN (SELECT id FROM sub))"
                     if is_msg else "t.id IN (SELECT id FROM sub)")
    cols = f"t.id, t.session_id, {'t.role' if is_msg else chr(39) + 'summary' + chr(39)}, t.{tcol}, t.text"
    return where, with_sql, cols


def _filter_args(target: str, session_ids: Sequence[str] | None, role: str | None, since: float | None,
                 until: float | None, under_summary: int | None) -> tuple[list[Any], list[Any]]:
    """The parameters of :func:`_filter_sql`'s WHERE terms and of its WITH clause."""
    params: list[Any] = []
    if session_ids is not None:
        params.append([_t(s) for s in session_ids])
    if role and target == "messages":
        params.append(_t(role))
    if since is not None:
        params.append(since)
    if until is not None:
        params.append(until)
    return params, ([int(under_summary)] if under_summary is not None else [])


def _substrings(plan: Any) -> list[str]:
    return [_t(s) for s in (getattr(plan, "substrings", ()) or ()) if _t(s)]


def _cjk_only(subs: Sequence[str]) -> bool:
    return all(len(x) >= 2 and _CJK_RE.fullmatch(x) for x in subs)


def _substring_sql(target: str, n: int, cjk_only: bool, where: list[str], with_sql: str, cols: str,
                   kept: bool = False) -> str:
    """A substring search of ``target`` for ``n`` substrings (parameters: :func:`_substring_args`);
    ``kept``: the search is lcm_cjk_messages' (:meth:`PostgresSearch._cjk_kept_plan`).
    A run of CJK characters has no case and no LIKE wildcard: strpos() is the same test, and
    the planner does not estimate it from messages.text's statistics (the LIKE estimate was
    ~0.1 ms of each statement's planning, the search itself 0.02)."""
    if kept:
        return "SELECT * FROM lcm_cjk_messages(%s::text[], %s::text[], %s, %s, %s, %s)"
    and_where = "".join(f" AND {w}" for w in where)
    scoped = _scoped(where)
    if target == "messages" and cjk_only:
        # CJK runs: the bigram index of messages holding CJK text (message_index.cjk) narrows
        # the rows the substring test checks; still-listed rows are checked directly.
        ors = " OR ".join(["(x.cjk @> %s::text[] AND strpos(t.text, %s) > 0)"] * n)
        pors = " OR ".join(["strpos(t.text, %s) > 0"] * n)
        # scoped: the candidates are the scope's CJK rows (their session index, migration 023),
        # not a walk of every lineage's newest rows until the scope's turn (207 ms for the
        # oldest of 200 users at 200,000 CJK messages); rows indexed before migration 013
        # have no session there and are tested by the join
        in_scope = " AND (x.session_id = ANY(%s::text[]) OR x.session_id IS NULL)" if scoped else ""
        return (f"{with_sql}SELECT * FROM (("
                f"SELECT {cols}, 0.0::float8 AS rank FROM message_index x JOIN messages t ON t.id = x.id"
                f" WHERE x.cjk IS NOT NULL{in_scope} AND ({ors}){and_where} ORDER BY x.id DESC LIMIT %s"
                f") UNION ALL ("
                f"SELECT {cols}, 0.0::float8 AS rank FROM message_index_pending p"
                f" CROSS JOIN LATERAL {_PENDING_ROW} WHERE ({pors}){and_where} ORDER BY t.id DESC LIMIT %s"
                ")) u ORDER BY id DESC LIMIT %s OFFSET %s")
    if cjk_only:
        # CJK runs in summaries: their bigrams' expression index (migration 016)
        ors = " OR ".join(["(lcm_cjk_grams(t.text) @> %s::text[] AND strpos(t.text, %s) > 0)"] * n)
        return (f"{with_sql}SELECT {cols}, 0.0::float8 FROM summaries t WHERE ({ors}){and_where}"
                " ORDER BY t.id DESC LIMIT %s OFFSET %s")
    table = "messages" if target == "messages" else "summaries"
    ors = " OR ".join(["t.text ILIKE %s ESCAPE '\\'"] * n)
    return (f"{with_sql}SELECT {cols}, 0.0::float8 FROM {table} t WHERE ({ors}){and_where}"
            " ORDER BY t.id DESC LIMIT %s OFFSET %s")


def _scoped(where: list[str]) -> bool:
    """Whether :func:`_filter_sql`'s WHERE terms start with the scope's (its parameter first)."""
    return bool(where) and where[0].startswith("t.session_id")


def _scope_only(where: list[str], with_sql: str) -> bool:
    """Whether a search of messages is filtered by its scope alone (if by anything)."""
    return not with_sql and all(w.startswith("t.session_id") for w in where)


def _substring_args(target: str, subs: list[str], params: list[Any], with_params: list[Any], limit: int,
                    offset: int, kept: bool = False, scoped: bool = False) -> tuple:
    """The parameters of :func:`_substring_sql`'s statement (``scoped``: :func:`_scoped`)."""
    from ...search.query import like_pattern

    top = int(limit) + int(offset)
    if kept:  # (the scope is the only filter there: params holds it, if any)
        return (params[0] if params else None, cjk_bigrams(subs[0]), subs[0], top, int(limit), int(offset))
    if _cjk_only(subs):
        grams = [a for s in subs for a in (cjk_bigrams(s), s)]
        if target == "messages":  # (the scope first again for the index's session test)
            scope = params[:1] if scoped else []
            return (*with_params, *scope, *grams, *params, top, *subs, *params, top, limit, offset)
        return (*with_params, *grams, *params, limit, offset)
    return (*with_params, *[like_pattern(s) for s in subs], *params, limit, offset)
