"""Our own question set over the generated demo sessions: does ``lcm_grep`` find the planted facts?

``lossless_context.demo.sessions.coding_session`` plants facts (canaries: an error string, a path
in a decision, a number in a tool output, a name said once, …), each with a plain-language
question whose answer it is. A session is driven through the engine (``bench.host.HostDriver``,
a 64K window, the extractive summariser, so the DAG has leaves and condensed nodes), then:

* **questions** — ``lcm_grep(query=question)`` (default scope: messages and summaries, as the
  agent calls it): the rank of the first message hit that is the planted message, reported as
  hit@1/5/10 and MRR@10;
* **identifiers** — ``lcm_grep(query=value)``: the share whose *first* hit is the original
  message (not a summary quoting it), and the share with the original anywhere on page one.

Each figure is measured twice in the same run on the same store: with the ranking of this
release and with the previous one (context ranking and originals-first switched off), so the
difference is the change, not the machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any, Iterator

from . import common


@contextlib.contextmanager
def previous_ranking() -> Iterator[None]:
    """The lcm_grep ranking before context ranking and originals-first (for the same-run baseline)."""
    from lossless_context.retrieval import originals, ranking

    saved = ranking.wants_context, originals.fold
    ranking.wants_context = lambda plan: False  # type: ignore[assignment]
    originals.fold = lambda store, scope, plan, ordered, **kw: ordered  # type: ignore[assignment]
    try:
        yield
    finally:
        ranking.wants_context, originals.fold = saved


def _measure(eng: Any, sess: Any, first_id: int) -> dict[str, Any]:
    ranks: list[int | None] = []
    first_is_original = on_page = 0
    t_q: list[float] = []
    for c in sess.canaries:
        target = first_id + c.message_index
        t0 = time.perf_counter()
        res = json.loads(eng.handle_tool_call("lcm_grep", {"query": c.question, "limit": 10}))
        t_q.append((time.perf_counter() - t0) * 1000)
        msgs = [int(h["id"][1:]) for g in res["groups"] for h in g["hits"] if h["kind"] == "message"]
        ranks.append(msgs.index(target) + 1 if target in msgs else None)
        res = json.loads(eng.handle_tool_call("lcm_grep", {"query": c.value, "limit": 10}))
        hits = [h["id"] for g in res["groups"] for h in g["hits"]]
        first_is_original += bool(hits) and hits[0] == f"m{target}"
        on_page += f"m{target}" in hits
    n = max(1, len(ranks))
    return {
        "questions": len(ranks),
        **{f"hit@{k}": round(100 * sum(1 for r in ranks if r and r <= k) / n, 1) for k in (1, 5, 10)},
        "mrr@10": round(sum(1 / r for r in ranks if r) / n, 3),
        "identifier_first_hit_is_original": round(100 * first_is_original / n, 1),
        "identifier_original_on_page": round(100 * on_page / n, 1),
        "question_ms": common.dist(t_q, 2),
    }


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    from lossless_context.demo.sessions import coding_session

    from .host import HostDriver

    n = 800 if cfg.get("quick") else 3000
    out: dict[str, Any] = {"sessions": []}
    for seed in ((3,) if cfg.get("quick") else (3, 11)):
        store = str(Path(os.environ.get("LCM_BENCH_SCRATCH", "/tmp")) / f"recall-demo-{seed}-{os.getpid()}.db")
        eng = common.make_engine(store, context_length=64_000)
        sess = coding_session(n, seed=seed)
        drv = HostDriver(eng, session_id=f"demo-{seed}", context_length=64_000)
        drv.start()
        drv.feed(sess.messages)
        drv.end()
        eng.store.wait_indexed()
        first = eng.store.session_messages(f"demo-{seed}", limit=1)[0].id
        after = _measure(eng, sess, first)
        with previous_ranking():
            before = _measure(eng, sess, first)
        out["sessions"].append({"seed": seed, "messages": len(sess.messages),
                                "summaries": eng.store.max_row_id("summaries"),
                                "before": before, "after": after})
    return out
