"""Message and summary rows as both stores read them: the columns, in order, and the records
made of them; and the statement that outlines a summary's children."""

from __future__ import annotations

import json

from ..records import MessageRecord, SummaryRecord

MSG_COLS = "id, session_id, seq, uid, ident, role, raw, text, tokens, created_at, large, exploration"
SUM_COLS = ("id, session_id, kind, depth, text, tokens, source_tokens, level, summarizer, "
            "t_start, t_end, n_messages, state, pass_id, created_at")
# A summary's children in order (published child summaries first, then messages), each with
# its size: (0 summary | 1 message, ord, id, tokens). Both parameters are the summary's id;
# the placeholder is the store's ("?" or "%s").
OUTLINE = ("SELECT 0, sp.ord, sp.child_id, s.tokens FROM summary_parents sp JOIN summaries s ON s.id = sp.child_id"
           " WHERE sp.parent_id = {p} AND s.state = 'published'"
           " UNION ALL SELECT 1, sm.ord, sm.message_id, m.tokens FROM summary_messages sm"
           " JOIN messages m ON m.id = sm.message_id WHERE sm.summary_id = {p} ORDER BY 1, 2")


def summary_record(row: tuple) -> SummaryRecord:
    """A :class:`SummaryRecord` from a row of ``SELECT {SUM_COLS}``."""
    return SummaryRecord(*row)


def outline_items(rows: list[tuple]) -> list[tuple[str, int, int]]:
    """:data:`OUTLINE`'s rows as (``"s"`` or ``"m"``, id, tokens)."""
    return [("s" if r[0] == 0 else "m", r[2], r[3]) for r in rows]


def message_record(row: tuple) -> MessageRecord:
    """A :class:`MessageRecord` from a row of ``SELECT {MSG_COLS}``."""
    try:
        raw = json.loads(row[6])
    except ValueError:
        raw = row[6]
    return MessageRecord(
        id=row[0], session_id=row[1], seq=row[2], uid=row[3], ident=row[4], role=row[5],
        raw=raw, text=row[7], tokens=row[8], created_at=row[9], large=bool(row[10]),
        exploration=row[11],
    )
