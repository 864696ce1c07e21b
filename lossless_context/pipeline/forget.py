"""Forgetting a session, and hiding messages the host rolled back.

`forget_session` removes a session — and the host's background forks hanging from it —
for good: its messages, its summaries, every summary anywhere that was built over them
(their text carries the forgotten words), their index rows, edges, staged passes and
prepared summaries. Any other session whose active context referred to what goes (a
branch that shared the parent's history, a summary over both) is repaired: a deleted
summary in its context is replaced by the surviving parts under it, in order, so that
session keeps all of its own history. Children of the session hang from its parent.

`retract_rolled_back` is the undo/retry rule: messages that were at the end of the
session's active context and are no longer in the host's list, while everything before
them still is, were rolled back by the host. They are kept but hidden from search
(``Store.retract_messages``) and restored if the host sends them again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from .forks import BACKGROUND
from ..records import ContextEntry
from ..store.base import Store


@dataclass
class ForgetReport:
    sessions: list[str]
    messages: int = 0
    summaries: int = 0
    repaired: list[str] = field(default_factory=list)  # other sessions whose context was repaired


def forget_session(store: Store, session_id: str) -> ForgetReport:
    """Remove `session_id` (and its background forks) from the store; see the module doc."""
    if store.get_session(session_id) is None:
        raise LookupError(f"unknown session {session_id!r}")
    sessions_all = store.list_sessions()
    targets = [session_id] + [s["id"] for s in sessions_all
                              if s.get("parent_id") == session_id and s.get("boundary_reason") == BACKGROUND]
    store.wait_indexed()
    mids: set[int] = set()
    sids: set[int] = set()
    for t in targets:
        mids.update(store.session_message_ids(t))
        sids.update(store.session_summary_ids(t))
    # Every summary built over forgotten material, all the way up the DAG.
    frontier_m, frontier_s = list(mids), list(sids)
    while frontier_m or frontier_s:
        over = store.summaries_over(frontier_m, frontier_s) - sids
        sids.update(over)
        frontier_m, frontier_s = [], list(over)
    contexts: dict[str, list[tuple[str, int]]] = {}
    for s in sessions_all:
        sid = s["id"]
        if sid in targets:
            continue
        _version, ctx = store.get_context(sid)
        if any((e.kind == "m" and e.ref in mids) or (e.kind == "s" and e.ref in sids) for e in ctx):
            contexts[sid] = _repaired(store, ctx, mids, sids)
        for staged in store.staged_passes(sid):
            store.discard_pass(staged.pass_id)  # a pending pass may name what goes
    counts = store.forget_records(targets, sorted(mids), sorted(sids), contexts)
    return ForgetReport(targets, counts.get("messages", 0), counts.get("summaries", 0), sorted(contexts))


def _repaired(store: Store, ctx: Sequence[ContextEntry], mids: set[int], sids: set[int]) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []

    def expand(node: int, depth: int = 0) -> None:
        kids, msgs = store.summary_children(node)
        for k in kids:
            if k in sids:
                if depth < 64:
                    expand(k, depth + 1)
            else:
                out.append(("s", k))
        out.extend(("m", m) for m in msgs if m not in mids)

    for e in ctx:
        if e.kind == "m":
            if e.ref not in mids:
                out.append(("m", e.ref))
        elif e.ref in sids:
            expand(e.ref)
        else:
            out.append(("s", e.ref))
    seen: set[tuple[str, int]] = set()
    return [x for x in out if not (x in seen or seen.add(x))]  # type: ignore[func-returns-value]


def rolled_back(old: Sequence[ContextEntry], new: Sequence[ContextEntry]) -> list[int]:
    """Message ids at the end of the `old` active context that the `new` one lost while it
    kept everything before them (what an undo or a retry leaves)."""
    new_refs = {(e.kind, e.ref) for e in new}
    last_kept = -1
    for i, e in enumerate(old):
        if (e.kind, e.ref) in new_refs:
            last_kept = i
    if last_kept < 0:
        return []  # nothing in common: another list (a new caller), not a rollback of this one
    tail = old[last_kept + 1:]
    return [e.ref for e in tail if e.kind == "m" and ("m", e.ref) not in new_refs]


def retract_rolled_back(store: Store, old: Sequence[ContextEntry], new: Sequence[ContextEntry],
                        new_ids: Sequence[int] = ()) -> list[int]:
    """After an ingest (the host's full list): hide what the host rolled back, and restore
    retracted messages the new context holds again. O(1) in the usual case, where the new
    context extends the old one by new rows."""
    n = len(old)
    extends = len(new) >= n and (n == 0 or (new[n - 1].kind, new[n - 1].ref) == (old[-1].kind, old[-1].ref))
    gone = [] if extends else rolled_back(old, new)
    if gone:
        store.retract_messages(gone)
    fresh = set(new_ids)
    tail = new[n:] if extends else new
    again_candidates = [e.ref for e in tail if e.kind == "m" and e.ref not in fresh]
    if again_candidates:  # matched an older stored row (never in the usual case)
        again = store.retracted(again_candidates[-256:])
        if again:
            store.restore_messages(sorted(again))
    return gone

