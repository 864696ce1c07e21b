"""Originals first: for an identifier or a quoted phrase, the message that holds it outranks
the summaries that repeat it.

Every summary over a message that quotes ``ERR_BATCH_OVERFLOW_1490`` quotes it again, and so
does every ancestor of that summary: a plain ranking fills a page with nested summaries and
the original falls off it. :func:`fold` walks a ranked hit list once; each summary hit that
matches exact items which a message under it also holds is *folded*: its slot goes to those
messages (at most ``PER_SUMMARY`` of them, moved up from further down the list or fetched when
the list did not reach them) and its id is kept on them (``folded``), so the tool can still
show the chain. A summary whose matching text no message below it holds (it names the thing
in its own words, or the messages are filtered out) keeps its slot.

Backend-neutral: one ``Store.search_under_summaries`` for the summary hits looked at (at most
``MAX_FOLDS``), which both stores answer from their indexes (PostgreSQL in one round trip).
"""

from __future__ import annotations

from typing import Any, Sequence

from . import traffic
from ..search.query import QueryPlan
from ..store.search_api import SearchAPI

MAX_FOLDS = 30  # summary hits a search checks for originals (bounds the extra queries)
PER_SUMMARY = 3  # originals that take a folded summary's slot


def _flat(s: str) -> str:
    return " ".join(s.split()).casefold()


def fold(store: SearchAPI, scope: Sequence[str] | None, plan: QueryPlan, ordered: list[dict[str, Any]], *,
         role: str | None = None, since: float | None = None, until: float | None = None,
         under_summary: int | None = None) -> list[dict[str, Any]]:
    """``ordered`` (ranked rows of kind "m"/"s") with summaries folded into their originals."""
    exact = {_flat(e) for e in plan.exact}
    idx = [i for i, it in enumerate(plan.items) if _flat(it) in exact]
    if not idx or not any(r["kind"] == "s" for r in ordered):
        return ordered
    # The summaries looked at (at most MAX_FOLDS) are searched together: one store call.
    looked = [r for r in ordered if r["kind"] == "s"][:MAX_FOLDS]
    asks = [(r, _matched(plan, r, idx)) for r in looked]
    todo = [(r, m, plan.subset(m, "AND")) for r, m in asks if m]
    todo = [(r, m, sub) for r, m, sub in todo if sub.fts_match or sub.pg_tsquery]
    found = store.search_under_summaries(scope, [(r["id"], sub) for r, _, sub in todo], role=role, since=since,
                                         until=until, limit=PER_SUMMARY * 4) if todo else []
    originals_of: dict[int, list[dict[str, Any]]] = {}
    traffic.mark(store, [row for rows in found for row in rows], plan.items)
    for (r, m, _), rows in zip(todo, found):
        want = [_flat(plan.items[i]) for i in m]
        if rows and all(row.get("traffic") for row in rows):
            r["traffic"] = True  # it matched only by quoting the agent's own searches
        rows = [row for row in rows if not row.get("traffic")]  # never the agent's own searches
        originals_of[r["id"]] = [row for row in rows if all(w in _flat(row.get("text") or "") for w in want)][
            :PER_SUMMARY]
    out: list[dict[str, Any]] = []
    placed: dict[int, dict[str, Any]] = {}  # message id → its row in `out`
    later = {r["id"]: r for r in ordered if r["kind"] == "m"}
    for r in ordered:
        if r["kind"] == "m":
            if r["id"] not in placed:
                placed[r["id"]] = r
                out.append(r)
            continue
        originals = originals_of.get(r["id"], [])
        if not originals:
            out.append(r)
            continue
        for orig in originals:
            row = placed.get(orig["id"])
            if row is None:
                row = later.get(orig["id"]) or {**orig, "kind": "m", "score": r.get("score", 0.0)}
                placed[row["id"]] = row
                out.append(row)
            row.setdefault("folded", []).append(r["id"])
    return out


def _matched(plan: QueryPlan, summary: dict[str, Any], idx: list[int]) -> list[int]:
    """The exact items (of ``idx``) the summary's own text holds."""
    text = _flat(summary.get("text") or "")
    return [i for i in idx if _flat(plan.items[i]) in text]
