"""Identifiers as whole lexemes in the PostgreSQL full-text index (migrations 033 and 035, in
``migrations/identifiers.py``; the current ``lcm_ident_lexemes`` in ``migrations/functions.py``).

The english parser splits `reconcile_day` at the underscore (and `QX-6153`, `narwhal-gossamer-38`
at the hyphens), so `to_tsquery` makes a phrase of it ('reconcil' <-> 'day'). GIN keeps no
positions: every row holding all the phrase's words was read back from the table and its
tsvector tested (at 100k messages a common identifier's page cost 18 ms, most of it that
recheck). Migration 033 indexes, besides the parser's words, each run of ASCII letters and
digits joined by "_", "-", "." or "/" (snake_case, kebab-case, dotted names, paths) as lexemes:
every run of 2 to 4 consecutive parts (of its first 12), each part stemmed as the english
configuration stems a word, joined by "/" — `reconcil/day` for `reconcile_day` and
`Reconciled-Days` alike, `qx/6153`; the english parser keeps that
form whole (a "file" token), so `to_tsquery` turns the operand `'reconcil/day'` into exactly
that lexeme, and the search is one GIN probe with nothing to recheck.

A query's identifier operand of 2 to 4 parts is rewritten to that form (`whole_identifiers`;
the lexeme is computed by the same SQL function as the index's, `lcm_ident_lexemes`),
once the index holds the lexemes for every row: rows indexed before the migration get them from
the store's indexer thread when it is idle (`backfill_step`, newest first, in short batches off
the commit path; summaries too), and until it has finished — `lcm_ident_backfill` holds a row
— searches keep the phrase. An identifier of 5 or more parts, or one inside a quoted phrase,
stays a phrase. What changes for the user: an identifier matches identifiers (snake_case and
kebab-case spellings alike, any case and inflection, as a run inside a longer identifier too),
no longer the same words side by side in prose ("Retry policy with backoff" for `retry_policy`).
"""

from __future__ import annotations

import re
import time
from typing import Any, Callable

from .text import pg_text as _t

try:  # (the store's own import guard gives the install hint; this module only names its errors)
    import psycopg
    _REFUSED: tuple[type[BaseException], ...] = (psycopg.DataError, psycopg.ProgrammingError)
except ImportError:  # pragma: no cover
    _REFUSED = ()


# A query operand that is an identifier of 2 to 4 ASCII parts joined by "_" or "-", standing on
# its own (not inside a quoted phrase's "<->" chain).
_OPERAND = re.compile(r"(?<!<-> )'([A-Za-z0-9]+(?:[_-][A-Za-z0-9]+){1,3})'(?! <->)")

# The whole run's lexeme (the longest of lcm_ident_lexemes), and what to_tsquery makes of it.
LEXEME_SQL = ("SELECT x, to_tsquery('english', quote_literal(x))::text FROM unnest(lcm_ident_lexemes(%s)) AS x"
              " ORDER BY length(x) DESC LIMIT 1")


def whole_identifiers(tsq: str, lexeme_of: Callable[[str], str | None]) -> str:
    """`tsq` (to_tsquery input) with each free-standing identifier operand replaced by its
    whole lexeme; `lexeme_of(identifier)` gives that lexeme, or None to keep the phrase (the
    parser would not keep the lexeme whole)."""
    def sub(m: re.Match[str]) -> str:
        lexeme = lexeme_of(m.group(1))
        return f"'{lexeme}'" if lexeme else m.group(0)

    return _OPERAND.sub(sub, tsq) if "'" in tsq else tsq


def lexeme_row(row: Any) -> str | None:
    """The lexeme of a LEXEME_SQL row when to_tsquery keeps it as exactly that one lexeme."""
    if not row or not row[0]:
        return None
    lexeme, parsed = str(row[0]), str(row[1] or "")
    return lexeme if parsed == "'" + lexeme.replace("'", "''") + "'" and "'" not in lexeme else None


BATCH = 200  # rows whose lexemes one backfill transaction recomputes (well inside a store call's bound)


