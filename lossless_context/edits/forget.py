"""Forgetting a session, and hiding messages the host rolled back.

`forget_session` removes a session — and the host's background forks hanging from it —
for good: its messages, its summaries, every summary anywhere that was built over them
(their text carries the forgotten words), their index rows, edges, staged passes and
prepared summaries. Any other session whose active context referred to what goes (a
branch that shared the parent's history, a summary over both) is repaired: a deleted
summary in its context is replaced by the surviving parts under it, in order, so that
session keeps all of its own history. Children of the session hang from its parent.

`plan_forget_messages` / `forget_messages` remove single messages (or whole turns) for good:
the rows, their index entries, vectors and aliases; every summary built over them is rebuilt
without them (deterministically, keeping its id, so the host's summary block and citations
stay valid; its earlier texts go), a summary left with nothing under it is deleted and the
contexts that held it repaired; then the store is scrubbed (`Store.scrub`). Each one leaves a
mark without its text (forgotten.py), so a live host that hands it over again does not get it
stored again.

`retract_rolled_back` is the undo/retry rule: messages that were at the end of the
session's active context and are no longer in the host's list, while everything before
them still is, were rolled back by the host. They are kept but hidden from search
(``Store.retract_messages``) and restored if the host sends them again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from ..pipeline.assemble import Slot
from ..pipeline.compaction import source_text
from ..pipeline.forgotten import marks_for
from ..sessions.forks import BACKGROUND
from ..records import ContextEntry, Source
from ..store.base import Store
from ..summarizers.summarize import SummaryRequest, deterministic_summary
from ..tokens import estimate_text_tokens


@dataclass
class ForgetReport:
    sessions: list[str]
    messages: int = 0
    summaries: int = 0
    repaired: list[str] = field(default_factory=list)  # other sessions whose context was repaired


@dataclass
class ForgetPlan:
    """What forgetting a set of sessions removes, computed before anything is removed."""
    targets: list[str]  # the sessions (and their background forks)
    message_ids: list[int]
    summary_ids: list[int]  # theirs, and every summary anywhere built over them
    contexts: dict[str, list[tuple[str, int]]]  # other sessions' repaired active contexts


def plan_forget(store: Store, session_ids: Sequence[str], every_stage: bool = True) -> ForgetPlan:
    """What removing these sessions (with the host's background forks hanging from them)
    takes away, and how other sessions' contexts that referred to it are repaired. Pending
    passes of other sessions are discarded (a stage may name what goes): every one, or with
    ``every_stage=False`` (retention, which runs beside live sessions) those of the sessions
    whose context is repaired."""
    sessions_all = store.list_sessions()
    targets = list(dict.fromkeys(session_ids))
    chosen = set(targets)
    targets += [s["id"] for s in sessions_all
                if s.get("parent_id") in chosen and s.get("boundary_reason") == BACKGROUND and s["id"] not in chosen]
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
        elif not every_stage:
            continue
        for staged in store.staged_passes(sid):
            store.discard_pass(staged.pass_id)  # a pending pass may name what goes
    return ForgetPlan(targets, sorted(mids), sorted(sids), contexts)


def forget_session(store: Store, session_id: str) -> ForgetReport:
    """Remove `session_id` (and its background forks) from the store; see the module doc."""
    if store.get_session(session_id) is None:
        raise LookupError(f"unknown session {session_id!r}")
    plan = plan_forget(store, [session_id])
    counts = store.forget_records(plan.targets, plan.message_ids, plan.summary_ids, plan.contexts)
    store.scrub()  # nothing of the forgotten text left in index segments, free pages or the WAL
    return ForgetReport(plan.targets, counts.get("messages", 0), counts.get("summaries", 0), sorted(plan.contexts))


@dataclass
class MessagesPlan:
    """What `forget_messages` will do (``lcm forget m123 --dry-run`` shows it)."""

    messages: list[int]
    sessions: list[str]  # the sessions of those messages
    rebuilt: list[int] = field(default_factory=list)  # summaries rebuilt without them (ids kept)
    dropped: list[int] = field(default_factory=list)  # summaries with nothing left under them
    contexts: dict[str, list[tuple[str, int]]] = field(default_factory=dict)  # repaired active contexts
    texts: dict[int, tuple[str, int, int]] = field(default_factory=dict)  # rebuilt: (text, tokens, n_messages)
    previews: dict[int, str] = field(default_factory=dict)  # message id -> role and first characters
    staged_in: list[str] = field(default_factory=list)  # sessions with a staged pass over them

    def as_dict(self) -> dict[str, Any]:
        return {"messages": [f"m{m}" for m in self.messages], "sessions": self.sessions,
                "summaries_rebuilt": [f"s{s}" for s in self.rebuilt],
                "summaries_deleted": [f"s{s}" for s in self.dropped],
                "contexts_repaired": sorted(self.contexts),
                "previews": {f"m{k}": v for k, v in self.previews.items()}}


def turn_of(store: Store, message_id: int) -> list[int]:
    """The ids of the turn holding `message_id`: from the user message that opened it (the
    last one at or before it) up to the next user message of its session."""
    rec = store.get_messages([message_id]).get(message_id)
    if rec is None:
        raise LookupError(f"unknown message m{message_id}")
    start, cursor = None, rec.seq
    while start is None:  # back, a window at a time, to the user message that opened the turn
        after = max(-1, cursor - 257)
        rows = [r for r in store.session_messages(rec.session_id, after_seq=after, limit=cursor - after)
                if r.seq <= rec.seq]
        users = [r.seq for r in rows if r.role == "user"]
        if users:
            start = users[-1]
        elif after < 0 or not rows:
            start = rows[0].seq if rows else rec.seq
        cursor = after
    out: list[int] = []
    after = start - 1
    while True:
        rows = store.session_messages(rec.session_id, after_seq=after, limit=256)
        for r in rows:
            if r.role == "user" and r.seq != start:
                return out
            out.append(r.id)
        if len(rows) < 256:
            return out
        after = rows[-1].seq


def plan_forget_messages(store: Store, message_ids: Sequence[int], turn: bool = False) -> MessagesPlan:
    """What forgetting these messages (their whole turns with `turn`) takes; nothing is written."""
    ids: list[int] = []
    for mid in message_ids:
        ids.extend(turn_of(store, mid) if turn else [mid])
    ids = sorted(set(ids))
    recs = store.get_messages(ids)
    missing = [f"m{i}" for i in ids if i not in recs]
    if missing:
        raise LookupError(f"unknown message {', '.join(missing)}")
    plan = MessagesPlan(ids, sorted({r.session_id for r in recs.values()}))
    plan.previews = {i: f"{recs[i].role}: {' '.join((recs[i].text or '').split())[:60]}" for i in ids}
    gone = set(ids)
    # every summary over them, up the DAG, bottom up (children before parents)
    over = store.summaries_over(ids, [])
    every, frontier = set(over), set(over)
    while frontier:
        frontier = store.summaries_over([], sorted(frontier)) - every
        every |= frontier
    staged = store.get_summaries(sorted(every), include_staged=True)
    plan.staged_in = sorted({r.session_id for r in staged.values() if r.state != "published"})
    nodes = {k: r for k, r in staged.items() if r.state == "published"}  # (a staged pass is discarded)
    removed: dict[int, int] = {}
    dropped: set[int] = set()
    for sid in sorted(nodes, key=lambda k: (nodes[k].depth, k)):
        kids, msgs = store.summary_children(sid)
        left_m = [m for m in msgs if m not in gone]
        left_k = [k for k in kids if k not in dropped]
        removed[sid] = (len(msgs) - len(left_m)) + sum(removed.get(k, 0) for k in kids)
        if not left_m and not left_k:
            dropped.add(sid)
            continue
        sources: list[Source] = []
        if left_m:
            mrecs = store.get_messages(left_m)
            for m in left_m:
                r = mrecs.get(m)
                text = source_text(Slot("m", [m], None, r.role, r.tokens), mrecs) if r is not None else None
                if text is not None and r is not None:
                    sources.append(Source(f"m{m}", r.role, text, None))
        kid_recs = store.get_summaries(left_k)
        for k in left_k:
            text = plan.texts[k][0] if k in plan.texts else (kid_recs[k].text if k in kid_recs else None)
            if text is not None:
                sources.append(Source(f"s{k}", "summary", text, None))
        node = nodes[sid]
        target = max(32, min(node.tokens, sum(estimate_text_tokens(x.text) for x in sources) // 2 or 32))
        text = deterministic_summary(SummaryRequest(sources, target, node.kind)) if sources else ""
        plan.texts[sid] = (text, estimate_text_tokens(text), max(0, node.n_messages - removed[sid]))
        plan.rebuilt.append(sid)
    plan.dropped = sorted(dropped)
    for s in store.list_sessions():
        _v, ctx = store.get_context(s["id"])
        if any((e.kind == "m" and e.ref in gone) or (e.kind == "s" and e.ref in dropped) for e in ctx):
            plan.contexts[s["id"]] = _repaired(store, ctx, gone, dropped)
    return plan


def forget_messages(store: Store, plan: MessagesPlan) -> dict[str, Any]:
    """Carry out `plan` (from plan_forget_messages, on the same store state)."""
    store.wait_indexed()
    # A live host still holds them and hands them over again: marks keep them from being
    # stored again (forgotten.py), written before the rows go.
    marks, moved = marks_for(store, plan.messages)
    store.add_forget_marks(marks, moved)
    touched = set(plan.sessions) | set(plan.contexts)
    for sess in touched | set(plan.staged_in):
        for staged in store.staged_passes(sess):
            store.discard_pass(staged.pass_id)  # a pending pass may hold their text
    rows = [(sid, *plan.texts[sid]) for sid in plan.rebuilt]
    store.rewrite_summaries(rows, sorted(touched))
    counts = store.forget_records([], plan.messages, plan.dropped, plan.contexts)
    return {**counts, "summaries_rebuilt": len(plan.rebuilt), "marks": len(marks), "scrub": store.scrub()}


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
    return list(dict.fromkeys(out))  # each once, in order


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

