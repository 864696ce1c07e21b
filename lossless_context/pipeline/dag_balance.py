"""Balanced condensation: which summaries a pass condenses, and how large nodes should be.

The summary block of a context holds the roots of the DAG in time order. A condensed node
is made of `fanin` adjacent roots of the SAME depth, so a node of depth d covers fanin**d
leaves and the DAG's depth stays ≤ ⌈log_fanin(leaves)⌉ (+1 for stores made before this
rule: their old roots are never merged with anything of another depth, so a chain stops
growing). Each summary is condensed at most once in its life — never once per pass.

Once no run of `fanin` same-depth roots is left, the block holds at most fanin − 1 roots
per depth (recent history fine, old history coarse). If it is still over its budget, the
block is made to fit by *rendering* nodes shorter (`summary_view.py`), not by deepening the
tree; node targets derived from the block budget (`node_targets`) keep that rare.

The one exception: when even the shortest rendering (ids only) of the roots cannot fit the
block, runs of 2…fanin−1 same-depth roots are merged (`partial_run`). Children still share
a depth; only the fanin**d coverage of such a node is less. It needs more than about
block/2 roots, i.e. a fan-in far above the default with a tiny window.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

MIN_NODE_TOKENS = 120  # below this a summary keeps too little to be worth a model call


def _runs(depths: Sequence[int]) -> list[tuple[int, int, int]]:
    """(depth, start, end) of each maximal run of equal adjacent depths."""
    out: list[tuple[int, int, int]] = []
    i, n = 0, len(depths)
    while i < n:
        j = i + 1
        while j < n and depths[j] == depths[i]:
            j += 1
        out.append((depths[i], i, j))
        i = j
    return out


def condense_run(depths: Sequence[int], fanin: int) -> tuple[int, int] | None:
    """The oldest `fanin` adjacent roots of the shallowest depth that has that many, or None."""
    full = [(d, a) for d, a, b in _runs(depths) if b - a >= fanin]
    if not full:
        return None
    _d, a = min(full)
    return a, a + fanin


def partial_run(depths: Sequence[int], fanin: int) -> tuple[int, int] | None:
    """The last resort (see the module doc): the oldest run of ≥ 2 roots of the shallowest
    depth that has one, up to `fanin` of them."""
    runs = [(d, a, b) for d, a, b in _runs(depths) if b - a >= 2]
    if not runs:
        return None
    _d, a, b = min(runs)
    return a, min(b, a + fanin)


def next_condensation(depths: Sequence[int], tokens: Sequence[int], block_budget: int, fanin: int,
                      block_fits: Callable[[], bool]) -> tuple[int, int] | None:
    """The run of roots a pass condenses next (half-open), or None when it is done.

    Nothing is condensed while the roots' summaries fit the block in full (a condensation
    costs a model call). Over budget: a full run of `fanin` same-depth roots; without one,
    the block is left to fit by shorter rendering unless even that cannot fit
    (`block_fits()` false), the last resort of `partial_run`."""
    if len(depths) < 2 or sum(tokens) <= block_budget:
        return None
    run = condense_run(depths, fanin)
    if run is None and not block_fits():
        run = partial_run(depths, fanin)
    return run


def node_targets(summary_block: int, fanin: int, leaf_cap: int, condensed_cap: int) -> tuple[int, int]:
    """Leaf and condensed summary targets for a block of `summary_block` tokens.

    In steady state the block holds up to fanin − 1 roots per depth; a share of
    block / (2·(fanin − 1)) lets the newest two levels show in full and the older ones
    mostly so. The configured sizes are upper bounds (large windows keep them)."""
    share = max(MIN_NODE_TOKENS, summary_block // max(2, 2 * (fanin - 1)))
    return min(leaf_cap, share), min(condensed_cap, max(share, share * 4 // 3))


def depth_bound(leaves: int, fanin: int) -> int:
    """⌈log_fanin(leaves)⌉ + 1: the deepest a DAG over `leaves` leaves may be (1 for ≤ 1 leaf)."""
    if leaves <= 1:
        return 1
    return math.ceil(math.log(leaves) / math.log(max(2, fanin)) - 1e-9) + 1
