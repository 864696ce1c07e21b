"""Just the lcm_grep part of the scale bench, on a store ``bench.scale build`` made:

    python -m bench.scale build --store S --n 1000000 --real-cap 100000 --out build.json
    python -m bench.grep_scale --store S

The text, question, identifier and CJK queries of ``bench/scale.py`` from a live session of the
built conversation, each with this release's ranking and the previous one (context ranking and
originals-first off), interleaved so machine noise hits both alike; p50 in ms."""

from __future__ import annotations

import argparse
import json
import time

from . import common
from .recall_demo import previous_ranking
from .scale import CJK_UNIQUE, CONV, LIVE_CONTEXT, TEXT_QUERY

QUERIES = (("text", TEXT_QUERY), ("question", "when did we decide to move the quota file?"),
           ("keywords", "webhook retries limit"), ("identifier", "reconcile_day"), ("cjk_substring", CJK_UNIQUE))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.grep_scale")
    ap.add_argument("--store", required=True)
    ap.add_argument("--reps", type=int, default=9)
    a = ap.parse_args(argv)
    common.isolate_env()
    common.quiet_logs()
    eng = common.make_engine(a.store, context_length=LIVE_CONTEXT)
    eng.on_session_start("live", conversation_id=CONV, platform="cli")
    out: dict = {"messages": eng.store.max_row_id("messages")}
    for kind, q in QUERIES:
        eng.handle_tool_call("lcm_grep", {"query": q})  # warm the page cache for both arms alike
        ts: dict[str, list[float]] = {"this": [], "previous": []}
        for _ in range(a.reps):
            for arm in ("this", "previous"):
                t0 = time.perf_counter()
                if arm == "previous":
                    with previous_ranking():
                        r = eng.handle_tool_call("lcm_grep", {"query": q})
                else:
                    r = eng.handle_tool_call("lcm_grep", {"query": q})
                ts[arm].append((time.perf_counter() - t0) * 1000)
        out[kind] = {"query": q, "hits": json.loads(r).get("hits"),
                     **{arm: common.dist(v, 2) for arm, v in ts.items()}}
        print(kind, {arm: out[kind][arm]["p50"] for arm in ts}, flush=True)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
