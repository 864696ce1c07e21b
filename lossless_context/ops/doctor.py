"""Store integrity checks (`lcm doctor`) and the safe repairs (`--repair`).

Checks: the store's schema migrations (applied, any pending: store/migrate.py), the database's
own integrity check, foreign keys, full-text indexes in sync with
their tables, every message reachable from an active context or the DAG, no cycles in the
DAG, no summary without sources, no leftover staged work, no copy of our summary block
stored as a message (merge_copies.py: what host merges did under earlier engines). Reported as information: messages
of a turn the host did not keep, and summary chains deeper than ⌈log_fanin(leaves)⌉ + 1
(made before balanced condensation). Repairs only what is safe: rebuild indexes, drop stale
staged passes, re-attach unreachable messages to their session's active context, rebalance
chains in place (dag_rebalance.py), delete the summaries and messages an earlier engine or
import made again (the originals stay); nothing is ever deleted that holds user data.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from ..store.base import Store
from . import merge_copies

STALE_STAGE_SECONDS = 3600

# Checks both backends run as they are (portable SQL: Store.query_rows).
# (a summary whose originals retention removed keeps a pruned_spans row instead: ops/retention.py)
SQL_NO_SOURCES = (
    "SELECT s.id FROM summaries s WHERE NOT EXISTS (SELECT 1 FROM summary_messages m WHERE m.summary_id=s.id)"
    " AND NOT EXISTS (SELECT 1 FROM summary_parents p WHERE p.parent_id=s.id)"
    " AND NOT EXISTS (SELECT 1 FROM pruned_spans x WHERE x.summary_id=s.id)")
SQL_CYCLES = """
    WITH RECURSIVE walk(start, node, depth) AS (
        SELECT parent_id, child_id, 1 FROM summary_parents
        UNION ALL
        SELECT w.start, p.child_id, w.depth + 1 FROM walk w JOIN summary_parents p ON p.parent_id = w.node
        WHERE w.depth < 200)
    SELECT DISTINCT start FROM walk WHERE start = node LIMIT 10"""
SQL_ORPHAN_STAGED = ("SELECT COUNT(*) FROM summaries WHERE state='staged'"
                     " AND pass_id NOT IN (SELECT pass_id FROM staged_passes)")
# A message is reachable when it is in an active context or under any summary (a staged one
# belongs to a pass still waiting for the host's commit).
SQL_UNREACHABLE = """
    SELECT m.id, m.session_id FROM messages m
    WHERE NOT EXISTS (SELECT 1 FROM context_items ci WHERE ci.message_id = m.id)
      AND NOT EXISTS (SELECT 1 FROM summary_messages sm WHERE sm.message_id = m.id)
      AND NOT EXISTS (SELECT 1 FROM message_retractions r WHERE r.message_id = m.id)
    ORDER BY m.id LIMIT 100000"""
# The newest message of each session the conversation still holds (context or a leaf): a
# message stored before it but held by neither was left out by the host (see _split).
SQL_LATEST_HELD = """
    SELECT session_id, MAX(mid) FROM (
        SELECT ci.session_id AS session_id, MAX(ci.message_id) AS mid FROM context_items ci
        WHERE ci.message_id IS NOT NULL GROUP BY ci.session_id
        UNION ALL
        SELECT m.session_id AS session_id, MAX(sm.message_id) AS mid FROM summary_messages sm
        JOIN messages m ON m.id = sm.message_id GROUP BY m.session_id) t
    GROUP BY session_id"""
SQL_CONTEXT_ROOTS = ("SELECT session_id, summary_id FROM context_items WHERE summary_id IS NOT NULL"
                     " ORDER BY session_id, pos")
# (A host's background fork — a memory review — summarises the parent's messages it copied for
# its own view: those leaves are the fork's, not a second summary of the conversation.)
_OWN_LEAF = ("s.state='published' AND NOT EXISTS (SELECT 1 FROM sessions b WHERE b.id = s.session_id"
             " AND b.boundary_reason = 'background')")
SQL_MULTI_LEAF = f"""
    SELECT sm.message_id FROM summary_messages sm JOIN summaries s ON s.id = sm.summary_id
    WHERE {_OWN_LEAF} GROUP BY sm.message_id HAVING COUNT(*) > 1 LIMIT 10"""
# Every published leaf over such a message.
SQL_MULTI_LEAF_SUMMARIES = f"""
    SELECT DISTINCT sm.summary_id FROM summary_messages sm JOIN summaries s ON s.id = sm.summary_id
    WHERE {_OWN_LEAF} AND sm.message_id IN (
        SELECT sm.message_id FROM summary_messages sm JOIN summaries s ON s.id = sm.summary_id
        WHERE {_OWN_LEAF} GROUP BY sm.message_id HAVING COUNT(*) > 1)
    ORDER BY sm.summary_id"""
SQL_STAGED_TOPS = "SELECT top_nodes FROM staged_passes"  # what pending passes will put in a context


@dataclass
class Check:
    name: str
    ok: bool
    detail: str = ""
    repaired: bool = False
    info: bool = False  # a finding to know about, not a failure (never makes the report unhealthy)


@dataclass
class DoctorReport:
    checks: list[Check] = field(default_factory=list)
    facts: list[str] = field(default_factory=list)  # what the store is (size, age, retention: lifecycle_info.py)

    @property
    def ok(self) -> bool:
        return all(c.ok or c.repaired for c in self.checks)

    def add(self, name: str, ok: bool, detail: str = "", info: bool = False) -> Check:
        c = Check(name, ok or info, detail, info=info)
        self.checks.append(c)
        return c

    def render_text(self) -> str:
        lines = []
        for c in self.checks:
            mark = "info" if c.info else "ok" if c.ok else ("repaired" if c.repaired else "FAIL")
            lines.append(f"[{mark:>8}] {c.name}" + (f" — {c.detail}" if c.detail else ""))
        lines.extend(f"{'':>10} {f}" for f in self.facts)
        lines.append("healthy" if self.ok else "problems found (run `lcm doctor --repair`)")
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "checks": [c.__dict__ for c in self.checks], "facts": self.facts}


def run_doctor(store: Store, repair: bool = False, fanin: int = 4, retention: Any = None) -> DoctorReport:
    """`fanin` is the configured `condense_fanin` (the depth bound depends on it); `retention`
    the configured policy (shown with the store's size and age: lifecycle_info.py)."""
    from .lifecycle_info import lifecycle_checks
    from .retention import finish_interrupted, interrupted

    # A prune stopped half-way left summaries without sources: finish it before checking.
    finished = finish_interrupted(store) if repair and interrupted(store) else 0
    rep = DoctorReport()
    _store_checks(store, rep, repair)
    _migrations_check(store, rep)
    _depth_check(store, rep, repair, fanin)
    lifecycle_checks(store, rep, finished, retention)
    return rep


def _migrations_check(store: Store, rep: DoctorReport) -> None:
    """One line: the store's schema migrations (store/migrate.py). A required one pending is a
    failure (a writing open applies it; a read-only one, `lcm mcp`, never does); an optional one
    the server could not apply, or names a newer lcm recorded, are information."""
    st = store.migration_state()
    detail = f"{len(st.applied)} applied"
    if st.pending:
        rep.add("schema migrations", False, f"{detail}; pending: {', '.join(st.pending)}"
                " (open the store once with a writing lcm, e.g. `lcm doctor`, to apply them)")
        return
    notes = []
    if st.pending_optional:
        notes.append(f"optional, not applied (the server lacks what they need; retried at each writing open):"
                     f" {', '.join(st.pending_optional)}")
    if st.unknown:
        notes.append(f"recorded by a newer lcm: {', '.join(st.unknown)}")
    rep.add("schema migrations", True, "; ".join([detail + ", none pending" if not notes else detail] + notes),
            info=bool(notes))


def _split(unreachable: list[tuple], latest: list[tuple]) -> tuple[list[tuple], list[tuple]]:
    """(left out by the host, others). A message stored before the newest message its session
    still holds, yet held by neither context nor DAG, belongs to a turn the host did not keep
    (killed before the host saved it, or a history the host rewound): still stored and
    searchable, but not part of the conversation the host continues — information, not damage.
    The others are the newest rows (an append whose context update did not happen): repaired."""
    newest = {sid: mid for sid, mid in latest if mid is not None}
    left: list[tuple] = []
    other: list[tuple] = []
    for mid, sid in unreachable:
        (left if mid < newest.get(sid, -1) else other).append((mid, sid))
    return left, other


def _merge_check(store: Store, rep: DoctorReport, repair: bool, left: list[tuple],
                 unreachable: list[tuple]) -> tuple[list[tuple], list[tuple]]:
    """Copies of our block and what host merges took out of view (merge_copies.py), told apart
    from a turn the host did not keep; returns (left out, unreachable) without them."""
    rest = set(merge_copies.check(store, rep, repair, left + unreachable))
    return [x for x in left if x in rest], [x for x in unreachable if x in rest]


def _left_out_check(rep: DoctorReport, left: list[tuple]) -> None:
    if left:
        sessions = sorted({sid for _m, sid in left})
        rep.add("messages the host's conversation left out", True,
                f"{len(left)} stored message(s) of {len(sessions)} session(s) are in no context or summary: a turn "
                "the host did not keep (killed before it was saved, or rewound); still stored and searchable, "
                f"e.g. m{left[0][0]} in {sessions[0]}", info=True)


def _depth_check(store: Store, rep: DoctorReport, repair: bool, fanin: int) -> None:
    """Depth of each active context's summaries against ⌈log_fanin(leaves)⌉ + 1; chains left by
    0.1.x are information (nothing is wrong with their data) and `--repair` rebalances them."""
    from ..edits.dag_rebalance import find_unbalanced, rebalance

    name = f"summary DAG depth within ⌈log_{fanin}(leaves)⌉ + 1"
    try:
        roots = store.query_rows(SQL_CONTEXT_ROOTS)
        deep = find_unbalanced(store, fanin, [(r[0], int(r[1])) for r in roots])
    except Exception as exc:  # a report, not a reason to stop the doctor
        rep.add(name, True, f"not measured: {type(exc).__name__}: {exc}", info=True)
        return
    if not deep:
        rep.add(name, True, f"{len(roots)} summar{'y' if len(roots) == 1 else 'ies'} in active contexts, all within"
                if roots else "")
        return
    worst = max(deep, key=lambda u: u.depth)
    detail = (f"{len(deep)} summar{'y' if len(deep) == 1 else 'ies'} in active contexts deeper than the bound (a chain "
              f"made before 0.2), worst s{worst.summary_id} of {worst.session_id}: depth {worst.depth} over "
              f"{worst.leaves} leaves, bound {worst.bound}")
    if not repair:
        rep.add(name, True, detail + "; `lcm doctor --repair` rebalances (keeps every id and message)", info=True)
        return
    made = sum(rebalance(store, u.summary_id, fanin) for u in deep)
    chk = rep.add(name, False, detail + f"; rebalanced with {made} new condensed nodes (ids kept)")
    chk.repaired = True


def _store_checks(store: Store, rep: DoctorReport, repair: bool) -> None:
    """The checks every backend runs alike, after the lines only the backend can tell
    (`Store.self_checks`: SQLite's integrity check and full-text indexes, PostgreSQL's index
    and what its server lacks), over the store's portable SQL reads and its repairs."""
    # Messages are full-text indexed after their commit: index any backlog (left by a crash or
    # a dead process, or still running) before the store compares the index with the rows.
    store.wait_indexed()
    for sc in store.self_checks(repair):
        chk = rep.add(sc.name, sc.ok, sc.detail, info=sc.info)
        chk.repaired = sc.repaired
    q = store.query_rows

    empty = q(SQL_NO_SOURCES)
    rep.add("every summary has sources", not empty,
            f"{len(empty)} without sources: " + ", ".join(f"s{r[0]}" for r in empty[:10]) if empty else "")
    cyc = q(SQL_CYCLES)
    rep.add("summary DAG has no cycles", not cyc, ", ".join(f"s{r[0]}" for r in cyc) if cyc else "")

    stale = q("SELECT pass_id, session_id FROM staged_passes WHERE created_at < ?", (time.time() - STALE_STAGE_SECONDS,))
    orphan = q(SQL_ORPHAN_STAGED)[0][0]
    chk = rep.add("no stale staged work", not stale and not orphan,
                  f"{len(stale)} stale staged passes, {orphan} orphan staged summaries" if stale or orphan else "")
    if (stale or orphan) and repair:
        for pid, _sid in stale:
            store.discard_pass(pid)
        store.delete_orphan_staged()
        chk.repaired = True

    # Reachability: every message is in an active context or under a published summary
    # (directly, or through a staged summary of a pending pass).
    left, unreachable = _split(q(SQL_UNREACHABLE), q(SQL_LATEST_HELD))
    left, unreachable = _merge_check(store, rep, repair, left, unreachable)
    _left_out_check(rep, left)
    chk = rep.add("every message reachable from a context or the DAG", not unreachable,
                  f"{len(unreachable)} unreachable (still stored; searchable)" if unreachable else "")
    if unreachable and repair:
        by_session: dict[str, list[int]] = {}
        for mid, sid in unreachable:
            by_session.setdefault(sid, []).append(mid)
        store.reattach_messages(by_session)
        chk.repaired = True
    _multi_leaf_check(store, rep, repair)
    _copies_check(store, rep, repair)


def _multi_leaf_check(store: Store, rep: DoctorReport, repair: bool) -> None:
    """Each message under at most one published leaf. An earlier engine summarised again the
    originals a host re-sent (pipeline/ingest_replay.py says when): ``--repair`` deletes the
    copies no context reaches (the summaries, never a message)."""
    name = "each message under at most one leaf"
    multi = store.query_rows(SQL_MULTI_LEAF)
    if not multi:
        rep.add(name, True)
        return
    detail = ", ".join(f"m{r[0]}" for r in multi) + " (summarised again after a host re-sent them)"
    if not repair:
        rep.add(name, False, detail + "; `lcm doctor --repair` deletes the copies no context reaches")
        return
    dropped = _duplicate_summaries(store)
    if dropped:
        store.forget_records([], [], sorted(dropped), {})
    left = store.query_rows(SQL_MULTI_LEAF)
    chk = rep.add(name, False, detail + f"; deleted {len(dropped)} copies no context reaches (every message is"
                  " still stored)" + (f"; still under two leaves: {', '.join(f'm{r[0]}' for r in left)}" if left else ""))
    chk.repaired = not left


SQL_TWICE = ("SELECT session_id, ident FROM messages GROUP BY session_id, ident HAVING COUNT(*) > 1"
             " ORDER BY session_id LIMIT 100000")
SQL_SESSION_ROWS = ("SELECT m.id, m.ident, m.tokens, EXISTS (SELECT 1 FROM summary_messages sm"
                    " WHERE sm.message_id = m.id) FROM messages m WHERE m.session_id = ? ORDER BY m.seq")
# A run of this many messages repeating an earlier run word for word, in order, is a copy, and
# so is a run of two with a message of COPY_TOKENS in it; a single repeat never is (a user may
# paste the same text again), nor a short "continue" / "ok" pair said again.
COPY_RUN = 3
COPY_TOKENS = 50


def _copies_check(store: Store, rep: DoctorReport, repair: bool) -> None:
    """Messages an earlier `lcm import hermes` stored again: it read 0.19.0's archived rows and
    the head and tail the host re-persists at each compaction as new turns. A copy repeats an
    earlier run of its session word for word, in order: three messages or more, or two with a
    long one; one under a summary is left alone. ``--repair`` deletes the copies (the originals
    stay) and points the contexts that held them at the originals."""
    name = "no message stored twice by an import"
    sessions = sorted({str(r[0]) for r in store.query_rows(SQL_TWICE)})
    copies: dict[int, int] = {}  # copy -> original
    by_session: dict[str, list[int]] = {}
    for sid in sessions:
        found = _copies(store.query_rows(SQL_SESSION_ROWS, (sid,)))
        if found:
            copies.update(found)
            by_session[sid] = sorted(found)
    if not copies:
        rep.add(name, True)
        return
    first = next(iter(by_session))
    detail = (f"{len(copies)} copies in {len(by_session)} session(s), e.g. m{by_session[first][0]} of {first} repeats"
              f" m{copies[by_session[first][0]]}")
    if not repair:
        rep.add(name, False, detail + "; `lcm doctor --repair` deletes the copies (the originals stay)")
        return
    contexts: dict[str, list[tuple[str, int]]] = {}
    for s in store.list_sessions():
        _v, ctx = store.get_context(s["id"])
        fixed = _deduped(store, [(e.kind, e.ref) for e in ctx], copies)
        if fixed != [(e.kind, e.ref) for e in ctx]:
            contexts[s["id"]] = fixed
    store.forget_records([], sorted(copies), [], contexts)
    chk = rep.add(name, False, detail + f"; deleted them, repaired {len(contexts)} context(s)")
    chk.repaired = True


def _copies(session_rows: list[tuple]) -> dict[int, int]:
    """Copies among a session's rows (id, ident, tokens, under a summary), in order."""
    first: dict[str, int] = {}
    pos_of: dict[int, int] = {}
    dup: dict[int, int] = {}  # row position -> position of the first with its identity
    for i, (mid, ident, _tokens, _under) in enumerate(session_rows):
        pos_of[mid] = i
        if ident in first:
            dup[i] = first[ident]
        else:
            first[ident] = i
    def long(i: int) -> bool:
        return (session_rows[i][2] or 0) >= COPY_TOKENS

    copy_run: dict[int, bool] = {}  # position -> its run of repeats in a row makes it a copy
    for i in sorted(dup):
        if i in copy_run:  # (inside a run met already)
            continue
        k = i
        while k + 1 in dup and dup[k + 1] == dup[k] + 1:
            k += 1
        run = range(i, k + 1)
        verdict = len(run) >= COPY_RUN or (len(run) > 1 and any(long(x) for x in run))
        for x in run:
            copy_run[x] = verdict
    out: dict[int, int] = {}
    for i, j in dup.items():
        if session_rows[i][3]:  # under a summary: left alone
            continue
        if copy_run.get(i):
            out[int(session_rows[i][0])] = int(session_rows[j][0])
    return out


def _deduped(store: Store, ctx: list[tuple[str, int]], copies: dict[int, int]) -> list[tuple[str, int]]:
    """A context without copies: each item once, a copy replaced by its original unless the
    context already holds that original (itself, or under one of its summaries)."""
    covered: set[int] = set()
    stack = [ref for k, ref in ctx if k == "s"]
    seen_s: set[int] = set()
    while stack:
        node = stack.pop()
        if node in seen_s:
            continue
        seen_s.add(node)
        kids, mids = store.summary_children(node)
        stack.extend(kids)
        covered.update(mids)
    out: list[tuple[str, int]] = []
    have: set[tuple[str, int]] = set()
    for k, ref in ctx:
        item = (k, copies.get(ref, ref)) if k == "m" else (k, ref)
        if item in have or (item[0] == "m" and item[1] in covered):
            continue
        have.add(item)
        out.append(item)
    return out


def _duplicate_summaries(store: Store) -> set[int]:
    """Summaries that only repeat others: a published leaf over a message another leaf covers,
    that no active context or pending pass reaches and whose messages the leaves they do reach
    all cover; and above those, summaries nothing reaches whose children are all such."""
    roots = {int(r[1]) for r in store.query_rows(SQL_CONTEXT_ROOTS)}
    for (tops,) in store.query_rows(SQL_STAGED_TOPS):
        roots.update(int(x) for x in json.loads(tops or "[]"))
    reached: set[int] = set()
    covered: set[int] = set()
    stack = list(roots)
    while stack:
        node = stack.pop()
        if node in reached:
            continue
        reached.add(node)
        kids, mids = store.summary_children(node)
        stack.extend(kids)
        covered.update(mids)
    drop: set[int] = set()
    for (leaf,) in store.query_rows(SQL_MULTI_LEAF_SUMMARIES):
        if leaf not in reached:
            kids, mids = store.summary_children(leaf)
            if mids and not kids and set(mids) <= covered:
                drop.add(int(leaf))
    frontier = set(drop)
    while frontier:
        above = store.summaries_over([], sorted(frontier)) - reached - drop
        frontier = set()
        for node in sorted(above):
            kids, mids = store.summary_children(node)
            if kids and not mids and set(kids) <= drop:
                drop.add(node)
                frontier.add(node)
    return drop
