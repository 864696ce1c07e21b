"""Balanced condensation (issue #17): properties over random histories, windows and fan-ins.

Two levels. The algorithm (dag_balance.next_condensation + the block's rendering) is run over
hundreds of simulated passes per example for windows from 16K to 1M tokens: depth bound, one
root path per leaf, same-depth children, at most one condensation per node, calls bound, a
block that always fits. Then the real engine (SQLite, extractive summariser) replays random
generated sessions the way the host does: every output valid and within target, every stored
message reachable exactly once from the context, one leaf per message, same-depth children,
depth within ⌈log_fanin(leaves)⌉ + 1.
"""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lossless_context.pipeline.assemble import render_summary
from lossless_context.pipeline.validate import pairing_problems
from lossless_context.pipeline.dag_balance import condense_run, depth_bound, next_condensation, node_targets, partial_run
from lossless_context.records import SummaryRecord
from lossless_context.tokens import estimate_message_tokens

WORDS = ("deploy ledger invoice parser ERR_QUOTA_7 src/app/main.py retry batch window 4821 cache "
         "token migration config value user asked decided fixed").split()


def _text(rng: random.Random, tokens: int) -> str:
    out, n = [], 0
    while n < tokens * 4:
        w = rng.choice(WORDS)
        out.append(w)
        n += len(w) + 1
    return " ".join(out)


def _block_budget(window: int, cond_cap: int) -> int:
    """The engine's block budget for a window (engine._budget's formula, no overhead)."""
    threshold = int(window * 0.75)
    target = max(1000, int(max(2000, threshold) * 0.55))
    return max(400, min(int(target * 0.25), 8 * cond_cap))


def _render(roots: list[dict], limit: int) -> dict:
    recs = [SummaryRecord(r["id"], "", "", r["depth"], r["text"], r["tokens"], 0, "", "", None, None,
                          r["n"], "", None, 0.0) for r in roots]
    return render_summary(recs, sum(r["n"] for r in roots), "user", max_tokens=limit)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(window=st.integers(16_000, 1_000_000), fanin=st.integers(2, 8), leaf_cap=st.integers(50, 3000),
       cond_cap=st.integers(50, 4000), passes=st.integers(1, 160), per_pass=st.integers(1, 3),
       seed=st.integers(0, 10_000))
