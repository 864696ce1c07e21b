"""The summary block's text when its nodes do not all fit its budget in full.

The block always names every root (the marker lists them, each with a header: id, depth,
messages covered, time span), so every older message stays represented. What shrinks is
the body shown per node: first every body is cut to one common cap (the largest that fits —
short nodes stay whole), then, if even the headers do not fit, the block lists the nodes
by id only. The full summary is one `lcm_expand(id)` away; nothing is stored shorter.
"""

from __future__ import annotations

from typing import Callable, Sequence

from ..tokens import estimate_text_tokens

CUT_NOTE = " …[shortened to fit the context; lcm_expand(\"s{id}\") shows this summary in full]"


def cut_text(text: str, tokens: int, node_id: int) -> str:
    """`text` cut to about `tokens` tokens at a line or word boundary, with a note saying so."""
    text = text.strip()
    if estimate_text_tokens(text) <= tokens:
        return text
    if tokens <= 0:
        return ""
    limit = max(0, tokens * 4 - 4)
    cut = text[:limit]
    nl = cut.rfind("\n")
    sp = cut.rfind(" ")
    at = nl if nl > limit // 2 else sp if sp > limit // 2 else limit
    return cut[:at].rstrip() + CUT_NOTE.format(id=node_id)


def fit_bodies(bodies: Sequence[str], ids: Sequence[int], avail: int) -> list[str] | None:
    """Bodies cut to one common cap so their total is ≤ `avail` tokens (None: impossible
    even with every body empty)."""
    sizes = [estimate_text_tokens(b.strip()) for b in bodies]
    if sum(sizes) <= avail:
        return [b.strip() for b in bodies]
    note = estimate_text_tokens(CUT_NOTE.format(id=max(ids, default=0))) + 1
    if avail < 0:
        return None
    lo, hi = 0, max(sizes, default=0)
    # The largest cap whose cost (a cut body pays for its note) fits: binary search.
    def cost(cap: int) -> int:
        return sum(s if s <= cap else (cap + note if cap > 0 else 0) for s in sizes)
    if cost(0) > avail:
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if cost(mid) <= avail:
            lo = mid
        else:
            hi = mid - 1
    return [b.strip() if s <= lo else cut_text(b, lo, i) for b, s, i in zip(bodies, sizes, ids)]


def fit_block(render: Callable[[Sequence[str] | None], str], bodies: Sequence[str], ids: Sequence[int],
              budget: int, measure: Callable[[str], int] = estimate_text_tokens) -> str:
    """The block text from `render(bodies)` (None = ids only) whose `measure` (the tokens of
    the message it becomes) is within `budget` when possible: full bodies, else cut bodies,
    else ids only (the smallest form)."""
    full = render(list(bodies))
    if measure(full) <= budget:
        return full
    overhead = measure(render([""] * len(bodies)))
    avail = budget - overhead
    for _ in range(6):  # a message's estimate counts escapes (newlines, quotes): tighten
        cut = fit_bodies(bodies, ids, avail)
        if cut is None:
            break
        text = render(cut)
        over = measure(text) - budget
        if over <= 0:
            return text
        avail -= over + 2
    return render(None)
