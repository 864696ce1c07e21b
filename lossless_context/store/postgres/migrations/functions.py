"""The current definition of each PostgreSQL function that changes over time, kept once.

A migration that created a function is never edited (``migrations/__init__.py``). To change the
function, edit its entry here and raise its ``revision`` by one: the runner (``store/migrate.py``,
from ``conn.py``, in the migrations' transaction and under their lock) runs, after the
migrations, every definition whose revision is above the one the store recorded in
``lcm_definitions``, and records it. A store never goes back: an older lcm meeting a newer
revision leaves it. ``tests/test_migrations.py`` pins each definition's (name, revision,
SHA-256), so an edit that forgets the revision fails the suite.

A definition runs after every migration, on a fresh store and an upgraded one alike: it may use
any table or function the migrations made (not an OPTIONAL migration's, which may be missing),
and a definition used by another one comes first in the list. A function that needs a new
table gets the table from a new migration and the function's change here. The text of each
entry below was, at revision 1, the last migration's that defined it (byte for byte: the same
function on stores made before and after); the migrations that changed it are named.
"""

from __future__ import annotations

from ...migrate import Definition

DEFINITIONS: list[Definition] = [
    # The lexemes of the runs of 2 to 4 parts of each identifier in a text (``idents.py``).
    # (migrations 033, 035)
    Definition("lcm_ident_lexemes", 1, r"""
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
        """),
    # The words of a text as the full-text index sees them: the english parser's, the parts of
    # paths, hosts and addresses, and the identifiers' lexemes (``lcm_ident_lexemes``).
    # (migrations 001, 008, 014, 033)
    Definition("lcm_tsvector_of", 1, r"""
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
        """),
    # A search's term-pair tests: for each query (two of its words), whether a row of messages or
    # summaries holds it, newest summaries first, within a time budget.
    # (migrations 012, 017, 030)
    Definition("lcm_any_match", 1, r"""
        CREATE OR REPLACE FUNCTION lcm_any_match(target text, qs tsquery[], budget interval) RETURNS boolean[]
        LANGUAGE plpgsql STABLE SET enable_seqscan = off AS $fn$
        DECLARE
            stop timestamptz := clock_timestamp() + budget;
            res boolean[] := '{}';
            hit boolean;
            q tsquery;
            newest tsvector[] := '{}';
        BEGIN
            IF target <> 'summaries' THEN
                newest := ARRAY(SELECT x.tsv FROM message_index x ORDER BY x.id DESC LIMIT 256);
            END IF;
            FOREACH q IN ARRAY qs LOOP
                IF clock_timestamp() > stop THEN
                    res := res || NULL::boolean;
                    CONTINUE;
                END IF;
                IF target = 'summaries' THEN
                    hit := EXISTS (SELECT 1 FROM (SELECT x.tsv FROM summaries x ORDER BY x.id DESC LIMIT 64) w
                                   WHERE w.tsv @@ q);
                    IF NOT hit THEN
                        hit := EXISTS (SELECT 1 FROM summaries x WHERE x.tsv @@ q);
                    END IF;
                ELSE
                    hit := EXISTS (SELECT 1 FROM unnest(newest) AS w(v) WHERE w.v @@ q);
                    IF NOT hit THEN
                        hit := EXISTS (SELECT 1 FROM message_index x WHERE x.tsv @@ q);
                    END IF;
                    IF NOT hit THEN
                        hit := EXISTS (SELECT 1 FROM message_index_pending p
                            CROSS JOIN LATERAL (SELECT * FROM messages m WHERE m.id = p.message_id OFFSET 0) t
                            WHERE COALESCE(t.tsv, lcm_tsvector(t.text)) @@ q);
                    END IF;
                END IF;
                res := res || hit;
            END LOOP;
            RETURN res;
        END
        $fn$;
        """),
    # Each term's count of matching messages or summaries, capped (is it rare, and its weight).
    # (migrations 017, 027, 031)
    Definition("lcm_term_counts", 1, r"""
        CREATE OR REPLACE FUNCTION lcm_term_counts(target text, qs tsquery[], cap integer, floor bigint)
        RETURNS integer[]
        LANGUAGE plpgsql STABLE SET enable_seqscan = off AS $fn$
        DECLARE
            res integer[] := '{}';
            n integer;
            q tsquery;
        BEGIN
            IF floor IS NOT NULL THEN
                RETURN lcm_term_counts_window(target, qs, cap, floor);
            END IF;
            FOREACH q IN ARRAY qs LOOP
                IF target = 'summaries' THEN
                    SELECT count(*) INTO n FROM (SELECT 1 FROM summaries x WHERE x.tsv @@ q LIMIT cap + 1) a;
                ELSE
                    SELECT count(*) INTO n FROM (SELECT 1 FROM message_index x WHERE x.tsv @@ q LIMIT cap + 1) a;
                    IF n <= cap THEN  -- still-listed rows count too
                        n := n + (SELECT count(*) FROM (SELECT 1 FROM message_index_pending p
                            CROSS JOIN LATERAL (SELECT * FROM messages m WHERE m.id = p.message_id OFFSET 0) t
                            WHERE COALESCE(t.tsv, lcm_tsvector(t.text)) @@ q LIMIT cap + 1) b);
                    END IF;
                END IF;
                res := res || LEAST(n, cap + 1);
            END LOOP;
            RETURN res;
        END
        $fn$;
        ALTER FUNCTION lcm_term_counts(text, tsquery[], integer, bigint) RESET plan_cache_mode;
        """),
    # A hit's chain up the DAG: the published summaries covering some messages, and their parents.
    # (migrations 018, 028)
    Definition("lcm_summary_chains", 1, r"""
        CREATE OR REPLACE FUNCTION lcm_summary_chains(mids bigint[], sids bigint[])
        RETURNS TABLE(kind int, ref bigint, other bigint)
        LANGUAGE plpgsql STABLE SET plan_cache_mode = force_generic_plan AS $fn$
        BEGIN
            RETURN QUERY
            WITH RECURSIVE cov AS MATERIALIZED (
                SELECT sm.message_id, sm.summary_id FROM unnest(mids) AS u(m)
                CROSS JOIN LATERAL (SELECT x.message_id, x.summary_id FROM summary_messages x
                                    WHERE x.message_id = u.m OFFSET 0) sm
                WHERE (SELECT s.state FROM summaries s WHERE s.id = sm.summary_id) = 'published'),
            walk(id) AS (
                SELECT unnest(sids) UNION SELECT min(c.summary_id) FROM cov c GROUP BY c.message_id
                UNION SELECT q.p FROM walk w CROSS JOIN LATERAL (
                    SELECT min(sp.parent_id) AS p FROM summary_parents sp
                    WHERE sp.child_id = w.id
                      AND (SELECT s.state FROM summaries s WHERE s.id = sp.parent_id) = 'published') q
                WHERE q.p IS NOT NULL)
            SELECT 0, c.message_id, c.summary_id FROM cov c
            UNION ALL SELECT 1, w.id, NULL::bigint FROM walk w
            UNION ALL SELECT 2, sp.child_id, sp.parent_id FROM walk w
                CROSS JOIN LATERAL (SELECT x.child_id, x.parent_id FROM summary_parents x WHERE x.child_id = w.id
                                    OFFSET 0) sp
                WHERE (SELECT s.state FROM summaries s WHERE s.id = sp.parent_id) = 'published'
            ORDER BY 1, 2, 3;
        END
        $fn$;
        """),
]
