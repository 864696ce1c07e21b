"""Publishing a staged compaction pass and discarding stale ones: the logic both backends share.

A pass is staged (its summaries written as ``staged``, its context kept in ``staged_passes``)
and published only when the host commits it. Publishing, in the caller's write transaction:
the stage is read under the backend's lock; when the session's context moved on since the
stage's base, what was appended after the base is kept (`with_appended`: no message reference
is lost); the pass's summaries become published, the session counts a compaction, the context
(and, for a host that continues in another session, that session's too) is written, the stage
goes, and this engine's older stages of the session with it (another live engine's stage may
still be adopted: owners.py). The statements are `PassWrites`: `PortablePassWrites` runs them
in the SQL both backends read alike; a backend overrides only what it does its own way
(PostgreSQL: its row locks, and deletes over arrays).
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable, NamedTuple, Protocol, Sequence

from .base import Execute, with_appended
from .owners import pass_owner


class Stage(NamedTuple):
    """A staged pass as read under the backend's lock, with its session's current context
    version (None: the session row is gone)."""

    session_id: str
    base_version: int
    base_len: int
    items_json: str
    current_version: int | None


class PassWrites(Protocol):
    """One backend's statements inside the write transaction of a publish or a discard."""

    def locked_stage(self, pass_id: str, into_session: str | None) -> Stage | None:
        """Lock what the publish writes (the sessions, the stage) and read the stage; None
        when no such stage exists (already published or discarded)."""

    def context_rows_from(self, session_id: str, pos: int) -> Sequence[tuple[Any, Any]]:
        """(message_id, summary_id) of the session's context items from ``pos`` on, in order."""

    def mark_published(self, pass_id: str, session_id: str, now: float) -> None:
        """The pass's summaries become published; the session counts one more compaction."""

    def write_context(self, session_id: str, items: Sequence[tuple[str, int]]) -> None:
        """Replace the session's active context (its version moves on)."""

    def stale_pass_ids(self, session_id: str, keep: str | None) -> set[str]:
        """Every staged pass of the session but ``keep``, and the passes of staged summaries of
        the session whose stage row is gone."""

    def delete_passes(self, pass_ids: Sequence[str]) -> None:
        """Delete these passes' staged summaries (published ones stay) and stage rows."""


class PortablePassWrites:
    """`PassWrites` in portable SQL (`?` placeholders) over the caller's ``execute``, in its
    write transaction; ``write_context(session_id, items)`` is the backend's own."""

    def __init__(self, execute: Execute, write_context: Callable[[str, Sequence[tuple[str, int]]], None]) -> None:
        self.ex, self._write_context = execute, write_context

    def locked_stage(self, pass_id: str, into_session: str | None) -> Stage | None:
        # (the caller's transaction already holds the store's single writer slot)
        row = self.ex("SELECT session_id, base_version, base_len, items FROM staged_passes WHERE pass_id=?",
                      (pass_id,)).fetchone()
        if row is None:
            return None
        cur = self.ex("SELECT context_version FROM sessions WHERE id=?", (row[0],)).fetchone()
        return Stage(row[0], row[1], row[2], row[3], cur[0] if cur else None)

    def context_rows_from(self, session_id: str, pos: int) -> Sequence[tuple[Any, Any]]:
        return self.ex("SELECT message_id, summary_id FROM context_items WHERE session_id=? AND pos>=? ORDER BY pos",
                       (session_id, pos)).fetchall()

    def mark_published(self, pass_id: str, session_id: str, now: float) -> None:
        self.ex("UPDATE summaries SET state='published' WHERE pass_id=?", (pass_id,))
        self.ex("UPDATE sessions SET compactions = compactions + 1, last_compaction_at=? WHERE id=?", (now, session_id))

    def write_context(self, session_id: str, items: Sequence[tuple[str, int]]) -> None:
        self._write_context(session_id, items)

    def stale_pass_ids(self, session_id: str, keep: str | None) -> set[str]:
        staged = self.ex("SELECT pass_id FROM staged_passes WHERE session_id=?", (session_id,)).fetchall()
        orphan = self.ex("SELECT DISTINCT pass_id FROM summaries WHERE session_id=? AND state='staged'"
                         " AND pass_id NOT IN (SELECT pass_id FROM staged_passes)", (session_id,)).fetchall()
        # (`!=` in Python: the null-safe comparison both dialects spell differently)
        return {r[0] for r in [*staged, *orphan] if r[0] != keep}

    def delete_passes(self, pass_ids: Sequence[str]) -> None:
        for pid in pass_ids:
            self.ex("DELETE FROM summaries WHERE pass_id=? AND state='staged'", (pid,))
            self.ex("DELETE FROM staged_passes WHERE pass_id=?", (pid,))


def publish(w: PassWrites, pass_id: str, into_session: str | None = None) -> bool:
    """Publish a staged pass (see the module docstring); False when it is no longer staged."""
    stage = w.locked_stage(pass_id, into_session)
    if stage is None:
        return False
    items: list[tuple[str, int]] = [(x[0], x[1]) for x in json.loads(stage.items_json)]
    if stage.current_version is not None and stage.current_version != stage.base_version:
        # The published context moved on since staging: keep what was appended after the
        # staged base so no message reference is lost.
        items = with_appended(items, w.context_rows_from(stage.session_id, stage.base_len))
    w.mark_published(pass_id, stage.session_id, time.time())
    w.write_context(stage.session_id, items)
    if into_session and into_session != stage.session_id:
        w.write_context(into_session, items)
    w.delete_passes([pass_id])
    # This engine's older stages can never be adopted any more (another live engine's stage
    # of the same session may still be: see owners.py).
    discard_stale(w, stage.session_id, keep=None, owner_of=pass_id)
    return True


def discard_stale(w: PassWrites, session_id: str, keep: str | None, owner_of: str | None = None) -> int:
    """Delete the session's stages but ``keep`` (with ``owner_of``: only those of the engine
    that staged that pass, or of nobody); how many."""
    ids = w.stale_pass_ids(session_id, keep)
    if owner_of is not None:  # only this engine's own older stages (see owners.py)
        mine = pass_owner(owner_of)
        ids = {p for p in ids if pass_owner(p) in (None, mine)}
    if ids:
        w.delete_passes(sorted(ids))
    return len(ids)
