"""RESULTS.md sections of the recall parts (bench/realtalk.py, bench/recall_demo.py)."""

from __future__ import annotations

from typing import Any


def _rows(table: dict[str, Any], label: str) -> list[str]:
    out = []
    for half, cats in table.items():
        cells = [f"{v.get('R@5')} / {v.get('R@10')} / {v.get('R@25')} (n={v.get('n')})" for v in cats.values()]
        out.append(f"| {label} | {half} | " + " | ".join(cells) + " |")
    return out


def realtalk(r: dict[str, Any]) -> list[str]:
    L = ["", "## Recall on REALTALK (R@5 / R@10 / R@25, % of evidence turns in the top k message hits)", ""]
    if r.get("skipped") or r.get("error"):
        return L + [f"Not run: {r.get('skipped') or r.get('error')}"]
    arms = [("lcm_grep", "lcm_grep (this release)"), ("lcm_grep_roles", "lcm_grep (this release, roles only: no names)"),
            ("lcm_grep_semantic", "lcm_grep with `semantic: true` (the extra's model)"),
            ("lcm_grep_previous", "lcm_grep (previous ranking)"),
             ("fts5_or", "plain FTS5 OR query")]
    cats = list(next(iter(r["lcm_grep"]["table"].values())).keys())
    L += ["| arm | chats | " + " | ".join(cats) + " |", "|---|---|" + "---|" * len(cats)]
    for key, label in arms:
        if key in r and "table" in r[key]:
            L += _rows(r[key]["table"], label)
    ing = r.get("ingest", {})
    L += ["", f"{r.get('chats')} chats, each one session through the engine at a {r.get('context_length')} window "
          f"({ing.get('messages')} messages, {ing.get('summaries')} summaries, ingest {ing.get('msgs_per_s')} msgs/s), "
          "each message named by its speaker (OpenAI's `name`) except in the roles-only arm; "
          f"lcm_grep per call p50 {r['lcm_grep']['ask_ms'].get('p50')} ms (previous ranking "
          f"{r.get('lcm_grep_previous', {}).get('ask_ms', {}).get('p50')} ms). Constants were chosen on chats 1-5 (dev); "
          "6-10 (test) were held out."]
    sem = r.get("lcm_grep_semantic") or {}
    if "table" in sem:
        L += ["", f"Semantic arm: {sem.get('model')}, embedding {sem.get('embed_ms_per_message')} ms per message "
              f"(the background thread's cost), lcm_grep per call p50 {sem.get('ask_ms', {}).get('p50')} ms; its "
              "fusion weight was chosen on chats 1-5."]
    elif sem.get("skipped"):
        L += ["", f"Semantic arm not measured: {sem['skipped']}."]
    return L


def recall_demo(r: dict[str, Any]) -> list[str]:
    L = ["", "## Own question set over the demo sessions (planted facts)", ""]
    if r.get("error"):
        return L + [f"Error: {r['error']}"]
    keys = ["hit@1", "hit@5", "hit@10", "mrr@10", "identifier_first_hit_is_original", "identifier_original_on_page"]
    L += ["| session | ranking | questions | " + " | ".join(keys) + " |", "|---|---|---|" + "---|" * len(keys)]
    for s in r.get("sessions", []):
        for arm in ("before", "after"):
            m = s[arm]
            L.append(f"| seed {s['seed']}, {s['messages']} msgs, {s['summaries']} summaries | {arm} | {m['questions']} | "
                     + " | ".join(str(m.get(k)) for k in keys) + " |")
    return L


def grep_scale(r: dict[str, Any]) -> list[str]:
    L = ["", f"## lcm_grep at {r.get('messages')} messages (SQLite; `python -m bench.grep_scale`)", "",
         "| query | kind | hits | p50 ms this release | p50 ms previous ranking |", "|---|---|---|---|---|"]
    for kind, v in r.items():
        if isinstance(v, dict) and "this" in v:
            L.append(f"| `{v['query']}` | {kind} | {v.get('hits')} | {v['this'].get('p50')} | {v['previous'].get('p50')} |")
    L += ["", "Both rankings on the same built store, calls interleaved; the machine was shared with other jobs."]
    return L
