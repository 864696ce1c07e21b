"""Rebalancing a summary chain left by 0.1.x (`lcm doctor --repair`).

Before balanced condensation a pass could merge the top node with the newest leaf whatever
their depths, so a long session's DAG became a chain hundreds of levels deep. This rebuilds
a balanced tree over the same leaves, in place and losing nothing:

* the chain's top node keeps its id, text and span (the host's summary block names it);
  its children become ≤ fanin new condensed nodes of one depth, built level by level from
  groups of 2…fanin same-depth nodes over its leaves, in time order;
* no node is deleted: the chain's intermediate nodes keep their ids, texts and children
  (lcm_describe / lcm_expand still open them); they are just no longer under the top node;
* leaves and their messages are untouched, so every message stays under exactly one leaf.

The new nodes are summarised by the built-in extractive summariser (no network: a repair
must not spend model calls); the next passes keep the tree balanced.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from ..pipeline.dag_balance import depth_bound
from ..records import Source
from ..records import NewSummary, SummaryRecord
from ..store.base import Store
from ..summarizers.summarize import SummaryRequest, deterministic_summary
from ..tokens import estimate_text_tokens

CONDENSED_TARGET = 2000  # the default condensed_summary_tokens


@dataclass
class Unbalanced:
    summary_id: int
    session_id: str
    depth: int
    leaves: int
    bound: int


def leaves_under(store: Store, summary_id: int) -> list[int]:
    """The leaves under a node, in time order (children are stored in order)."""
    out: list[int] = []
    stack = [summary_id]
    seen: set[int] = set()
    recs = store.get_summaries([summary_id])
    while stack:
        nid = stack.pop()
        if nid in seen:
            continue
        seen.add(nid)
        rec = recs.get(nid) or store.get_summaries([nid]).get(nid)
        if rec is None:
            continue
        if rec.kind == "leaf":
            out.append(nid)
            continue
        kids, _mids = store.summary_children(nid)
        stack.extend(reversed(kids))
    return out


def find_unbalanced(store: Store, fanin: int, context_roots: Sequence[tuple[str, int]]) -> list[Unbalanced]:
    """Context roots deeper than the bound for the leaves under them."""
    recs = store.get_summaries([r for _s, r in context_roots])
    out = []
    for sid, root in context_roots:
        rec = recs.get(root)
        if rec is None or rec.kind == "leaf" or rec.state != "published":
            continue
        n = len(leaves_under(store, root))
        bound = depth_bound(n, fanin)
        if rec.depth > bound:
            out.append(Unbalanced(root, sid, rec.depth, n, bound))
    return out


def _groups(n: int, fanin: int) -> list[int]:
    """Sizes of ceil(n / fanin) groups as even as possible (each 2…fanin when n ≥ 2 and
    fanin ≥ 3; with fanin 2 an odd count leaves one group of 1)."""
    k = math.ceil(n / fanin)
    base, extra = divmod(n, k)
    return [base + (1 if i < extra else 0) for i in range(k)]


def rebalance(store: Store, summary_id: int, fanin: int, redact: bool = True) -> int:
    """Rebuild the tree under one node (see the module doc); returns the new node count."""
    leaf_ids = leaves_under(store, summary_id)
    recs: dict[int, SummaryRecord] = store.get_summaries(leaf_ids)
    level: list[tuple[str | int, Any]] = [(i, recs[i]) for i in leaf_ids if i in recs]
    if len(level) < 2:
        return 0
    new: list[NewSummary] = []
    depth = 0
    while len(level) > fanin:
        nxt: list[tuple[str | int, Any]] = []
        at = 0
        for size in _groups(len(level), fanin):
            group = level[at:at + size]
            at += size
            sources = [Source(f"s{k}" if isinstance(k, int) else k, "summary", r.text, None) for k, r in group]
            src = sum(r.tokens for _k, r in group)
            text = deterministic_summary(SummaryRequest(sources, min(CONDENSED_TARGET, max(32, src // 2)),
                                                        "condensed"), redact)
            starts = [r.t_start for _k, r in group if r.t_start]
            ends = [r.t_end for _k, r in group if r.t_end]
            node = NewSummary(f"rb{len(new)}", "condensed", depth + 1, text, estimate_text_tokens(text), src,
                              "deterministic", "extractive", min(starts) if starts else None,
                              max(ends) if ends else None, sum(r.n_messages for _k, r in group),
                              child_keys=[k for k, _r in group])
            new.append(node)
            nxt.append((node.key, node))
        level = nxt
        depth += 1
    store.rebalance_summary(summary_id, new, [k for k, _r in level], depth + 1)
    return len(new)
