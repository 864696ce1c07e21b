"""`lcm doctor`'s check for what host merges of our summary block did to a store.

The host merges our block into a same-role neighbour before a request (pipeline/unmerge.py).
Engines before 0.3 stored such a merged message verbatim — a copy of the block, found by
search — and dropped the head message it was merged into from the active context, under no
summary; the next merge stored another copy. So a store may hold *block copies* (a user or
assistant row holding our whole block) and messages out of the model's view that a plain
"turn the host did not keep" check would excuse.

`check` tells those apart: a row left out of a session that holds block copies was taken out
by a merge, not by the host. `--repair` puts such rows back into the session's context in their
place (duplicate summary entries the confusion left are dropped) and deletes each copy whose
every other part is still stored as its own message of that session — never a copy that
holds text found nowhere else, nor one a summary covers.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..messages import content_ident
from ..pipeline.unmerge import split
from ..records import ContextEntry
from ..store.base import Store

_OPEN = '<lcm-summary nodes="'
# Rows that may hold our whole block (the test of the whole block is `unmerge.split`/the marker).
_BLOCK_MARKS = (_OPEN, "</lcm-summary>")
_BLOCK_ROLES = ("user", "assistant")


def block_copies(store: Store) -> dict[str, list[int]]:
    """Session → ids of the rows holding a copy of our block (merged with text or alone)."""
    found = store.messages_containing(_BLOCK_MARKS, _BLOCK_ROLES)
    recs = store.get_messages([int(r[0]) for r in found])
    out: dict[str, list[int]] = {}
    for mid, sid in found:
        rec = recs.get(int(mid))
        content = rec.raw.get("content") if rec is not None and isinstance(rec.raw, dict) else None
        if isinstance(content, str) and content.lstrip().startswith(_OPEN) or split(rec.raw if rec else None):
            out.setdefault(sid, []).append(int(mid))
    return out


def check(store: Store, rep: Any, repair: bool, left: list[tuple]) -> list[tuple]:
    """Report block copies and the messages merges left out; repair them with `repair`.
    Returns the left-out rows that have nothing to do with a merge (the caller reports those)."""
    name = "no summary block stored as a message"
    copies = block_copies(store)
    if not copies:
        rep.add(name, True)
        return left
    copy_ids = {m for ids in copies.values() for m in ids}
    merged_out = [(m, s) for m, s in left if s in copies and m not in copy_ids]
    rest = [(m, s) for m, s in left if s not in copies]
    spare = sorted(m for s, ids in copies.items() for m in ids if _held_elsewhere(store, s, m))
    kept = sorted(copy_ids - set(spare))
    note = (f"; {len(kept)} row(s) holding the block also hold text stored nowhere else or lie under a "
            f"summary, and stay: {', '.join(f'm{m}' for m in kept[:10])}") if kept else ""
    if not spare and not merged_out:
        rep.add(name, True, note.lstrip("; "), info=True)
        return rest
    detail = (f"{len(spare)} cop{'y' if len(spare) == 1 else 'ies'} of the summary block stored as "
              f"messages, e.g. m{spare[0]} (a host merged the block with a neighbour and an earlier engine "
              "stored the merged text; search lists them)" if spare else "")
    if merged_out:
        detail += ("; " if detail else "") + (
            f"{len(merged_out)} message(s) a merge took out of the model's view, under no summary, "
            f"e.g. m{merged_out[0][0]} — not a turn the host did not keep")
    if not repair:
        rep.add(name, False, detail + note + "; `lcm doctor --repair` puts those messages back and deletes the copies")
        return rest
    back = 0
    for sid in sorted({s for _m, s in merged_out} | set(copies)):
        back += _restore_context(store, sid, sorted(m for m, s in merged_out if s == sid), set(copies.get(sid, ())))
    if spare:
        store.forget_records([], spare, [], {})
    chk = rep.add(name, False, detail + note + f"; repaired: {back} message(s) back in their context, "
                  f"{len(spare)} cop{'y' if len(spare) == 1 else 'ies'} deleted")
    chk.repaired = True
    return rest


def _restore_context(store: Store, sid: str, mids: Sequence[int], copies: set[int]) -> int:
    """The session's context with `mids` back in place (before the first entry that starts
    later) and without the copies or a summary listed twice; how many were put back."""
    _v, ctx = store.get_context(sid)
    entries: list[ContextEntry] = []
    seen_s: set[int] = set()
    for e in ctx:
        if e.kind == "s" and e.ref in seen_s:
            continue  # (the old alignment listed a merged block's summaries again)
        if e.kind == "m" and e.ref in copies:
            continue
        seen_s.update([e.ref] if e.kind == "s" else [])
        entries.append(e)
    present = {e.ref for e in entries if e.kind == "m"}
    added = 0
    for mid in mids:
        if mid in present:
            continue
        at = next((i for i, e in enumerate(entries) if _first_message(store, e) > mid), len(entries))
        entries.insert(at, ContextEntry("m", mid))
        added += 1
    if added or len(entries) != len(ctx):
        store.set_context(sid, entries)
    return added


def _first_message(store: Store, e: ContextEntry) -> int:
    """The oldest message an entry stands for (a summary's first leaf's first message)."""
    if e.kind == "m":
        return e.ref
    node = e.ref
    for _ in range(64):
        kids, mids = store.summary_children(node)
        if mids:
            return min(mids)
        if not kids:
            break
        node = kids[0]
    return 0


def _held_elsewhere(store: Store, sid: str, mid: int) -> bool:
    """Is every part of copy `mid` besides the block stored as its own message of `sid`,
    and is the copy itself under no summary (deleting it loses nothing)?"""
    if store.message_summaries(mid):
        return False
    rec = store.get_messages([mid]).get(mid)
    if rec is None:
        return False
    pieces = split(rec.raw)
    texts = [p for p in (pieces[0], pieces[2]) if p.strip()] if pieces else []
    if not texts:
        return True  # the block alone
    own: list[Any] | None = None
    for t in texts:
        hit = store.find_ident(sid, content_ident({"role": rec.role, "content": t}), 0)
        if hit is not None and hit[0] != mid:
            continue
        if own is None:  # (an assistant text the merge stripped: compared as text)
            own = [r for r in store.session_messages(sid, -1, 100_000) if r.id != mid and r.role == rec.role]
        if not any(r.text.strip() == t.strip() for r in own):
            return False
    return True
