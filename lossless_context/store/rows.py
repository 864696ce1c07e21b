"""Message and summary rows as both stores read them: the columns, in order, and the records
made of them."""

from __future__ import annotations

import json

from ..records import MessageRecord, SummaryRecord

MSG_COLS = "id, session_id, seq, uid, ident, role, raw, text, tokens, created_at, large, exploration"
SUM_COLS = ("id, session_id, kind, depth, text, tokens, source_tokens, level, summarizer, "
            "t_start, t_end, n_messages, state, pass_id, created_at")



def summary_record(row: tuple) -> SummaryRecord:
    """A :class:`SummaryRecord` from a row of ``SELECT {SUM_COLS}``."""
    return SummaryRecord(*row)


def outline_items(rows: list[tuple]) -> list[tuple[str, int, int]]:
    """Rows of a summary's outline - (0 for a child summary or 1 for a message, ord, id,
    tokens), in order - as :meth:`~.base.Store.summary_outline` returns them."""
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
