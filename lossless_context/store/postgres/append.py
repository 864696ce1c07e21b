"""How the PostgreSQL store writes a batch of new messages: one INSERT per chunk of rows.

Each chunk is one statement with the columns as binary arrays (``unnest``): one plan and one
firing of the statement trigger that lists the rows for the indexer, where one INSERT per row
cost a plan and a trigger firing each. Chunks keep each array value far below the server's
1 GB limit on one value (a first import may hand over a whole history in one call).

The rows are sorted by seq so that ids follow seq; the sort holds whole rows, and a batch of
2,000 messages spilled to disk under the default ``work_mem`` (4 MB): each chunk raises it for
its own transaction (``set_config(..., true)``), sized to the chunk. In the store's pipelined
append this costs no round trip.
"""

from __future__ import annotations

from typing import Any, Sequence

from ...messages import safe_json
from ...records import NewMessage
from .text import pg_text as _t

APPEND_CHUNK_ROWS = 5_000
APPEND_CHUNK_CHARS = 64 * 1024 * 1024
SORT_MEM_MIN_KB = 4 * 1024  # PostgreSQL's default work_mem
SORT_MEM_MAX_KB = 128 * 1024  # past this a (first-import) chunk sorts on disk, as before

INSERT_SQL = (
    "INSERT INTO messages(session_id, seq, uid, ident, role, raw, text, tokens, created_at,"
    " supersedes, large, exploration)"
    " SELECT %s, u.seq, u.uid, u.ident, u.role, u.raw, u.text, u.tokens, u.created_at,"
    " u.supersedes, u.large, u.exploration"
    " FROM unnest(%b::bigint[], %b::text[], %b::text[], %b::text[], %b::text[], %b::text[],"
    " %b::bigint[], %b::float8[], %b::bigint[], %b::boolean[], %b::text[])"
    " AS u(seq, uid, ident, role, raw, text, tokens, created_at, supersedes, large, exploration)"
    " ORDER BY u.seq RETURNING seq, id"
)


def chunks(sizes: Sequence[int]) -> list[tuple[int, int]]:
    """[lo, hi) ranges over rows of these sizes: at most APPEND_CHUNK_ROWS rows and, past its
    first row, APPEND_CHUNK_CHARS characters each."""
    max_rows, max_chars = APPEND_CHUNK_ROWS, APPEND_CHUNK_CHARS
    out: list[tuple[int, int]] = []
    lo = total = 0
    for i, n in enumerate(sizes):
        if i > lo and (i - lo >= max_rows or total + n > max_chars):
            out.append((lo, i))
            lo, total = i, 0
        total += n
    if lo < len(sizes):
        out.append((lo, len(sizes)))
    return out


def sort_mem_kb(sizes: Sequence[int]) -> int:
    """work_mem (kB) for sorting a chunk of rows of these sizes in memory: twice the text
    (bytes may exceed characters; the sort keeps its own copy) plus a per-row overhead."""
    need = (2 * sum(sizes) + 256 * len(sizes)) // 1024 + 1
    return max(SORT_MEM_MIN_KB, min(SORT_MEM_MAX_KB, need))


def insert_messages(c: Any, session_id: str, first_seq: int, rows: Sequence[NewMessage]) -> dict[int, int]:
    """Insert ``rows`` as seq ``first_seq``, ``first_seq + 1``, ... of ``session_id`` on
    connection ``c`` (inside the caller's transaction); seq → new id. Rows go in seq order, so
    ids follow seq."""
    raws = [_t(safe_json(r.raw)) for r in rows]
    texts = [_t(r.text) for r in rows]
    by_seq: dict[int, int] = {}
    sizes = [len(a) + len(b) for a, b in zip(raws, texts)]
    for lo, hi in chunks(sizes):
        part = rows[lo:hi]
        c.execute("SELECT set_config('work_mem', %s, true)", (f"{sort_mem_kb(sizes[lo:hi])}kB",))
        by_seq.update(c.execute(INSERT_SQL, (
            session_id, list(range(first_seq + lo, first_seq + hi)), [_t(r.uid) for r in part],
            [_t(r.ident) for r in part], [_t(r.role) for r in part], raws[lo:hi], texts[lo:hi],
            [r.tokens for r in part], [r.created_at for r in part], [r.supersedes for r in part],
            [bool(r.large) for r in part], [_t(r.exploration) for r in part])).fetchall())
    return by_seq
