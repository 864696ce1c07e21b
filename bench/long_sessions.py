"""Long sessions: the summary DAG's shape and cost at small windows and long histories.

Each point drives one generated coding session through our engine with the R19 host calls
(`bench.host.HostDriver`), summarising through a FakeOpenAI server on 127.0.0.1 whose
replies are as long as a real model's (`ModelLengthResponder`: ~900 words, never past the
request's `max_tokens`, as a real server stops there). Reported per (window, messages):

* leaves, the deepest node and the bound ⌈log_fanin(leaves)⌉ + 1;
* summariser calls and tokens sent (the fake server's recorded requests), per 1k messages;
* planted facts visible in the final context (exact, or all distinctive terms);
* planted identifiers whose FIRST `lcm_grep` hit is the original message;
* pass wall time.

The same session also goes through Hermes' built-in `ContextCompressor` (same server, same
host calls) for its calls and tokens. The grid is windows × sizes; the full grid is long on a
shared 2-core machine, so `cfg["long_grid"]` (or `--quick`) picks a subset and the result
says which points ran.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from pathlib import Path
from typing import Any

from . import common
from .common import dist
from .host import HostDriver, estimate

FULL_GRID = [(w, n) for w in (32_000, 64_000, 128_000, 200_000) for n in (10_000, 36_000, 100_000)]
QUICK_GRID = [(32_000, 800)]

_KEEP = re.compile(r"\d|[\w.-]*/[\w./-]+|\b[A-Za-z]+_[A-Za-z0-9_]+\b|\b[A-Z][A-Z0-9_]{3,}\b")
_FILLER = ("The agent kept working on the task described above, checked the results of each step "
           "against the user's constraints, noted what remained open and moved on to the next item. ").split()


class ModelLengthResponder:
    """A summariser reply as long as a real model's: up to `words` words (900 by default) and
    at most half the source's words, cut where the request's `max_tokens` would stop a real
    server (~4 characters a token).
    It keeps the source's identifier-bearing lines in order (as a model keeps ids, paths and
    numbers) and fills the rest with prose, so length, not content, is what it models."""

    def __init__(self, words: int = 900) -> None:
        from tests.support.fake_openai import summary_source_text

        self.words = words
        self._source = summary_source_text
        self._lock = threading.Lock()
        self.calls = 0

    def reply_text(self, source: str, max_tokens: int | None) -> str:
        budget = max(8, min(self.words, len(source.split()) // 2))
        out: list[str] = []
        n = 0
        seen: set[str] = set()
        for raw in source.splitlines():
            line = raw.strip()[:160]
            if not line or line in seen or not _KEEP.search(line):
                continue
            w = len(line.split())
            if n + w + 1 > budget:
                break
            seen.add(line)
            out.append("- " + line)
            n += w + 1
        filler = [_FILLER[k % len(_FILLER)] for k in range(max(0, budget - n))]
        text = "Summary:\n" + "\n".join(out) + ("\n" + " ".join(filler) if filler else "")
        if max_tokens:  # a real server stops at max_tokens (~4 characters a token)
            text = text[: int(max_tokens * 4 * 0.95)]
        return text

    def __call__(self, req: dict[str, Any]) -> Any:
        from tests.support.fake_openai import Reply, estimate_tokens, prompt_tokens_for

        with self._lock:
            self.calls += 1
        mt = req.get("max_tokens") or req.get("max_completion_tokens")
        text = self.reply_text(self._source(req), int(mt) if isinstance(mt, (int, float)) else None)
        pt = prompt_tokens_for(req)
        ct = estimate_tokens(text)
        return Reply(content=text, usage={"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct})


def depth_bound(leaves: int, fanin: int) -> int:
    """⌈log_fanin(leaves)⌉ + 1 (1 for a single leaf)."""
    if leaves <= 1:
        return 1
    return math.ceil(math.log(leaves) / math.log(fanin) - 1e-9) + 1


def _server() -> Any:
    """One FakeOpenAI with the model-length responder; the host's auxiliary client (the
    built-in compressor's summariser) is pointed at it through $HERMES_HOME/config.yaml."""
    srv = common.fake_server()
    srv.set_responder(ModelLengthResponder())
    return srv


def first_hit_is_original(engine: Any, value: str) -> bool:
    """Is the first hit `lcm_grep(value)` returns a message that holds `value`?"""
    from lossless_context.demo import expand_message

    try:
        res = json.loads(engine.handle_tool_call("lcm_grep", {"query": value, "limit": 10}))
    except Exception:
        return False
    hits = [h for g in res.get("groups", []) for h in g.get("hits", [])]
    if not hits or hits[0].get("kind") != "message":
        return False
    msg = expand_message(engine, hits[0]["id"])
    return msg is not None and value in json.dumps(msg, ensure_ascii=False)


