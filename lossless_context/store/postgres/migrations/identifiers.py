"""PostgreSQL migrations 033 and 035: identifiers as whole lexemes in the full-text index (what
they do and why: ``store/postgres/idents.py``; listed in order in ``migrations/__init__.py``;
applied SQL never changes)."""

from __future__ import annotations

ENTRIES: list[tuple[str, str]] = [
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
ENTRIES += [
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
