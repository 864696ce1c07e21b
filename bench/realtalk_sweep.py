"""Dev-half constant sweep for the context ranking on REALTALK (a tool, not a bench part).

Ingests the chats once per window into a kept store, then asks every question of one half
(``dev`` = chats 1-5, where constants may be chosen; ``test`` = 6-10, held out) through
``lcm_grep`` once per variant, a variant being a set of overrides of ``ranking``'s (or
``textsearch.CONTEXT_POOL``'s) module constants. One call at k = 25 per question: the first
50 hits form one ranked block, so its prefixes are the k = 5 and k = 10 answers.

    python -m bench.realtalk_sweep --data DIR --half dev --context 16000 \
        --store /tmp/rt16k.db '{}' '{"WINDOW": 2}' '{"W_SUMMARY": 0.0}'

Prints R@5/R@10/R@25 per category for each variant. The data is read locally, never stored
in the repository.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from . import common, realtalk


def sweep(data: str, store: str, half: str, context: int, variants: list[dict[str, Any]],
          semantic: bool = False) -> list[dict[str, Any]]:
    """R@k tables (for ``half``) of each variant, in order; constants are restored afterwards.
    With ``semantic`` the engine's semantic arm is on (its vectors are embedded into the store
    first) and ``semantic``'s constants (WEIGHT, POOL, RRF_K0) can be varied too."""
    from lossless_context.retrieval import ranking, semantic as sem, textsearch

    chats = realtalk.load(data)
    if not os.path.exists(store):
        realtalk.ingest(store, chats, context_length=context)
    pick = [c for c in chats if (c.number in realtalk.DEV_CHATS) == (half == "dev")]
    if semantic:
        arm = common.make_engine(store, context_length=context, semantic=True).semantic_arm()
        arm.close()
        arm.catch_up()
    asks = {c.number: realtalk.grep_arm(store, c, context_length=context, semantic=semantic) for c in pick}
    out = []
    for v in variants:
        saved = {}
        for name, value in v.items():
            mod = textsearch if name == "CONTEXT_POOL" else sem if name in ("WEIGHT", "POOL", "RRF_K0") else ranking
            saved[name] = (mod, getattr(mod, name))  # an unknown name fails here, loudly
            setattr(mod, name, value)
        try:
            per = []
            for c in pick:
                for q in c.questions:
                    got = asks[c.number](q.question, max(realtalk.KS))
                    gold = set(q.evidence)
                    per.append({"chat": c.number, "category": q.category,
                                **{k: len(gold & set(got[:k])) / len(gold) for k in realtalk.KS}})
        finally:
            for name, (mod, value) in saved.items():
                setattr(mod, name, value)
        key = "dev 1-5" if half == "dev" else "test 6-10"
        out.append({"variant": v, "table": realtalk.table(per)[key]})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.realtalk_sweep", description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="the directory of REALTALK's Chat_*.json files")
    ap.add_argument("--store", required=True, help="SQLite store to ingest into (reused when it exists)")
    ap.add_argument("--half", choices=("dev", "test"), default="dev")
    ap.add_argument("--context", type=int, default=64_000, help="the host's context window (16000 makes summaries)")
    ap.add_argument("--semantic", action="store_true", help="with the semantic arm (the extra's model)")
    ap.add_argument("variants", nargs="*", default=["{}"], help="JSON objects of constant overrides")
    a = ap.parse_args()
    common.isolate_env()
    common.quiet_logs()
    for r in sweep(a.data, a.store, a.half, a.context, [json.loads(v) for v in a.variants], a.semantic):
        cells = {c: (x.get("R@5"), x.get("R@10"), x.get("R@25")) for c, x in r["table"].items()}
        print(json.dumps(r["variant"]), cells, flush=True)


if __name__ == "__main__":
    main()
