"""The PostgreSQL store (gateways on several hosts): `store` (PostgresStore), `conn` (pools and
reconnection), `deadline` (the client-side bound of every call), `migrations` (append-only, named;
020 onward in `kept_plans`), `idents` (identifiers as whole lexemes, migration 033), `index`
(deferred full-text indexing), `append` (the write path of a batch of new messages), `search`,
`text` (tsvector text), `records`, `lifecycle` and `lifecycle_schema` (retention), `costs`,
`vectors` (the semantic arm's vectors), `versions` (LISTEN/NOTIFY context-version cache),
`repair` (the methods of ops/: portable SQL, the doctor's own checks and safe repairs) and `readonly` (a store opened for reading only, for `lcm mcp`)."""
