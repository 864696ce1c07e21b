"""Our engine vs the built-in `ContextCompressor` of the installed hermes-agent, side by side.

Both engines get the same host calls (`bench.host.HostDriver`, R19 order) over the same long
sessions (coding, chat, mixed from `lossless_context.demo.sessions`), and both summarise through the
SAME FakeOpenAI server with the deterministic `SummariserResponder`: ours with
`summarizer: openai` + `summary_base_url`, the built-in through the host's auxiliary client
(`call_llm(task="compression")`), configured to the same server via `$HERMES_HOME/config.yaml`.
The built-in is constructed exactly as `agent/agent_init.py` does with the default
`compression:` config (threshold 0.50 → floored to 0.75 below 512K, protect_first_n 3,
protect_last_n 20, target_ratio 0.20).

Reported per engine and session: compactions, summariser calls and what was sent to the
summariser (the fake server's recorded requests: count, bytes, chars/4 tokens), wall time per
pass, final context size, and canary recall. A canary is a value planted exactly once:

* **in context, exact** — the value is a substring of the final assembled context;
* **in context, paraphrased** — not exact, but all of its *distinctive* terms (words of the
  value that occur nowhere else in the session) are in the context;
* **via tools** — `lcm_grep(value)` → a hit → `lcm_expand(hit)` returns the value byte for
  byte. The built-in has no tools, so this is 0 for it by construction.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from . import common
from .common import dist
from .host import HostDriver, estimate


def _texts(messages: list[dict]) -> str:
    parts: list[str] = []
    for m in messages:
        c = m.get("content")
        if isinstance(c, str):
            parts.append(c)
        elif isinstance(c, list):
            parts.extend(p.get("text", "") for p in c if isinstance(p, dict))
        for tc in m.get("tool_calls") or ():
            fn = tc.get("function") or {}
            parts.append(str(fn.get("name", "")))
            parts.append(str(fn.get("arguments", "")))
    return "\n".join(parts)


def canary_recall(session: Any, final: list[dict], engine: Any | None) -> dict[str, Any]:
    ctx_text = _texts(final)
    ctx_words = common.words(ctx_text)
    per_msg_words = [common.words(_texts([m])) for m in session.messages]
    rows = []
    for c in session.canaries:
        others: set[str] = set()
        for i, w in enumerate(per_msg_words):
            if i != c.message_index:
                others |= w
        distinctive = sorted(common.words(c.value) - others)
        exact = c.value in ctx_text
        para = (not exact) and bool(distinctive) and all(w in ctx_words for w in distinctive)
        tools = False
        if engine is not None:
            tools = _recover(engine, c.value)
        status = "context_exact" if exact else "context_paraphrased" if para else "tools_exact" if tools else "lost"
        rows.append({"key": c.key, "kind": c.kind, "value": c.value, "message_index": c.message_index,
                     "in_context_exact": exact, "in_context_paraphrased": para, "via_tools_exact": tools,
                     "distinctive_terms": distinctive, "status": status})
    n = len(rows)
    cnt = lambda k: sum(1 for r in rows if r[k])  # noqa: E731
    return {
        "canaries": n,
        "in_context_exact": cnt("in_context_exact"),
        "in_context_paraphrased": cnt("in_context_paraphrased"),
        "via_tools_exact": cnt("via_tools_exact"),
        "exact_anywhere": sum(1 for r in rows if r["in_context_exact"] or r["via_tools_exact"]),
        "lost": sum(1 for r in rows if r["status"] == "lost"),
        "rows": rows,
    }


def _recover(engine: Any, value: str) -> bool:
    try:
        res = json.loads(engine.handle_tool_call("lcm_grep", {"query": value, "limit": 5}))
    except Exception:
        return False
    ids = [h["id"] for g in res.get("groups", []) for h in g.get("hits", [])][:5]
    for hid in ids:
        try:
            page = engine.handle_tool_call("lcm_expand", {"id": hid, "max_tokens": 12000})
        except Exception:
            continue
        if any(value in t for t in common.leaves(json.loads(page))):
            return True
    return False




def _builtin(ctx: int, base_url: str):
    from agent.context_compressor import ContextCompressor

    return ContextCompressor(model=common.MODEL, threshold_percent=0.50, protect_first_n=3, protect_last_n=20,
                             summary_target_ratio=0.20, quiet_mode=True, base_url=base_url,
                             api_key=common.API_KEY, config_context_length=ctx, provider="custom",
                             api_mode="chat_completions")


def _warm_builtin(srv: Any, ctx: int) -> None:
    """The host's first summary call imports the openai SDK (~2-3 s, once per process): pay it here."""
    from lossless_context.demo.sessions import chat_session

    msgs = chat_session(80, 99).messages
    try:
        _builtin(ctx, srv.base_url).compress(msgs, current_tokens=estimate(msgs), force=True)
    except Exception:
        pass
    srv.clear()


