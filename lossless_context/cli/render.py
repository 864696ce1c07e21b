"""How the `lcm` command line prints: rich tables for status and sessions, and plain-text
renderings of the agent tools' JSON (grep hits, a node's description, an expansion)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import JustifyMethod


def _ts(t: Any) -> str:
    if not t:
        return "-"
    from datetime import datetime, timezone

    return datetime.fromtimestamp(float(t), tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _size(n: int) -> str:
    x = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if x < 1024 or unit == "GiB":
            return f"{x:,.0f} {unit}" if unit == "B" else f"{x:,.1f} {unit}"
        x /= 1024
    return str(x)


def _depths(by_depth: dict[Any, int]) -> str:
    items = sorted(((int(k), v) for k, v in by_depth.items()))
    return ", ".join(f"d{d}: {n}" for d, n in items) if items else "none"


def status_table(console: Any, st: dict[str, Any]) -> None:
    from rich.table import Table

    t = Table(show_header=False, title="lcm store", title_justify="left")
    t.add_column("what", style="bold")
    t.add_column("value")
    t.add_row("store", f"{st['location']} ({st['backend']})")
    t.add_row("size", _size(int(st.get("bytes") or 0)))
    t.add_row("sessions", f"{st['sessions']:,}")
    t.add_row("messages", f"{st['messages']:,} ({st.get('message_tokens', 0):,} tokens)")
    t.add_row("summary nodes", _depths(st["summaries_by_depth"]))
    if st.get("staged_summaries"):
        t.add_row("staged (uncommitted)", f"{st['staged_summaries']:,}")
    if st.get("unindexed_messages"):
        t.add_row("not yet full-text indexed", f"{st['unindexed_messages']:,} (indexed by the next search)")
    t.add_row("compactions", f"{st['compactions']:,}")
    sem = st.get("semantic") or {}
    if sem.get("enabled") or sem.get("vectors"):
        kept = ", ".join(f"{n:,} ({m})" for m, n in sem.get("vectors", {}).items()) or "none yet"
        t.add_row("semantic search", f"{'on' if sem.get('enabled') else 'off'}; message vectors kept: {kept}")
    sp = st.get("summariser_spend") or {}
    if sp.get("calls"):
        t.add_row("summariser spend", f"{sp['calls']:,} calls for {sp['nodes']:,} nodes, {sp['input_tokens']:,} tokens "
                  f"in / {sp['output_tokens']:,} out, {sp['ms'] / 1000:.1f} s, model {', '.join(sp['models'])}")
    last = _ts(st.get("last_compaction_at"))
    if st.get("last_compaction_session"):
        last += f" (session {st['last_compaction_session']})"
    t.add_row("last compaction", last)
    console.print(t)


def sessions_table(console: Any, rows: list[dict[str, Any]]) -> None:
    from rich.table import Table

    if not rows:
        console.print("no sessions")
        return
    by_parent: dict[Any, list[dict[str, Any]]] = {}
    ids = {r["id"] for r in rows}
    for r in rows:
        by_parent.setdefault(r["parent_id"] if r["parent_id"] in ids else None, []).append(r)
    t = Table(title=f"{len(rows)} sessions", title_justify="left")
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("session", "left"), ("parent", "left"), ("conversation", "left"), ("messages", "right"),
        ("summaries", "right"), ("compactions", "right"), ("updated", "left"))
    for col, just in columns:
        t.add_column(col, justify=just, overflow="fold")
    seen: set[str] = set()

    def add(r: dict[str, Any], depth: int) -> None:
        if r["id"] in seen:
            return
        seen.add(r["id"])
        prefix = ("   " * (depth - 1) + "└─ ") if depth else ""
        t.add_row(prefix + r["id"], r["parent_id"] or "-", r["conversation_id"] or "-", f"{r['messages']:,}",
                  f"{r['summaries']:,}", str(r["compactions"]), _ts(r["updated_at"]))
        for kid in by_parent.get(r["id"], []):
            add(kid, depth + 1)

    for r in by_parent.get(None, []):
        add(r, 0)
    for r in rows:  # cycles or anything unreached
        add(r, 0)
    console.print(t)


def _one_line(s: Any, n: int = 160) -> str:
    s = " ".join(str(s or "").split())
    return s if len(s) <= n else s[: n - 1] + "…"


def grep_text(data: dict[str, Any]) -> str:
    lines = [f"{data.get('hits', 0)} hits for {data.get('query')!r} ({data.get('mode')})"]
    for g in data.get("groups", []):
        lines.append("")
        lines.append(f"[{g.get('summary_id') or 'active context'}]" + (f" {g['note']}" if g.get("note") else ""))
        for h in g.get("hits", []):
            chain = " → ".join(h.get("summary_chain") or [])
            lines.append(f"  {h['id']:>8}  {h.get('role') or '':9} {h.get('time') or '':25} "
                         f"{_one_line(h.get('snippet'), 120)}")
            if chain:
                lines.append(f"  {'':8}  under {chain}")
    if data.get("next_cursor"):
        lines.append("")
        lines.append(f"more: --cursor {data['next_cursor']}")
    return "\n".join(lines)


def describe_text(d: dict[str, Any]) -> str:
    if d.get("kind") == "message":
        lines = [f"{d['id']}  message  role {d.get('role')}  session {d.get('session_id')}",
                 f"time {d.get('time')}  tokens {d.get('tokens')}  chars {d.get('chars')}"]
        if d.get("tool_call_id"):
            lines.append(f"tool_call_id {d['tool_call_id']}")
        if d.get("tool_calls"):
            lines.append("tool calls: " + ", ".join(str(x) for x in d["tool_calls"]))
        lines.append("covered by: " + (" → ".join(d.get("covered_by") or []) or "(not summarised)"))
        if d.get("large"):
            lines.append("large message; exploration summary:")
            lines.append(str(d.get("exploration") or ""))
        lines.append("")
        lines.append(str(d.get("preview") or ""))
        return "\n".join(lines)
    kids = d.get("children") or []
    lines = [
        f"{d['id']}  {d.get('kind')} summary  depth {d.get('depth')}",
        f"tokens {d.get('tokens')} (from {d.get('source_tokens')} source tokens), "
        f"{d.get('messages_covered')} messages, {d.get('time_start')} → {d.get('time_end')}",
        f"level {d.get('level')}, summariser {d.get('summarizer')}" + _node_cost(d.get("cost")),
        "parents: " + (" ".join(d.get("parents") or []) or "none (top of the DAG)"),
        f"children ({d.get('children_total', len(kids))}): " + " ".join(kids[:40])
        + (" …" if len(kids) > 40 else ""),
        "", str(d.get("text") or ""),
    ]
    return "\n".join(lines)


def _node_cost(c: Any) -> str:
    if not isinstance(c, dict):
        return ""
    return (f", model {c.get('model')}: {c.get('calls')} calls, {c.get('input_tokens'):,} tokens in / "
            f"{c.get('output_tokens'):,} out, {c.get('ms')} ms")


def _message_body(msg: Any) -> str:
    if not isinstance(msg, dict):
        return json.dumps(msg, ensure_ascii=False)
    out = []
    content = msg.get("content")
    if isinstance(content, str):
        out.append(content)
    elif content is not None:
        out.append(json.dumps(content, ensure_ascii=False, indent=2))
    if msg.get("tool_calls"):
        out.append("tool_calls: " + json.dumps(msg["tool_calls"], ensure_ascii=False, indent=2))
    return "\n".join(out)


def expand_text(d: dict[str, Any]) -> str:
    lines: list[str] = []
    if str(d.get("id", "")).startswith("m"):
        msg = d.get("message")
        lines.append(f"── {d['id']}  {d.get('role')}  {d.get('time')}"
                     + (f"  tool_call_id {msg.get('tool_call_id')}" if isinstance(msg, dict) and msg.get("tool_call_id") else ""))
        if msg is not None:
            lines.append(_message_body(msg))
        else:
            lines.append(f"(characters {d.get('offset')}–{d.get('offset', 0) + len(d.get('page', ''))} of "
                         f"{d.get('total_chars')}, field {d.get('paged_field')})")
            lines.append(str(d.get("page", "")))
    else:
        lines.append(f"── {d['id']}  {d.get('kind')} summary, depth {d.get('depth')}: children "
                     f"{d.get('from', 0) + 1}–{d.get('from', 0) + len(d.get('children') or [])} of {d.get('children_total')}")
        for c in d.get("children") or []:
            lines.append("")
            if str(c.get("id", "")).startswith("s"):
                lines.append(f"── {c['id']}  {c.get('kind')} d{c.get('depth')}  {c.get('messages_covered')} messages  "
                             f"{c.get('time_start')} → {c.get('time_end')}")
                lines.append(str(c.get("text") or ""))
            else:
                lines.append(f"── {c['id']}  {c.get('role')}  {c.get('time')}")
                lines.append(_message_body(c.get("message")) if "message" in c else
                             f"{c.get('note')}\n{c.get('preview', '')}")
    if d.get("next_cursor"):
        lines.append("")
        lines.append(f"more: lcm expand {d['id']} --cursor {d['next_cursor']}")
    return "\n".join(lines)
