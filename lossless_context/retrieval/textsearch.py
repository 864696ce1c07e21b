"""Text-mode candidate search for ``lcm_grep``: relevance without scoring every match.

A natural-language question ("what did we decide about the retry limit?") is a bag of terms,
some of which occur in a quarter of a large history. Ranking the OR of all of them by BM25
scores every matching row — about a second at a million messages. Search engines avoid that
by relaxing the query step by step, and so does this module (same steps on both backends):

0. count each term's matches, capped (a term found nowhere is dropped), and test which terms
   occur together (a capped AND per pair, rarest pairs first, bounded in number and time);
1. the AND of each largest group of terms that occur together — every term when they all do —
   most specific group first;
2. the OR of the rare terms, ranked by BM25 — affordable because their capped counts add up
   to at most ``RANK_BUDGET`` rows;
3. the newest matches of any term (OR, newest first), so a page is never empty while
   something matches.
A query is ranked by BM25 only when its match count is known to fit ``RANK_BUDGET``; otherwise
it takes the newest matches (FTS5 walks its index newest first and stops at the limit).

Candidates from every step are then ranked together by one BM25-style score (``score_hit``
with the idf measured in step 0), in fixed blocks (see ``ranked_page``): the steps decide
which rows are looked at, not how they rank within a block.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from . import originals, ranking, traffic
from ..search.query import QueryPlan, score_hit
from ..store.search_api import SearchAPI

BLOCK = 50  # candidates ranked together (see ranked_page)
MAX_POOL = 500  # candidates a search looks at, per target: the deepest page reachable
CONTEXT_POOL = 200  # lexical candidates a natural-language query re-ranks with context (ranking.py)
AVG_CHARS = 2_000.0  # BM25's average document length, in characters
RANK_BUDGET = 2_000  # rows a ranked query may score (~2-10 µs each); also the count cap
MAX_COUNTED = 8  # terms whose match counts are measured; the rest only join the last step
MAX_GROUPS = 6  # AND queries over groups of co-occurring terms
MAX_PAIRS = 15  # co-occurrence tests, rarest pairs first
SAMPLE_ROWS = 20_000  # newest rows a common term's frequency is estimated from
# (of summaries: a gateway holds tens of thousands, each a long text; 2,000 summaries span
# ~200,000 messages of history)
SUMMARY_SAMPLE_ROWS = 2_000
PAIR_SECONDS = 0.02  # and at most this long: a safety net for terms that never meet


def ranked_page(store: SearchAPI, scope: Sequence[str] | None, plan: QueryPlan, targets: list[str], *, offset: int, limit: int,
                semantic: Any = None, **filters: Any) -> tuple[list[dict[str, Any]], bool]:
    """One page of ranked hits over ``targets`` ("messages", "summaries"), and whether more follow.
    ``semantic``: the optional semantic arm (``semantic.SemanticArm``), fused into the ranking of
    messages for natural-language questions.

    Candidates are gathered in a fixed order (substring hits, then the steps above) and ranked
    in blocks of ``BLOCK``: a block's members never depend on the page asked for, so pages
    fetched one after another neither repeat nor skip a hit."""
    end = min(MAX_POOL, -(-(offset + limit) // BLOCK) * BLOCK)
    seqs: list[list[dict[str, Any]]] = []
    exhausted = True
    pre: dict[str, list[int]] = {}
    if plan.fts_items and len(targets) > 1:  # every target's term counts in one store call
        counted = [plan.subset([i], "AND") for i in range(min(len(plan.fts_items), MAX_COUNTED))]
        pre = dict(zip(targets, store.term_counts_many([(t, counted) for t in targets], RANK_BUDGET)))
    subs: dict[str, list[dict[str, Any]]] = {}
    if plan.needs_substring:  # what the full-text index cannot hold (CJK, symbols) goes first
        subs = dict(zip(targets, store.search_substrings(
            [(t, {"session_ids": scope, "plan": plan, "limit": end, "offset": 0, **filters}) for t in targets])))
    for t in targets:
        rows: list[dict[str, Any]] = subs.get(t, [])
        contextual = t == "messages" and ranking.wants_context(plan)
        pool = max(end, CONTEXT_POOL) if contextual else end  # a fixed pool: pages stay stable
        tplan = plan
        found, idf = candidates(store, t, scope, plan, need=pool, want=pool, counts=pre.get(t), **filters)
        speakers: list[str] = []
        if contextual and found:
            # a speaker's name is who said it, not what was said: search without it
            speakers, narrowed = ranking.named_speakers(store, plan, found)
            if narrowed is not None:
                tplan = narrowed
                found, idf = candidates(store, t, scope, tplan, need=pool, want=pool, **filters)
        have = {r["id"] for r in rows}
        rows += [r for r in found if r["id"] not in have]
        for r in rows:
            r["kind"] = "m" if t == "messages" else "s"
            r["score"] = score_hit(tplan, r["text"], idf, AVG_CHARS)
        if contextual:
            def widen(lo: float, hi: float, t: str = t, tplan: QueryPlan = tplan) -> list[dict[str, Any]]:
                extra, _ = candidates(store, t, scope, tplan, need=BLOCK, want=BLOCK,
                                      **{**filters, "since": lo, "until": hi})
                for r in extra:
                    r["kind"] = "m"
                return extra

            rows = ranking.rerank(store, tplan, rows, idf, more=widen, speakers=speakers, **filters)
            if semantic is not None:
                rows = semantic.fuse(store, scope, plan.query, rows, **filters)
        rows = rows[:end]
        if t == "messages":  # the engine's own tool traffic ranks after the originals (traffic.py)
            traffic.mark(store, rows, plan.items, top=2 * (offset + limit))
        exhausted = exhausted and len(rows) < end
        seqs.append(rows)
    ordered: list[dict[str, Any]] = []
    for b in range(0, end, BLOCK):
        block = [r for rows in seqs for r in rows[b:b + BLOCK]]
        block.sort(key=lambda r: (bool(r.get("traffic")), -r["score"], -(r.get("created_at") or 0), r["kind"], -r["id"]))
        ordered.extend(block)
    if "summaries" in targets and "messages" in targets and plan.exact:
        ordered = originals.fold(store, scope, plan, ordered, **filters)
        ordered.sort(key=lambda r: bool(r.get("traffic")))  # (stable) a summary of searches only, too
    more = len(ordered) > offset + limit or (not exhausted and end < MAX_POOL)
    return ordered[offset:offset + limit], more


def candidates(store: SearchAPI, target: str, scope: Sequence[str] | None, plan: QueryPlan, *, need: int, want: int,
               counts: list[int] | None = None, **filters: Any) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Up to about ``want`` rows of ``target`` per step for ``plan`` (steps stop once ``need``
    rows are found), and the BM25 weight (idf) of each item, for ranking them. ``counts``: the
    capped counts of the first ``MAX_COUNTED`` items, when already read."""
    n = len(plan.fts_items)
    if not n:
        return [], {}
    rows: list[dict[str, Any]] = []
    have: set[int] = set()
    counted = list(range(min(n, MAX_COUNTED)))
    if counts is None:
        counts = store.term_counts(target, [plan.subset([i], "AND") for i in counted], RANK_BUDGET)
    cost = {i: RANK_BUDGET + 1 for i in range(n)}
    cost.update(zip(counted, counts))
    idf = _idf(store, target, plan, cost)

    def run(items: list[int], op: str) -> bool:
        # FTS5's bm25() (and ts_rank_cd) first counts every match of every phrase, whatever
        # the LIMIT: only affordable when the items are all rare. Otherwise take the newest
        # matches; the caller ranks every candidate the same way afterwards.
        sub = plan.subset(items, op)
        if sub.fts_match or sub.pg_tsquery:
            order = "rank" if sum(cost[i] for i in items) <= RANK_BUDGET else "recent"
            for r in store.search(target, scope, sub, mode="fts", order=order, limit=want, offset=0,
                                  **filters):
                if r["id"] not in have:
                    have.add(r["id"])
                    rows.append(r)
        return len(rows) >= need

    live = [i for i in range(n) if cost[i] > 0]  # a term found nowhere cannot help any query
    if not live:
        return rows, idf
    for group in _groups(store, target, plan, live, cost, idf)[:MAX_GROUPS]:
        if run(group, "AND"):
            return rows, idf
    rare: list[int] = []
    budget = RANK_BUDGET
    for i in sorted(live, key=lambda i: (cost[i], i)):
        if cost[i] > budget:
            break
        rare.append(i)
        budget -= cost[i]
    if len(rare) > 1 and run(rare, "OR"):
        return rows, idf
    if len(live) > 1 and set(rare) != set(live):  # the same OR again would find nothing new
        run(live, "OR")
    return rows, idf


