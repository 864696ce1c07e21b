"""Removal in transactions bounded by time, not by a count of rows (retention, ops/retention.py).

A prune deletes rows while the host goes on writing to the same store, and each transaction
holds the single write lock. What a row costs to delete varies a thousandfold: its index rows
are fixed work, but its text leaves the full-text indexes token by token (SQLite re-tokenizes a
deleted message for the FTS delete), so a batch sized by the time of the previous one can take
seconds when it reaches a run of long messages. Here every row is weighed before it is taken —
``1 + tokens / ROW_TOKENS`` *units* (a fixed part, and the text's share) — and the time per unit
is measured on every transaction: a transaction takes rows, in order, while their predicted cost
stays within the budget, at least one (a single huge row goes alone), at most ``MAX_ROWS``.
After a slow transaction the measured rate replaces the estimate at once (the next batch is
smaller by as much as this one overran); after a fast one the estimate moves half-way down
(one lucky batch does not double the next). Between two transactions a pause lets other
writers in.

A prediction can still be wrong: on shared cores, or when the pages are not in memory, an
ordinary batch runs three to five times long. So a transaction can stop partway: its rows
are split into groups of about ``1/GROUPS`` of the budget each, and the store (``fn``, e.g.
``Store.remove_rows``) reads the clock between two groups and commits as soon as
``deadline`` seconds have passed since the transaction began; the groups not done lead the
next transaction. A transaction then holds the lock for about the deadline plus one group.
The rate is learnt from the time a transaction *held* the write lock (the store reports it:
from the lock granted to the commit), never from the time it waited for the lock first: a
host's write or a background merge step ahead of it says nothing about what the rows cost,
and counting the wait made the next batches a row or two each (a prune of twice as many
transactions, each still waiting its turn).
The clock and the pause are injectable (tests drive them without waiting).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

BUDGET_SECONDS = 0.04  # the target length of one removal transaction
ROW_TOKENS = 400  # a row's fixed deletion work is about what this many tokens of its text cost
FIRST_UNIT_SECONDS = 0.0005  # the first transaction's guess (measured from then on)
MAX_ROWS = 2_000  # a transaction's ceiling whatever the measurements say (statement sizes)
DEADLINE_SECONDS = 0.05  # a transaction commits once this has passed, whatever is left of it
GROUPS = 8  # a transaction's rows go in groups of about budget / GROUPS each (the stop points;
# a store says how many suit it: Store.removal_groups)


@dataclass
class BatchLog:
    """What the transactions did: count, longest (the lock held), how many stopped at the
    deadline, the longest wait for the lock, and (rows, units, seconds held) of each."""

    transactions: int = 0
    longest_s: float = 0.0
    stopped: int = 0
    longest_wait_s: float = 0.0
    batches: list[tuple[int, float, float]] = field(default_factory=list)

    def add(self, rows: int, units: float, seconds: float, waited: float = 0.0) -> None:
        self.transactions += 1
        self.longest_s = max(self.longest_s, seconds)
        self.longest_wait_s = max(self.longest_wait_s, waited)
        if len(self.batches) < 100_000:  # (a bound on what a very long prune keeps)
            self.batches.append((rows, units, seconds))


class TimedBatches:
    """Run ``fn`` over ids in transactions of about ``budget`` seconds each (see the module doc)."""

    def __init__(self, *, budget: float = BUDGET_SECONDS, pause: float = 0.05,
                 clock: Callable[[], float] = time.perf_counter, sleep: Callable[[float], None] = time.sleep,
                 max_rows: int = MAX_ROWS, deadline: float = DEADLINE_SECONDS, groups: int = GROUPS) -> None:
        self.budget, self.pause, self.clock, self.sleep, self.max_rows = budget, pause, clock, sleep, max_rows
        self.deadline, self.n_groups = deadline, max(1, int(groups))
        self.unit_seconds = FIRST_UNIT_SECONDS  # the estimate: seconds one unit of work takes
        self.log = BatchLog()

    @staticmethod
    def units(tokens: int) -> float:
        return 1.0 + max(0, int(tokens)) / ROW_TOKENS

    def next_batch(self, weights: Sequence[float]) -> int:
        """How many of the next rows (their units, in order) the next transaction takes."""
        allowed = self.budget / max(self.unit_seconds, 1e-9)
        n, spent = 0, 0.0
        for w in weights[:self.max_rows]:
            if n and spent + w > allowed:
                break
            n, spent = n + 1, spent + w
        return n

    def observe(self, units: float, seconds: float) -> None:
        """Learn from one transaction: ``units`` of work took ``seconds``."""
        rate = seconds / max(units, 1e-9)
        if rate >= self.unit_seconds:
            self.unit_seconds = rate
        else:
            self.unit_seconds = (self.unit_seconds + rate) / 2

    def groups(self, weights: Sequence[float]) -> list[int]:
        """The sizes of the groups one transaction's rows (their units, in order) go in: each
        about ``budget / groups`` predicted, at least one row."""
        allowed = self.budget / self.n_groups / max(self.unit_seconds, 1e-9)
        sizes: list[int] = []
        n, spent = 0, 0.0
        for w in weights:
            if n and spent + w > allowed:
                sizes.append(n)
                n, spent = 0, 0.0
            n, spent = n + 1, spent + w
        if n:
            sizes.append(n)
        return sizes

    def run(self, ids: Sequence[int], fn: Callable[[list[list[int]], float], tuple[int, int, float]],
            tokens: Mapping[int, int] | None = None) -> int:
        """``fn(groups, deadline)`` removes ``groups`` (lists of ids, in order) in one
        transaction, stopping between two groups once ``deadline`` seconds have passed (the
        first group always goes), and returns (groups done, rows removed, seconds the write
        lock was held); the rest leads the next transaction. ``tokens`` weighs each id
        (missing: the fixed part only). Returns the total removed."""
        ids = list(ids)
        weights = [self.units((tokens or {}).get(i, 0)) for i in ids]
        done, i = 0, 0
        while i < len(ids):
            n = self.next_batch(weights[i:i + self.max_rows])
            sizes = self.groups(weights[i:i + n])
            parts, at = [], i
            for k in sizes:
                parts.append(ids[at:at + k])
                at += k
            t0 = self.clock()
            taken, removed, held = fn(parts, self.deadline)
            dt = self.clock() - t0
            held = min(max(0.0, held), dt)  # (what it waited for the lock first: dt - held)
            if not 1 <= taken <= len(parts):  # (the store's contract: the first group always goes)
                raise RuntimeError(f"a removal transaction did {taken} of {len(parts)} groups")
            rows = sum(sizes[:taken])
            units = sum(weights[i:i + rows])
            done += removed
            i += rows
            self.log.add(rows, units, held, dt - held)
            self.log.stopped += taken < len(parts)
            self.observe(units, held)
            if self.pause and i < len(ids):
                self.sleep(self.pause)
        return done
