"""Zero wait by default (issue 41): the host's wait per pass with background compaction on and
off, what the worker spends ahead of need, on a mix of sessions, with a slow model.

Each configuration replays the same mix through the newer host's calls against a FakeOpenAI
server on 127.0.0.1 whose every summary call takes 2 s, or 60 s: two short sessions that cross
the soft threshold and end below the compaction threshold (a host's typical session: no pass is
ever needed), then a long one (20+ passes). The host is driven as it drives an engine: after
every tool batch it asks `should_compress` with the list so far and runs `compress` when told
(the agent loop checks after each batch, not only at a turn's end); `on_turn_complete` after
each turn; the host's deepcopies as in `bench/background.py`. Between turns the user reads and
types: the worker gets that think time (capped).

Per pass: *wait* = wall time inside `compress()` (what the host waits), *CPU* = the calling
thread's CPU time in it; a pass *waited on the model* when it made a summary call itself; its
reason is read from the pass's size (above `hard_threshold` or over the window a pass does not
hand its leaves to the worker). *Tokens sent* = chars/4 of every request the model server
received (the worker's included, after it has drained); *ahead of need* = tokens sent with the
worker on minus with it off, per session: on a short session all of it is spent for a pass that
never comes. With the 60 s model the worker-off run stops after `off_passes_60` passes (each
waits a minute or more); its tokens are the same as at 2 s (the same passes ask the same
questions), so those are the 60 s baseline for *ahead of need*.
"""

from __future__ import annotations

import copy
import os
import resource
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
    out.append(("long", coding_session(400 if quick else 3000, seed=33).messages))
    return out


def _steps(msgs: list[dict], a: int, b: int) -> list[int]:
    """Where the host checks the size within a turn: after each tool batch, and at its end."""
    ends = [i + 1 for i in range(a, b - 1)
            if msgs[i].get("role") == "tool" and msgs[i + 1].get("role") != "tool"]
    return ends + [b]


def _drive(url: str, store: str, mix: list[tuple[str, list[dict]]], mode: str, think: float, srv: Any,
           max_passes: int | None = None) -> dict[str, Any]:
    from lossless_context.demo.sessions import turn_ranges
    from lossless_context.pipeline.background import BackgroundWorker
    from lossless_context.tokens import estimate_messages_tokens

    kw: dict[str, Any] = {"summary_timeout": 150, "compaction_time_budget": 400}
    if mode == "off":
        kw["background_compaction"] = False
    e = common.make_engine(store, context_length=WINDOW, summarizer="openai", summary_base_url=url, **kw)
    e.update_model(model=common.MODEL, context_length=WINDOW, base_url="", api_key="", provider="custom")
    hard = e.config.hard_threshold
    res: dict[str, Any] = {"sessions": {}, "passes": []}
    for name, msgs in mix:
        sid = f"mix-{name}"
        e.on_session_start(sid, platform="bench")
        history: list[dict] = []
        passes: list[dict[str, Any]] = []
        sent0 = _sent(srv)
        done = False
        for a, b in turn_ranges(msgs):
            at = a
            for end in _steps(msgs, a, b):
                history.extend(copy.deepcopy(msgs[at:end]))
                at = end
                tokens = estimate_messages_tokens(history)
                if not e.should_compress(tokens):
                    continue
                before = _last_pass(e)
                busy = mode != "off" and BackgroundWorker.for_store(e.store.location,
                                                                    e.config.background_concurrency).backlog > 0
                r0 = resource.getrusage(resource.RUSAGE_THREAD)
                c0, p0, t0 = time.thread_time(), time.process_time(), time.perf_counter()
                out = e.compress(history, current_tokens=tokens, session_id=sid)
                wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
                pcpu = time.process_time() - p0
                r1 = resource.getrusage(resource.RUSAGE_THREAD)
                p = _last_pass(e)
                rec = p if p is not None and p is not before else {}
                calls = int(rec.get("calls") or 0)
                frac = tokens / WINDOW
                why = (None if not calls else "worker off" if mode == "off" else "over the window" if frac >= 1.0
                       else f"above hard_threshold ({hard:g})" if frac >= hard else "other")
                passes.append({"session": name, "messages": len(history), "fill": round(frac, 3),
                               "wait_ms": round(wall * 1000, 2), "cpu_ms": round(cpu * 1000, 2),
                               "process_cpu_ms": round(pcpu * 1000, 2), "worker_busy": busy, "calls": calls,
                               # the calling thread's context switches: waits on a lock, a thread or
                               # the disk (voluntary); taken off the core by other work (involuntary)
                               "switches": [r1.ru_nvcsw - r0.ru_nvcsw, r1.ru_nivcsw - r0.ru_nivcsw],
                               "why": why, "levels": rec.get("levels") or {}, "changed": out != history})
                if out != history:
                    e.on_session_end(sid, history)
                    history = [m for m in out if m.get("role") != "system"]
                    e.on_session_start(sid, boundary_reason="compression", old_session_id=sid)
                if max_passes is not None and len(passes) >= max_passes:
                    done = True
                    break
            if done:
                break
            e.on_turn_complete(copy.deepcopy(history), session_id=sid)
            if mode != "off":  # the user reads and types: the worker gets that time
                e.wait_background(think)
        if mode != "off":  # what the worker still does for this session is spent for it
            e.wait_background(900)
        calls, tokens = _sent(srv)
        res["sessions"][name] = _summary(passes) | {"messages": len(msgs), "complete": not done,
                                                    "calls": calls - sent0[0], "tokens_sent": tokens - sent0[1]}
        res["passes"].extend(passes)
    res["all_passes"] = _summary(res["passes"])
    e.store.close()
    return res