def backfill_step(write: Callable[[Callable[[Any], Any]], Any]) -> bool:
    """Give one batch of rows indexed before migration 033 their identifier lexemes (messages
    first, newest first, then summaries). True while work is left."""
    def tx(c: Any) -> bool:
        row = c.execute("SELECT messages_below, summaries_below FROM lcm_ident_backfill FOR UPDATE SKIP LOCKED"
                        ).fetchone()
        if row is None:  # done, or another indexer (thread, process, host) is at it
            return False
        m_below, s_below = int(row[0]), int(row[1])
        if m_below > 0:
            lo = c.execute("SELECT min(id) FROM (SELECT id FROM message_index WHERE id < %s ORDER BY id DESC"
                           " LIMIT %s) x", (m_below, BATCH)).fetchone()[0]
            lo = 0 if lo is None else int(lo)
            c.execute("UPDATE message_index x SET tsv = lcm_tsvector(m.text) FROM messages m"
                      " WHERE m.id = x.id AND x.id >= %s AND x.id < %s AND m.text ~ '[A-Za-z0-9][_./-][A-Za-z0-9]'",
                      (lo, m_below))
            c.execute("UPDATE lcm_ident_backfill SET messages_below = %s", (lo,))
            return True
        if s_below > 0:
            lo = c.execute("SELECT min(id) FROM (SELECT id FROM summaries WHERE id < %s ORDER BY id DESC"
                           " LIMIT %s) x", (s_below, BATCH)).fetchone()[0]
            lo = 0 if lo is None else int(lo)
            # (the generated tsv column is computed again for every row an UPDATE writes)
            c.execute("UPDATE summaries SET text = text WHERE id >= %s AND id < %s"
                      " AND text ~ '[A-Za-z0-9][_./-][A-Za-z0-9]'", (lo, s_below))
            c.execute("UPDATE lcm_ident_backfill SET summaries_below = %s", (lo,))
            return True
        c.execute("DELETE FROM lcm_ident_backfill")
        return False

    return bool(write(tx))


def backfill_done(read: Callable[[Callable[[Any], Any]], Any]) -> bool:
    return not read(lambda c: c.execute("SELECT EXISTS (SELECT 1 FROM lcm_ident_backfill)").fetchone()[0])


IDENTS_RECHECK = 30.0  # seconds between reads of the backfill's state while it is under way


class IdentifierQueries:
    """The PostgreSQL search's side (a mixin of PostgresSearch): a plan's tsquery input with its
    identifiers as whole lexemes once the index holds them for every row."""

    _read: Callable[[Callable[[Any], Any]], Any]

    def _tsq(self, s: str) -> str:
        """A plan's to_tsquery input for this store: its identifier operands as the whole
        lexemes migration 033 indexes, once every row has them; else as planned."""
        s = _t(s)
        return whole_identifiers(s, self._ident_lexeme) if "'" in s and self._idents_ready() else s

    def _ident_lexeme(self, ident: str) -> str | None:
        """The whole lexeme migration 033 indexes for `ident` (None: keep the phrase); cached."""
        cache = self.__dict__.setdefault("_ident_cache", {})
        if ident not in cache:
            try:
                row = self._read(lambda c: c.execute(LEXEME_SQL, (ident,)).fetchone())
            except _REFUSED:
                row = None
            if len(cache) > 4096:
                cache.clear()
            cache[ident] = lexeme_row(row)
        return cache[ident]

    def _idents_ready(self) -> bool:
        """Whether every indexed row has its identifier lexemes; read again every IDENTS_RECHECK
        seconds until it is so (another process's indexer may finish the backfill)."""
        state = self.__dict__.get("_idents_state")
        now = time.monotonic()
        if state is not None and (state[1] or now - state[0] < IDENTS_RECHECK):
            return bool(state[1])
        try:
            ready = backfill_done(self._read)
        except _REFUSED:
            ready = False
        self.__dict__["_idents_state"] = (now, ready)
        return ready
