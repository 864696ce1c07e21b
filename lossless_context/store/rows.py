"""Message rows as both stores read them: the columns, in order, and the record made of them."""

from __future__ import annotations

import json

from ..records import MessageRecord

MSG_COLS = "id, session_id, seq, uid, ident, role, raw, text, tokens, created_at, large, exploration"


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
