"""Issue #43: a prune's transactions are bounded by time, not by a count of rows (ops/batches.py).

Driven by an injected clock: each row's removal "costs" a fixed part plus its tokens' share of
simulated time, so what the batch sizing does is seen without timing anything real.
"""

from __future__ import annotations

from lossless_context.ops.batches import GROUPS, ROW_TOKENS, TimedBatches

BUDGET = 0.04


class FakeStore:
    """Removes rows on a simulated clock: ``row_s`` per row plus ``token_s`` per token, and
    ``stall`` extra seconds for the listed ids (a row slow for reasons of its own)."""

    def __init__(self, tokens: dict[int, int], row_s: float = 0.0002, token_s: float = 0.0000008,
                 stall: dict[int, float] | None = None, wait: dict[int, float] | None = None) -> None:
        self.now = 0.0
        self.tokens, self.row_s, self.token_s, self.stall = tokens, row_s, token_s, stall or {}
        self.wait = wait or {}  # transaction number -> seconds it waits for the write lock first
        self.parts: list[list[int]] = []  # what each transaction removed
        self.spent: list[float] = []
        self.offered: list[int] = []  # the rows each transaction was given

    def clock(self) -> float:
        return self.now

    def remove(self, groups: list[list[int]], seconds: float) -> tuple[int, int, float]:
        """One transaction, as Store.remove_rows runs it: the write lock waited for (another
        writer's turn), then group after group, the clock read between two, a commit once
        ``seconds`` have passed (the first group always goes); the time held returned."""
        self.now += self.wait.get(len(self.parts), 0.0)
        t0, part = self.now, []
        done = 0
        for g in groups:
            if done and self.now - t0 >= seconds:
                break
            self.now += sum(self.row_s + self.token_s * self.tokens[i] + self.stall.get(i, 0.0) for i in g)
            part += g
            done += 1
        self.parts.append(part)
        self.spent.append(self.now - t0)
        self.offered.append(sum(len(g) for g in groups))
        return done, len(part), self.now - t0


def _batches(fake: FakeStore) -> TimedBatches:
    return TimedBatches(budget=BUDGET, pause=0.05, clock=fake.clock, sleep=lambda s: None)


def test_the_budget_is_respected_in_rows():
    b = TimedBatches(budget=BUDGET, clock=lambda: 0.0, sleep=lambda s: None)
    b.unit_seconds = 0.0005  # measured: half a millisecond per unit → 80 units fit in 40 ms
    assert b.next_batch([1.0] * 1000) == 80
    assert b.next_batch([2.0] * 1000) == 40  # rows twice as heavy: half as many
    assert b.next_batch([1.0] * 10 + [200.0] + [1.0] * 100) == 10  # stops before the heavy row
    assert b.next_batch([200.0, 1.0, 1.0]) == 1  # a row heavier than the budget goes alone
    assert b.next_batch([1.0] * 10) == 10
    b.unit_seconds = 1e-9
    assert b.next_batch([1.0] * 10_000) == b.max_rows  # the ceiling whatever the rate


def test_a_slow_transaction_makes_the_next_one_smaller_and_a_fast_one_grows_it_gently():
    b = TimedBatches(budget=BUDGET, clock=lambda: 0.0, sleep=lambda s: None)
    b.unit_seconds = 0.0005
    n0 = b.next_batch([1.0] * 1000)
    b.observe(units=n0, seconds=4 * BUDGET)  # four times over: the next takes a quarter
    n1 = b.next_batch([1.0] * 1000)
    assert n1 == n0 // 4
    b.observe(units=n1, seconds=BUDGET / 10)  # ten times faster: half-way, not ×10
    n2 = b.next_batch([1.0] * 1000)
    assert n1 < n2 < 10 * n1


def test_mixed_rows_every_transaction_stays_near_the_budget_and_a_huge_row_goes_alone():
    # 3,000 short messages, a run of long ones, one huge one, short ones again (ids in order,
    # as a prune removes them): rows sized by count would take 60x longer on the long run.
    tokens = {i: 50 for i in range(3000)}
    tokens.update({i: 6000 for i in range(3000, 3400)})
    tokens[3400] = 400_000
    tokens.update({i: 50 for i in range(3401, 5000)})
    fake = FakeStore(tokens)
    b = _batches(fake)
    assert b.run(list(tokens), fake.remove, tokens) == 5000
    assert sorted(i for p in fake.parts for i in p) == list(range(5000))  # each row once, in order
    assert [3400] in fake.parts  # the huge row alone
    # after the first transaction (the rate not yet measured), none overruns the budget by
    # more than the model's error (the fixed/text split of a row's cost is approximate)
    multi = [(len(p), s) for p, s in zip(fake.parts[1:], fake.spent[1:]) if len(p) > 1]
    assert multi and max(s for _n, s in multi) <= 1.5 * BUDGET, max(s for _n, s in multi)
    # and none is much smaller than it needs to be once measured (the budget is used)
    short = [s for p, s in zip(fake.parts[2:], fake.spent[2:]) if len(p) > 1 and p[-1] < 2990]
    assert sum(short) / len(short) >= 0.6 * BUDGET
    # the long rows' transactions take fewer rows than the short rows' did
    short_rows = max(len(p) for p in fake.parts if p[0] < 3000 and p[-1] < 3000)
    long_rows = max(len(p) for p in fake.parts if 3000 <= p[0] and p[-1] < 3400)
    assert long_rows * 10 < short_rows, (long_rows, short_rows)
    assert b.log.transactions == len(fake.parts) and abs(b.log.longest_s - max(fake.spent)) < 1e-9


