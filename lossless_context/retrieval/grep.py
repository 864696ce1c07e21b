"""One page of ``lcm_grep`` hits, in either mode: what the tool asks, before it shows them.

Text mode is the ranked search of :mod:`textsearch` (candidates, ranking, originals first,
the semantic arm). Regex mode takes each target's newest rows that match the pattern (the
stores scan them with a time bound, ``search/regex.py``) and merges them newest first. The
tool (``tools.py``) then drops what its caller may not see (a branch's rows past its fork
point, retracted messages) and groups the page by summary.
"""

from __future__ import annotations

from typing import Any, Sequence

from . import textsearch
from ..search.query import QueryPlan
from ..search.regex import BoundedRegex
from ..store.search_api import SearchAPI, SearchRow

MAX_REGEX_POOL = 500  # regex candidates a search looks at, per target: the deepest page reachable


def page(store: SearchAPI, scope: Sequence[str] | None, plan: QueryPlan, targets: list[str], *,
         offset: int, limit: int, regex: BoundedRegex | None = None, semantic: Any = None,
         **filters: Any) -> tuple[list[SearchRow], bool]:
    """Hits ``offset`` to ``offset + limit`` over ``targets`` ("messages", "summaries") of the
    lineage ``scope`` (its sessions; None: every session), and whether more follow. ``regex``:
    regex mode with this pattern; text mode when None (``semantic``: the optional arm).
    ``filters``: role, since, until, under_summary. Each row carries ``kind`` ("m"/"s")."""
    if regex is None:
        return textsearch.ranked_page(store, scope, plan, targets, offset=offset, limit=limit,
                                      semantic=semantic, **filters)
    cands: list[SearchRow] = []
    want = min(MAX_REGEX_POOL, offset + limit + 1)
    for t in targets:
        rows = store.search(t, scope, plan, mode="regex", regex=regex, limit=want, offset=0, **filters)
        for r in rows:
            r["kind"] = "m" if t == "messages" else "s"
        cands.extend(rows)
    cands.sort(key=lambda r: (-(r.get("created_at") or 0), r["kind"], -r["id"]))
    return cands[offset: offset + limit], len(cands) > offset + limit
