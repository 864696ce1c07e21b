"""Zero wait by default (issue 41): what background compaction costs ahead of need and what it
saves in waiting, on a mix of sessions, with a slow model.

Each configuration replays the same mix through the newer host's calls (`on_turn_complete`
after every turn, then `should_compress` / `compress` and the commit signal; the host's
deepcopies as in `bench/background.py`) against a FakeOpenAI server on 127.0.0.1 whose every
summary call takes 2 s, or 60 s: a short session that crosses the soft threshold and ends below
the compaction threshold (a host's typical session: no pass is ever needed), then a long one
(several passes). Between turns the user reads and types: the worker gets that think time.
*Waiting* = wall time inside `compress()`; *tokens sent* = chars/4 of every request the model
server received (the worker's included, after it has drained); *ahead of need* = tokens sent
with the worker on minus with it off, per session kind: on a short session all of it is spent
for a pass that never comes.

Configurations: worker off; worker on as it was before issue 41 (summarise ahead at every turn
above the soft threshold); worker on as now (`background_compaction: auto`, the spend bound:
ahead only for a session that grew in its last turns and is projected to reach the threshold
soon).
"""

from __future__ import annotations

import copy
import tempfile
import time
from pathlib import Path
from typing import Any

from . import common

WINDOW = 64_000


def _sessions(quick: bool) -> list[tuple[str, list[dict]]]:
    from lossless_context.demo.sessions import coding_session, turn_ranges
    from lossless_context.tokens import estimate_messages_tokens

    out = []
    for k, seed in enumerate((31,) if quick else (31, 32)):
        msgs = coding_session(400, seed=seed).messages
        cut = len(msgs)
        for a, b in turn_ranges(msgs):
            if estimate_messages_tokens(msgs[:b]) > 0.70 * WINDOW:
                cut = a
                break
        out.append((f"short-{k + 1}", msgs[:cut]))
    out.append(("long", coding_session(300 if quick else 700, seed=33).messages))
    return out


def _drive(url: str, store: str, mix: list[tuple[str, list[dict]]], mode: str, think: float,
           srv: Any) -> dict[str, Any]:
    from lossless_context.demo.sessions import turn_ranges
    from lossless_context.pipeline.background import BackgroundWorker
    from lossless_context.tokens import estimate_messages_tokens

    kw: dict[str, Any] = {"summary_timeout": 150, "compaction_time_budget": 400}
    if mode == "off":
        kw["background_compaction"] = False
    elif mode == "on, before #41":
        kw.update(background_compaction=True, background_spend_bound=False)
    e = common.make_engine(store, context_length=WINDOW, summarizer="openai", summary_base_url=url, **kw)
    e.update_model(model=common.MODEL, context_length=WINDOW, base_url="", api_key="", provider="custom")
    res: dict[str, Any] = {"sessions": {}}
    for name, msgs in mix:
        sid = f"mix-{name}"
        e.on_session_start(sid, platform="bench")
        history: list[dict] = []
        waits: list[float] = []
        sent0 = _sent(srv)
        for a, b in turn_ranges(msgs):
            history.extend(copy.deepcopy(msgs[a:b]))
            e.on_turn_complete(copy.deepcopy(history), session_id=sid)
            if mode != "off":  # the user reads and types: the worker gets that time
                BackgroundWorker.for_store(e.store.location, e.config.background_concurrency).wait_idle(think)
            tokens = estimate_messages_tokens(history)
            if not e.should_compress(tokens):
                continue
            t0 = time.perf_counter()
            out = e.compress(history, current_tokens=tokens, session_id=sid)
            waits.append(time.perf_counter() - t0)
            if out == history:
                continue
            e.on_session_end(sid, history)
            history = [m for m in out if m.get("role") != "system"]
            e.on_session_start(sid, boundary_reason="compression", old_session_id=sid)
        if mode != "off":  # what the worker still does for this session is spent for it
            BackgroundWorker.for_store(e.store.location, e.config.background_concurrency).wait_idle(900)
        calls, tokens = _sent(srv)
        res["sessions"][name] = {"messages": len(msgs), "passes": len(waits),
                                 "wait_ms": common.dist([w * 1000 for w in waits], 1),
                                 "wait_total_s": round(sum(waits), 2),
                                 "calls": calls - sent0[0], "tokens_sent": tokens - sent0[1]}
    res["wait_ms_all_passes"] = common.dist([w for s in res["sessions"].values() for w in [s["wait_ms"]["p50"]]
                                             if w is not None], 1)
    e.store.close()
    return res


def _sent(srv: Any) -> tuple[int, int]:
    reqs = srv.chat_requests
    return len(reqs), sum(sum(len(str(m.get("content") or "")) for m in r.json.get("messages", [])) // 4
                          for r in reqs)


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    from tests.support.fake_openai import Delay, FailureSequence, FakeOpenAI, SummariserResponder

    quick = bool(cfg.get("quick"))
    speeds = [0.2] if quick else [2.0, 60.0]
    mix = _sessions(quick)
    out: dict[str, Any] = {"window": WINDOW, "mix": [[n, len(m)] for n, m in mix], "speeds": {}}
    with tempfile.TemporaryDirectory(prefix="lcm-bgcost-") as d:
        for delay in speeds:
            think = min(30.0, 2 * delay)
            row: dict[str, Any] = {"think_time_cap_s": think}
            for mode in (("off", "on") if quick else ("off", "on, before #41", "on")):
                responder = FailureSequence([Delay(delay)], base=SummariserResponder(max_chars=1200), cycle=True)
                with FakeOpenAI(responder=responder) as srv:
                    store = str(Path(d) / f"{delay}-{mode.replace(' ', '_').replace(',', '')}.db")
                    t0 = time.perf_counter()
                    row[mode] = _drive(srv.base_url, store, mix, mode, think, srv)
                    row[mode]["wall_s"] = round(time.perf_counter() - t0, 1)
                print(f"  bg_cost {delay:g} s/call, worker {mode}: "
                      + "; ".join(f"{k}: {v['passes']} passes, wait p50 {v['wait_ms']['p50']} ms, "
                                  f"{v['tokens_sent']:,} tokens" for k, v in row[mode]["sessions"].items()),
                      flush=True)
            out["speeds"][f"{delay:g}"] = row
    return out
