"""Append-only named schema migrations for the SQLite store.

Never edit or reorder an entry once released: add a new one. Each runs once, inside a
transaction, and is recorded in `lcm_migrations` (the runner: ``store/migrate.py``; a script is
cut into statements by ``sqlite3.complete_statement``, so trigger bodies stay whole).
"""

from __future__ import annotations

MIGRATIONS: list[tuple[str, str]] = [
    (
        "001_initial",
        """
        CREATE TABLE sessions (
            id TEXT PRIMARY KEY,
            parent_id TEXT REFERENCES sessions(id),
            conversation_id TEXT,
            platform TEXT,
            model TEXT,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            context_version INTEGER NOT NULL DEFAULT 0,
            compactions INTEGER NOT NULL DEFAULT 0,
            last_compaction_at REAL,
            boundary_reason TEXT
        );
        CREATE INDEX sessions_parent ON sessions(parent_id);
        CREATE INDEX sessions_conversation ON sessions(conversation_id);

        CREATE TABLE messages (
            id INTEGER PRIMARY KEY,
            session_id TEXT NOT NULL REFERENCES sessions(id),
            seq INTEGER NOT NULL,
            uid TEXT,
            ident TEXT NOT NULL,
            role TEXT NOT NULL,
            raw TEXT NOT NULL,
            text TEXT NOT NULL,
            tokens INTEGER NOT NULL,
            created_at REAL NOT NULL,
            supersedes INTEGER REFERENCES messages(id),
            large INTEGER NOT NULL DEFAULT 0,
            exploration TEXT,
            UNIQUE (session_id, seq)
        );
        CREATE INDEX messages_uid ON messages(uid) WHERE uid IS NOT NULL;
        CREATE INDEX messages_session_ident ON messages(session_id, ident);
        CREATE INDEX messages_created ON messages(session_id, created_at);

        CREATE TABLE message_absorbed (
            message_id INTEGER NOT NULL REFERENCES messages(id),
            uid TEXT NOT NULL,
            PRIMARY KEY (message_id, uid)
        );

        CREATE VIRTUAL TABLE messages_fts USING fts5(
            text, content='messages', content_rowid='id',
            tokenize='porter unicode61 remove_diacritics 2'
        );
        CREATE TRIGGER messages_ai AFTER INSERT ON messages BEGIN
            INSERT INTO messages_fts(rowid, text) VALUES (new.id, new.text);
        END;
        CREATE TRIGGER messages_ad AFTER DELETE ON messages BEGIN
            INSERT INTO messages_fts(messages_fts, rowid, text) VALUES ('delete', old.id, old.text);
        END;

        CREATE TABLE summaries (
            id INTEGER PRIMARY KEY,
            session_id TEXT NOT NULL REFERENCES sessions(id),
            kind TEXT NOT NULL CHECK (kind IN ('leaf', 'condensed')),
            depth INTEGER NOT NULL,
            text TEXT NOT NULL,
            tokens INTEGER NOT NULL,
            source_tokens INTEGER NOT NULL,
            level TEXT NOT NULL,
            summarizer TEXT NOT NULL,
            t_start REAL,
            t_end REAL,
            n_messages INTEGER NOT NULL,
            state TEXT NOT NULL CHECK (state IN ('staged', 'published')),
            pass_id TEXT,
            created_at REAL NOT NULL
        );
        CREATE INDEX summaries_session ON summaries(session_id, state);
        CREATE INDEX summaries_pass ON summaries(pass_id);

        CREATE TABLE summary_messages (
            summary_id INTEGER NOT NULL REFERENCES summaries(id) ON DELETE CASCADE,
            message_id INTEGER NOT NULL REFERENCES messages(id),
            ord INTEGER NOT NULL,
            PRIMARY KEY (summary_id, message_id)
        );
        CREATE INDEX summary_messages_message ON summary_messages(message_id);

        CREATE TABLE summary_parents (
            parent_id INTEGER NOT NULL REFERENCES summaries(id) ON DELETE CASCADE,
            child_id INTEGER NOT NULL REFERENCES summaries(id) ON DELETE CASCADE,
            ord INTEGER NOT NULL,
            PRIMARY KEY (parent_id, child_id)
        );
        CREATE INDEX summary_parents_child ON summary_parents(child_id);

        CREATE VIRTUAL TABLE summaries_fts USING fts5(
            text, content='summaries', content_rowid='id',
            tokenize='porter unicode61 remove_diacritics 2'
        );
        CREATE TRIGGER summaries_ai AFTER INSERT ON summaries BEGIN
            INSERT INTO summaries_fts(rowid, text) VALUES (new.id, new.text);
        END;
        CREATE TRIGGER summaries_ad AFTER DELETE ON summaries BEGIN
            INSERT INTO summaries_fts(summaries_fts, rowid, text) VALUES ('delete', old.id, old.text);
        END;
        CREATE TRIGGER summaries_au AFTER UPDATE OF text ON summaries BEGIN
            INSERT INTO summaries_fts(summaries_fts, rowid, text) VALUES ('delete', old.id, old.text);
            INSERT INTO summaries_fts(rowid, text) VALUES (new.id, new.text);
        END;

        CREATE TABLE context_items (
            session_id TEXT NOT NULL REFERENCES sessions(id),
            pos INTEGER NOT NULL,
            message_id INTEGER REFERENCES messages(id),
            summary_id INTEGER REFERENCES summaries(id),
            CHECK ((message_id IS NULL) <> (summary_id IS NULL)),
            PRIMARY KEY (session_id, pos)
        );

        CREATE TABLE staged_passes (
            pass_id TEXT PRIMARY KEY,
            session_id TEXT NOT NULL REFERENCES sessions(id),
            base_version INTEGER NOT NULL,
            base_len INTEGER NOT NULL,
            items TEXT NOT NULL,
            top_nodes TEXT NOT NULL,
            created_at REAL NOT NULL
        );
        CREATE INDEX staged_passes_session ON staged_passes(session_id, created_at);
        """,
    ),
    (
        "002_message_aliases",
        """
        CREATE TABLE message_aliases (
            ident TEXT NOT NULL,
            message_id INTEGER NOT NULL REFERENCES messages(id),
            PRIMARY KEY (ident, message_id)
        );
        CREATE INDEX message_aliases_message ON message_aliases(message_id);
        """,
    ),
    (
        "003_presummaries",
        """
        CREATE TABLE presummaries (
            session_id TEXT NOT NULL REFERENCES sessions(id),
            span_key TEXT NOT NULL,
            text TEXT NOT NULL,
            tokens INTEGER NOT NULL,
            source_tokens INTEGER NOT NULL,
            level TEXT NOT NULL,
            summarizer TEXT NOT NULL,
            created_at REAL NOT NULL,
            PRIMARY KEY (session_id, span_key)
        );
        """,
    ),
    (
        "004_summary_id_watermark",
        """
        CREATE TABLE summary_id_watermark (id INTEGER NOT NULL);
        INSERT INTO summary_id_watermark(id) SELECT COALESCE(MAX(id), 0) FROM summaries;
        """,
    ),
    (
        "005_messages_session_id",
        """
        CREATE INDEX messages_session_id ON messages(session_id, id);
        """,
    ),
    (
        "006_cjk_trigram",
        """
        CREATE VIRTUAL TABLE messages_cjk USING fts5(
            text, content='messages', content_rowid='id', tokenize='trigram'
        );
        CREATE TRIGGER messages_cjk_ai AFTER INSERT ON messages
        WHEN new.text GLOB '*[⺀-鿿가-힯぀-ヿ]*' BEGIN
            INSERT INTO messages_cjk(rowid, text) VALUES (new.id, new.text);
        END;
        CREATE TRIGGER messages_cjk_ad AFTER DELETE ON messages
        WHEN old.text GLOB '*[⺀-鿿가-힯぀-ヿ]*' BEGIN
            INSERT INTO messages_cjk(messages_cjk, rowid, text) VALUES ('delete', old.id, old.text);
        END;
        INSERT INTO messages_cjk(rowid, text) SELECT id, text FROM messages WHERE text GLOB '*[⺀-鿿가-힯぀-ヿ]*';
        """,
    ),
    (
        # FTS5 (3.40) flushes its pending terms into a new segment at every statement
        # savepoint, and a trigger makes each single-row INSERT one: indexing through the
        # triggers wrote one segment per message (plus merges) and ran the CJK GLOB over
        # every text, about 3/4 of ingest time. The store's own appends now index their rows
        # in bulk in the same transaction (SQLiteStore.append_messages) and raise this gate
        # around the row inserts; every other writer (import, SQL copies) finds the gate empty
        # and keeps the old triggers' behaviour. The delete triggers are unchanged.
        "007_bulk_message_index",
        """
        CREATE TABLE lcm_bulk_indexing (active INTEGER NOT NULL);
        DROP TRIGGER messages_ai;
        CREATE TRIGGER messages_ai AFTER INSERT ON messages
        WHEN NOT EXISTS (SELECT 1 FROM lcm_bulk_indexing) BEGIN
            INSERT INTO messages_fts(rowid, text) VALUES (new.id, new.text);
        END;
        DROP TRIGGER messages_cjk_ai;
        CREATE TRIGGER messages_cjk_ai AFTER INSERT ON messages
        WHEN NOT EXISTS (SELECT 1 FROM lcm_bulk_indexing) AND new.text GLOB '*[⺀-鿿가-힯぀-ヿ]*' BEGIN
            INSERT INTO messages_cjk(rowid, text) VALUES (new.id, new.text);
        END;
        """,
    ),
    (
        # A bulk append indexes each chunk of rows in the same statement that inserts them:
        # the trigger fires on the chunk's last row (its id is in lcm_bulk_range) and indexes
        # the whole range in one FTS statement. One statement per chunk instead of two, so a
        # pipelined append's writer thread comes back to Python once per chunk (see
        # store/sqlite/append.py). Only the store's own appends fill lcm_bulk_range.
        "008_bulk_range_trigger",
        """
        CREATE TABLE lcm_bulk_range (lo INTEGER NOT NULL, hi INTEGER NOT NULL);
        CREATE TRIGGER messages_bulk_fts AFTER INSERT ON messages
        WHEN new.id = (SELECT hi FROM lcm_bulk_range) BEGIN
            INSERT INTO messages_fts(rowid, text)
            SELECT id, text FROM messages WHERE id BETWEEN (SELECT lo FROM lcm_bulk_range) AND new.id;
        END;
        """,
    ),
    (
        # A large (pipelined) append commits its rows first and has them full-text indexed
        # by the writer thread in the transactions that follow (store/sqlite/index.py):
        # until then its id range is listed here, committed with the rows, so a crash in
        # between leaves a record of exactly what is still to index. Search indexes what is
        # listed before it matches. A row deleted before it was indexed is not in the index:
        # the delete trigger must not take it out (that would corrupt the FTS5 index).
        "009_deferred_message_index",
        """
        CREATE TABLE lcm_index_pending (lo INTEGER NOT NULL, hi INTEGER NOT NULL);
        DROP TRIGGER messages_ad;
        CREATE TRIGGER messages_ad AFTER DELETE ON messages
        WHEN NOT EXISTS (SELECT 1 FROM lcm_index_pending WHERE old.id BETWEEN lo AND hi) BEGIN
            INSERT INTO messages_fts(messages_fts, rowid, text) VALUES ('delete', old.id, old.text);
        END;
        """,
    ),
    (
        # get_status() / `lcm status` count messages and sum their tokens: with the tokens in
        # this index that is a scan of the index, not of every message row (100k messages:
        # 60 → 6 ms; per session an index range). Same number of index writes per row.
        "010_session_index_covers_tokens",
        """
        DROP INDEX messages_session_id;
        CREATE INDEX messages_session_id ON messages(session_id, id, tokens);
        """,
    ),
    (
        # A message the host rolled back (undo, retry) is kept, hidden: search skips it, the
        # active context no longer holds it, and it is restored if the host sends it again.
        "011_message_retractions",
        """
        CREATE TABLE message_retractions (
            message_id INTEGER PRIMARY KEY REFERENCES messages(id),
            retracted_at REAL NOT NULL
        );
        """,
    ),
    (
        # A branch sees its ancestors only up to the fork: the newest message and summary ids
        # of the whole store when the branch was made (NULL: not a branch, unbounded).
        "012_session_fork_point",
        """
        ALTER TABLE sessions ADD COLUMN fork_message_id INTEGER;
        ALTER TABLE sessions ADD COLUMN fork_summary_id INTEGER;
        """,
    ),
    (
        # Cost per summary node (summariser calls, tokens in/out, ms, model), the earlier
        # texts of a re-summarised node, and the continuity state a session's summary block
        # keeps in view (continuity.py). No foreign key on the costs: a discarded staged
        # node leaves its row behind harmlessly (summary ids are never reused).
        "013_summary_costs_history_continuity",
        """
        CREATE TABLE summary_costs (
            summary_id INTEGER PRIMARY KEY,
            model TEXT NOT NULL DEFAULT '',
            calls INTEGER NOT NULL DEFAULT 0,
            input_tokens INTEGER NOT NULL DEFAULT 0,
            output_tokens INTEGER NOT NULL DEFAULT 0,
            ms REAL NOT NULL DEFAULT 0
        );
        CREATE TABLE summary_history (
            summary_id INTEGER NOT NULL,
            text TEXT NOT NULL,
            tokens INTEGER NOT NULL,
            level TEXT NOT NULL,
            summarizer TEXT NOT NULL,
            replaced_at REAL NOT NULL
        );
        CREATE INDEX summary_history_summary ON summary_history(summary_id);
        CREATE TABLE session_continuity (
            session_id TEXT PRIMARY KEY,
            state TEXT NOT NULL,
            updated_at REAL NOT NULL
        );
        """,
    ),
    (
        # Message vectors of the optional semantic arm (retrieval/semantic.py): derived data,
        # one row per message and model; `seq` is the order they were kept in (a search's
        # in-memory copy reads only what is newer), `session_id` lets a lineage read its own.
        "014_message_vectors",
        """
        CREATE TABLE message_vectors (
            seq INTEGER PRIMARY KEY,
            model TEXT NOT NULL,
            message_id INTEGER NOT NULL REFERENCES messages(id),
            session_id TEXT NOT NULL,
            vec BLOB NOT NULL,
            UNIQUE (model, message_id)
        );
        CREATE INDEX message_vectors_session ON message_vectors(model, session_id, seq);
        """,
    ),
    (
        # A lineage's summaries matching a query (store/sqlite/search.py): in a gateway's store the
        # summaries of one user lie between every other user's, and FTS5 can bound a search
        # only by one rowid range, so a lineage's were searched one id range at a time, each
        # range's search reading every segment of the index for every term (300 users, 48,000
        # summaries: ~40 ranges, 30 ms a search, the question's grep 63 ms against 1.6 for the
        # user's history alone). Summaries indexed again with their session id as a column:
        # one search, the query's terms ANDed with the lineage's sessions (a phrase each),
        # FTS5 skipping between the two by rowid. Summaries are a small fraction of a store.
        "015_summaries_scoped_fts",
        """
        CREATE VIRTUAL TABLE summaries_scoped_fts USING fts5(
            text, session_id, content='summaries', content_rowid='id',
            tokenize='porter unicode61 remove_diacritics 2'
        );
        CREATE TRIGGER summaries_scoped_ai AFTER INSERT ON summaries BEGIN
            INSERT INTO summaries_scoped_fts(rowid, text, session_id) VALUES (new.id, new.text, new.session_id);
        END;
        CREATE TRIGGER summaries_scoped_ad AFTER DELETE ON summaries BEGIN
            INSERT INTO summaries_scoped_fts(summaries_scoped_fts, rowid, text, session_id)
            VALUES ('delete', old.id, old.text, old.session_id);
        END;
        CREATE TRIGGER summaries_scoped_au AFTER UPDATE OF text, session_id ON summaries BEGIN
            INSERT INTO summaries_scoped_fts(summaries_scoped_fts, rowid, text, session_id)
            VALUES ('delete', old.id, old.text, old.session_id);
            INSERT INTO summaries_scoped_fts(rowid, text, session_id) VALUES (new.id, new.text, new.session_id);
        END;
        INSERT INTO summaries_scoped_fts(summaries_scoped_fts) VALUES ('rebuild');
        """,
    ),
    (
        # The store's merge thread (store/sqlite/merge.py) merges every level of a full-text
        # index that holds two or more segments: FTS5 reads each segment for each term of a
        # query, and its own merging left up to 16 at the smallest level and a few more at
        # each above. Merging a level of two (not FTS5's default of four) keeps one per level.
        "016_fts_usermerge",
        """
        INSERT INTO messages_fts(messages_fts, rank) VALUES ('usermerge', 2);
        INSERT INTO messages_cjk(messages_cjk, rank) VALUES ('usermerge', 2);
        INSERT INTO summaries_fts(summaries_fts, rank) VALUES ('usermerge', 2);
        INSERT INTO summaries_scoped_fts(summaries_scoped_fts, rank) VALUES ('usermerge', 2);
        """,
    ),
    (
        # The trigram index of summaries holding CJK text, as messages have (006): a CJK phrase
        # was found in summaries by a LIKE scan of every summary of the lineage. Summaries are
        # rewritten in place (lcm resummarize, an upgrade, forget): the update trigger follows.
        "018_summaries_cjk",
        """
        CREATE VIRTUAL TABLE summaries_cjk USING fts5(
            text, content='summaries', content_rowid='id', tokenize='trigram'
        );
        CREATE TRIGGER summaries_cjk_ai AFTER INSERT ON summaries
        WHEN new.text GLOB '*[⺀-鿿가-힯぀-ヿ]*' BEGIN
            INSERT INTO summaries_cjk(rowid, text) VALUES (new.id, new.text);
        END;
        CREATE TRIGGER summaries_cjk_ad AFTER DELETE ON summaries
        WHEN old.text GLOB '*[⺀-鿿가-힯぀-ヿ]*' BEGIN
            INSERT INTO summaries_cjk(summaries_cjk, rowid, text) VALUES ('delete', old.id, old.text);
        END;
        CREATE TRIGGER summaries_cjk_au_old AFTER UPDATE OF text ON summaries
        WHEN old.text GLOB '*[⺀-鿿가-힯぀-ヿ]*' BEGIN
            INSERT INTO summaries_cjk(summaries_cjk, rowid, text) VALUES ('delete', old.id, old.text);
        END;
        CREATE TRIGGER summaries_cjk_au_new AFTER UPDATE OF text ON summaries
        WHEN new.text GLOB '*[⺀-鿿가-힯぀-ヿ]*' BEGIN
            INSERT INTO summaries_cjk(rowid, text) VALUES (new.id, new.text);
        END;
        INSERT INTO summaries_cjk(rowid, text) SELECT id, text FROM summaries WHERE text GLOB '*[⺀-鿿가-힯぀-ヿ]*';
        INSERT INTO summaries_cjk(summaries_cjk, rank) VALUES ('usermerge', 2);
        """,
    ),
    (
        # Retention (ops/retention.py). A leaf whose originals a prune removed keeps its text
        # and its place in the DAG; this row says how many messages went, which ids they
        # spanned and when (lcm_expand and lcm_grep say so). Each prune is logged, so
        # `lcm doctor` can tell an interrupted one and `lcm status` when the last ran.
        # The indexes serve the foreign-key checks of a deleted message or summary: without
        # them SQLite scanned the whole messages table for each message deleted (its
        # `supersedes` column; 200,000 messages: 1 s per message, 100 deletes 104 s -> 8 ms),
        # which made `lcm forget` of a session unusable on a large store. Building the first
        # reads every message once (one-off, at the first open after the upgrade).
        "019_retention",
        """
        CREATE INDEX messages_supersedes ON messages(supersedes) WHERE supersedes IS NOT NULL;
        CREATE INDEX message_vectors_message ON message_vectors(message_id);
        CREATE INDEX context_items_message ON context_items(message_id) WHERE message_id IS NOT NULL;
        CREATE INDEX context_items_summary ON context_items(summary_id) WHERE summary_id IS NOT NULL;
        CREATE TABLE pruned_spans (
            summary_id INTEGER PRIMARY KEY REFERENCES summaries(id) ON DELETE CASCADE,
            session_id TEXT NOT NULL,
            messages INTEGER NOT NULL,
            tokens INTEGER NOT NULL,
            first_id INTEGER NOT NULL,
            last_id INTEGER NOT NULL,
            pruned_at REAL NOT NULL,
            reason TEXT NOT NULL
        );
        CREATE INDEX pruned_spans_first ON pruned_spans(first_id);
        CREATE TABLE retention_runs (
            id INTEGER PRIMARY KEY,
            started_at REAL NOT NULL,
            finished_at REAL,
            mode TEXT NOT NULL,
            trigger TEXT NOT NULL,
            plan TEXT NOT NULL,
            sessions INTEGER NOT NULL DEFAULT 0,
            messages INTEGER NOT NULL DEFAULT 0,
            summaries INTEGER NOT NULL DEFAULT 0,
            bytes_before INTEGER,
            bytes_after INTEGER
        );
        """,
    ),
    (
        # What the user forgot (`lcm forget m123`), remembered without its text, so a live host
        # handing the message over again does not get it stored again (pipeline/forgotten.py):
        # its session, the message kept before it (anchor) and a salted, stretched digest of its
        # identity. The salt is the store's own (one row, made on first use).
        "020_forget_marks",
        """
        CREATE TABLE forget_marks (
            session_id TEXT NOT NULL,
            anchor INTEGER NOT NULL,
            digest TEXT NOT NULL,
            forgotten_at REAL NOT NULL,
            PRIMARY KEY (session_id, anchor, digest)
        ) WITHOUT ROWID;
        CREATE INDEX forget_marks_anchor ON forget_marks(anchor);
        CREATE TABLE forget_salt (id INTEGER PRIMARY KEY CHECK (id = 1), salt BLOB NOT NULL);
        """,
    ),
]