def _idf(store: SearchAPI, target: str, plan: QueryPlan, cost: dict[int, int]) -> dict[str, float]:
    """BM25's idf per item. Exact counts for rare items; a common item's count is scaled up
    from its matches among the newest ``SAMPLE_ROWS`` rows (``SUMMARY_SAMPLE_ROWS`` of
    summaries; an index walk of bounded length)."""
    total = max(1, store.max_row_id(target))
    common = [i for i, c in cost.items() if c > RANK_BUDGET and i < MAX_COUNTED]
    df = {i: float(c) for i, c in cost.items()}
    window = SAMPLE_ROWS if target == "messages" else SUMMARY_SAMPLE_ROWS
    if common and total > window:
        sampled = store.term_counts(target, [plan.subset([i], "AND") for i in common], window, newest=window)
        for i, c in zip(common, sampled):
            df[i] = max(df[i], c * total / window)
    out: dict[str, float] = {}
    for i, d in df.items():
        d = min(d, total)
        out[plan.items[i].casefold()] = math.log(1 + (total - d + 0.5) / (d + 0.5))
    return out


def _groups(store: SearchAPI, target: str, plan: QueryPlan, live: list[int], cost: dict[int, int],
            idf: dict[str, float]) -> list[list[int]]:
    """The largest groups of terms that pairwise occur together (maximal cliques of the
    co-occurrence graph), most specific first. Pairs are tested rarest first — a capped AND
    that stops at the first shared row, so pairs that do meet cost almost nothing; this is
    where a question's off-topic word ("decide") shows up. Pairs left untested when
    ``PAIR_SECONDS`` run out are assumed to meet."""
    ranked = sorted(live, key=lambda i: (-idf[plan.items[i].casefold()], i))
    pairs = [(a, b) for k, a in enumerate(ranked) for b in ranked[k + 1:]][:MAX_PAIRS]
    met = store.any_match(target, [plan.subset([a, b], "AND") for a, b in pairs], PAIR_SECONDS)
    apart = {(min(a, b), max(a, b)) for (a, b), m in zip(pairs, met) if m is False}
    near = {i: {j for j in live if j != i and (min(i, j), max(i, j)) not in apart} for i in live}
    cliques: list[list[int]] = []

    def grow(r: set[int], p: set[int], x: set[int]) -> None:  # Bron–Kerbosch with a pivot
        if not p and not x:
            cliques.append(sorted(r))
            return
        pivot = max(p | x, key=lambda u: len(near[u] & p))
        for v in sorted(p - near[pivot]):
            grow(r | {v}, p & near[v], x & near[v])
            p = p - {v}
            x = x | {v}

    grow(set(), set(live), set())
    weight = {i: idf[plan.items[i].casefold()] for i in live}
    return sorted(cliques, key=lambda g: (-sum(weight[i] for i in g), -len(g), g))