def _dag_shape(store: Any) -> dict[str, Any]:
    c = store.conn()
    leaves = c.execute("SELECT COUNT(*) FROM summaries WHERE state='published' AND kind='leaf'").fetchone()[0]
    nodes = c.execute("SELECT COUNT(*) FROM summaries WHERE state='published'").fetchone()[0]
    depth = c.execute("SELECT COALESCE(MAX(depth), 0) FROM summaries WHERE state='published'").fetchone()[0]
    mixed = c.execute(
        "SELECT COUNT(*) FROM (SELECT p.parent_id FROM summary_parents p JOIN summaries s ON s.id = p.child_id"
        " GROUP BY p.parent_id HAVING COUNT(DISTINCT s.depth) > 1)").fetchone()[0]
    return {"leaves": leaves, "nodes": nodes, "max_depth": depth, "mixed_depth_parents": mixed}


def run_point(window: int, n: int, which: str, session: Any, srv: Any, work: Path,
              fanin: int = 4) -> dict[str, Any]:
    from lossless_context.demo.sessions import SYSTEM_PROMPT

    from .side_by_side import _builtin, canary_recall

    srv.clear()
    if which == "lcm":
        store = str(work / f"long-{window}-{n}.db")
        eng = common.make_engine(store, context_length=window, summarizer="openai",
                                 summary_base_url=srv.base_url, condense_fanin=fanin)
    else:
        eng = _builtin(window, srv.base_url)
    drv = HostDriver(eng, session_id=f"long-{window}-{n}", system_prompt=SYSTEM_PROMPT, context_length=window,
                     model=common.MODEL, base_url=srv.base_url, api_key=common.API_KEY)
    drv.start()
    t0 = time.perf_counter()
    drv.feed(session.messages)
    drv.end()
    wall = time.perf_counter() - t0
    stats = common.chat_request_stats(srv.requests)
    final = drv.context()
    adopted = [p for p in drv.passes if p.adopted]
    res: dict[str, Any] = {
        "engine": which, "window": window, "messages": n, "compactions": len(adopted),
        "summariser_calls": stats["calls"], "summariser_tokens_sent": stats["tokens_sent"],
        "calls_per_1k_messages": round(stats["calls"] / n * 1000, 2),
        "tokens_sent_per_1k_messages": round(stats["tokens_sent"] / n * 1000),
        "pass_wall_ms": dist([p.wall_ms for p in adopted], 1), "session_wall_s": round(wall, 1),
        "final_context_tokens": estimate(final),
    }
    rc = canary_recall(session, final, None)
    res["planted"] = rc["canaries"]
    res["facts_in_context"] = rc["in_context_exact"] + rc["in_context_paraphrased"]
    res["facts_in_context_share"] = round(res["facts_in_context"] / max(1, rc["canaries"]), 3)
    if which == "lcm":
        res.update(_dag_shape(eng.store))
        res["depth_bound"] = depth_bound(res["leaves"], fanin)
        res["calls_bound"] = math.floor(res["leaves"] * (1 + 1 / (fanin - 1))) + 2
        firsts = sum(1 for c in session.canaries if first_hit_is_original(eng, c.value))
        res["first_hit_original"] = firsts
        res["first_hit_original_share"] = round(firsts / max(1, len(session.canaries)), 3)
        eng.store.close()
    return res


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    from lossless_context.demo.sessions import coding_session

    quick = cfg["quick"]
    grid = cfg.get("long_grid") or (QUICK_GRID if quick else FULL_GRID)
    engines = cfg.get("long_engines") or ("lcm", "builtin")
    try:
        import agent.context_compressor  # noqa: F401
    except Exception:
        engines = tuple(e for e in engines if e != "builtin")
    srv = _server()
    previous = srv.responder
    work = Path(common.isolate_env()) / "long_sessions"
    work.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, Any]] = []
    sessions: dict[int, Any] = {}
    for window, n in grid:
        session = sessions.get(n) or sessions.setdefault(n, coding_session(n, seed=17))
        for which in engines:
            t0 = time.perf_counter()
            r = run_point(window, n, which, session, srv, work)
            runs.append(r)
            extra = (f", {r['leaves']} leaves, depth {r['max_depth']} (bound {r['depth_bound']}), first hit "
                     f"original {r['first_hit_original']}/{r['planted']}") if which == "lcm" else ""
            print(f"  long_sessions {window // 1000}K × {n}/{which}: {r['summariser_calls']} calls{extra}, "
                  f"{time.perf_counter() - t0:.0f}s", flush=True)
    srv.set_responder(previous)
    return {"grid": [list(p) for p in grid], "full_grid": [list(p) for p in FULL_GRID], "fanin": 4,
            "reply_words": 900, "runs": runs}
