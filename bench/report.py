"""Render `results.json` (the source of truth) as the human-readable `RESULTS.md`."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterable, Sequence

from .common import get_path


def _f(v: Any, digits: int = 2) -> str:
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if v == 0:
            return "0"
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        if abs(v) >= 100:
            return f"{v:.1f}"
        if abs(v) < 0.01:
            return f"{v:.4f}"
        return f"{v:.{digits}f}"
    return str(v)


def _mb(v: Any) -> Any:
    return None if v is None else round(v / 1e6, 2)


def _pct(v: Any) -> str:
    return "—" if v is None else f"{v * 100:.1f}%"


def _table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for r in rows:
        out.append("| " + " | ".join(c if isinstance(c, str) else _f(c) for c in r) + " |")
    return out


def _n(n: Any) -> str:
    if not isinstance(n, int):
        return str(n)
    if n >= 1_000_000 and n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n >= 1000 and n % 1000 == 0:
        return f"{n // 1000}k"
    return f"{n:,}"


# ----------------------------------------------------------------------------------------------

def render(res: dict[str, Any]) -> str:
    L: list[str] = []
    meta = res.get("meta", {})
    m = res.get("machine", {})
    L += ["# lossless-context benchmark results", ""]
    L.append(f"Mode **{meta.get('mode', '?')}**, run {meta.get('started', '?')} (UTC), total wall time "
             f"{_f(meta.get('wall_seconds'))} s. Command: `{meta.get('command', 'python -m bench')}`. "
             "All figures come from `bench/results.json`; they are measurements on this machine, compared as "
             "ratios within the same run or as growth curves — not pass/fail tests.")
    L += ["", "## Machine", ""]
    L += _table(["CPU", "cores", "RAM", "Python", "SQLite", "hermes-agent", "OS", "commit"], [[
        m.get("cpu_model"), m.get("cores"), f"{m.get('ram_gb')} GB", f"{m.get('python')} ({m.get('python_impl')})",
        m.get("sqlite"), m.get("hermes_agent") or "—", m.get("os"),
        f"{m.get('git_commit')}{' + uncommitted changes' if m.get('git_dirty') else ''}"]])
    la, lb = m.get("load_avg_at_start"), meta.get("load_avg_at_end")
    if la or lb:
        L += ["", f"Load average (1/5/15 min) at start {la}, at end {lb}: other processes on this machine "
              f"(e.g. concurrent test runs) share the {m.get('cores')} cores, so absolute times carry that noise; "
              "ratios within one run and growth exponents are the robust figures."]
    parts = res.get("parts", {})
    L += ["", "## Summary", ""]
    L += _summary(parts)
    if "scale" in parts:
        L += _scale(parts["scale"])
    if "side_by_side" in parts:
        L += _sbs(parts["side_by_side"])
    if "quality" in parts:
        L += _quality(parts["quality"])
    if "backends" in parts:
        L += _backends(parts["backends"])
    if "background" in parts:
        L += _background(parts["background"])
    if "long_sessions" in parts:
        L += _long(parts["long_sessions"])
    from .report_recall import grep_scale, realtalk, recall_demo

    if "realtalk" in parts:
        L += realtalk(parts["realtalk"])
    if "recall_demo" in parts:
        L += recall_demo(parts["recall_demo"])
    if "grep_scale" in parts:
        L += grep_scale(parts["grep_scale"])
    from .report_cost import bg_cost, pass_cost, pg_ident

    if "pass_cost" in parts:
        L += pass_cost(parts["pass_cost"])
    if "mcp" in parts:
        L += _mcp(parts["mcp"])
    if "script_growth" in parts:
        from .script_growth import section

        L += section(parts["script_growth"])
    from .report_lifecycle import lifecycle

    if "lifecycle" in parts:
        L += lifecycle(parts["lifecycle"])
    if "bg_cost" in parts:
        L += bg_cost(parts["bg_cost"])
    if "pg_ident" in parts:
        L += pg_ident(parts["pg_ident"])
    profiles = _profiles(parts)
    if profiles:
        L += profiles
    L += ["", "## How to run", "",
          "```", "python -m bench            # the full run (this file), ~20 min on 2 cores",
          "python -m bench --quick    # the CI smoke configuration, well under a minute",
          "python -m bench --only scale|side_by_side|quality|backends|background|long_sessions|mcp   # one part; merged into results.json",
          "python -m bench --only long_sessions --long-grid 32000x10000,64000x36000   # chosen points",
          "```", ""]
    return "\n".join(L) + "\n"


def _long(ls: dict[str, Any]) -> list[str]:
    L = ["", "## 6. Long sessions: the DAG's shape and cost at small windows (`bench/long_sessions.py`)", ""]
    if ls.get("error"):
        return L + [f"failed: `{ls['error'][:2000]}`"]
    ran = ", ".join(f"{w // 1000}K×{_n(n)}" for w, n in ls.get("grid", []))
    full = ls.get("full_grid") or []
    L += [f"Generated coding sessions (seed 17) driven by the R19 host calls (`bench/host.py`); summaries through "
          f"FakeOpenAI on 127.0.0.1 with `ModelLengthResponder` (replies of ~{ls.get('reply_words')} words, cut where "
          f"`max_tokens` stops a real server); fan-in {ls.get('fanin')}. Points run: {ran}"
          + (f" (of the full grid {len(full)} points; the others were left out for time on this shared machine)"
             if full and len(ls.get("grid", [])) < len(full) else "") + ". Bounds: depth ⌈log_fanin(leaves)⌉ + 1, "
          "calls ⌊leaves × (1 + 1/(fanin − 1))⌋ + 2. *Facts in context*: planted values exact in the final context "
          "or with all their distinctive terms there. *First hit original*: `lcm_grep(value)`'s first hit is the "
          "message holding it. Pass times carry the noise of the other processes on this machine.", ""]
    runs = ls.get("runs", [])
    builtin = {(r["window"], r["messages"]): r for r in runs if r["engine"] == "builtin"}
    rows = []
    for r in runs:
        if r["engine"] != "lcm":
            continue
        b = builtin.get((r["window"], r["messages"]), {})
        p = r.get("pass_wall_ms") or {}
        rows.append([f"{r['window'] // 1000}K", _n(r["messages"]), r["leaves"], f"{r['max_depth']} / {r['depth_bound']}",
                     f"{r['summariser_calls']} / {r['calls_bound']}", _f(r["calls_per_1k_messages"]),
                     _n(r["tokens_sent_per_1k_messages"]), f"{r['facts_in_context']}/{r['planted']}",
                     f"{r['first_hit_original']}/{r['planted']}", _f(p.get("p50")), _f(p.get("p95")),
                     _f(b.get("calls_per_1k_messages")) if b else "—",
                     _n(b.get("tokens_sent_per_1k_messages")) if b else "—",
                     f"{b['facts_in_context']}/{b['planted']}" if b else "—"])
    L += _table(["window", "messages", "leaves", "max depth / bound", "calls / bound", "calls / 1k msgs",
                 "tokens sent / 1k msgs", "facts in context", "first hit original", "pass p50 ms", "p95 ms",
                 "built-in calls / 1k", "built-in tokens / 1k", "built-in facts in context"], rows)
    before = ls.get("before") or {}
    if before.get("runs"):
        after = {(r["window"], r["messages"]): r for r in runs if r["engine"] == "lcm"}
        L += ["", f"Before and after balanced condensation, same sessions and harness ({before.get('note', '')}):", ""]
        rows = []
        for r in before["runs"]:
            a = after.get((r["window"], r["messages"]))
            if r["engine"] != "lcm" or a is None:
                continue
            rows.append([f"{r['window'] // 1000}K", _n(r["messages"]), f"{r['leaves']} → {a['leaves']}",
                         f"{r['max_depth']} → {a['max_depth']}", f"{r['summariser_calls']} → {a['summariser_calls']}",
                         f"{_n(r['tokens_sent_per_1k_messages'])} → {_n(a['tokens_sent_per_1k_messages'])}",
                         f"{r['facts_in_context']} → {a['facts_in_context']} of {r['planted']}",
                         f"{r['first_hit_original']} → {a['first_hit_original']} of {r['planted']}"])
        L += _table(["window", "messages", "leaves", "max depth", "summariser calls", "tokens sent / 1k msgs",
                     "facts in context", "first hit original"], rows)
    return L


def _background(bg: dict[str, Any]) -> list[str]:
    L = ["", "## 5. Zero-wait compaction: waiting in compress() with the worker off / on (`bench/background.py`)", ""]
    if bg.get("error"):
        return L + [f"failed: {bg['error']}"]
    L.append(f"{_n(bg.get('messages'))}-message coding session, 64K window, every summary call delayed "
             f"{bg.get('summary_delay_s')} s; think time between turns capped at {bg.get('think_time_cap_s')} s. "
             "Waiting = wall time the host spends inside compress(); passes above the hard threshold block by "
             "design and are excluded from the ratio.")
    L.append("")
    rows = []
    for k in ("off", "on"):
        r = bg.get(k) or {}
        w = r.get("wait_below_hard") or {}
        rows.append([k, r.get("passes"), r.get("passes_below_hard"), _f(w.get("p50")), _f(w.get("p95")),
                     _f(r.get("wait_below_hard_total_s")), r.get("summariser_calls"),
                     ", ".join(f"{a}: {b}" for a, b in sorted((r.get("summary_levels") or {}).items()))])
    L += _table(["worker", "passes", "below hard", "wait p50 ms", "p95 ms", "total wait s", "summariser calls",
                 "summary levels"], rows)
    L += ["", f"Waiting ratio off/on below the hard threshold: **{bg.get('wait_ratio_off_on')}×** (target ≥ 20×)."]
    return L


def _mcp(r: dict[str, Any]) -> list[str]:
    L = ["", "## 8. lcm_grep through `lcm mcp` vs in-process (`bench/mcp.py`)", ""]
    if r.get("skipped") or r.get("error"):
        return L + [f"Not run: {r.get('skipped') or r.get('error')}"]
    L.append("The same questions (identifiers, words, a question, a phrase) asked of one compacted coding "
             "session three ways in one run: the engine's `handle_tool_call` in-process (as Hermes calls it), "
             "the server's own path without the transport (`dispatch_scoped` on the read-only store), and a "
             "spawned `lcm mcp --session` through the SDK's stdio client. Times per call, ms.")
    L.append("")
    rows = []
    for backend in ("sqlite", "postgresql"):
        b = r.get(backend) or {}
        if b.get("skipped") or b.get("error"):
            rows.append([backend, "—", "—", "—", "—", "—", "—", "—", "—", b.get("skipped") or b.get("error")])
            continue
        rows.append([backend, _n(b.get("messages")), f"{b.get('queries')}×{b.get('reps')}",
                     _f(b.get("engine_pass_ms")), _f(b.get("scoped_pass_ms")), _f(b.get("mcp_pass_ms")),
                     f"**{b.get('ratio_mcp_engine')}×**", _f(b.get("added_ms_per_call_median")),
                     _f(b.get("server_start_seconds")), "yes" if b.get("same_answers") else "**no**"])
    L += _table(["backend", "messages", "questions×rounds", "engine ms", "scoped ms", "MCP ms", "MCP / engine",
                 "MCP adds per call, ms (median)", "server start s", "same answers"], rows)
    L += ["", "A column's ms is one pass over the questions: the sum of each question's p50 on that path."]
    for backend in ("sqlite", "postgresql"):
        b = r.get(backend) or {}
        if b.get("per_query"):
            L += ["", f"Per question ({backend}), p50 ms:", ""]
            L += _table(["question", "hits", "engine", "scoped", "MCP"],
                        [[f"`{q['query']}`", q["hits"], _f(q["engine_p50_ms"]), _f(q["scoped_p50_ms"]),
                          _f(q["mcp_p50_ms"])] for q in b["per_query"]])
    return L


def _summary(parts: dict[str, Any]) -> list[str]:
    L: list[str] = []
    sc = parts.get("scale")
    if sc and not sc.get("error"):
        L += ["Targets (from the brief) against this run:", ""]
        rows = []
        for t in sc.get("targets", []):
            met = "—" if t["met"] is None else ("**met**" if t["met"] else "**missed**")
            label = t["target"] + (" *(extrapolated from the fit)*" if t.get("extrapolated") else "")
            if t.get("note"):
                label += f" *({t['note']})*"
            rows.append([label, f"{_f(t['value'])} {t['unit']}".strip(), f"{t['op']} {_f(t['limit'])} {t['unit']}".strip(),
                         met])
        L += _table(["target", "measured", "goal", "result"], rows)
        L.append("")
    sbs = parts.get("side_by_side")
    if sbs and sbs.get("skipped"):
        L += [f"Side by side: skipped — {sbs.get('reason')}", ""]
    elif sbs and not sbs.get("error"):
        L += ["Side by side (totals over the coding, chat and mixed sessions):", ""]
        agg: dict[str, dict[str, float]] = {}
        for r in sbs["runs"]:
            a = agg.setdefault(r["engine"], {"compactions": 0, "calls": 0, "tokens": 0, "canaries": 0, "exact": 0,
                                              "ctx_exact": 0, "msgs": 0})
            a["compactions"] += r["compactions"]
            a["calls"] += r["summariser"]["calls"]
            a["tokens"] += r["summariser"]["tokens_sent"]
            a["canaries"] += r["recall"]["canaries"]
            a["exact"] += r["recall"]["exact_anywhere"]
            a["ctx_exact"] += r["recall"]["in_context_exact"]
            a["msgs"] += r["messages"]
        rows = []
        for eng, a in agg.items():
            rows.append([_engine(eng), int(a["compactions"]), int(a["calls"]),
                         round(a["calls"] / a["msgs"] * 1000, 2), int(a["tokens"]),
                         f"{int(a['ctx_exact'])}/{int(a['canaries'])}", f"{int(a['exact'])}/{int(a['canaries'])}"])
        L += _table(["engine", "compactions", "summariser calls", "calls / 1k msgs", "tokens sent to summariser",
                     "canaries exact in final context", "canaries recoverable exactly (context or tools)"], rows)
        L.append("")
    q = parts.get("quality")
    if q and not q.get("error"):
        L += ["Summary quality (share of source identifiers/paths/numbers/quoted strings kept verbatim):", ""]
        L += _table(["summariser", "nodes", "in summary text", "in text or reachable via lcm_expand"],
                    [[r["summarizer"], r["nodes"], _pct(r["overall"]["in_text_share"]),
                      _pct(r["overall"]["reachable_share"])] for r in q["runs"]])
        L.append("")
    b = parts.get("backends")
    if b:
        if b.get("skipped") or b.get("error"):
            L += [f"Backends: skipped — {b.get('reason') or b.get('error')}", ""]
        else:
            pick = {r["metric"]: r for r in b["rows"]}
            keys = ["ingest msgs/s", "compress() engine ms p50", "lcm_grep text ms p50", "store bytes per 1k messages"]
            L += [f"SQLite vs PostgreSQL at {_f(b['n_compared'])} messages (ratio PostgreSQL/SQLite): "
                  + "; ".join(f"{k} ×{_f(pick[k]['ratio_pg_over_sqlite'])}" for k in keys if k in pick), ""]
    for name, p in parts.items():
        if isinstance(p, dict) and p.get("error"):
            L += [f"**{name} failed:** `{p['error'][:300]}`", ""]
    return L


def _engine(e: str) -> str:
    return {"lcm": "lossless-context (ours, tier 0 on)", "lcm_no_tier0": "lossless-context (ours, tier 0 off)",
            "builtin": "built-in ContextCompressor"}.get(e, e)


def _scale(sc: dict[str, Any]) -> list[str]:
    L = ["", "## 1. Scale curves (`bench/scale.py`)", ""]
    if sc.get("error"):
        return L + [f"Failed: `{sc['error'][:2000]}`"]
    L += [
        "History: deterministic \"mixed\" sessions (coding turns with tool calls and large tool outputs, "
        "interleaved with chat) from `SessionStream`, sessions of ~10,000 messages in one conversation, each "
        "handed to `engine.ingest()` as the host's growing list every 2,000 messages (the real alignment path; "
        "earlier messages are re-aligned each time). Ingest throughput counts new messages over ingest time "
        "(message generation excluded; the wait until the last message is full-text indexed included — the SQLite "
        "store indexes a large append after its commit). "
        + (f"Points above {_f(sc.get('real_cap'))} messages are **replicated**: the first {_f(sc.get('real_cap'))} "
           "messages are really ingested, the rest are those rows copied with SQL into more sessions of the same "
           "conversation (the FTS index is filled by the store's own triggers), because ingest through the engine "
           "would not fit the run's time budget at 1M; replicated points have no ingest figure."
           if any(p["build"].get("n_replicated") for p in sc.get("points", [])) else
           "Every point was really ingested (no replication in this run)."),
        "",
        "Per-request costs are measured in a fresh process on the built store: a live session in the same "
        "conversation (its lineage, hence every search, spans the whole history), 64K window, extractive "
        "summariser; each `compress()` pass adds 20–50 messages. *Engine time* = wall time minus time inside "
        "`Escalator.summarize` (the summariser). Passes whose list is already within target return early "
        "(only ingest + a budget check) — the `compacting` column counts the passes that did compact.",
        "",
    ]
    rows = []
    for p in sc["points"]:
        b, me = p["build"], p["measure"]
        c = me["compress"]
        label = _n(p["n"]) + (" (replicated)" if b.get("n_replicated") else "")
        ing = None if b.get("reused_base") or b.get("n_replicated") else get_path(b, "ingest.msgs_per_s")
        rows.append([label, b["n_stored"], ing, c["engine_ms"]["p50"], c["engine_ms"]["p95"],
                     f"{c['progressed']}/{c['passes']}", get_path(c, "compacting_engine_ms.p50"),
                     get_path(c, "compacting_engine_ms.p95"), c["wall_ms"]["p50"], c["summariser_ms"]["p50"],
                     me["should_compress_ms"]["p50"], me["select_context"]["cached_ms"]["p50"],
                     me["select_context"]["first_call_ms"],
                     "yes" if me["select_context"]["same_object_every_call"] else "**no**"])
    L += _table(["N", "stored", "ingest msgs/s", "compress engine p50 ms", "p95 ms", "compacting passes",
                 "engine p50 ms, compacting passes", "p95 ms", "wall p50 ms",
                 "summariser p50 ms", "should_compress p50 ms", "select_context cached p50 ms",
                 "select_context 1st call ms", "same object"], rows)
    L.append("")
    rows = []
    for p in sc["points"]:
        b, me = p["build"], p["measure"]
        g = me["lcm_grep"]
        e = me["lcm_expand"]
        rows.append([_n(p["n"]), g["text"]["ms"]["p50"], g["text"]["ms"]["p95"], g["identifier"]["ms"]["p50"],
                     g["identifier"]["ms"]["p95"], g["cjk_substring"]["ms"]["p50"], g["cjk_substring"]["ms"]["p95"],
                     e["message_ms"]["p50"], e["summary_ms"]["p50"], e["ms"]["p95"],
                     _mb(b.get("bytes_per_1k_messages")), b.get("build_peak_rss_mb"), me.get("measure_peak_rss_mb")])
    L += _table(["N", "grep text p50 ms", "p95", "grep identifier p50 ms", "p95", "grep CJK p50 ms", "p95",
                 "expand message p50 ms", "expand summary p50 ms", "expand p95 ms", "store MB / 1k msgs",
                 "build peak RSS MB", "measure peak RSS MB"], rows)
    L.append("")
    first = sc["points"][0]["measure"]["lcm_grep"] if sc.get("points") else {}
    if first:
        L.append("Queries: text = `" + first["text"]["query"] + "` (ranked FTS); identifier = a planted canary value "
                 "(unique in the history); CJK = `" + first["cjk_substring"]["query"] + "`, planted once early in the "
                 "history (a substring search; the worst case: the hit is far from the newest rows).")
        L.append("")
    rows2 = []
    for p in sc["points"]:
        b = p["build"]
        ing = b.get("ingest") or {}
        if b.get("reused_base") or b.get("n_replicated"):
            continue
        rows2.append([_n(p["n"]), ing.get("msgs_per_s"), get_path(ing, "all_new_batch_msgs_per_s.p50"),
                      get_path(ing, "batch_msgs_per_s.p50"), ing.get("realign_msgs_per_s"), ing.get("seconds"),
                      ing.get("generation_seconds")])
    if rows2:
        L += ["Ingest detail:", ""]
        L += _table(["N", "overall msgs/s", "all-new 2k batch msgs/s (p50)", "batch msgs/s (p50)",
                     "re-align of an unchanged list msgs/s", "ingest s", "generation s"], rows2)
        L.append("")
    L += ["Growth exponents (least squares on log-log, cost ∝ N^k; k ≈ 0 flat, k = 1 linear):", ""]
    rows = []
    fr = sc.get("fits_real_points") or {}
    for name, f in sc.get("fits", {}).items():
        if f:
            g = fr.get(name)
            rows.append([name, f["exponent"], f["r2"], f["points"]] + ([g["exponent"] if g else None,
                                                                       g["r2"] if g else None] if fr else []))
    L += _table(["metric", "exponent k (all points)", "r²", "points"]
                + (["k (really-ingested points only)", "r²"] if fr else []), rows)
    L.append("")
    mem = sc.get("fits", {}).get("measure_peak_rss_mb")
    if mem:
        grows = "does not grow" if mem["exponent"] < 0.1 else "grows"
        L.append(f"Memory: the measuring process's peak RSS {grows} with history size (k = {mem['exponent']}).")
        L.append("")
    return L


def _sbs(s: dict[str, Any]) -> list[str]:
    L = ["", "## 2. Side by side with the built-in ContextCompressor (`bench/side_by_side.py`)", ""]
    if s.get("skipped"):
        return L + [f"Skipped: {s.get('reason')}."]
    if s.get("error"):
        return L + [f"Failed: `{s['error'][:2000]}`"]
    L += [
        f"Sessions of {_f(s['messages_per_session'])} messages each, {_f(s['context_length'])}-token window, both "
        "engines driven by the same R19 host calls (`bench/host.py`) and summarising through the same FakeOpenAI "
        "server with the deterministic `SummariserResponder` (ours: `summarizer: openai` + `summary_base_url`; "
        "the built-in: the host's auxiliary client configured to the same server). The built-in is constructed "
        "as `agent_init.py` does with the default `compression:` config. Summariser traffic = the fake server's "
        "recorded requests (tokens = chars/4 of the request messages).",
        "",
        "**" + s.get("note", "") + "**",
        "",
    ]
    rows = []
    for r in s["runs"]:
        rc = r["recall"]
        rows.append([r["session"], _engine(r["engine"]), r["threshold_tokens"], r["compactions"],
                     r["no_progress_passes"], r["summariser"]["calls"], r["summariser_calls_per_1k_messages"],
                     r["summariser"]["tokens_sent"], r["summariser_tokens_sent_per_1k_messages"],
                     r["pass_wall_ms"]["p50"], r["pass_wall_ms"]["p95"], r["session_wall_s"],
                     r["final_context_tokens"], r["final_context_messages"]])
    L += _table(["session", "engine", "threshold", "compactions", "no-progress passes", "summariser calls",
                 "calls / 1k msgs", "tokens sent", "tokens sent / 1k msgs", "pass wall p50 ms", "p95 ms",
                 "session wall s", "final context tokens", "final context msgs"], rows)
    L.append("")
    L += ["Canary recall:", ""]
    rows = []
    for r in s["runs"]:
        rc = r["recall"]
        rows.append([r["session"], _engine(r["engine"]), rc["canaries"], rc["in_context_exact"],
                     rc["in_context_paraphrased"], rc["via_tools_exact"] if r["engine"] != "builtin" else "0 (no tools)",
                     rc["exact_anywhere"], rc["lost"]])
    L += _table(["session", "engine", "canaries", "exact in final context", "paraphrased in context",
                 "exact via lcm_grep → lcm_expand", "exact anywhere", "lost"], rows)
    L.append("")
    L += ["Per canary (status: context_exact > context_paraphrased > tools_exact > lost):", ""]
    by: dict[tuple, dict[str, str]] = {}
    for r in s["runs"]:
        for c in r["recall"]["rows"]:
            by.setdefault((r["session"], c["key"], c["kind"], c["value"], c["message_index"]), {})[r["engine"]] = c["status"]
    rows = [[k[0], k[2], f"`{k[3]}`", k[4], v.get("lcm", "—"), v.get("lcm_no_tier0", "—"), v.get("builtin", "—")]
            for k, v in by.items()]
    L += _table(["session", "kind", "value", "planted at msg", "ours (tier 0 on)", "ours (tier 0 off)", "built-in"], rows)
    L.append("")
    spend = [r for r in s["runs"] if r.get("lcm_status")]
    if spend:
        L += ["Our own cost figures (`get_status()`: summariser calls, tokens in/out as the server reported them, "
              "seconds; tier-0 passes reached their target with stubs alone, without a model call):", ""]
        rows = []
        for r in spend:
            st = r["lcm_status"]
            c = st.get("lcm_cost_total") or {}
            rows.append([r["session"], _engine(r["engine"]), c.get("calls", 0), c.get("input_tokens", 0),
                         c.get("output_tokens", 0), c.get("seconds", 0), st.get("lcm_tier0_passes", 0)])
        L += _table(["session", "engine", "calls", "tokens in", "tokens out", "seconds", "stub-only passes"], rows)
        L.append("")
    lv = [(r["session"], r.get("summary_levels")) for r in s["runs"] if r["engine"] != "builtin"]
    if any(x[1] for x in lv):
        L.append("Our summary nodes by escalation level: " + "; ".join(
            f"{k}: " + (", ".join(f"{a} {b}" for a, b in v.items()) if v else "none") for k, v in lv) + ".")
        L.append("")
    return L


def _quality(q: dict[str, Any]) -> list[str]:
    L = ["", "## 3. Summary quality without a model (`bench/quality.py`)", ""]
    if q.get("error"):
        return L + [f"Failed: `{q['error'][:2000]}`"]
    L += [
        f"A {_f(q['messages'])}-message mixed session through our engine ({_f(q['context_length'])}-token window), "
        "once per summariser. For each summary node: the facts of its sources (identifiers, paths/file names, "
        "numbers of 3+ digits, quoted strings; regex-extracted from the source messages, or from the child "
        "summaries for condensed nodes) and the share found verbatim in the summary text (*in text*) or in the "
        "text or in what `lcm_expand` of the node returns, all pages (*reachable*). Expansion returns the "
        "children verbatim, so *reachable* is ~100% in a lossless store by construction — it verifies that the "
        "DAG leads back to every source; *in text* is the real quality measure: what the model sees without a "
        "tool call. Micro share = all facts pooled; compression = summary tokens / source tokens.",
        "",
    ]
    for r in q["runs"]:
        L += [f"**{r['summarizer']}** — {r['nodes']} nodes, {r['compactions']} compactions, overall in text "
              f"{_pct(r['overall']['in_text_share'])}, reachable {_pct(r['overall']['reachable_share'])}.", ""]
        for key, title in (("by_level", "level"), ("by_depth", "depth")):
            rows = []
            for g, e in r[key].items():
                rows.append([g, e["nodes"], e["facts"], _pct(e["in_text_share"]), _pct(e["mean_node_in_text_share"]),
                             _pct(e["reachable_share"]), _pct(e["identifier_in_text_share"]),
                             _pct(e["path_in_text_share"]), _pct(e["number_in_text_share"]),
                             _pct(e["quoted_in_text_share"]), e["compression_ratio"]])
            L += _table([title, "nodes", "facts", "in text (micro)", "in text (mean/node)", "in text or reachable",
                         "identifiers", "paths", "numbers", "quoted", "compression"], rows)
            L.append("")
    return L


def _backends(b: dict[str, Any]) -> list[str]:
    L = ["", "## 4. SQLite vs PostgreSQL (`bench/backends.py`)", ""]
    if b.get("skipped"):
        return L + [f"Skipped: {b.get('reason')}."]
    if b.get("error"):
        return L + [f"Failed: `{b['error'][:2000]}`"]
    note = ""
    if b.get("pg_stopped_early"):
        note = (f" PostgreSQL's build hit its {_f(b['pg_budget_seconds'])} s budget at {_f(b['n_compared'])} of "
                f"{_f(b['n_requested'])} requested messages; SQLite was built on exactly the same messages.")
    L += [f"Same workload as the scale benchmark on both backends, {_f(b['n_compared'])} messages; PostgreSQL "
          f"{b.get('postgres_version') or '?'} (throw-away cluster from `tests/support/pg.py`, fsync off, "
          f"shared_buffers {b.get('shared_buffers') or '32MB'}; measured after `VACUUM (ANALYZE)` of the built "
          "store, as autovacuum leaves it, and again after the compaction passes, before the per-request "
          "figures, so that autovacuum does not run during them). On both backends `lcm_grep` is timed once "
          "the store's deferred full-text index has caught up with the compaction passes before it; the "
          "sub-millisecond searches (identifier, CJK) are timed over 4 times as many calls as the text search."
          + note + (" SQLite figures reused from the scale run (same stream, same N)." if b.get("sqlite_reused_from_scale")
                    else ""), ""]
    rows = [[r["metric"], r["sqlite"], r["postgresql"], r["ratio_pg_over_sqlite"], r["better"]] for r in b["rows"]]
    L += _table(["metric", "SQLite", "PostgreSQL", "ratio PG/SQLite", "better is"], rows)
    L.append("")
    rt = b.get("round_trip_ms")
    if rt:
        idle = b.get("round_trip_after_idle_ms")
        L += [f"One `SELECT 1` round trip to this server (psycopg, loopback): p50 {rt['p50']} ms back to back"
              + (f", {idle['p50']} ms after 2 ms idle (as between requests: waking an idle core)" if idle else "")
              + " — the floor of each statement a PostgreSQL request makes, against SQLite's in-process calls.", ""]
    big = b.get("postgresql_large")
    if big:
        g, m = big["grow"], big["measure"]
        cells = [["lcm_grep " + k + " ms p50", get_path(m, f"lcm_grep.{k}.ms.p50")]
                 for k in ("text", "identifier", "cjk_substring", "identifier_common")]
        cells += [["lcm_expand ms p50", get_path(m, "lcm_expand.ms.p50")],
                  ["compress() engine ms p50", get_path(m, "compress.engine_ms.p50")],
                  ["select_context cached ms p50", get_path(m, "select_context.cached_ms.p50")]]
        L += [f"PostgreSQL grown to {_f(g['n_stored'])} messages ({_f(g['n_replicated'])} copied with SQL in "
              f"{g['replicate_seconds']} s, their index rows with them; {_f(g['store_bytes'])} bytes), same "
              "measurement:", ""]
        L += _table(["metric", "PostgreSQL"], cells)
        L.append("")
    return L + _gateway(b.get("gateway") or {})


def _gateway(g: dict[str, Any]) -> list[str]:
    """The gateway table of bench/gateway.py (both backends)."""
    if not g:
        return []
    if g.get("error"):
        return [f"Gateway store: failed: `{g['error'][:2000]}`", ""]
    first = g.get("postgresql") or g.get("sqlite")
    b = first["build"]
    L = [f"A gateway's store (`bench/gateway.py`): {_f(b['users'])} users, each in its own conversation, "
         f"compacting in turns ({first['passes_per_user']} passes each, {first['summaries_per_pass']} leaf "
         f"summaries a pass): {_f(b['messages'])} messages and {_f(b['summaries'])} summaries, each user's ids "
         "in runs between everyone else's. One user's `lcm_grep` from a new session of its conversation, against "
         "the same user's history alone in a store of its own (the same texts); p50 ms over "
         f"{first['reps']} calls. The ratio is what the other users cost a search (hits must be equal).", ""]
    rows = []
    for backend in ("sqlite", "postgresql"):
        for r in (g.get(backend) or {}).get("rows", []):
            rows.append([backend, r["user"], r["query"], r["alone_ms"], r["gateway_ms"], r["ratio"],
                         f"{r['hits_alone']} / {r['hits_gateway']}"])
    L += _table(["backend", "user", "query", "alone ms", "gateway ms", "ratio", "hits alone / gateway"], rows)
    L.append("")
    for backend in ("sqlite", "postgresql"):
        if g.get(backend):
            L.append(f"{backend}: built in {g[backend]['build']['build_seconds']} s.")
    return L + [""]


def _stale_modules(profiles: list[dict[str, Any]]) -> list[str]:
    """Our modules named by `profiles` (`lossless_context/x.py:12(fn)`) that the tree no longer has."""
    root = Path(__file__).resolve().parents[1]
    named = {m.group(1) for pr in profiles
             for key in ("by_own_time", "by_cumulative_time_ours") for r in pr.get(key, [])
             if (m := re.match(r"(lossless_context/[\w/]+\.py):", str(r.get("function", ""))))}
    return sorted(n for n in named if not (root / n).exists())


def _profiles(parts: dict[str, Any]) -> list[str]:
    found = []
    sc = parts.get("scale") or {}
    for p in sc.get("points", []):
        for where in ("build", "measure"):
            for key, val in (p.get(where) or {}).items():
                if key.startswith("profile_"):
                    if key == "profile_grep":
                        found.extend(val.values())
                    else:
                        found.append(val)
    plans = [(p["n"], p["measure"]["query_plans"]) for p in sc.get("points", [])
             if (p.get("measure") or {}).get("query_plans")]
    if not found:
        return []
    stale = _stale_modules(found)
    if stale:
        # Profiles of code that has since moved would be read as this code's: say so instead.
        return ["", "## Profiles (cProfile)", "",
                "The profiles kept in `bench/results.json` come from an earlier `scale` run and name modules "
                f"that no longer exist ({', '.join(stale[:4])}"
                f"{', …' if len(stale) > 4 else ''}), so they are not shown as this code's. "
                "`python -m bench --only scale` profiles the current code (full mode).", ""]
    L = ["", "## Profiles (cProfile)", "",
         "Where the time goes in the costs that miss their targets, profiled in the run above: one ingest batch "
         "(2,000 new messages appended to a 2,000-message list, separate store), and 5 more compress passes plus "
         "3 of each lcm_grep query at the largest really-ingested size and at the largest size. Shares are of "
         "the profiled wall time (cProfile inflates Python-heavy code somewhat; `execute` of sqlite3 is time "
         "inside SQLite). Full listings: `bench/out/profiles/` (not committed).", ""]
    for pr in found:
        L += [f"**{pr['label']}** — {pr['profiled_seconds']} s profiled.", ""]
        L += _table(["own time: function", "calls", "s", "share"],
                    [[f"`{r['function']}`", r["calls"], r["seconds"], _pct(r["share"])] for r in pr["by_own_time"][:8]])
        L.append("")
        L += _table(["cumulative (our code): function", "calls", "s", "share"],
                    [[f"`{r['function']}`", r["calls"], r["seconds"], _pct(r["share"])]
                     for r in pr["by_cumulative_time_ours"][:8]])
        L.append("")
    for n, qp in plans:
        L += [f"SQLite query plans at {_n(n)} (live session lineage: {qp.get('lineage_sessions')} sessions):", ""]
        for name in ("log_after", "substring_search"):
            if name in qp:
                L.append(f"- `{name}`: " + "; ".join(f"`{x}`" for x in qp[name]))
        L.append("")
    return L