def run_one(kind: str, which: str, session: Any, srv: Any, ctx: int, work: Path) -> dict[str, Any]:
    from lossless_context.demo.sessions import SYSTEM_PROMPT

    srv.clear()
    store = None
    if which in ("lcm", "lcm_no_tier0"):
        store = str(work / f"sbs-{kind}-{which}.db")
        eng = common.make_engine(store, context_length=ctx, summarizer="openai", summary_base_url=srv.base_url,
                                 tool_stubs=(which == "lcm"))
    else:
        eng = _builtin(ctx, srv.base_url)
    drv = HostDriver(eng, session_id=f"sbs-{kind}", system_prompt=SYSTEM_PROMPT, context_length=ctx,
                     model=common.MODEL, base_url=srv.base_url, api_key=common.API_KEY)
    drv.start()
    t0 = time.perf_counter()
    drv.feed(session.messages)
    drv.end()
    wall = time.perf_counter() - t0
    reqs = srv.requests
    final = drv.context()
    n = len(session.messages)
    adopted = [p for p in drv.passes if p.adopted]
    res: dict[str, Any] = {
        "engine": which, "session": kind, "messages": n,
        "threshold_tokens": getattr(eng, "threshold_tokens", None),
        "compactions": len(adopted), "no_progress_passes": drv.no_progress,
        "summariser": common.chat_request_stats(reqs),
        "pass_wall_ms": dist([p.wall_ms for p in drv.passes], 2),
        "adopted_pass_wall_ms": dist([p.wall_ms for p in adopted], 2),
        "session_wall_s": round(wall, 2),
        "final_context_tokens": estimate(final), "final_context_messages": len(final),
        "session_tokens": estimate(session.messages),
    }
    s = res["summariser"]
    res["summariser_calls_per_1k_messages"] = round(s["calls"] / n * 1000, 2)
    res["summariser_tokens_sent_per_1k_messages"] = round(s["tokens_sent"] / n * 1000)
    res["recall"] = canary_recall(session, final, eng if which != "builtin" else None)
    if which != "builtin":
        res["lcm_status"] = {k: v for k, v in eng.get_status().items() if k in (
            "lcm_cost_total", "lcm_tier0_passes", "lcm_stubbed_results")}
        st = eng.store
        c = st.conn()
        res["summary_levels"] = {lvl: k for lvl, k in c.execute(
            "SELECT level, COUNT(*) FROM summaries WHERE state='published' GROUP BY level")}
        res["stored_messages"] = c.execute("SELECT COUNT(*) FROM messages").fetchone()[0]
        st.close()
    return res


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    from lossless_context.demo.sessions import make_session

    quick = cfg["quick"]
    try:
        import agent.context_compressor  # noqa: F401
    except Exception as exc:
        print(f"  side_by_side: skipped — hermes-agent not importable ({exc})", flush=True)
        return {"skipped": True, "reason": f"hermes-agent not importable: {type(exc).__name__}: {exc}"}
    n = cfg.get("sbs_messages") or (400 if quick else 3000)
    ctx = 64_000 if quick else 128_000
    srv = common.fake_server()
    work = Path(common.isolate_env()) / "side_by_side"
    work.mkdir(parents=True, exist_ok=True)
    _warm_builtin(srv, ctx)
    runs = []
    for kind in ("coding", "chat", "mixed"):
        session = make_session(kind, n, seed=11)
        for which in ("lcm", "lcm_no_tier0", "builtin"):
            t0 = time.perf_counter()
            r = run_one(kind, which, session, srv, ctx, work)
            runs.append(r)
            print(f"  side_by_side {kind}/{which}: {r['compactions']} compactions, "
                  f"{r['summariser']['calls']} summariser calls, {time.perf_counter() - t0:.1f}s", flush=True)
    return {"messages_per_session": n, "context_length": ctx, "runs": runs,
            "note": "The built-in compressor has no recall tools: its 'via tools' column is 0 by construction."}
