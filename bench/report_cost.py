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
    L.append(f"{_n(bc.get('window'))}-token window; the newer host's calls: `should_compress` after every tool batch "
             "and `compress` when asked (as the agent loop asks), `on_turn_complete` after each turn; session mix: "
             f"{mix}. *Wait* = wall time in `compress()` (what the host waits); *CPU* = the calling thread's CPU "
             "time in it; a pass *waited on the model* when it made a summary call itself; *tokens* = chars/4 of "
             "what the model server received (the worker's work included, after it drained); *ahead of need* = "
             "tokens with the worker minus without it, per session.")
    base_tokens: dict[str, int] = {}
    for row in (bc.get("speeds") or {}).values():
        off = row.get("off") or {}
        for name, sess in (off.get("sessions") or {}).items():
            if sess.get("complete", True):
                base_tokens.setdefault(name, sess["tokens_sent"])
    for speed, row in (bc.get("speeds") or {}).items():
        L += ["", f"Every summary call takes **{speed} s** (think time between turns capped at "
              f"{row.get('think_time_cap_s')} s):", ""]
        off = row.get("off") or {}
        rows = []
        modes = [(m, row.get(m) or {}) for m in ("off", "on, before #41", "on")]
        for extra in bc.get("other_runs") or []:  # (runs kept by hand: the code before a change, …)
            if extra.get("speed") == speed:
                modes.insert(-1, (extra["label"], extra["run"]))
        for mode, r in modes:
            for name, sess in (r.get("sessions") or {}).items():
                if mode not in ("off", "on") and not sess["passes"] and not sess["calls"]:
                    continue  # (a run kept by hand: its sessions without a pass are the others' rows)
                base = (off.get("sessions") or {}).get(name) or {}
                complete = base.get("complete", True) and sess.get("complete", True)
                ref = base["tokens_sent"] if base and complete else base_tokens.get(name)
                extra = (sess["tokens_sent"] - ref) if ref is not None and mode != "off" and sess.get("complete", True) \
                    else None
                saved = (base["wait_total_s"] - sess["wait_total_s"]) if base and complete and mode != "off" else None
                why = ", ".join(f"{k}: {v}" for k, v in (sess.get("why") or {}).items())
                w = sess.get("wait_ms") or {}
                c = sess.get("cpu_ms") or {}
                rows.append([mode, name + ("" if sess.get("complete", True) else f" (first {sess['passes']} passes)"),
                             sess["passes"], " / ".join(_f(w.get(k)) for k in ("p50", "p90", "max")),
                             " / ".join(_f(c.get(k)) for k in ("p50", "p90")),
                             f"{sess.get('waited_on_model', '—')}" + (f" ({why})" if why else ""),
                             _f(sess["wait_total_s"]), sess["calls"], _n(sess["tokens_sent"]),
                             "—" if extra is None else f"{extra:+,}", "—" if saved is None else _f(saved)])
        L += _table(["worker", "session", "passes", "wait p50 / p90 / max ms", "CPU p50 / p90 ms",
                     "waited on the model", "total wait s", "model calls", "tokens sent", "ahead of need (tokens)",
                     "waiting saved s"], rows)
        for mode, r in modes:
            quiet = [p for p in r.get("passes", []) if not p.get("calls")]
            if mode != "off" and quiet:
                L += ["", f"Worker {mode}, the passes that made no model call: " + _breakdown(quiet)]
    for note in bc.get("notes") or []:  # (what the runs showed, written with them)
        L += ["", note]
    return L + _when(bc)


def _breakdown(passes: list[dict[str, Any]]) -> str:
    """Where a pass's wall time goes when it waits on no model: its own CPU, the other threads',
    and the cores taken by other work (involuntary context switches)."""
    from .common import percentile

    def p50(key: Any) -> str:
        vals = [key(p) for p in passes]
        return _f(round(percentile(vals, 50) or 0.0, 1))

    alone = [p for p in passes if p.get("switches") and not p["switches"][1]]
    text = (f"{len(passes)} passes; wait p50 {p50(lambda p: p['wait_ms'])} ms, the calling thread's CPU p50 "
            f"{p50(lambda p: p['cpu_ms'])} ms, the process's CPU (every thread: the store's writer, the worker, "
            f"the model server of the bench) p50 {p50(lambda p: p.get('process_cpu_ms', 0.0))} ms")
    if passes and passes[0].get("switches") is not None:
        text += (f"; the calling thread was switched out p50 {p50(lambda p: p['switches'][0])} times waiting "
                 f"(a lock, a thread, the disk) and {p50(lambda p: p['switches'][1])} times taken off its core by "
                 "other work")
        if alone:
            w = percentile([p["wait_ms"] for p in alone], 50) or 0.0
            c = percentile([p["cpu_ms"] for p in alone], 50) or 0.0
            text += (f"; the {len(alone)} passes never taken off their core waited p50 {_f(round(w, 1))} ms "
                     f"for {_f(round(c, 1))} ms of CPU")
    return text + "."


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
