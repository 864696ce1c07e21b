"""What the user forgot, remembered without its text: the marks that keep a forgotten message
from being stored again.

`lcm forget m123` (or `--turn`) removes a message for good (forget.py), but a live host still
holds it in its own history and hands it over again with its next list: ingest would store it
as new. So each forgotten message leaves a *mark*: its session, its *anchor* — the newest
message of that session kept before it, where the host's list has it — and a digest of its
content identity, never the text. The identity of a short message (a password, a PIN pasted
alone) could be guessed back from a plain hash of it, so the digest is keyed and stretched:
PBKDF2-HMAC-SHA256 under the store's own random salt (32 bytes, made on first use and kept in
the store), ITERATIONS rounds. A guess then works against one store at a time and costs that
many hashes.

Ingest (`ingest.Walk.place`) asks only about a message it would otherwise store as new, and
only when a mark sits at the stored message the list's previous message aligned with; the
digest is computed for nothing else. Such a message is aligned as forgotten (`FORGOTTEN`): no
row, no slot, no place in the active context, so search never finds it and nothing the engine
assembles shows it. The same words said again somewhere else (later in the session, in another
session) are a new message, stored as usual.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from typing import Any, Sequence

from .assemble import Slot

ITERATIONS = 100_000  # ~40 ms a digest; computed once per forgotten message and process (below)
FORGOTTEN = Slot("f", [], None, "forgotten", 0)  # Walk.place's answer for a forgotten message

_MEMO: "OrderedDict[tuple[bytes, str], str]" = OrderedDict()  # (salt, identity) -> digest, per process
_MEMO_LOCK = threading.Lock()
_MEMO_SIZE = 1024


def digest(salt: bytes, ident: str) -> str:
    """The mark's digest of a message identity (content_ident) under the store's salt. The host
    re-sends a forgotten message with every list until it compacts it away: each process
    stretches it once (an in-memory memo of the last _MEMO_SIZE)."""
    key = (salt, ident)
    with _MEMO_LOCK:
        hit = _MEMO.get(key)
        if hit is not None:
            _MEMO.move_to_end(key)
            return hit
    out = hashlib.pbkdf2_hmac("sha256", ident.encode("utf-8"), salt, ITERATIONS).hex()
    with _MEMO_LOCK:
        _MEMO[key] = out
        while len(_MEMO) > _MEMO_SIZE:
            _MEMO.popitem(last=False)
    return out


def is_forgotten(store: Any, marks: dict[int, set[str]], anchor: int, ident: str) -> bool:
    """Is a message with this identity, standing right after stored message `anchor` in the
    host's list, one the user forgot? (`marks`: Store.forget_marks of the list's lineage.)"""
    at = marks.get(anchor)
    return at is not None and digest(store.forget_salt(), ident) in at


def marks_for(store: Any, message_ids: Sequence[int]) -> tuple[list[tuple[str, int, str]], dict[int, int]]:
    """The marks forgetting these messages leaves — (session, anchor, digest) each — and the
    anchors that move: an earlier mark anchored at one of these messages moves to the message
    kept before it (message id -> new anchor)."""
    gone = {int(i) for i in message_ids}
    recs = store.get_messages(sorted(gone))
    salt = store.forget_salt() if recs else b""
    kept: dict[str, list[int]] = {}
    for rec in recs.values():
        if rec.session_id not in kept:
            kept[rec.session_id] = sorted(m for m in store.session_message_ids(rec.session_id) if m not in gone)

    def before(session_id: str, mid: int) -> int:
        ids = kept.get(session_id, [])
        lo, hi = 0, len(ids)
        while lo < hi:  # the newest kept id below mid
            mid_ = (lo + hi) // 2
            if ids[mid_] < mid:
                lo = mid_ + 1
            else:
                hi = mid_
        return ids[lo - 1] if lo else 0

    marks = [(rec.session_id, before(rec.session_id, rec.id), digest(salt, rec.ident))
             for rec in sorted(recs.values(), key=lambda r: r.id)]
    moved = {rec.id: before(rec.session_id, rec.id) for rec in recs.values()}
    return marks, moved
