"""PostgreSQL migrations 020 to 031: statements turned into functions whose plans are kept per
connection (listed in order in ``migrations/__init__.py``; applied SQL never changes).

Most are statements turned into functions whose plans are kept per connection
(``plan_cache_mode = force_generic_plan``): a search or a read whose planning cost as much as
running it, or whose plan chosen per call could become a walk of a whole table. Each plan
is fixed by the statement's shape (a MATERIALIZED candidate set, rows read by key through an
``OFFSET 0`` lateral), not by estimates.
"""

from __future__ import annotations

ENTRIES: list[tuple[str, str]] = [
    (
        # A CJK substring search of messages whose bigrams are rare (search.py decides from
        # the statistics of message_index.cjk), as a function whose plan is made once per
        # connection: planning the statement cost ~0.2 ms of every call, the search ~0.04.
        # The plan is fixed by the statement's shape, not by estimates: the bigram index
        # gives the candidates (a MATERIALIZED CTE) and each is read by primary key (the
        # OFFSET 0 lateral), so a rare needle never becomes a walk of the whole table, which
        # a generic plan of the plain statement chose (35 ms at 50,000 CJK messages). A
        # common needle keeps the planned statement: its plan walks ids backwards and stops.
        "020_cjk_messages",
        """
        CREATE OR REPLACE FUNCTION lcm_cjk_messages(scope text[], grams text[], needle text, top int,
                                                    lim int, skip int)
        RETURNS TABLE(id bigint, session_id text, role text, created_at float8, text text, rank float8)
        LANGUAGE plpgsql STABLE SET plan_cache_mode = force_generic_plan AS $fn$
        BEGIN
            RETURN QUERY
            WITH hit AS MATERIALIZED (
                SELECT x.id FROM message_index x WHERE x.cjk IS NOT NULL AND x.cjk @> grams
                  AND (scope IS NULL OR x.session_id IS NULL OR x.session_id = ANY(scope)))
            SELECT * FROM ((
                SELECT t.id, t.session_id, t.role, t.created_at, t.text, 0.0::float8
                FROM hit h CROSS JOIN LATERAL (SELECT * FROM messages m WHERE m.id = h.id OFFSET 0) t
                WHERE strpos(t.text, needle) > 0 AND (scope IS NULL OR t.session_id = ANY(scope))
                ORDER BY t.id DESC LIMIT top
            ) UNION ALL (
                SELECT t.id, t.session_id, t.role, t.created_at, t.text, 0.0::float8
                FROM message_index_pending p
                CROSS JOIN LATERAL (SELECT * FROM messages m WHERE m.id = p.message_id OFFSET 0) t
                WHERE strpos(t.text, needle) > 0 AND (scope IS NULL OR t.session_id = ANY(scope))
                ORDER BY t.id DESC LIMIT top
            )) u ORDER BY 1 DESC LIMIT lim OFFSET skip;
        END
        $fn$;
        """,
    ),
    (
        # A ranked full-text search of messages filtered by scope alone (what an identifier or
        # the rare terms of a question ask), as a function whose plan is kept per connection:
        # planning the statement was most of a call's server time. A ranked search scores
        # every match (search.py asks for one only when the capped counts say they are few),
        # so the plan that reads the matches from the GIN index is right for any query; the
        # shape keeps it (the matches ranked first, then each returned row read by key).
        "021_fts_messages_ranked",
        """
        CREATE OR REPLACE FUNCTION lcm_fts_messages_ranked(scope text[], q tsquery, top int, lim int, skip int)
        RETURNS TABLE(id bigint, session_id text, role text, created_at float8, text text, rank float8)
        LANGUAGE plpgsql STABLE SET plan_cache_mode = force_generic_plan AS $fn$
        BEGIN
            RETURN QUERY
            SELECT * FROM ((
                SELECT t.id, t.session_id, t.role, t.created_at, t.text, k.rank
                FROM (SELECT x.id, -ts_rank_cd(x.tsv, q, 1)::float8 AS rank FROM message_index x
                      WHERE x.tsv @@ q AND (scope IS NULL OR x.session_id = ANY(scope)
                            OR (x.session_id IS NULL AND EXISTS
                                (SELECT 1 FROM messages m WHERE m.id = x.id AND m.session_id = ANY(scope))))
                      ORDER BY 2, 1 DESC LIMIT top) k
                CROSS JOIN LATERAL (SELECT * FROM messages m WHERE m.id = k.id OFFSET 0) t
            ) UNION ALL (
                SELECT t.id, t.session_id, t.role, t.created_at, t.text, -ts_rank_cd(v.tsv, q, 1)::float8
                FROM message_index_pending p
                CROSS JOIN LATERAL (SELECT * FROM messages m WHERE m.id = p.message_id OFFSET 0) t
                CROSS JOIN LATERAL (SELECT COALESCE(t.tsv, lcm_tsvector(t.text)) AS tsv OFFSET 0) v
                WHERE v.tsv @@ q AND (scope IS NULL OR t.session_id = ANY(scope))
                ORDER BY 6, 1 DESC LIMIT top
            )) u ORDER BY 6, 1 DESC LIMIT lim OFFSET skip;
        END
        $fn$;
        """,
    ),
    (
        # A summary's outline (its children in order with their sizes: SQLite's statement in
        # store/sqlite/records.py)
        # as a function whose plan is kept per connection: planning the two joins cost about
        # as much as running them (0.13 ms each for a leaf over ~100 messages), and expanding
        # a summary is read once per summary, so a per-statement plan cache rarely warmed up.
        "022_summary_outline",
        """
        CREATE OR REPLACE FUNCTION lcm_summary_outline(sid bigint)
        RETURNS TABLE(kind int, ord int, child bigint, tokens bigint)
        LANGUAGE plpgsql STABLE SET plan_cache_mode = force_generic_plan AS $fn$
        BEGIN
            RETURN QUERY
            SELECT 0, sp.ord, sp.child_id, s.tokens FROM summary_parents sp
                JOIN summaries s ON s.id = sp.child_id WHERE sp.parent_id = sid AND s.state = 'published'
            UNION ALL
            SELECT 1, sm.ord, sm.message_id, m.tokens FROM summary_messages sm
                JOIN messages m ON m.id = sm.message_id WHERE sm.summary_id = sid
            ORDER BY 1, 2;
        END
        $fn$;
        """,
    ),
    (
        # The session of each message holding CJK text, in the order of ids: a CJK substring
        # search scoped to a lineage reads that lineage's CJK rows, where it walked every
        # lineage's newest rows until its own (the oldest of 200 users at 200,000 CJK messages:
        # a common word in 207 ms, now 1.7). Built over message_index alone, as 013's: only
        # the indexer writes it (it waits); commits and searches do not.
        "023_message_index_cjk_session",
        """
        CREATE INDEX message_index_cjk_session ON message_index(session_id, id) WHERE cjk IS NOT NULL;
        """,
    ),
    (
        # A full-text search of the messages under one summary (lcm_grep's summary_id, and the
        # originals a grep folds a summary hit into: up to 30 a grep). The statement filtering
        # the index by "under this summary" was planned as a walk of message_index from the
        # newest id down, testing each row (2-4 ms a call at 100k messages, more for an older
        # summary): the planner cannot see how few messages a summary covers. The function
        # lists them first; up to probe_max are read by key and tested (an unindexed one on its
        # own text; newest first until the page is full, unless ranked), a larger summary's
        # matches come from the index as a set. The ranked and newest-first probes are two
        # statements on purpose: one ORDER BY covering both is an expression the generic plan
        # must sort by, so the newest-first probe would test every message instead of stopping.
        "024_fts_under_summary",
        """
        CREATE OR REPLACE FUNCTION lcm_fts_under(root bigint, q tsquery, scope text[], want_role text,
                                                 t0 float8, t1 float8, ranked boolean, top int, lim int,
                                                 skip int, probe_max int)
        RETURNS TABLE(id bigint, session_id text, role text, created_at float8, text text, rank float8)
        LANGUAGE plpgsql STABLE SET plan_cache_mode = force_generic_plan AS $fn$
        DECLARE
            ids bigint[];
        BEGIN
            ids := ARRAY(
                WITH RECURSIVE sub(id) AS (
                    SELECT root UNION SELECT c.child_id FROM sub
                    CROSS JOIN LATERAL (SELECT sp.child_id FROM summary_parents sp WHERE sp.parent_id = sub.id
                                        OFFSET 0) c)
                SELECT DISTINCT s.message_id FROM sub
                CROSS JOIN LATERAL (SELECT sm.message_id FROM summary_messages sm WHERE sm.summary_id = sub.id
                                    OFFSET 0) s);
            IF cardinality(ids) <= probe_max AND ranked THEN
                RETURN QUERY
                SELECT t.id, t.session_id, t.role, t.created_at, t.text, -ts_rank_cd(v.tsv, q, 1)::float8
                FROM unnest(ids) AS u(id)
                CROSS JOIN LATERAL (SELECT * FROM messages m WHERE m.id = u.id OFFSET 0) t
                CROSS JOIN LATERAL (SELECT COALESCE((SELECT x.tsv FROM message_index x WHERE x.id = u.id),
                                                    t.tsv, lcm_tsvector(t.text)) AS tsv OFFSET 0) v
                WHERE v.tsv @@ q AND (scope IS NULL OR t.session_id = ANY(scope))
                  AND (want_role IS NULL OR t.role = want_role)
                  AND (t0 IS NULL OR t.created_at >= t0) AND (t1 IS NULL OR t.created_at <= t1)
                ORDER BY 6, 1 DESC LIMIT lim OFFSET skip;
            ELSIF cardinality(ids) <= probe_max THEN
                -- newest first: the ids in order, each tested, until the page is full
                RETURN QUERY
                SELECT t.id, t.session_id, t.role, t.created_at, t.text, 0.0::float8
                FROM (SELECT i.id FROM unnest(ids) AS i(id) ORDER BY i.id DESC) u
                CROSS JOIN LATERAL (SELECT * FROM messages m WHERE m.id = u.id OFFSET 0) t
                CROSS JOIN LATERAL (SELECT COALESCE((SELECT x.tsv FROM message_index x WHERE x.id = u.id),
                                                    t.tsv, lcm_tsvector(t.text)) AS tsv OFFSET 0) v
                WHERE v.tsv @@ q AND (scope IS NULL OR t.session_id = ANY(scope))
                  AND (want_role IS NULL OR t.role = want_role)
                  AND (t0 IS NULL OR t.created_at >= t0) AND (t1 IS NULL OR t.created_at <= t1)
                ORDER BY u.id DESC LIMIT lim OFFSET skip;
            ELSE
                RETURN QUERY
                WITH u AS MATERIALIZED (SELECT unnest(ids) AS id)
                SELECT * FROM ((
                    SELECT t.id, t.session_id, t.role, t.created_at, t.text,
                           CASE WHEN ranked THEN -ts_rank_cd(x.tsv, q, 1)::float8 ELSE 0.0::float8 END
                    FROM (SELECT x.id, x.tsv FROM message_index x WHERE x.tsv @@ q OFFSET 0) x
                    JOIN u ON u.id = x.id
                    CROSS JOIN LATERAL (SELECT * FROM messages m WHERE m.id = x.id OFFSET 0) t
                    WHERE (scope IS NULL OR t.session_id = ANY(scope)) AND (want_role IS NULL OR t.role = want_role)
                      AND (t0 IS NULL OR t.created_at >= t0) AND (t1 IS NULL OR t.created_at <= t1)
                    ORDER BY 6, 1 DESC LIMIT top
                ) UNION ALL (
                    SELECT t.id, t.session_id, t.role, t.created_at, t.text,
                           CASE WHEN ranked THEN -ts_rank_cd(v.tsv, q, 1)::float8 ELSE 0.0::float8 END
                    FROM message_index_pending p JOIN u ON u.id = p.message_id
                    CROSS JOIN LATERAL (SELECT * FROM messages m WHERE m.id = p.message_id OFFSET 0) t
                    CROSS JOIN LATERAL (SELECT COALESCE(t.tsv, lcm_tsvector(t.text)) AS tsv OFFSET 0) v
                    WHERE v.tsv @@ q AND (scope IS NULL OR t.session_id = ANY(scope))
                      AND (want_role IS NULL OR t.role = want_role)
                      AND (t0 IS NULL OR t.created_at >= t0) AND (t1 IS NULL OR t.created_at <= t1)
                    ORDER BY 6, 1 DESC LIMIT top
                )) w ORDER BY 6, 1 DESC LIMIT lim OFFSET skip;
            END IF;
        END
        $fn$;
        """,
    ),
    (
        # The newest matches of a common term in a lineage (lcm_grep takes them when a term is
        # too common to rank every match). Planned as one statement, the search either read
        # every match in the store from the full-text index (rechecking each row: a phrase's
        # matches estimated ten times too few) or walked the whole index from the newest id
        # down: a gateway user whose lineage is old searched "retry" in 830 ms at 1M messages.
        # The function walks each session of the lineage newest first, in chunks, through
        # message_index(session_id, id), newest session first, until the page is full and no
        # older session can improve it. A lineage of more than 4 x `budget` rows (the sessions'
        # last seq) stops walking once the matches found so far say the page would take more
        # than `budget` rows (an AND of common terms, rare together) and runs the statement
        # as before, planned for the query (EXECUTE). Rows indexed before migration 013 (no
        # session yet) are tested as before. Each statement is an index walk by design:
        # sequential scans are off inside it (a small or young store's statistics made its
        # generic plans read the whole table).
        "025_fts_newest_in_lineage",
        """
        CREATE INDEX message_index_session ON message_index(session_id, id);
        CREATE OR REPLACE FUNCTION lcm_fts_newest(scope text[], q tsquery, top int, budget int, chunk int)
        RETURNS TABLE(id bigint)
        LANGUAGE plpgsql STABLE SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $fn$
        DECLARE
            s record;
            got bigint[];
            hits bigint[];
            lo bigint;
            n bigint;
            last bigint;
            walked bigint := 0;
            span bigint;
        BEGIN
            got := ARRAY(SELECT w.id FROM (SELECT x.id, x.tsv FROM message_index x WHERE x.session_id IS NULL
                                           ORDER BY x.id DESC OFFSET 0) w
                         WHERE w.tsv @@ q AND EXISTS (SELECT 1 FROM messages m WHERE m.id = w.id
                                                      AND m.session_id = ANY(scope))
                         LIMIT top);
            span := (SELECT COALESCE(sum((SELECT m.seq + 1 FROM messages m WHERE m.session_id = u.sid
                                          ORDER BY m.seq DESC LIMIT 1)), 0) FROM unnest(scope) AS u(sid));
            -- (each walk names its session as a range and is ordered by session and id: only
            -- message_index_session gives that order. Written as an equality, the order
            -- reduces to the id's and the planner may walk the primary key instead: every
            -- newer row of every session down to this one's.)
            FOR s IN SELECT u.sid, (SELECT x.id FROM message_index x WHERE x.session_id >= u.sid
                                    AND x.session_id <= u.sid ORDER BY x.session_id DESC, x.id DESC LIMIT 1) AS hi
                     FROM unnest(scope) AS u(sid) ORDER BY 2 DESC NULLS LAST LOOP
                EXIT WHEN s.hi IS NULL OR (cardinality(got) >= top AND s.hi < got[top]);
                last := s.hi + 1;
                LOOP
                    SELECT array_agg(c.id ORDER BY c.id DESC) FILTER (WHERE c.tsv @@ q), min(c.id), count(*)
                      INTO hits, lo, n
                      FROM (SELECT x.id, x.tsv FROM message_index x WHERE x.session_id >= s.sid
                            AND x.session_id <= s.sid AND x.id < last
                            ORDER BY x.session_id DESC, x.id DESC LIMIT chunk) c;
                    walked := walked + n;
                    IF hits IS NOT NULL THEN
                        got := ARRAY(SELECT i FROM unnest(got || hits) AS i ORDER BY i DESC LIMIT top);
                    END IF;
                    EXIT WHEN n < chunk OR (cardinality(got) >= top AND lo < got[top]);
                    IF span > 4 * budget AND walked * top > budget * GREATEST(cardinality(got), 1) THEN
                        RETURN QUERY EXECUTE 'SELECT x.id FROM message_index x WHERE x.tsv @@ $1'
                            ' AND (x.session_id = ANY($2) OR (x.session_id IS NULL AND EXISTS'
                            ' (SELECT 1 FROM messages m WHERE m.id = x.id AND m.session_id = ANY($2))))'
                            ' ORDER BY x.id DESC LIMIT $3' USING q, scope, top;
                        RETURN;
                    END IF;
                    last := lo;
                END LOOP;
            END LOOP;
            RETURN QUERY SELECT unnest(got);
        END
        $fn$;
        """,
    ),
    (
        # The originals a grep folds its summary hits into (Store.search_under_summaries): the
        # newest matches under each of up to 30 summaries. lcm_fts_under probes each summary's
        # messages one by one (~4 us a message: an index read, the row's vector), which for a
        # common identifier came to ~0.5 ms a summary, 16 ms a grep at 100k messages, where
        # SQLite's index seeks within each summary's id range. This function searches the
        # summaries that share a query together: their messages listed once, and, when the
        # caller's estimate of the index rows the query reads (`gin_rows`, from the planner's
        # statistics) is below `weight` x the distinct messages, one read of the full-text
        # index ANDed with their id ranges (at most 16, split at the widest gaps; rows of
        # other sessions inside a range are dropped after) - each match is then rechecked
        # once, not probed per summary. Otherwise, or with no estimate, each summary is probed
        # as before. Rows still listed for indexing are tested on their own text, as in
        # lcm_fts_under's index route. The index read is planned with the ranges written out
        # (EXECUTE), so the planner sees how narrow they are and intersects the two bitmaps.
        "026_fts_under_many",
        """
        CREATE OR REPLACE FUNCTION lcm_fts_under_many(roots bigint[], q tsquery, scope text[], want_role text,
                                                      t0 float8, t1 float8, lim int, probe_max int,
                                                      gin_rows float8, weight float8)
        RETURNS TABLE(root bigint, id bigint, session_id text, role text, created_at float8, text text,
                      rank float8)
        LANGUAGE plpgsql STABLE SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $fn$
        DECLARE
            pr bigint[];  -- (root, summary under it) pairs
            pn bigint[];
            los bigint[];  -- the id span of each summary's own messages, by first id
            his bigint[];
            total bigint;
            cuts bigint[];
            cond text := '';
            lo bigint;
            hi bigint;
            k int;
            hits bigint[];
        BEGIN
            SELECT array_agg(w.r), array_agg(w.id) INTO pr, pn FROM (
                WITH RECURSIVE sub(r, id) AS (
                    SELECT u.r, u.r FROM unnest(roots) AS u(r)
                    UNION SELECT sub.r, c.child_id FROM sub
                    CROSS JOIN LATERAL (SELECT sp.child_id FROM summary_parents sp WHERE sp.parent_id = sub.id
                                        OFFSET 0) c)
                SELECT DISTINCT sub.r, sub.id FROM sub) w;
            SELECT array_agg(s.lo ORDER BY s.lo), array_agg(s.hi ORDER BY s.lo), sum(s.n) INTO los, his, total
            FROM (SELECT (SELECT min(sm.message_id) FROM summary_messages sm WHERE sm.summary_id = u.id) AS lo,
                         (SELECT max(sm.message_id) FROM summary_messages sm WHERE sm.summary_id = u.id) AS hi,
                         (SELECT count(*) FROM summary_messages sm WHERE sm.summary_id = u.id) AS n
                  FROM (SELECT DISTINCT v.id FROM unnest(pn) AS v(id)) u) s
            WHERE s.lo IS NOT NULL;
            IF los IS NULL THEN
                RETURN;
            END IF;
            IF gin_rows IS NULL OR gin_rows > weight * total THEN
                RETURN QUERY SELECT u.r, f.* FROM unnest(roots) AS u(r)
                    CROSS JOIN LATERAL lcm_fts_under(u.r, q, scope, want_role, t0, t1, false, lim, lim, 0,
                                                     probe_max) f;
                RETURN;
            END IF;
            -- the spans as at most 16 ranges of ids: overlapping ones joined, then cut at the
            -- 15 widest gaps between neighbours
            cuts := ARRAY(SELECT g.at FROM (
                              SELECT los[i] AS at, los[i] - max(his[i - 1]) OVER (ORDER BY i ROWS UNBOUNDED PRECEDING)
                                     AS gap
                              FROM generate_subscripts(los, 1) AS i) g
                          WHERE g.gap > 1 ORDER BY g.gap DESC, g.at LIMIT 15);
            lo := los[1];
            hi := his[1];
            FOR k IN 2 .. cardinality(los) + 1 LOOP
                IF k > cardinality(los) OR los[k] = ANY(cuts) AND los[k] > hi THEN
                    cond := cond || CASE WHEN cond = '' THEN '' ELSE ' OR ' END
                            || format('x.id BETWEEN %s AND %s', lo, hi);
                    EXIT WHEN k > cardinality(los);
                    lo := los[k];
                END IF;
                hi := GREATEST(hi, his[k]);
            END LOOP;
            EXECUTE 'SELECT array_agg(x.id) FROM message_index x WHERE x.tsv @@ $1 AND (' || cond || ')'
                INTO hits USING q;
            -- rows still listed for indexing, tested on their own text
            hits := COALESCE(hits, '{}') || ARRAY(
                SELECT p.message_id FROM message_index_pending p
                CROSS JOIN LATERAL (SELECT * FROM messages m WHERE m.id = p.message_id OFFSET 0) t
                WHERE p.message_id >= los[1] AND p.message_id <= (SELECT max(h) FROM unnest(his) AS h)
                  AND COALESCE(t.tsv, lcm_tsvector(t.text)) @@ q);
            RETURN QUERY
            WITH kept AS MATERIALIZED (
                SELECT h.id FROM unnest(hits) AS h(id)
                CROSS JOIN LATERAL (SELECT m.session_id, m.role, m.created_at FROM messages m WHERE m.id = h.id
                                    OFFSET 0) t
                WHERE (scope IS NULL OR t.session_id = ANY(scope)) AND (want_role IS NULL OR t.role = want_role)
                  AND (t0 IS NULL OR t.created_at >= t0) AND (t1 IS NULL OR t.created_at <= t1)),
            owned AS MATERIALIZED (
                SELECT DISTINCT p.r, kept.id FROM kept
                CROSS JOIN LATERAL (SELECT sm.summary_id FROM summary_messages sm WHERE sm.message_id = kept.id
                                    OFFSET 0) o
                JOIN unnest(pr, pn) AS p(r, n) ON p.n = o.summary_id),
            page AS MATERIALIZED (
                SELECT w.r, w.id FROM (
                    SELECT owned.r, owned.id, row_number() OVER (PARTITION BY owned.r ORDER BY owned.id DESC) AS k
                    FROM owned) w
                WHERE w.k <= lim)
            SELECT page.r, t.id, t.session_id, t.role, t.created_at, t.text, 0.0::float8 FROM page
            CROSS JOIN LATERAL (SELECT * FROM messages m WHERE m.id = page.id OFFSET 0) t
            ORDER BY page.r, t.id DESC;
        END
        $fn$;
        """,
    ),
    (
        # lcm_term_counts (migration 017) runs one statement for a capped count of the whole
        # store (floor NULL) and for a count among the newest rows (floor set). After five
        # calls PL/pgSQL may plan it once, generically, for both: the windowed count then read
        # every match in the store from the full-text index and tested the window on each
        # row (at 1M messages 8 -> 45 ms of a common identifier's grep, depending on which
        # counts the connection had served before). Each call is planned with its arguments
        # (~0.1 ms; a count reads hundreds to thousands of rows).
        "027_term_counts_custom_plans",
        """
        ALTER FUNCTION lcm_term_counts(text, tsquery[], integer, bigint) SET plan_cache_mode = force_custom_plan;
        """,
    ),
    (
        # A hit's chain up the DAG (migration 018) read each summary's state by a hash join over
        # the whole summaries table: the plan kept for every call scanned it (155 summaries:
        # 0.06 ms; a gateway's 46,000: 13.6 ms on every lcm_grep page and lcm_describe). Each
        # row is now reached by key: the messages' leaves, the parents of each summary walked,
        # a summary's state by its primary key.
        "028_summary_chains_by_key",
        """
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
        """,
    ),
    (
        # A lineage's summaries matching a query. Planned as one statement, the search read the
        # query's matches among every user's summaries (a gateway's tens of thousands: the
        # full-text index, each vector read from its row) or walked them newest first down to
        # the lineage's: "retry" in a lineage of 155 among 46,000 summaries took 145 ms. A
        # lineage of up to `probe_max` summaries has them listed (summaries_session) and each
        # tested by key: ranked, all of them; newest first, in order until the page is full. A
        # larger lineage runs the statement as before, planned for its arguments (EXECUTE).
        # Sequential scans are off inside: a small table's generic plan listed a lineage's
        # summaries by reading every user's.
        "029_fts_summaries_in_lineage",
        """
        CREATE OR REPLACE FUNCTION lcm_fts_summaries(scope text[], q tsquery, ranked boolean, lim int, skip int,
                                                     probe_max int)
        RETURNS TABLE(id bigint, session_id text, role text, created_at float8, text text, rank float8)
        LANGUAGE plpgsql STABLE SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $fn$
        DECLARE
            ids bigint[];
        BEGIN
            ids := ARRAY(SELECT s.id FROM summaries s WHERE s.session_id = ANY(scope) AND s.state = 'published'
                         LIMIT probe_max + 1);
            IF cardinality(ids) <= probe_max AND ranked THEN
                RETURN QUERY
                SELECT t.id, t.session_id, 'summary'::text, t.t_end, t.text, -ts_rank_cd(t.tsv, q, 1)::float8
                FROM unnest(ids) AS u(id)
                CROSS JOIN LATERAL (SELECT * FROM summaries s WHERE s.id = u.id OFFSET 0) t
                WHERE t.tsv @@ q ORDER BY 6, 1 DESC LIMIT lim OFFSET skip;
            ELSIF cardinality(ids) <= probe_max THEN
                RETURN QUERY
                SELECT t.id, t.session_id, 'summary'::text, t.t_end, t.text, 0.0::float8
                FROM (SELECT i.id FROM unnest(ids) AS i(id) ORDER BY i.id DESC) u
                CROSS JOIN LATERAL (SELECT * FROM summaries s WHERE s.id = u.id OFFSET 0) t
                WHERE t.tsv @@ q ORDER BY u.id DESC LIMIT lim OFFSET skip;
            ELSE
                RETURN QUERY EXECUTE
                    'SELECT t.id, t.session_id, text ''summary'', t.t_end, t.text, '
                    || CASE WHEN ranked THEN '-ts_rank_cd(t.tsv, $2, 1)::float8 AS rank'
                            ELSE '0.0::float8 AS rank' END
                    || ' FROM summaries t WHERE t.tsv @@ $2 AND t.session_id = ANY($1)'
                    || ' AND t.state = ''published'''
                    || CASE WHEN ranked THEN ' ORDER BY rank, t.id DESC' ELSE ' ORDER BY t.id DESC' END
                    || ' LIMIT $3 OFFSET $4'
                    USING scope, q, lim, skip;
            END IF;
        END
        $fn$;
        """,
    ),
    (
        # A search's term-pair tests (lcm_any_match, migrations 012/017) of summaries read the
        # full-text index for both words of each pair: the pairs of a question's common words
        # among a gateway's 48,000 summaries took 16 ms (the budget is 20). Most pairs that meet
        # do so in the newest summaries: those are now walked first, newest first, each vector
        # read only until the first that holds both (up to 64; the array of the newest 256
        # read every vector first, which is why 017 dropped it), then the index as before.
        "030_any_match_newest_summaries",
        """
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
        """,
    ),
    (
        # lcm_term_counts is called on every lcm_grep (each term's capped count: is it rare,
        # and its weight). 027 planned every call with its arguments so that the windowed
        # count (floor set) could not inherit a plan made for the capped one; but the capped
        # count's plan is the same whatever the term (the full-text index, stopping at the
        # cap) and planning its statements was most of the call: a rare identifier's counts of
        # messages and summaries 0.37 -> 0.24 ms. The windowed count moves to its own function,
        # still planned per call; the capped one keeps its plans per connection.
        "031_term_counts_capped_plans_kept",
        """
        CREATE FUNCTION lcm_term_counts_window(target text, qs tsquery[], cap integer, floor bigint)
        RETURNS integer[]
        LANGUAGE plpgsql STABLE SET enable_seqscan = off SET plan_cache_mode = force_custom_plan AS $fn$
        DECLARE
            res integer[] := '{}';
            n integer;
            q tsquery;
        BEGIN
            FOREACH q IN ARRAY qs LOOP
                IF target = 'summaries' THEN
                    SELECT count(*) INTO n FROM (SELECT 1 FROM summaries x
                        WHERE x.tsv @@ q AND x.id > floor LIMIT cap + 1) a;
                ELSE
                    SELECT count(*) INTO n FROM (SELECT 1 FROM message_index x
                        WHERE x.tsv @@ q AND x.id > floor LIMIT cap + 1) a;
                    IF n <= cap THEN  -- still-listed rows count too
                        n := n + (SELECT count(*) FROM (SELECT 1 FROM message_index_pending p
                            CROSS JOIN LATERAL (SELECT * FROM messages m WHERE m.id = p.message_id OFFSET 0) t
                            WHERE COALESCE(t.tsv, lcm_tsvector(t.text)) @@ q
                              AND p.message_id > floor LIMIT cap + 1) b);
                    END IF;
                END IF;
                res := res || LEAST(n, cap + 1);
            END LOOP;
            RETURN res;
        END
        $fn$;

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
        """,
    ),
]
