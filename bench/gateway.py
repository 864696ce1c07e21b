"""A gateway's store: many users' compacted histories in one store, one user's searches.

`bench.backends` runs this on both backends. Each of `users` users has its own conversation;
the users compact in turns (a pass each: a few messages and the leaf summaries over them), so
every user's messages and summaries are runs of ids between everyone else's, as a gateway
serving them at once writes them. Then, for the oldest, a middle and the newest user, a fresh
engine in a new session of that user's conversation (its lineage: that user's history) times
`lcm_grep` for a question whose words every user's summaries hold, a word they all hold and an
identifier only that user's history holds. The baseline, in the same run: the same user's
history alone in a store of its own (the same texts), the same searches. The ratio
gateway/alone is what the other users cost a search; it stays near 1 when a search reads only
its own lineage.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from typing import Any

from . import common

VOCAB = ("deploy window ledger invoice cache queue shard replica quota cursor schema migration billing "
         "export import tenant report dashboard alert metric latency budget review release branch build "
         "test fixture config secret token session worker cron backup restore index vacuum lock").split()
TOPIC = "the retry limit for the flaky webhook retries was raised after review"
QUERIES = (("question", "what did we decide about the retry limit for flaky webhook retries"),
           ("common word", "deploy"), ("own identifier", None))
WINDOW = 64_000


def _user_texts(k: int, passes: int, per_pass: int) -> list[tuple[list[str], list[str]]]:
    """(message texts, summary texts) of each of user k's passes: the same for every store."""
    rng = random.Random(1000 + k)
    out = []
    for p in range(passes):
        msgs = [" ".join(rng.choice(VOCAB) for _ in range(12)) + (f" saw ERR_GW_{k}_TIMEOUT" if p == 0 and j == 0
                                                                   else "") for j in range(2 * per_pass)]
        sums = [" ".join(rng.choice(VOCAB) for _ in range(40)) + (" " + TOPIC if rng.random() < 0.3 else "")
                + (f" ERR_GW_{k}_TIMEOUT" if p == 0 and j == 0 else "") for j in range(per_pass)]
        out.append((msgs, sums))
    return out


def _message(text: str, t: float) -> Any:
    from lossless_context.records import NewMessage

    return NewMessage(raw={"role": "user", "content": text}, role="user", ident=uuid.uuid4().hex, uid=None,
                      text=text, tokens=len(text) // 4 + 1, created_at=t)


def build(loc: str, users: list[int], passes: int, per_pass: int) -> dict[str, Any]:
    """Fill the store at `loc` with these users' histories, their passes in turns."""
    from lossless_context.records import NewSummary
    from lossless_context.store import open_store

    t0 = time.perf_counter()
    st = open_store(loc)
    texts = {k: _user_texts(k, passes, per_pass) for k in users}
    t = 1_700_000_000.0
    n_msgs = n_sums = 0
    try:
        for k in users:
            st.ensure_session(f"gw{k}", conversation_id=f"gwconv{k}")
        for p in range(passes):
            for k in users:
                sid = f"gw{k}"
                msgs, sums = texts[k][p]
                mids = st.append_messages(sid, [_message(x, t + j) for j, x in enumerate(msgs)])
                v, e = st.get_context(sid)
                new = [NewSummary(key=f"L{j}", kind="leaf", depth=0, text=x, tokens=len(x) // 4, source_tokens=200,
                                  level="normal", summarizer="bench", t_start=t, t_end=t + 2 * j + 1, n_messages=2,
                                  message_ids=mids[2 * j:2 * j + 2]) for j, x in enumerate(sums)]
                st.stage_pass(sid, f"{sid}-{p}", new, [("s", s.key) for s in new], v, len(e))
                st.publish_pass(f"{sid}-{p}")
                n_msgs += len(msgs)
                n_sums += len(sums)
                t += 10
        common.settle_indexes(st)
    finally:
        st.close()
    if loc.startswith("postgres"):
        common.settle_postgres(loc)
    return {"users": len(users), "messages": n_msgs, "summaries": n_sums,
            "build_seconds": round(time.perf_counter() - t0, 1)}


def measure(loc: str, k: int, reps: int) -> dict[str, Any]:
    """p50 ms of each query for user k, from a new session of its conversation."""
    eng = common.make_engine(loc, context_length=WINDOW)
    eng.on_session_start(f"gw{k}-live", conversation_id=f"gwconv{k}", platform="cli")
    eng.select_context([{"role": "system", "content": "x"}, {"role": "user", "content": "hi"}])
    common.settle_indexes(eng.store)  # (the new session's writes: SQLite merges after them)
    out: dict[str, Any] = {}
    try:
        for kind, q in QUERIES:
            q = q or f"ERR_GW_{k}_TIMEOUT"
            eng.handle_tool_call("lcm_grep", {"query": q})  # warm both stores alike
            ts = []
            for _ in range(reps):
                t0 = time.perf_counter()
                r = json.loads(eng.handle_tool_call("lcm_grep", {"query": q}))
                ts.append((time.perf_counter() - t0) * 1000)
            out[kind] = {"query": q, "ms": common.dist(ts, 3), "hits": r.get("hits")}
    finally:
        eng.store.close()
    return out


def run(backend: str, make_loc: Any, *, quick: bool) -> dict[str, Any]:
    """Build the gateway store and, for three users, their stores alone; measure both.
    `make_loc(name)` gives a fresh store location on `backend`."""
    users, passes, per_pass, reps = (8, 3, 3, 5) if quick else (300, 40, 4, 9)
    everyone = list(range(users))
    gw = make_loc("gateway")
    built = build(gw, everyone, passes, per_pass)
    rows = []
    for label, k in (("oldest", 0), ("middle", users // 2), ("newest", users - 1)):
        alone = make_loc(f"alone{k}")
        build(alone, [k], passes, per_pass)
        m_gw, m_alone = measure(gw, k, reps), measure(alone, k, reps)
        for kind, _ in QUERIES:
            a, b = m_alone[kind], m_gw[kind]
            rows.append({"user": label, "query": kind, "alone_ms": a["ms"]["p50"], "gateway_ms": b["ms"]["p50"],
                         "ratio": round(b["ms"]["p50"] / a["ms"]["p50"], 2) if a["ms"]["p50"] else None,
                         "hits_alone": a["hits"], "hits_gateway": b["hits"]})
    return {"backend": backend, "build": built, "passes_per_user": passes, "summaries_per_pass": per_pass,
            "reps": reps, "rows": rows}
