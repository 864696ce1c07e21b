"""The one runner of the stores' append-only named schema migrations (both backends).

A migration is a ``(name, sql)`` pair in a backend's list (``sqlite/migrations.py``,
``postgres/migrations/__init__.py``); a store records each one it applied, by name, in its
``lcm_migrations`` table. Entries are never edited or reordered once released: a change is
a new entry. This module holds what both backends share:

- :func:`pending`: which entries a store still lacks, given the names it recorded;
- :func:`apply_pending`: apply those in list order through the backend's own callables (the
  backend keeps its lock, its transactions and its execute), an OPTIONAL entry inside a
  savepoint, skipped with a warning when it fails (the next writing open retries it);
- :func:`require_applied`: the read-only check: a store opened for reading only is never
  migrated, so one that lacks a required entry is refused with a message naming the fix;
- :func:`split_sql`: an SQLite migration script cut into statements by
  ``sqlite3.complete_statement`` (SQLite's own parser: trigger bodies, strings and comments
  holding ``;`` stay whole);
- :class:`MigrationState`: what ``lcm doctor`` reports (applied, pending, unknown names);
- :class:`Definition`, :func:`definitions_due`, :func:`apply_definitions`: the current text of a
  function that changes over time, kept once (``postgres/migrations/functions.py``), with a
  revision; run after the migrations when the store recorded a lower revision (or none), so a
  change of such a function is an edit of its one definition, not a new migration pasting it.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from dataclasses import dataclass
from typing import Callable, Collection, ContextManager, Iterable, Mapping, Sequence

from .base import StoreError

log = logging.getLogger("lossless_context.store")

Migration = tuple[str, str]  # (name, sql)


def pending(migrations: Sequence[Migration], applied: Collection[str],
            optional: Collection[str] = ()) -> list[str]:
    """Names of the entries not in `applied`, in list order; `optional` ones left out."""
    return [name for name, _sql in migrations if name not in applied and name not in optional]


def apply_pending(location: str, migrations: Sequence[Migration], applied: Collection[str],
                  apply: Callable[[str, str], bool], *, optional: Collection[str] = (),
                  savepoint: Callable[[], ContextManager[object]] = contextlib.nullcontext,
                  failure: type[BaseException] | tuple[type[BaseException], ...] = Exception) -> list[str]:
    """Apply every entry not in `applied`, in list order; the names applied.

    `apply(name, sql)` runs one entry's statements and records its name in the same
    transaction, returning False when it finds the entry applied meanwhile (another process,
    seen under the backend's write lock). An entry in `optional` runs inside `savepoint()`:
    if it raises `failure` the savepoint is rolled back, a warning is logged and nothing is
    recorded; any other entry's error propagates (the backend's transaction rolls back).
    """
    done: list[str] = []
    for name, sql in migrations:
        if name in applied:
            continue
        if name in optional:
            try:
                with savepoint():
                    ran = apply(name, sql)
            except failure as exc:
                log.warning("lcm store %s: optional migration %s skipped: %s", location, name, str(exc).strip())
                continue
        else:
            ran = apply(name, sql)
        if ran:
            log.info("lcm store %s: applied migration %s", location, name)
            done.append(name)
    return done


def read_applied(location: str, read: Callable[[], Iterable[str]],
                 errors: type[BaseException] | tuple[type[BaseException], ...] = Exception) -> set[str]:
    """The names a store recorded, read by `read`; a store without ``lcm_migrations`` (or one
    that cannot be read) is refused with a StoreError that says so."""
    try:
        return set(read())
    except errors as exc:
        raise StoreError(f"{location} is not an lcm store (or is unreadable): {exc}") from exc


def require_applied(location: str, migrations: Sequence[Migration], applied: Collection[str],
                    optional: Collection[str], fix: str) -> None:
    """The read-only open: refuse a store that lacks a required entry, naming them and `fix`."""
    missing = pending(migrations, applied, optional)
    if missing:
        raise StoreError(f"store {location} was made by an older version and needs upgrading "
                         f"({', '.join(missing)}); {fix}")


@dataclass(frozen=True)
class MigrationState:
    """A store's migrations as `lcm doctor` shows them."""

    applied: list[str]  # recorded names this version knows, in list order
    pending: list[str]  # required entries not recorded
    pending_optional: list[str]  # optional entries not recorded (skipped: the store works without them)
    unknown: list[str]  # recorded names this version does not know (a newer lcm migrated the store)

    @classmethod
    def of(cls, migrations: Sequence[Migration], applied: Collection[str],
           optional: Collection[str] = ()) -> "MigrationState":
        known = [name for name, _sql in migrations]
        return cls(applied=[n for n in known if n in applied],
                   pending=pending(migrations, applied, optional),
                   pending_optional=[n for n in known if n in optional and n not in applied],
                   unknown=sorted(set(applied) - set(known)))


@dataclass(frozen=True)
class Definition:
    """The current definition of one database function: `sql` (CREATE OR REPLACE ... and what
    goes with it) at `revision`, raised by one at every change of `sql`."""

    name: str
    revision: int
    sql: str

    def run(self, execute: Callable[[str], object]) -> None:
        """Run this definition's text through `execute` (the backend's statement runner)."""
        execute(self.sql)


def definitions_due(definitions: Sequence[Definition], recorded: Mapping[str, int]) -> list[Definition]:
    """The definitions a store lacks: those whose revision is above the one it recorded (or it
    recorded none), in list order. A higher recorded revision (a newer lcm ran here) is left."""
    return [d for d in definitions if recorded.get(d.name, 0) < d.revision]


def apply_definitions(location: str, definitions: Sequence[Definition], recorded: Mapping[str, int],
                      apply: Callable[[Definition], None]) -> list[str]:
    """Run every due definition in list order through `apply` (which runs its SQL and records its
    revision, in the backend's migration transaction); the names run. Call it after the
    migrations, under the same lock: a definition may use anything they made."""
    done: list[str] = []
    for d in definitions_due(definitions, recorded):
        apply(d)
        log.info("lcm store %s: defined %s (revision %d)", location, d.name, d.revision)
        done.append(d.name)
    return done


def split_sql(script: str) -> list[str]:
    """An SQLite script's statements, in order, each stripped (``sqlite3.Connection.execute``
    runs one statement at a time). A statement ends at a ``;`` where SQLite's own parser says
    the text so far is complete, so a ``;`` inside a trigger body, a string or a comment does
    not cut it; text after the last complete statement that is more than blanks is returned as
    a last statement (SQLite then reports what is wrong with it)."""
    out: list[str] = []
    start = 0
    at = script.find(";")
    while at != -1:
        piece = script[start:at + 1]
        if sqlite3.complete_statement(piece):
            if piece.strip() != ";":
                out.append(piece.strip())
            start = at + 1
        at = script.find(";", at + 1)
    rest = script[start:].strip()
    if rest:
        out.append(rest)
    return out
