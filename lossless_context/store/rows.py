"""Message and summary rows as both stores read them: the columns, in order, and the records
made of them."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

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


_PENDING: Any = object()


class StoredMessage(MessageRecord):
    """A :class:`MessageRecord` read from a store whose ``raw`` column (the host's message as
    JSON) is decoded on first read of :attr:`raw`: a pass reads every context row (hundreds)
    but decodes only the few it stubs, summarises or represents. Equal to, and used as, the
    eager record; the decoded value is kept, so reads after the first see the same object."""

    @property
    def raw(self) -> Any:
        d = self.__dict__
        v = d["_raw"]
        if v is _PENDING:
            try:
                v = json.loads(d["_raw_json"])
            except ValueError:
                v = d["_raw_json"]
            d["_raw"] = v
        return v

    @raw.setter
    def raw(self, value: Any) -> None:
        self.__dict__["_raw"] = value
        self.__dict__["_raw_json"] = None  # (no longer the text `raw` comes from: raw_json says None)

    def __eq__(self, other: object) -> bool:  # (the dataclass's compares classes: an eager record is equal too)
        if not isinstance(other, MessageRecord):
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in _MSG_FIELDS)

    def __reduce__(self) -> tuple[Any, tuple]:
        # copied or pickled as the eager record (the pending marker is this process's object)
        return MessageRecord, tuple(getattr(self, f) for f in _MSG_FIELDS)

    # (as the dataclass: mutable, so unhashable)
    __hash__ = None  # type: ignore[assignment]  # the dataclass sets it so; typeshed types it as a method


_MSG_FIELDS = tuple(f.name for f in dataclasses.fields(MessageRecord))


def raw_json(rec: MessageRecord) -> str | None:
    """The stored JSON text `rec.raw` is decoded from (a record read from a store, whose raw
    was not replaced since); None for any other record. A caller deriving facts from a
    message keys them by it: the same text, the same message."""
    if type(rec) is StoredMessage:
        v = rec.__dict__.get("_raw_json")
        return v if isinstance(v, str) else None
    return None

def message_record(row: tuple) -> MessageRecord:
    """A :class:`MessageRecord` from a row of ``SELECT {MSG_COLS}`` (its ``raw`` decoded
    when first read)."""
    rec = StoredMessage.__new__(StoredMessage)
    d = rec.__dict__
    d["id"], d["session_id"], d["seq"], d["uid"], d["ident"], d["role"] = row[:6]
    d["_raw"], d["_raw_json"] = _PENDING, row[6]
    d["text"], d["tokens"], d["created_at"] = row[7], row[8], row[9]
    d["large"], d["exploration"] = bool(row[10]), row[11]
    return rec
