"""The SQLite store (the default: one private file, FTS5): `store` (SQLiteStore), `migrations`
(append-only, named), `append` (the write path), `writelock` (taking the write lock: polled,
so a writer gets it in a prune's pauses), `index` (deferred full-text indexing), `merge`
(background merging of the full-text index's segments), `search`, `records`, `lifecycle`
(retention's removals, pruned spans, space), `cipher` (encryption at rest: SQLCipher, keys) and
`convert` (`lcm encrypt` / `rekey` / `decrypt`), `costs`, `vectors` (the semantic arm's vectors),
`wal` (checkpoints), `file` (probing and backing up a file), `maintenance` (the methods of ops/:
portable SQL, the doctor's own checks and repairs) and `readonly` (a store opened
read-only for the `lcm` command on someone else's file)."""
