"""Zero-wait compaction: how long the host waits in compress() with the background worker on
versus off, on a long session with a deliberately slow summariser (issue 9).

Both runs drive the same newer-host call sequence (on_turn_complete after every turn, then
should_compress/compress with the commit signal) through the same FakeOpenAI server whose
every summary call is delayed. The user's think time between turns is simulated by letting
the worker drain for a bounded time. Passes above the hard threshold block by design and are
reported apart; the ratio is over passes below it.
"""

from __future__ import annotations

import copy
import tempfile
import time
from pathlib import Path
from typing import Any

from . import common


def _drive(url: str, store: str, msgs: list[dict], background: bool, think: float) -> dict[str, Any]:
    from lossless_context.pipeline.background import BackgroundWorker
    from lossless_context.demo.sessions import turn_ranges
    from lossless_context.tokens import estimate_messages_tokens

    ctx = 64_000
    e = common.make_engine(store, context_length=ctx, summarizer="openai", summary_base_url=url,
                           background_compaction=background, soft_threshold=0.45)
    sid = "bg-bench"
    e.update_model(model=common.MODEL, context_length=ctx, base_url="", api_key="", provider="custom")
    e.on_session_start(sid, platform="bench")
    history: list[dict] = []
    waits: list[tuple[float, bool]] = []  # (seconds in compress, below the hard threshold)
    for a, b in turn_ranges(msgs):
        history.extend(copy.deepcopy(msgs[a:b]))
        e.on_turn_complete(copy.deepcopy(history), session_id=sid)
        if background:  # the user reads and types: the worker gets that time
            BackgroundWorker.for_store(e.store.location, e.config.background_concurrency).wait_idle(think)
        tokens = estimate_messages_tokens(history)
        if not e.should_compress(tokens):
            continue
        t0 = time.perf_counter()
        out = e.compress(history, current_tokens=tokens, session_id=sid)
        waited = time.perf_counter() - t0
        if out == history:
            continue
        waits.append((waited, tokens < e.config.hard_threshold * ctx))
        e.on_session_end(sid, history)
        history = [m for m in out if m.get("role") != "system"]
        e.on_session_start(sid, boundary_reason="compression", old_session_id=sid)
    if background:
        BackgroundWorker.for_store(e.store.location, e.config.background_concurrency).wait_idle(60)
    levels: dict[str, int] = {}
    for s in e.store.get_summaries(range(1, 100_000)).values():
        levels[s.level] = levels.get(s.level, 0) + 1
    below = [w for w, ok in waits if ok]
    return {
        "passes": len(waits), "passes_below_hard": len(below),
        "wait_below_hard": common.dist([w * 1000 for w in below]),
        "wait_total_s": round(sum(w for w, _ in waits), 3),
        "wait_below_hard_total_s": round(sum(below), 3),
        "summary_levels": levels, "presummaries": e.store.count_presummaries(),
    }


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    from lossless_context.demo.sessions import coding_session
    from tests.support.fake_openai import Delay, FailureSequence, FakeOpenAI, SummariserResponder

    quick = cfg.get("quick")
    delay = 0.2 if quick else 2.0
    n = 500 if quick else 3000
    think = 5.0 if quick else 20.0
    msgs = coding_session(n, seed=11).messages
    out: dict[str, Any] = {"messages": n, "summary_delay_s": delay, "think_time_cap_s": think}
    with tempfile.TemporaryDirectory(prefix="lcm-bg-bench-") as d:
        for name, background in (("off", False), ("on", True)):
            responder = FailureSequence([Delay(delay)], base=SummariserResponder(max_chars=1200), cycle=True)
            with FakeOpenAI(responder=responder) as srv:
                res = _drive(srv.base_url, str(Path(d) / f"{name}.db"), msgs, background, think)
                res["summariser_calls"] = len(srv.chat_requests)
            out[name] = res
            print(f"  background {name}: {res['passes']} passes, waited {res['wait_below_hard_total_s']} s below "
                  f"the hard threshold", flush=True)
    off, on = out["off"]["wait_below_hard_total_s"], out["on"]["wait_below_hard_total_s"]
    out["wait_ratio_off_on"] = round(off / on, 1) if on else None
    return out
