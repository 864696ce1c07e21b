"""The host's own session database (hermes_state.SessionDB), for tests that bind one.

`bind_session_state(session_db, session_id)` hands the engine the host's database; the engine
reads a session's row (its parent, for branches) and its messages (turns a dead process never
handed over). Tests use the real class of the installed host, not a stand-in: `session_db()`
makes one in a file of the test's own, with the sessions given (id → parent id), and skips
with a reason naming the host when it is not installed (a failure under LCM_REQUIRE_HERMES,
tests/support/requires.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


def session_db(path: Path, sessions: dict[str, str | None] | None = None) -> Any:
    hermes_state = pytest.importorskip("hermes_state", reason="hermes-agent is not installed (its SessionDB)")
    db = hermes_state.SessionDB(db_path=Path(path))
    for sid, parent in (sessions or {}).items():
        add_session(db, sid, parent)
    return db


def add_session(db: Any, session_id: str, parent: str | None = None) -> None:
    """A session row as the host writes it (a /branch names its parent)."""
    db.create_session(session_id=session_id, source="cli", model="m", parent_session_id=parent)
