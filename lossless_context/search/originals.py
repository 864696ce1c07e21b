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

Backend-neutral: one ``Store.search(..., under_summary=...)`` per summary hit looked at (at
most ``MAX_FOLDS``), which both stores answer from their indexes.
"""

from __future__ import annotations

from typing import Any

from .query import QueryPlan

MAX_FOLDS = 30  # summary hits a search checks for originals (bounds the extra queries)
PER_SUMMARY = 3  # originals that take a folded summary's slot


def _flat(s: str) -> str:
    return " ".join(s.split()).casefold()


def fold(store: Any, scope: Any, plan: QueryPlan, ordered: list[dict[str, Any]], *,
         role: str | None = None, since: float | None = None, until: float | None = None,
         under_summary: int | None = None) -> list[dict[str, Any]]:
    """``ordered`` (ranked rows of kind "m"/"s") with summaries folded into their originals."""
    exact = {_flat(e) for e in plan.exact}
    idx = [i for i, it in enumerate(plan.items) if _flat(it) in exact]
    if not idx or not any(r["kind"] == "s" for r in ordered):
        return ordered
    out: list[dict[str, Any]] = []
    placed: dict[int, dict[str, Any]] = {}  # message id → its row in `out`
    later = {r["id"]: r for r in ordered if r["kind"] == "m"}
    checked = 0
    for r in ordered:
        if r["kind"] == "m":
            if r["id"] not in placed:
                placed[r["id"]] = r
                out.append(r)
            continue
        originals = []
        if checked < MAX_FOLDS:
            checked += 1
            originals = _originals(store, scope, plan, r, idx, role=role, since=since, until=until)
        if not originals:
            out.append(r)
            continue
        for m in originals:
            row = placed.get(m["id"])
            if row is None:
                row = later.get(m["id"]) or {**m, "kind": "m", "score": r.get("score", 0.0)}
                placed[row["id"]] = row
                out.append(row)
            row.setdefault("folded", []).append(r["id"])
    return out


def _originals(store: Any, scope: Any, plan: QueryPlan, summary: dict[str, Any], idx: list[int], *,
               role: str | None, since: float | None, until: float | None) -> list[dict[str, Any]]:
    """Messages under ``summary`` holding every exact item the summary matches, newest first."""
    text = _flat(summary.get("text") or "")
    matched = [i for i in idx if _flat(plan.items[i]) in text]
    if not matched:
        return []
    sub = plan.subset(matched, "AND")
    if not sub.fts_match and not sub.pg_tsquery:
        return []
    rows = store.search("messages", scope, sub, mode="fts", order="recent", role=role, since=since,
                        until=until, under_summary=summary["id"], limit=PER_SUMMARY * 4, offset=0)
    want = [_flat(plan.items[i]) for i in matched]
    return [m for m in rows if all(w in _flat(m.get("text") or "") for w in want)][:PER_SUMMARY]
