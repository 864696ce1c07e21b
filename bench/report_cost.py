"""RESULTS.md sections of issue 41's parts: the cost of a pass (`pass_cost`)."""

from __future__ import annotations

from typing import Any

from .report import _f, _n, _table


def pass_cost(pc: dict[str, Any]) -> list[str]:
    L = ["", "## 7. The cost of a pass (`bench/pass_cost.py`)", ""]
    if pc.get("error"):
        return L + [f"failed: `{pc['error'][:2000]}`"]
    base = pc.get("baseline")
    L.append(f"Generated coding sessions driven by the R19 host calls (the host's own estimator), "
             f"{_n(pc.get('window'))}-token window, extractive summariser, every other setting default; the "
             "late passes (second half of the session). *Engine ms* = wall time inside the pass's hooks "
             "(`compress`, and the commit's `on_session_end`/`on_session_start`) minus the summariser's; "
             "*CPU ms* = the calling thread's CPU time in those hooks, summariser included (what the pass costs "
             "when other processes take the cores: wall times wait for them). "
             + (f"*Before* = this run on `lossless_context/` of commit `{base}`, *after* = this tree; same messages, "
                "each in a child process of its own." if base else "(No baseline code: this tree only.)"))
    L.append("")
    rows = []
    for p in pc.get("points", []):
        a, b = p.get("after") or {}, p.get("before") or {}
        rows.append([_n(p["n"]), "on" if p["tool_stubs"] else "off (`tool_stubs: false`)",
                     _f(get(b, "engine_ms.p50")), _f(get(a, "engine_ms.p50")),
                     _f(get(b, "cpu_ms.p50")), _f(get(a, "cpu_ms.p50")),
                     _f(get(b, "summariser_ms.p50")), _f(get(a, "summariser_ms.p50")),
                     a.get("late_passes"), _f(get(a, "engine_ms.p95"))])
    L += _table(["messages", "tier 0", "engine ms p50 before", "after", "CPU ms p50 before", "after",
                 "summariser ms p50 before", "after", "late passes", "after: engine p95"], rows)
    g = pc.get("growth") or {}
    if g:
        L += ["", "Growth exponent of the engine p50 with session length: "
              + "; ".join(f"{k.replace('_', ', tier 0 ')} {_f(v)}" for k, v in g.items()) + "."]
    for p in pc.get("points", []):
        for label in ("before", "after"):
            prof = get(p, f"{label}.profile_by_own_ms_per_pass")
            if not prof:
                continue
            L += ["", f"Profile of a late pass at {_n(p['n'])} messages, tier 0 on, {label} (cProfile, engine hooks "
                  "only, per pass; the profiler itself slows calls down):", ""]
            L += _table(["function", "own ms", "cumulative ms", "calls"],
                        [[f"`{r['function']}`", _f(r["own_ms"]), _f(r["cum_ms"]), _f(r["calls_per_pass"])]
                         for r in prof[:10]])
    return L


def get(d: Any, path: str) -> Any:
    for k in path.split("."):
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d