def test_a_slow_row_makes_the_next_transaction_smaller():
    tokens = {i: 50 for i in range(4000)}
    fake = FakeStore(tokens, stall={1500: 0.3})  # one row stalls 300 ms (a lock, a page fault)
    b = _batches(fake)
    b.run(list(tokens), fake.remove, tokens)
    k = next(j for j, p in enumerate(fake.parts) if 1500 in p)
    before, after = len(fake.parts[k - 1]), len(fake.parts[k + 1])
    assert after * 4 < before, (before, after)
    # and it recovers: a few transactions later the batches are back near their size
    assert max(len(p) for p in fake.parts[k + 1:k + 12]) * 2 > before


def test_a_wait_for_the_lock_is_not_counted_as_the_rows_cost():
    # transactions 5 and 6 each wait a second for the write lock (a host's write, a merge
    # step of another process): what their rows cost is unchanged, so the batches after them
    # keep their size (counting the wait made them a row or two each), and the log says how
    # long the lock was held apart from the wait
    tokens = {i: 50 for i in range(6000)}
    fake = FakeStore(tokens, wait={5: 1.0, 6: 1.0})
    b = _batches(fake)
    assert b.run(list(tokens), fake.remove, tokens) == 6000
    sizes = [len(p) for p in fake.parts]
    assert min(sizes[7:12]) * 2 > sizes[4], sizes[:14]
    assert b.log.longest_s < 0.2 and b.log.longest_wait_s >= 1.0, (b.log.longest_s, b.log.longest_wait_s)


def test_unweighed_rows_count_their_fixed_part():
    fake = FakeStore({i: 0 for i in range(500)})
    b = _batches(fake)
    assert b.run(list(range(500)), fake.remove) == 500
    assert TimedBatches.units(0) == 1.0 and TimedBatches.units(ROW_TOKENS) == 2.0


def test_a_transaction_that_runs_long_stops_at_the_deadline_and_the_rest_leads_the_next():
    # 6,000 short messages; rows 2,000-2,999 cost four times what the measured rate says (shared
    # cores, pages read from disk): a batch sized for 40 ms takes ~160 ms unless it stops.
    tokens = {i: 50 for i in range(6000)}
    base = FakeStore(tokens).row_s + FakeStore(tokens).token_s * 50
    fake = FakeStore(tokens, stall={i: 3 * base for i in range(2000, 3000)})
    b = _batches(fake)
    assert b.run(list(tokens), fake.remove, tokens) == 6000
    assert [i for p in fake.parts for i in p] == list(range(6000))  # each row once, in order
    stopped = [k for k, p in enumerate(fake.parts) if len(p) < fake.offered[k]]
    assert stopped and b.log.stopped == len(stopped)
    # a stopped transaction ran past the deadline by at most its last group (an eighth of the
    # budget as predicted, four times over here), never by the rest of its batch
    group = 4 * BUDGET / GROUPS * 1.5
    assert max(fake.spent) <= b.deadline + group, (max(fake.spent), b.deadline + group)
    assert all(fake.spent[k] >= b.deadline for k in stopped)
    # what a stopped transaction left leads the next one (nothing skipped, nothing repeated)
    for k in stopped:
        assert fake.parts[k + 1][0] == fake.parts[k][-1] + 1
    # the groups follow the rows' weights: a transaction's groups each near budget / GROUPS
    sizes = b.groups([1.0] * 40 + [40.0] + [1.0] * 40)
    assert sum(sizes) == 81 and 1 in sizes and max(sizes) < 40
    # a store whose groups cost more each (PostgreSQL: Store.removal_groups) asks for fewer
    two = TimedBatches(budget=BUDGET, clock=lambda: 0.0, sleep=lambda s: None, groups=2)
    eight = TimedBatches(budget=BUDGET, clock=lambda: 0.0, sleep=lambda s: None)
    assert len(two.groups([1.0] * 80)) == 2 and len(eight.groups([1.0] * 80)) == GROUPS


def test_a_store_that_reports_no_group_done_is_an_error():
    fake = FakeStore({i: 0 for i in range(10)})
    b = _batches(fake)
    try:
        b.run(list(range(10)), lambda groups, seconds: (0, 0, 0.0))
    except RuntimeError as exc:
        assert "0 of" in str(exc)
    else:
        raise AssertionError("a removal that did nothing went unnoticed")
