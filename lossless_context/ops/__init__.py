"""Operations on a store, through the public store API only: `doctor` (checks and safe
repairs; `merge_copies`: what host merges of our block did under earlier engines), `export`
(JSONL export/import, the data behind the viewer) and `viewer` (the self-contained HTML view of a
session's DAG), `retention` (`lcm prune` and the background retention policy; `batches`: its
removal in transactions bounded by time) and
`lifecycle_info` (the store's size, growth, age, retention and encryption for `lcm status` and
`lcm doctor`)."""
