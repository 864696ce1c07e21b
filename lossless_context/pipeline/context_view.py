"""What the model sees now: a session's active context, item by item, with ids and tokens.

Used by `/lcm context` (the live session) and `lcm context SESSION`. Reads the stored
active context (the list the engine assembles the next request from): message items as
`m<id>`, summary nodes as `s<id>` with their depth and span, each with its token count.
"""

from __future__ import annotations

from typing import Any

from ..store.base import Store

PREVIEW_CHARS = 72


def context_rows(store: Store, session_id: str) -> list[dict[str, Any]]:
    """One row per active-context item, in order."""
    _version, entries = store.get_context(session_id)
    mids = [e.ref for e in entries if e.kind == "m"]
    sids = [e.ref for e in entries if e.kind == "s"]
    msgs = store.get_messages(mids) if mids else {}
    sums = store.get_summaries(sids) if sids else {}
    rows: list[dict[str, Any]] = []
    for pos, e in enumerate(entries):
        if e.kind == "m":
            rec = msgs.get(e.ref)
            text = rec.exploration if rec is not None and rec.large and rec.exploration else (rec.text if rec else "")
            rows.append({"pos": pos, "id": f"m{e.ref}", "role": rec.role if rec else e.role,
                         "tokens": e.tokens or (rec.tokens if rec else 0),
                         "note": "large: shown as its exploration summary" if rec is not None and rec.large else "",
                         "preview": _preview(text)})
        else:
            srec = sums.get(e.ref)
            rows.append({"pos": pos, "id": f"s{e.ref}", "role": "summary",
                         "tokens": srec.tokens if srec else 0,
                         "note": (f"{srec.kind} depth {srec.depth}, {srec.n_messages} messages" if srec else "missing"),
                         "preview": _preview(srec.text if srec else "")})
    return rows


def render_rows(session_id: str, rows: list[dict[str, Any]]) -> str:
    total = sum(r["tokens"] for r in rows)
    n_s = sum(1 for r in rows if r["id"].startswith("s"))
    lines = [f"active context of {session_id}: {len(rows)} items ({len(rows) - n_s} messages, {n_s} summaries), "
             f"~{total} tokens (the system prompt and tool schemas come on top)"]
    for r in rows:
        note = f" [{r['note']}]" if r["note"] else ""
        lines.append(f"{r['pos']:>4} {r['id']:>9} {r['role']:<9} {r['tokens']:>7} tok{note}  {r['preview']}")
    return "\n".join(lines)


def render_context(engine: Any) -> str:
    """`/lcm context`: the live session's active context."""
    sid = engine.current_session()
    if not sid:
        return "lcm context: no session yet"
    return render_rows(sid, context_rows(engine.store, sid))


def _preview(text: str) -> str:
    one = " ".join((text or "").split())
    return one if len(one) <= PREVIEW_CHARS else one[: PREVIEW_CHARS - 1] + "…"
