"""Identifiers as whole lexemes in the PostgreSQL full-text index (migration 033).

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

IDENT_MIGRATIONS: list[tuple[str, str]] = [
    (
        "033_identifier_lexemes",
        r"""
        -- (the lexemes of the runs of parts of each identifier: see idents.py)
        -- The english configuration's stem of every part, read from one to_tsvector of all
        -- the text's distinct identifiers' parts of letters in a row (the word at position k is
        -- that k-th part; a stop word has no lexeme and stays as written). jit off: the
        -- planner's guesses for these set functions made it compile the query, a second a call.
        CREATE FUNCTION lcm_ident_lexemes(t text) RETURNS text[]
        LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE SET jit = off AS $fn$
        DECLARE
            ids text[];
            batch text[];
            words text[];
            stems text[];
            out text[] := '{}';
            k integer := 1;
        BEGIN
            SELECT pg_catalog.array_agg(DISTINCT pg_catalog.lower(m[1])) INTO ids
            FROM pg_catalog.regexp_matches(t, '([A-Za-z0-9]+(?:[_./-][A-Za-z0-9]+)+)', 'g') AS m;
            WHILE k <= COALESCE(pg_catalog.cardinality(ids), 0) LOOP
                batch := ids[k:k + 999];  -- (a tsvector has 16,383 positions: parts of 1,000 ids)
                k := k + 1000;
                words := pg_catalog.regexp_split_to_array(pg_catalog.array_to_string(batch, ' '), '[_./ -]');
                IF pg_catalog.cardinality(words) > 16000 THEN
                    CONTINUE;  -- (identifiers of over 16 parts on average: left to the phrase)
                END IF;
                -- (only words of letters: one token each, whatever they spell; a word with a digit
                -- may be two, 06e82d63 is a number and a word, and the english configuration
                -- does not stem those anyway)
                WITH w AS (SELECT g, words[g] AS word, words[g] ~ '^[a-z]+$' AS alpha
                           FROM pg_catalog.generate_series(1, pg_catalog.cardinality(words)) AS g),
                     a AS (SELECT w.g, pg_catalog.row_number() OVER (ORDER BY w.g) AS r FROM w WHERE w.alpha),
                     s AS (SELECT u.lexeme, pos
                           FROM pg_catalog.unnest(pg_catalog.to_tsvector('pg_catalog.english'::regconfig,
                                    (SELECT pg_catalog.string_agg(w.word, ' ' ORDER BY w.g)
                                     FROM w WHERE w.alpha))) AS u,
                                pg_catalog.unnest(u.positions) AS pos)
                SELECT pg_catalog.array_agg(COALESCE(s.lexeme, w.word) ORDER BY w.g) INTO stems
                FROM w LEFT JOIN a ON a.g = w.g LEFT JOIN s ON s.pos = a.r;
                out := out || ARRAY(
                    SELECT DISTINCT pg_catalog.array_to_string(stems[x.base + i:x.base + j], '/')
                    FROM (SELECT c.n, (sum(c.n) OVER (ORDER BY u.k) - c.n)::integer AS base
                          FROM pg_catalog.unnest(batch) WITH ORDINALITY AS u(id, k),
                               LATERAL (SELECT pg_catalog.cardinality(
                                   pg_catalog.regexp_split_to_array(u.id, '[_./-]')) AS n) c) x,
                         pg_catalog.generate_series(1, LEAST(x.n, 12) - 1) AS i,
                         pg_catalog.generate_series(i + 1, LEAST(x.n, 12, i + 3)) AS j);
            END LOOP;
            RETURN CASE WHEN pg_catalog.cardinality(out) > 0 THEN out END;
        END
        $fn$;

        -- 014's function, and the identifier lexemes (positionless: a phrase never needs them)
        CREATE OR REPLACE FUNCTION lcm_tsvector_of(t text) RETURNS tsvector
        LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $fn$
        DECLARE
            v tsvector := pg_catalog.to_tsvector('pg_catalog.english'::regconfig, t);
            parts text;
            idents text[];
        BEGIN
            SELECT pg_catalog.string_agg(l, ' ') INTO parts
            FROM pg_catalog.unnest(pg_catalog.tsvector_to_array(v)) AS l
            WHERE l ~ '[./\\:@=]';
            IF pg_catalog.strpos(t, '://') > 0 THEN  -- a URL's scheme is no lexeme of its own
                SELECT pg_catalog.concat_ws(' ', parts, pg_catalog.string_agg(m[1], ' ')) INTO parts
                FROM pg_catalog.regexp_matches(t, '([[:alnum:]]+)://', 'g') AS m;
            END IF;
            IF parts IS NOT NULL THEN
                v := v || pg_catalog.ts_delete(
                    pg_catalog.to_tsvector('pg_catalog.english'::regconfig,
                                           pg_catalog.translate(parts, './\:@=', '      ')),
                    pg_catalog.tsvector_to_array(v));
            END IF;
            IF t ~ '[A-Za-z0-9][_./-][A-Za-z0-9]' THEN
                idents := lcm_ident_lexemes(t);
                IF idents IS NOT NULL THEN
                    v := v || pg_catalog.array_to_tsvector(idents);
                END IF;
            END IF;
            RETURN v;
        END
        $fn$;

        -- Rows below these ids were indexed before: the indexer adds their lexemes (backfill_step)
        -- and deletes this row when both reach the start; until then searches keep the phrase.
        CREATE TABLE lcm_ident_backfill (
            one integer PRIMARY KEY DEFAULT 1 CHECK (one = 1),
            messages_below bigint NOT NULL,
            summaries_below bigint NOT NULL
        );
        INSERT INTO lcm_ident_backfill(messages_below, summaries_below)
            SELECT COALESCE((SELECT max(id) FROM messages), 0) + 1, COALESCE((SELECT max(id) FROM summaries), 0) + 1
            WHERE EXISTS (SELECT 1 FROM messages) OR EXISTS (SELECT 1 FROM summaries);
        """,
    ),
]

# Migration 035: the same lexemes for a fraction of the cost. 033's function ran, per text, one
# query of CTEs, a window, three joins and a to_tsvector of the parts, then a sub-select per
# identifier: on 20,000 bench messages 9.9 s of the 13.8 s lcm_tsvector took (to_tsvector of
# the text alone is 1.7 s). Here a batch of identifiers of at most 255 parts (all but the
# largest texts) is one flat query: each identifier's first 12 parts, each stemmed by the
# dictionary to_tsvector gives an ASCII word in the english configuration (`ts_lexize` of
# english_stem; a stop word has no lexeme and stays as written, as before), and each part's
# run of the next 1 to 3 parts from a window frame. A larger batch takes 033's steps unchanged:
# they leave as written a part past the 255 positions a tsvector keeps of one lexeme (and
# misnumber the parts after one of over 2,047 letters, a word to_tsvector drops), and those
# lexemes must stay what 033 stored. The same lexemes either way (tests/test_pg_ident_lexemes.py
# compares both functions over a generated corpus), so vectors stored before need no rebuild;
# the flat query's array may hold a lexeme twice (array_to_tsvector and LEXEME_SQL do not mind).
IDENT_LEXEMES_FLAT: list[tuple[str, str]] = [
    (
        "035_identifier_lexemes_flat",
        r"""
        CREATE OR REPLACE FUNCTION lcm_ident_lexemes(t text) RETURNS text[]
        LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE SET jit = off AS $fn$
        DECLARE
            ids text[];
            batch text[];
            words text[];
            stems text[];
            out text[] := '{}';
            k integer := 1;
        BEGIN
            SELECT pg_catalog.array_agg(DISTINCT pg_catalog.lower(m[1])) INTO ids
            FROM pg_catalog.regexp_matches(t, '([A-Za-z0-9]+(?:[_./-][A-Za-z0-9]+)+)', 'g') AS m;
            WHILE k <= COALESCE(pg_catalog.cardinality(ids), 0) LOOP
                batch := ids[k:k + 999];  -- (033's batches of 1,000 identifiers)
                k := k + 1000;
                IF pg_catalog.length(pg_catalog.array_to_string(batch, ' ')) <= 509 THEN
                    -- (at most 255 parts: no lexeme past the 255 positions a tsvector keeps of one)
                    out := out || ARRAY(
                        SELECT pg_catalog.array_to_string(r.run[1:j], '/')
                        FROM (SELECT pg_catalog.array_agg(x.stem) OVER (PARTITION BY x.k ORDER BY x.o
                                         ROWS BETWEEN CURRENT ROW AND 3 FOLLOWING) AS run
                              FROM (SELECT b.k, p.o,
                                           CASE WHEN p.w ~ '^[a-z]+$'
                                                THEN COALESCE((pg_catalog.ts_lexize(
                                                         'pg_catalog.english_stem'::regdictionary, p.w))[1], p.w)
                                                ELSE p.w END AS stem
                                    FROM pg_catalog.unnest(batch) WITH ORDINALITY AS b(id, k),
                                         pg_catalog.unnest(pg_catalog.regexp_split_to_array(b.id, '[_./-]'))
                                             WITH ORDINALITY AS p(w, o)
                                    WHERE p.o <= 12) x) r,
                             pg_catalog.generate_series(2, LEAST(pg_catalog.cardinality(r.run), 4)) AS j);
                    CONTINUE;
                END IF;
                words := pg_catalog.regexp_split_to_array(pg_catalog.array_to_string(batch, ' '), '[_./ -]');
                IF pg_catalog.cardinality(words) > 16000 THEN
                    CONTINUE;  -- (as 033: identifiers of over 16 parts on average, left to the phrase)
                END IF;
                IF NOT EXISTS (SELECT FROM pg_catalog.unnest(words) AS w WHERE pg_catalog.length(w) >= 2047) THEN
                    -- (a larger batch: as above, each part past the 255th of its lexeme as written)
                    out := out || ARRAY(
                        SELECT pg_catalog.array_to_string(r.run[1:j], '/')
                        FROM (SELECT pg_catalog.array_agg(y.stem) OVER (PARTITION BY y.k ORDER BY y.o
                                         ROWS BETWEEN CURRENT ROW AND 3 FOLLOWING) AS run
                              FROM (SELECT x.k, x.o,
                                           CASE WHEN x.lex IS NOT NULL AND pg_catalog.row_number() OVER (
                                                         PARTITION BY x.lex ORDER BY x.k, x.o) <= 255
                                                THEN x.lex ELSE x.w END AS stem
                                    FROM (SELECT b.k, p.o, p.w,
                                                 CASE WHEN p.w ~ '^[a-z]+$'
                                                      THEN (pg_catalog.ts_lexize(
                                                               'pg_catalog.english_stem'::regdictionary, p.w))[1]
                                                      END AS lex
                                          FROM pg_catalog.unnest(batch) WITH ORDINALITY AS b(id, k),
                                               pg_catalog.unnest(pg_catalog.regexp_split_to_array(b.id, '[_./-]'))
                                                   WITH ORDINALITY AS p(w, o)) x) y
                              WHERE y.o <= 12) r,
                             pg_catalog.generate_series(2, LEAST(pg_catalog.cardinality(r.run), 4)) AS j);
                    CONTINUE;
                END IF;
                -- (a part of 2,047 letters or more: 033's steps as they were, to the letter)
                -- (only words of letters: one token each, whatever they spell; a word with a digit
                -- may be two, 06e82d63 is a number and a word, and the english configuration
                -- does not stem those anyway)
                WITH w AS (SELECT g, words[g] AS word, words[g] ~ '^[a-z]+$' AS alpha
                           FROM pg_catalog.generate_series(1, pg_catalog.cardinality(words)) AS g),
                     a AS (SELECT w.g, pg_catalog.row_number() OVER (ORDER BY w.g) AS r FROM w WHERE w.alpha),
                     s AS (SELECT u.lexeme, pos
                           FROM pg_catalog.unnest(pg_catalog.to_tsvector('pg_catalog.english'::regconfig,
                                    (SELECT pg_catalog.string_agg(w.word, ' ' ORDER BY w.g)
                                     FROM w WHERE w.alpha))) AS u,
                                pg_catalog.unnest(u.positions) AS pos)
                SELECT pg_catalog.array_agg(COALESCE(s.lexeme, w.word) ORDER BY w.g) INTO stems
                FROM w LEFT JOIN a ON a.g = w.g LEFT JOIN s ON s.pos = a.r;
                out := out || ARRAY(
                    SELECT DISTINCT pg_catalog.array_to_string(stems[x.base + i:x.base + j], '/')
                    FROM (SELECT c.n, (sum(c.n) OVER (ORDER BY u.k) - c.n)::integer AS base
                          FROM pg_catalog.unnest(batch) WITH ORDINALITY AS u(id, k),
                               LATERAL (SELECT pg_catalog.cardinality(
                                   pg_catalog.regexp_split_to_array(u.id, '[_./-]')) AS n) c) x,
                         pg_catalog.generate_series(1, LEAST(x.n, 12) - 1) AS i,
                         pg_catalog.generate_series(i + 1, LEAST(x.n, 12, i + 3)) AS j);
            END LOOP;
            RETURN CASE WHEN pg_catalog.cardinality(out) > 0 THEN out END;
        END
        $fn$;
        """,
    ),
]

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
