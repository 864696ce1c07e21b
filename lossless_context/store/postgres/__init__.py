"""The PostgreSQL store (gateways on several hosts): `store` (PostgresStore), `conn` (pools and
reconnection), `deadline` (the client-side bound of every call), `migrations` (the schema: every
append-only named migration, in order, in its `ORDER`, the SQL in modules named by what it holds;
the current definition of each function that changes over time in `migrations/functions.py`),
`idents` (identifiers as whole lexemes, migrations 033 and 035), `index` (deferred full-text
indexing), `append` (the write path of a batch of new messages), `search`, `text` (tsvector text),
`records`, `lifecycle` (retention), `costs`, `vectors` (the semantic arm's vectors), `versions`
(LISTEN/NOTIFY context-version cache), `repair` (the methods of ops/: portable SQL, the doctor's
own checks and safe repairs) and `readonly` (a store opened for reading only, for `lcm mcp`).

Schema rules: a released migration is never edited, renamed or reordered (tests/test_migrations.py
pins each one's SHA-256); a change of the schema is a new migration appended to `ORDER`. A function
kept in `migrations/functions.py` changes there, in place, with its revision raised by one: the
runner re-runs it after the migrations on every store that recorded a lower revision in
`lcm_definitions` (never a higher one), so no migration pastes a whole function again.
"""
