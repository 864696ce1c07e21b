"""Text as PostgreSQL accepts it, for the PostgreSQL store and its search."""

from __future__ import annotations

from typing import Any

from ...messages import clean_text


def pg_text(s: Any) -> Any:
    """A str PostgreSQL accepts (no NUL, no lone surrogate), cleaned exactly as
    :func:`~lossless_context.messages.clean_text` does for the SQLite store."""
    if not isinstance(s, str) or not s:
        return s
    if "\x00" in s:
        return clean_text(s)
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return clean_text(s)
    return s
