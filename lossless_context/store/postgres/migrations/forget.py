"""PostgreSQL migration 034: what the user forgot (``pipeline/forgotten.py``; listed in order in
``migrations/__init__.py``; applied SQL never changes)."""

from __future__ import annotations

ENTRIES: list[tuple[str, str]] = [
    (
        # What the user forgot, as SQLite's 020 (pipeline/forgotten.py): its session, the message
        # kept before it and a salted, stretched digest of its identity, never its text.
        "034_forget_marks",
        """
        CREATE TABLE forget_marks (
            session_id TEXT NOT NULL,
            anchor BIGINT NOT NULL,
            digest TEXT NOT NULL,
            forgotten_at DOUBLE PRECISION NOT NULL,
            PRIMARY KEY (session_id, anchor, digest)
        );
        CREATE INDEX forget_marks_anchor ON forget_marks(anchor);
        CREATE TABLE forget_salt (id INTEGER PRIMARY KEY CHECK (id = 1), salt BYTEA NOT NULL);
        """,
    ),
]
