"""Checks that a session's DAG is connected: every stored message is reached exactly once
from the active context (directly, or under exactly one top-level summary path)."""

from __future__ import annotations

from collections import Counter
from typing import Any


def coverage(store: Any, session_id: str) -> tuple[Counter, set[int]]:
    _, ctx = store.get_context(session_id)
    reached: Counter = Counter()
    for e in ctx:
        if e.kind == "m":
            reached[e.ref] += 1
            continue
        stack = [e.ref]
        while stack:
            s = stack.pop()
            kids, mids = store.summary_children(s)
            stack.extend(kids)
            for m in mids:
                reached[m] += 1
    stored = {m.id for m in store.iter_all_messages() if m.session_id in store.lineage(session_id)}
    return reached, stored


def assert_connected(store: Any, session_id: str) -> None:
    reached, stored = coverage(store, session_id)
    missing = stored - set(reached)
    twice = [m for m, n in reached.items() if n > 1]
    assert not missing, f"{len(missing)} stored messages not reachable from the context: {sorted(missing)[:10]}"
    assert not twice, f"messages reached by more than one path: {twice[:10]}"
