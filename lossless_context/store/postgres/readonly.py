"""A PostgreSQL store opened for reading only (`lcm mcp`: other agents reading the history).

Every connection runs with ``default_transaction_read_only=on``, so the server itself refuses
any write, whatever the role may do. The store never migrates (a missing migration is an
error naming the fix), never indexes (a search computes the rows still listed for the index
itself, as every search does) and refuses its own writes with a StoreError that names it.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, TypeVar

from ..base import StoreError
from .. import migrate
from .deadline import watch
from .conn import recorded_schema
from .migrations import DEFINITIONS, MIGRATIONS, OPTIONAL
from .store import PostgresStore

T = TypeVar("T")

READ_ONLY_OPTION = "-c default_transaction_read_only=on"


class ReadOnlyPostgresStore(PostgresStore):
    """PostgresStore whose sessions are read-only: reads work, writes raise StoreError."""

    read_only = True

    def __init__(self, location: str, **kwargs: Any) -> None:
        super().__init__(location, background_index=False, **kwargs)

    def _conn_kwargs(self) -> dict[str, Any]:
        kwargs = super()._conn_kwargs()
        given = ""
        try:
            import psycopg

            given = str(psycopg.conninfo.conninfo_to_dict(self._dsn).get("options") or "")
        except Exception:  # (an invalid DSN is reported when connecting)
            pass
        # The DSN's own options are kept: a keyword argument replaces the DSN's value.
        kwargs["options"] = " ".join(x for x in (kwargs.get("options") or given, READ_ONLY_OPTION) if x)
        return kwargs

    def _migrate(self, conn: Any) -> None:
        revisions: dict[str, int] = {}

        def read() -> list[str]:
            with watch(conn, self._call_timeout):  # (a frozen server: bounded like every call)
                names, got = recorded_schema(conn)
                if not names:  # (not an lcm store: read_applied says so)
                    return [r[0] for r in conn.execute("SELECT name FROM lcm_migrations")]
                revisions.update(got)
                return list(names)

        done = migrate.read_applied(self.location, read)
        fix = "open it once with a writing lcm (e.g. `lcm doctor`)"
        migrate.require_applied(self.location, MIGRATIONS, done, OPTIONAL, fix)
        due = migrate.definitions_due(DEFINITIONS, revisions)
        if due:  # (a function's current definition is missing: as a missing migration)
            raise StoreError(f"store {self.location} was made by an older version and needs upgrading "
                             f"({', '.join(d.name for d in due)}); {fix}")

    def _refuse(self) -> StoreError:
        return StoreError(f"store {self.location} is opened read-only: nothing can be written")

    def _write(self, fn: Callable[[Any], T], seconds: float | None = None, *, pipeline: bool = False) -> T:
        raise self._refuse()

    def wait_indexed(self) -> None:
        return None  # indexing is a write: a search reads the rows still listed itself

    @contextlib.contextmanager
    def compaction_lock(self, session_id: str, timeout: float) -> Iterator[bool]:
        raise self._refuse()
        yield False  # pragma: no cover  (a generator, for contextmanager)
