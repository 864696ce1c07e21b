"""Durable stores for the lossless history: SQLite (embedded default) and PostgreSQL.

* `base`      — the `Store` interface both backends implement, and its shared helpers;
* `search_api` — the part of that interface a grep reads (`retrieval/` above the store);
* `sqlite/`, `postgres/` — the two backends (each folder's docstring lists its modules);
* `rows`      — message and summary rows as both stores read them (columns, records);
* `guard`     — the store circuit breaker, and the session's way on without its store;
* `owners`    — which engine staged a pass, and whether it can still commit it;
* `passes`    — publishing a staged pass and discarding stale ones (each backend: its SQL);
* `migrate`   — the one runner of both backends' append-only named schema migrations.
"""

from __future__ import annotations

from typing import Any

from .base import Store, StoreError


def open_store(location: str, *, read_only: bool = False, call_timeout: float | None = None) -> Store:
    """Open (lazily connecting) the store named by a path or a postgresql:// DSN.

    `call_timeout`: PostgreSQL's client-side bound on one store call (seconds; its default
    when None). SQLite's waits are its busy timeout and lock waits. `read_only`: a reader
    beside the writers (`lcm mcp`): SQLite opened ``mode=ro``, a PostgreSQL session with
    ``default_transaction_read_only``; it never writes nor migrates."""
    if location.startswith(("postgresql://", "postgres://")):
        kw: dict[str, Any] = {} if call_timeout is None else {"call_timeout": call_timeout}
        if read_only:
            from .postgres.readonly import ReadOnlyPostgresStore

            return ReadOnlyPostgresStore(location, **kw)
        from .postgres.store import PostgresStore

        return PostgresStore(location, **kw)
    from .sqlite.readonly import ReadOnlySQLiteStore, is_read_only

    if read_only or is_read_only(location):  # someone else's store, a read-only mount: inspect, never write
        return ReadOnlySQLiteStore(location)
    from .sqlite.store import SQLiteStore

    return SQLiteStore(location)


__all__ = ["Store", "StoreError", "open_store"]
