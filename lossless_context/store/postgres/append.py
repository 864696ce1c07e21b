"""How the PostgreSQL store writes a batch of new messages: one INSERT per chunk of rows.

Each chunk is one statement with the columns as binary arrays (``unnest``): one plan and one
firing of the statement trigger that lists the rows for the indexer, where one INSERT per row
cost a plan and a trigger firing each. Chunks keep each array value far below the server's
1 GB limit on one value (a first import may hand over a whole history in one call).

The rows are sorted by seq so that ids follow seq; the sort holds whole rows, and a batch of
2,000 messages spilled to disk under the default ``work_mem`` (4 MB): each chunk raises it for
its own transaction (``set_config(..., true)``), sized to the chunk. In the store's pipelined
append this costs no round trip.

Rows handed over lazily are sent as they are built, STREAM_CHUNK_ROWS at a time, and nothing is
read back until all are sent: the server inserts a chunk while the client builds and encodes
the next (SQLite's append overlaps the same way with its writer thread).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, Sequence

from ...messages import safe_json
from ...records import NewMessage
from .text import pg_text as _t

APPEND_CHUNK_ROWS = 5_000
APPEND_CHUNK_CHARS = 64 * 1024 * 1024
SORT_MEM_MIN_KB = 4 * 1024  # PostgreSQL's default work_mem
SORT_MEM_MAX_KB = 128 * 1024  # past this a (first-import) chunk sorts on disk, as before

# The seqs follow the session's last one as the statement finds it (the caller holds the
# session's lock; an earlier chunk of the same append is already there), so a chunk can be sent
# before the client has read anything back.
INSERT_SQL = (
    "INSERT INTO messages(session_id, seq, uid, ident, role, raw, text, tokens, created_at,"
    " supersedes, large, exploration)"
    " SELECT %s, b.base + u.k, u.uid, u.ident, u.role, u.raw, u.text, u.tokens, u.created_at,"
    " u.supersedes, u.large, u.exploration"
    " FROM (SELECT COALESCE((SELECT m.seq FROM messages m WHERE m.session_id = %s"
    " ORDER BY m.seq DESC LIMIT 1), -1) + 1 AS base) AS b,"
    " unnest(%b::bigint[], %b::text[], %b::text[], %b::text[], %b::text[], %b::text[],"
    " %b::bigint[], %b::float8[], %b::bigint[], %b::boolean[], %b::text[])"
    " AS u(k, uid, ident, role, raw, text, tokens, created_at, supersedes, large, exploration)"
    " ORDER BY u.k RETURNING seq, id"
)
# Rows per statement while the caller's rows are still being built (a lazy iterable): the
# server inserts one chunk while the client builds and encodes the next, as SQLite's writer
# thread does. Each statement costs a plan and a trigger firing, so chunks stay a few hundred.
STREAM_CHUNK_ROWS = 500


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


class Replay:
    """The rows of an append as they are built: the first pass over them builds (a lazy
    iterable: the store sends each chunk while the next is built), a retried transaction
    goes over the same rows again."""

    def __init__(self, rows: Iterable[NewMessage]) -> None:
        self._it: Iterator[NewMessage] | None = iter(rows)
        self.rows: list[NewMessage] = []

    def empty(self) -> bool:
        if not self.rows and self._it is not None:
            first = next(self._it, None)
            if first is None:
                self._it = None
            else:
                self.rows.append(first)
        return not self.rows

    def __iter__(self) -> Iterator[NewMessage]:
        k = 0
        while True:
            if k < len(self.rows):
                yield self.rows[k]
                k += 1
                continue
            if self._it is None:
                return
            nxt = next(self._it, None)
            if nxt is None:
                self._it = None
                return
            self.rows.append(nxt)


def send_messages(c: Any, session_id: str, rows: Iterable[NewMessage]) -> Callable[[], dict[int, int]]:
    """Send the inserts of ``rows`` as the next seqs of ``session_id`` on connection ``c``
    (inside the caller's transaction, which holds the session's lock), a chunk as soon as it is
    built, without reading an answer (in pipeline mode: no wait); returns the reader of the
    answers, seq → new id. Rows go in seq order, so ids follow seq."""
    answers: list[Any] = []
    part: list[tuple[NewMessage, str, str]] = []
    total = 0
    max_rows = min(APPEND_CHUNK_ROWS, STREAM_CHUNK_ROWS)

    def send() -> None:
        sizes = [len(a) + len(b) for _, a, b in part]
        c.execute("SELECT set_config('work_mem', %s, true)", (f"{sort_mem_kb(sizes)}kB",))
        rs = [r for r, _, _ in part]
        answers.append(c.execute(INSERT_SQL, (
            session_id, session_id, list(range(len(rs))), [_t(r.uid) for r in rs],
            [_t(r.ident) for r in rs], [_t(r.role) for r in rs], [a for _, a, _ in part],
            [b for _, _, b in part], [r.tokens for r in rs], [r.created_at for r in rs],
            [r.supersedes for r in rs], [bool(r.large) for r in rs], [_t(r.exploration) for r in rs])))

    for r in rows:  # (chunks as chunks() cuts them, and at most STREAM_CHUNK_ROWS rows)
        raw, text = _t(safe_json(r.raw)), _t(r.text)
        n = len(raw) + len(text)
        if part and (len(part) >= max_rows or total + n > APPEND_CHUNK_CHARS):
            send()
            part, total = [], 0
        part.append((r, raw, text))
        total += n
    if part:
        send()

    def read() -> dict[int, int]:
        by_seq: dict[int, int] = {}
        for cur in answers:
            by_seq.update(cur.fetchall())
        return by_seq

    return read