def test_simulated_passes_keep_a_balanced_dag(window, fanin, leaf_cap, cond_cap, passes, per_pass, seed):
    rng = random.Random(seed)
    block = _block_budget(window, cond_cap)
    leaf_t, cond_t = node_targets(block, fanin, leaf_cap, cond_cap)
    assert leaf_t <= leaf_cap and cond_t <= cond_cap
    limit = block
    roots: list[dict] = []
    depth_of: dict[int, int] = {}
    children: dict[int, list[int]] = {}
    next_id = [1]
    leaves = condensations = 0

    def new(depth: int, tokens: int, n: int, kids: list[int]) -> dict:
        nid = next_id[0]
        next_id[0] += 1
        depth_of[nid] = depth
        children[nid] = kids
        return {"id": nid, "depth": depth, "tokens": tokens, "text": _text(rng, tokens), "n": n}

    for _ in range(passes):
        for _ in range(rng.randint(1, per_pass)):
            size = max(16, min(leaf_t, int(leaf_t * rng.uniform(0.3, 1.0))))
            roots.append(new(0, size, rng.randint(1, 60), []))
            leaves += 1
        while True:
            run = next_condensation([r["depth"] for r in roots], [r["tokens"] for r in roots], block, fanin,
                                    lambda: estimate_message_tokens(_render(roots, limit)) <= block)
            if run is None:
                break
            a, b = run
            group = roots[a:b]
            assert len({g["depth"] for g in group}) == 1, "children of one node share a depth"
            assert 2 <= len(group) <= fanin
            size = min(cond_t, max(32, sum(g["tokens"] for g in group) // 2))
            roots[a:b] = [new(group[0]["depth"] + 1, size, sum(g["n"] for g in group), [g["id"] for g in group])]
            condensations += 1
        # The block shown to the model fits its budget and names every root.
        msg = _render(roots, limit)
        assert estimate_message_tokens(msg) <= block, (estimate_message_tokens(msg), block, len(roots))
        assert all(f"s{r['id']}" in msg["content"] for r in roots)
        # Depth never passes the bound; the roots run from coarse (old) to fine (new).
        assert max(r["depth"] for r in roots) <= depth_bound(leaves, fanin)
        ds = [r["depth"] for r in roots]
        assert ds == sorted(ds, reverse=True)
    # Every leaf under exactly one root path; every node condensed at most once.
    seen: list[int] = []
    stack = [r["id"] for r in roots]
    while stack:
        nid = stack.pop()
        seen.append(nid)
        kids = children[nid]
        assert len({depth_of[k] for k in kids}) <= 1
        stack.extend(kids)
    assert len(seen) == len(set(seen)) == len(depth_of)
    assert sum(1 for n in seen if depth_of[n] == 0) == leaves
    assert condensations <= leaves / (fanin - 1) + 1


def test_condense_run_takes_the_oldest_full_run_of_the_shallowest_depth():
    assert condense_run([2, 1, 1, 0, 0, 0, 0, 0], 4) == (3, 7)
    assert condense_run([2, 1, 1, 1, 1, 0, 0], 4) == (1, 5)
    assert condense_run([3, 2, 1, 0], 2) is None  # distinct depths: never merged across depths
    assert condense_run([402, 0, 0, 0], 4) is None  # an old chain's top is not merged with leaves
    assert partial_run([402, 0, 0, 0], 4) == (1, 4)
    assert partial_run([3, 2, 1, 0], 4) is None


def test_block_within_budget_renders_shorter_not_deeper():
    rng = random.Random(3)
    roots = [{"id": i, "depth": d, "tokens": 900, "text": _text(rng, 900), "n": 40} for i, d in
             enumerate([3, 3, 2, 2, 2, 1, 0, 0], start=10)]
    assert next_condensation([r["depth"] for r in roots], [900] * 8, 2000, 4, lambda: True) is None
    msg = _render(roots, 2000)
    assert estimate_message_tokens(msg) <= 2000
    assert "lcm_expand(\"s10\")" in msg["content"]  # a cut body says how to see it whole
    tiny = _render(roots, 150)  # not even headers fit: ids only, still every node named
    assert all(f"s{r['id']}" in tiny["content"] for r in roots)
    assert pairing_problems([msg, {"role": "assistant", "content": "ok"}]) == []


# -- the real engine ---------------------------------------------------------------------------

def _published_shape(store) -> tuple[int, int, int, list, list]:
    c = store.conn()
    leaves = c.execute("SELECT COUNT(*) FROM summaries WHERE state='published' AND kind='leaf'").fetchone()[0]
    depth = c.execute("SELECT COALESCE(MAX(depth), 0) FROM summaries WHERE state='published'").fetchone()[0]
    fanin_max = c.execute("SELECT COALESCE(MAX(k), 0) FROM (SELECT COUNT(*) k FROM summary_parents"
                          " GROUP BY parent_id)").fetchone()[0]
    mixed = c.execute("SELECT p.parent_id FROM summary_parents p JOIN summaries s ON s.id = p.child_id"
                      " GROUP BY p.parent_id HAVING COUNT(DISTINCT s.depth) > 1").fetchall()
    wrong = c.execute("SELECT p.parent_id FROM summary_parents p JOIN summaries s ON s.id = p.child_id"
                      " JOIN summaries q ON q.id = p.parent_id GROUP BY p.parent_id"
                      " HAVING MAX(q.depth) != MAX(s.depth) + 1").fetchall()
    return leaves, depth, fanin_max, mixed, wrong


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(window=st.sampled_from([16_000, 20_000, 32_000, 48_000]), n=st.integers(250, 1200),
       fanin=st.integers(2, 6), leaf_cap=st.integers(100, 3000), seed=st.integers(0, 50))
def test_engine_replay_keeps_dag_balanced_valid_and_lossless(window, n, fanin, leaf_cap, seed):
    import shutil
    import tempfile
    from pathlib import Path

    from lossless_context.demo import replay, with_timestamps
    from lossless_context.engine import LCMEngine
    from lossless_context.demo.sessions import coding_session
    from tests.support.dagcheck import assert_connected

    work = Path(tempfile.mkdtemp(prefix="lcm-dag-"))
    try:
        eng = LCMEngine(context_length=window, store=str(work / "lcm.db"), summarizer="extractive",
                        condense_fanin=fanin, leaf_summary_tokens=leaf_cap)
        real = eng.compress

        def checked(messages, *a, **kw):
            out = real(messages, *a, **kw)
            assert pairing_problems(out) == [], pairing_problems(out)
            reason = eng.get_status().get("lcm_last_reason") or ""
            assert not reason.startswith("target"), reason  # within target
            return out

        eng.compress = checked  # the host calls it through the instance
        msgs = with_timestamps(coding_session(n, seed).messages)
        host = replay(eng, msgs, "prop", window)
        assert host.compactions >= 1
        assert_connected(eng.store, host.session_id)  # every stored message reached exactly once
        leaves, depth, fan, mixed, wrong = _published_shape(eng.store)
        assert not mixed and not wrong, (mixed, wrong)
        assert fan <= fanin
        assert depth <= depth_bound(leaves, fanin), (depth, leaves, fanin)
        multi = eng.store.conn().execute(
            "SELECT message_id FROM summary_messages sm JOIN summaries s ON s.id = sm.summary_id"
            " WHERE s.state='published' GROUP BY message_id HAVING COUNT(*) > 1").fetchall()
        assert not multi
        eng.store.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