def _summary(passes: list[dict[str, Any]]) -> dict[str, Any]:
    waits = [p["wait_ms"] for p in passes]
    why: dict[str, int] = {}
    for p in passes:
        if p["why"]:
            why[p["why"]] = why.get(p["why"], 0) + 1
    return {"passes": len(passes), "wait_ms": _pcts(waits), "cpu_ms": _pcts([p["cpu_ms"] for p in passes]),
            "wait_total_s": round(sum(waits) / 1000, 2),
            "waited_on_model": sum(1 for p in passes if p["calls"]), "why": why,
            "wait_ms_without_model": _pcts([p["wait_ms"] for p in passes if not p["calls"]]),
            "cpu_ms_without_model": _pcts([p["cpu_ms"] for p in passes if not p["calls"]])}


def _pcts(values: list[float]) -> dict[str, Any]:
    d = common.dist(values, 1)
    return {"n": d["n"], "p50": d["p50"], "p90": common.percentile(values, 90) if values else None,
            "max": d["max"]} if values else {"n": 0, "p50": None, "p90": None, "max": None}


def _last_pass(e: Any) -> dict[str, Any] | None:
    last = e.passes.last()
    return last[-1] if last else None


def _sent(srv: Any) -> tuple[int, int]:
    reqs = srv.chat_requests
    return len(reqs), sum(sum(len(str(m.get("content") or "")) for m in r.json.get("messages", [])) // 4
                          for r in reqs)


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    from tests.support.fake_openai import Delay, FailureSequence, FakeOpenAI, SummariserResponder

    quick = bool(cfg.get("quick"))
    speeds = [float(s) for s in cfg.get("bg_speeds") or ([0.2] if quick else [2.0, 60.0])]
    modes = cfg.get("bg_modes") or ("off", "on")
    off_passes_60 = int(cfg.get("off_passes_60", 3))
    mix = _sessions(quick)
    out: dict[str, Any] = {"window": WINDOW, "mix": [[n, len(m)] for n, m in mix], "speeds": {},
                           "off_passes_60": off_passes_60}
    with tempfile.TemporaryDirectory(prefix="lcm-bgcost-") as d:
        for delay in speeds:
            # Think time: a user reading a reply and typing the next; with the 60 s model, shorter
            # than a call (the worker falls behind: the hard case), and the run stays bounded.
            think = min(5.0, 2 * delay)
            row: dict[str, Any] = {"think_time_cap_s": think}
            for mode in modes:
                responder = FailureSequence([Delay(delay)], base=SummariserResponder(max_chars=1200), cycle=True)
                cap = off_passes_60 if mode == "off" and delay >= 30 else None
                with FakeOpenAI(responder=responder) as srv:
                    store = str(Path(d) / f"{delay}-{mode}.db")
                    t0 = time.perf_counter()
                    row[mode] = _drive(srv.base_url, store, mix, mode, think, srv, max_passes=cap)
                    row[mode]["wall_s"] = round(time.perf_counter() - t0, 1)
                    row[mode]["load_at_end"] = [round(x, 2) for x in os.getloadavg()]
                a = row[mode]["all_passes"]
                print(f"  bg_cost {delay:g} s/call, worker {mode}: {a['passes']} passes, wait p50/p90/max "
                      f"{a['wait_ms']['p50']}/{a['wait_ms']['p90']}/{a['wait_ms']['max']} ms, CPU p50 "
                      f"{a['cpu_ms']['p50']} ms, {a['waited_on_model']} waited on the model {a['why']}; "
                      + "; ".join(f"{k}: {v['tokens_sent']:,} tokens" for k, v in row[mode]["sessions"].items()),
                      flush=True)
            out["speeds"][f"{delay:g}"] = row
    out["run_at"] = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    out["load_end"] = list(os.getloadavg())
    return out


if __name__ == "__main__":  # python -m bench.bg_cost [speed ...] [--modes off,on]: one configuration
    import json
    import sys

    common.isolate_env()
    common.quiet_logs()
    args = sys.argv[1:]
    ms = ("off", "on")
    if "--modes" in args:
        i = args.index("--modes")
        ms = tuple(args[i + 1].split(","))
        del args[i:i + 2]
    result = run({"bg_speeds": [float(x) for x in args] or None, "bg_modes": ms})
    dest = os.environ.get("LCM_BG_COST_OUT")
    if dest:
        Path(dest).write_text(json.dumps(result, indent=1, default=str), encoding="utf-8")
