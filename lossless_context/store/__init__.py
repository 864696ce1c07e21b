"""Durable stores for the lossless history: SQLite (embedded default) and PostgreSQL."""

from __future__ import annotations

from .base import Store, StoreError


def open_store(location: str, *, call_timeout: float | None = None) -> Store:
    """Open (lazily connecting) the store named by a path or a postgresql:// DSN.

    `call_timeout`: PostgreSQL's client-side bound on one store call (seconds; its default
    when None). SQLite's waits are its busy timeout and lock waits."""
    if location.startswith(("postgresql://", "postgres://")):
        from .postgres.store import PostgresStore

        if call_timeout is None:
            return PostgresStore(location)
        return PostgresStore(location, call_timeout=call_timeout)
    from .sqlite.readonly import ReadOnlySQLiteStore, is_read_only

    if is_read_only(location):  # someone else's store, a read-only mount: inspect, never write
        return ReadOnlySQLiteStore(location)
    from .sqlite.store import SQLiteStore

    return SQLiteStore(location)


__all__ = ["Store", "StoreError", "open_store"]
