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
    L += _when(pc)
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


def _when(part: dict[str, Any]) -> list[str]:
    """The part's own run (parts are run on their own, on a machine others share)."""
    if not part.get("run_at"):
        return []
    return ["", f"Run {part['run_at']} (UTC) on its own (`--only`), {_f(part.get('wall_seconds'))} s; load average at "
            f"its end {[round(x, 1) for x in part.get('load_end') or []]} on 2 cores shared with other work: compare before and after, not "
            "absolute times."]


def get(d: Any, path: str) -> Any:
    for k in path.split("."):
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def bg_cost(bc: dict[str, Any]) -> list[str]:
    L = ["", "## 9. Zero wait by default: waiting saved and tokens spent ahead of need (`bench/bg_cost.py`)", ""]
    if bc.get("error"):
        return L + [f"failed: `{bc['error'][:2000]}`"]
    mix = ", ".join(f"{n} ({_n(k)} messages)" for n, k in bc.get("mix", []))
    L.append(f"{_n(bc.get('window'))}-token window; the newer host's calls (`on_turn_complete` each turn, then "
             f"`compress` when asked); session mix: {mix}. *Wait* = wall time in `compress()`; *tokens* = chars/4 of "
             "what the model server received (the worker's work included, after it drained); *ahead of need* = "
             "tokens with the worker minus without it, per session.")
    for speed, row in (bc.get("speeds") or {}).items():
        L += ["", f"Every summary call takes **{speed} s** (think time between turns capped at "
              f"{row.get('think_time_cap_s')} s):", ""]
        off = row.get("off") or {}
        rows = []
        for mode in ("off", "on, before #41", "on"):
            r = row.get(mode) or {}
            for name, sess in (r.get("sessions") or {}).items():
                base = (off.get("sessions") or {}).get(name) or {}
                extra = (sess["tokens_sent"] - base["tokens_sent"]) if base and mode != "off" else None
                saved = (base["wait_total_s"] - sess["wait_total_s"]) if base and mode != "off" else None
                rows.append([mode, name, sess["passes"], _f(get(sess, "wait_ms.p50")), _f(get(sess, "wait_ms.p95")),
                             _f(sess["wait_total_s"]), sess["calls"], _n(sess["tokens_sent"]),
                             "—" if extra is None else f"{extra:+,}", "—" if saved is None else _f(saved)])
        L += _table(["worker", "session", "passes", "wait p50 ms", "p95 ms", "total wait s", "model calls",
                     "tokens sent", "ahead of need (tokens)", "waiting saved s"], rows)
    return L + _when(bc)


def pg_ident(pi: dict[str, Any]) -> list[str]:
    L = ["", "## 10. PostgreSQL identifiers as whole lexemes (`bench/pg_ident.py`)", ""]
    if pi.get("error") or pi.get("skipped"):
        return L + [f"not run: {pi.get('error') or pi.get('reason')}"]
    L.append(f"The backends bench's history, kept between runs; *before* = a copy measured with the code of "
             f"`{pi.get('baseline')}`, *after* = another copy opened by this tree (migration 033, then the "
             "identifier lexemes of the rows already there) and measured; the scale bench's `measure` "
             "(identifier = a planted canary, common identifier = `reconcile_day`).")
    metrics = [("lcm_grep identifier ms p50", "lcm_grep.identifier.ms.p50"),
               ("lcm_grep common identifier ms p50", "lcm_grep.identifier_common.ms.p50"),
               ("lcm_grep text ms p50", "lcm_grep.text.ms.p50"),
               ("lcm_grep CJK ms p50", "lcm_grep.cjk_substring.ms.p50"),
               ("lcm_expand ms p50", "lcm_expand.ms.p50"),
               ("compress() engine ms p50", "compress.engine_ms.p50"),
               ("select_context cached ms p50", "select_context.cached_ms.p50")]
    for p in pi.get("points", []):
        L += ["", f"**{_n(p['n'])} messages**:", ""]
        rows = []
        for label, path in metrics:
            b, a = get(p, f"before.{path}"), get(p, f"after.{path}")
            ratio = round(a / b, 2) if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None
            rows.append([label, _f(b), _f(a), _f(ratio)])
        L += _table(["metric", "before", "after", "after / before"], rows)
        op = p.get("after_open") or {}
        L += ["", f"Opening the store after (migration and backfill of the rows already indexed): open "
              f"{_f(op.get('open_seconds'))} s, identifier backfill {_f(op.get('identifier_backfill_seconds'))} s."]
    ing = pi.get("ingest") or {}
    if ing:
        L += ["", f"Ingest of the same {_n(ing.get('messages'))} messages (all-new batches on the commit path; "
              "until indexed; the indexer's `lcm_tsvector` over their texts):", ""]
        rows = []
        for label in ("before", "after", "sqlite"):
            r = ing.get(label) or {}
            rows.append([label if label != "sqlite" else "SQLite (this tree)", _f(r.get("all_new_batch_msgs_per_s")),
                         _f(r.get("msgs_per_s")), _f(get(r, "tsvector.seconds")), _f(get(r, "tsvector.bytes"))])
        L += _table(["store", "all-new batch msgs/s", "until indexed msgs/s", "lcm_tsvector s", "tsvector bytes"], rows)
        a, sq = get(ing, "after.all_new_batch_msgs_per_s"), get(ing, "sqlite.all_new_batch_msgs_per_s")
        if a and sq:
            L += ["", f"Commit path, PostgreSQL after / SQLite: ×{a / sq:.2f} (goal ≥ ×0.5)."]
    return L + _when(pi)
