"""A host's list that replays originals our active context already summarises.

A host that lost our compacted list sends the originals again: it crashed between our
commit and its own (Hermes' gateway persists the compacted transcript after the engine's
pass), or it rebuilt the conversation from a transcript of the originals. Aligned one by
one (ingest.py) they are the stored rows they were, but taken as they come the active
context would lose its summary nodes, and the next pass would summarise the same messages
again: new model calls, a second leaf over each message (duplicate summaries in search, a
DAG `lcm doctor` rejects), and no reuse of what was summarised before.

:func:`fold_replayed` puts the summaries back: a summary of the stored context that the
list does not carry, whose messages (all of them, in order) stand as one run of the
aligned slots, stands for that run again. Nothing else changes: a summary whose span is
not there whole (the host dropped a message, or replays only part of it) is left out as
before. An ordinary call (the list carries our summary blocks) reads nothing more; a
pass reads which of its messages published leaves cover (one store call).

Aligning comes first and must meet the originals one by one: where the context holds a
summary and the list a message, the alignment's walk opens that summary (:func:`opened`)
if the message is the summary's first, so the replay matches the summary's messages in
order (matched instead against later messages of the context, a repeated text such as
"continue" sent the walk past the rest of the replay, which was then stored again).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from typing import Sequence

from .assemble import Slot, groups
from ..records import ContextEntry
from ..store.base import Store

log = logging.getLogger("lossless_context.pipeline.ingest")

MAX_DEPTH = 64  # summary levels walked down to a summary's first message
MAX_NODES = 4096  # summary nodes read to learn the spans of one list's missing summaries
OVERHEAD_TOKENS = 20  # of a summary's rendering beyond its text (a folded slot's estimate)
SAID_MAX = 256  # folds already logged (session, summaries), most recent kept
_said: "OrderedDict[tuple[str, tuple[int, ...]], None]" = OrderedDict()
_said_lock = threading.Lock()


def fold_replayed(store: Store, session_id: str, context: Sequence[ContextEntry], slots: Sequence[Slot], *,
                  leaves: bool = False) -> tuple[list[Slot] | None, int | None]:
    """``slots`` with each replayed summary span folded back into its summary (module
    docstring), or None when nothing folds; and where a pass must stop (below). ``context``
    is the stored active context the slots were aligned with. A context summary whose span
    is not there whole is tried node by node below it (the list may carry one of its
    children as a summary block).

    ``leaves`` (before a pass, which would summarise what is left): also this session's
    published leaves over any message of the list, found by one store call. They fold a
    replay that arrives in parts (a host that rebuilds the list a turn at a time): the
    context lost a summary at the first call, when its span was not there whole yet. A
    leaf whose span the list ends inside (the rest not sent yet) is not folded; the
    returned index is the first slot (of its turn group) a pass must keep out of what it
    summarises, or the pass would summarise those messages a second time."""
    carried = {r for s in slots if s.kind == "s" for r in s.refs}
    missing = list(dict.fromkeys(e.ref for e in context if e.kind == "s" and e.ref not in carried))
    if not (missing or leaves):
        return None, None
    at = {s.refs[0]: i for i, s in enumerate(slots) if s.kind in ("m", "x") and s.refs}
    if not at:
        return None, None
    tree = _Tree(store)
    runs: list[tuple[int, int, int]] = []  # (first slot, end slot, summary id)

    def place(node: int) -> None:
        if node in carried or not tree.read(node):
            return
        span = tree.span(node)
        i, k = _matched(slots, at, span)
        if span and k == len(span):
            runs.append((i, i + k, node))
            return
        for kid in tree.children[node][0]:
            place(kid)

    for top in missing:
        place(top)
    recs = {}
    begun: set[int] = set()  # first messages of leaves the list ends inside
    if leaves:
        inside = {k for a, b, _ in runs for k in range(a, b)}
        over = store.message_summaries_many([m for m, i in at.items() if i not in inside])
        found = {sid for sids in over.values() for sid in sids} - carried
        if found:
            recs = store.get_summaries(sorted(found))
            for sid in sorted(found):
                if sid in recs and recs[sid].session_id == session_id:
                    placed = len(runs)
                    place(sid)
                    if len(runs) == placed and sid in tree.children:
                        # the list ends inside the leaf's span: its first messages, in order,
                        # are the list's last (not a message missing in between: a host that
                        # dropped one would keep every later pass from summarising after it)
                        span = tree.span(sid)
                        i, k = _matched(slots, at, span)
                        if k and i + k == len(slots):
                            begun.add(span[0])
    if not runs:
        return None, _hold(slots, begun)
    runs.sort()
    recs.update(store.get_summaries([sid for _, _, sid in runs if sid not in recs]))
    out: list[Slot] = []
    pos = 0
    folded: list[int] = []
    for a, b, sid in runs:
        if a < pos or sid not in recs:  # (overlapping spans cannot both be the context's)
            continue
        out.extend(slots[pos:a])
        out.append(Slot("s", [sid], None, "user", recs[sid].tokens + OVERHEAD_TOKENS))
        folded.append(sid)
        pos = b
    if not folded:
        return None, _hold(slots, begun)
    out.extend(slots[pos:])
    key = (session_id, tuple(folded))
    with _said_lock:
        first = key not in _said
        _said[key] = None
        while len(_said) > SAID_MAX:
            _said.popitem(last=False)
    # (once: until the host takes the summaries from a pass, each call re-sends the originals)
    (log.info if first else log.debug)(
        "lcm: the host re-sent %d messages our context summarises (%s): they stand for those summaries "
        "again, not summarised twice", len(slots) - len(out) + len(folded), ", ".join(f"s{x}" for x in folded))
    return out, _hold(out, begun)


def _matched(slots: Sequence[Slot], at: dict[int, int], span: Sequence[int]) -> tuple[int, int]:
    """Where ``span``'s first message stands among the message slots, and how many of its
    messages follow there in order (0 if it is not in the list)."""
    i = at.get(span[0]) if span else None
    if i is None:
        return 0, 0
    k = 0
    while (k < len(span) and i + k < len(slots) and slots[i + k].kind in ("m", "x")
           and slots[i + k].refs[0] == span[k]):
        k += 1
    return i, k


def _hold(slots: Sequence[Slot], begun: set[int]) -> int | None:
    """The start of the turn group holding the first slot of such a leaf, if any."""
    if not begun:
        return None
    first = next((i for i, s in enumerate(slots) if s.kind in ("m", "x") and s.refs and s.refs[0] in begun), None)
    if first is None:
        return None
    return next(a for a, b in groups(slots) if a <= first < b)


def opened(store: Store, summary_id: int, skip: set[int]) -> tuple[str | None, list[ContextEntry]]:
    """A context summary opened for a replay (ingest.Walk): the identity of its first message
    and the entries that stand in its place while the list replays it - down the first
    child of each level, each summary replaced by its children (those in ``skip``, which the
    list carried as summary blocks already, left out) and the leaf at the bottom by its
    messages. The Walk then meets the originals one by one, as it meets any message of the
    context, and fold_replayed folds them back once aligned. (None, []) if there is no
    first message."""
    path: list[tuple[list[int], list[int]]] = []
    node = summary_id
    for _ in range(MAX_DEPTH):
        kids, mids = store.summary_children(node)
        kids = [k for k in kids if k not in skip]
        path.append((kids, mids))
        if not kids:
            break
        node = kids[0]
    kids, mids = path[-1]
    if kids or not mids:
        return None, []
    recs = store.get_messages(mids)
    entries = [ContextEntry("m", m, recs[m].ident, recs[m].role, recs[m].tokens) for m in mids if m in recs]
    if not entries or entries[0].ref != mids[0]:
        return None, []
    for kids, _mids in reversed(path[:-1]):  # (each level: its first child opened, the rest as they are)
        entries = entries + [ContextEntry("s", k) for k in kids[1:]]
    return entries[0].ident, entries


class _Tree:
    """The summary nodes below the context's missing summaries, read on demand (at most
    MAX_NODES per list: past that, nothing more is folded)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.children: dict[int, tuple[list[int], list[int]]] = {}
        self._spans: dict[int, list[int]] = {}

    def read(self, node: int) -> bool:
        """Whether ``node`` and everything below it are read (within the budget)."""
        stack = [node]
        while stack:
            n = stack.pop()
            if n in self.children:
                continue
            if len(self.children) >= MAX_NODES:
                return False
            kids, mids = self.store.summary_children(n)
            self.children[n] = (list(kids), list(mids))
            stack.extend(kids)
        return True

    def span(self, node: int) -> list[int]:
        """The node's messages in order (a condensed node's: its children's, in order)."""
        if node not in self._spans:
            kids, mids = self.children[node]
            out: list[int] = []
            for k in kids:
                out.extend(self.span(k))
            self._spans[node] = out + mids
        return self._spans[node]
