"""`lcm view`: a self-contained HTML page showing one session's summary DAG.

Holds the data collection (`collect`) and the page writer (`render_view`, `write_view`).
The page template is the package file `viewer.html` (inline CSS and JS, no network): the
data is embedded as JSON in a `<script type="application/json">` tag and the page builds
DOM lazily — only the top level (paged, 100 rows at a time) at load, a node's children
when it is opened — so it stays usable with tens of thousands of messages. A URL hash
opens nodes on load (`#expand=s12`, `#expand=s12,m345`) or runs a search (`#q=text`).
"""

from __future__ import annotations

import html
import json
import os
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path
from typing import Any

from .export import StoreSQL, lineage_sessions
from ..store.base import Store
from ..files import write_text_atomic

MAX_TEXT_CHARS = 20_000  # per message in the page; `lcm expand` shows the rest
_DATA_TOKEN = "/*__LCM_DATA__*/"
_TITLE_TOKEN = "__LCM_TITLE__"


def latest_session(store: Store) -> str | None:
    """The user's latest real session (never a host background fork; see forks.py)."""
    from ..sessions.forks import latest_real_session

    return latest_real_session(store.list_sessions())


def collect(store: Store, session_id: str) -> dict[str, Any]:
    """Everything the page shows for `session_id` and its lineage, as compact JSON-able data."""
    db = StoreSQL(store)
    scope = lineage_sessions(store, session_id)
    sessions = db.sessions(scope)
    summaries = db.summaries(scope)
    context = db.contexts([session_id]).get(session_id, [])
    in_ctx_m = {ref for k, ref in context if k == "m"}
    in_ctx_s = {ref for k, ref in context if k == "s"}

    undone = db.retracted()
    messages: list[dict[str, Any]] = []
    for (mid, sess, _seq, _uid, _ident, role, tokens, created_at, large, _expl, _sup, text, _raw) in db.message_rows(scope):
        # A message the host rolled back (undo, retry) is listed as undone, without its text:
        # the page is made to be shared, and its search must not find what the user took back.
        text = "" if mid in undone else (text or "")
        m: dict[str, Any] = {"i": mid, "r": role, "k": tokens, "t": created_at, "x": text[:MAX_TEXT_CHARS]}
        if mid in undone:
            m["u"] = 1
        if len(text) > MAX_TEXT_CHARS:
            m["c"] = len(text)
        if sess != session_id:
            m["s"] = sess
        if mid in in_ctx_m:
            m["a"] = 1
        if large:
            m["L"] = 1
        messages.append(m)

    covered: set[int] = set()
    has_parent: set[int] = set()
    first: dict[int, int] = {}
    out_s: list[dict[str, Any]] = []
    node_costs = store.get_summary_costs([s["id"] for s in summaries])  # model, tokens in/out, ms per node
    for s in summaries:  # ascending ids: children come before their parents
        covered.update(s["messages"])
        has_parent.update(s["children"])
        cands = list(s["messages"]) + [first[c] for c in s["children"] if c in first]
        if cands:
            first[s["id"]] = min(cands)
        d: dict[str, Any] = {"i": s["id"], "d": s["depth"], "n": s["kind"], "k": s["tokens"], "o": s["source_tokens"],
                             "c": s["n_messages"], "a": s["t_start"], "b": s["t_end"], "x": s["text"],
                             "m": s["messages"], "s": s["children"], "l": s["level"], "z": s["summarizer"]}
        if s["id"] in in_ctx_s:
            d["ctx"] = 1
        cost = node_costs.get(s["id"])
        if cost:
            d["$"] = [cost["model"], cost["input_tokens"], cost["output_tokens"], cost["ms"]]
        out_s.append(d)

    roots: list[tuple[int, str, int]] = []
    for s in summaries:
        if s["id"] not in has_parent:
            roots.append((first.get(s["id"], 0), "s", s["id"]))
    for m in messages:
        if m["i"] not in covered:
            roots.append((m["i"], "m", m["i"]))
    roots.sort()

    by_depth: dict[str, int] = {}
    for s in summaries:
        by_depth[str(s["depth"])] = by_depth.get(str(s["depth"]), 0) + 1
    ctx_tokens = sum(m["k"] for m in messages if m.get("a")) + sum(s["k"] for s in out_s if s.get("ctx"))
    return {
        "session": session_id,
        "store": store.location,
        "generated": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "sessions": [{"id": s["id"], "parent": s["parent_id"], "conversation": s["conversation_id"],
                      "compactions": s["compactions"]} for s in sessions],
        "stats": {"messages": len(messages), "undone": sum(1 for m in messages if m.get("u")), "message_tokens": sum(m["k"] or 0 for m in messages),
                  "summaries": len(out_s), "by_depth": by_depth, "context_items": len(context),
                  "context_tokens": ctx_tokens},
        "roots": [[k, i] for _, k, i in roots],
        "messages": messages,
        "summaries": out_s,
    }


def _template() -> str:
    return resources.files("lossless_context.ops").joinpath("viewer.html").read_text(encoding="utf-8")


def render_view(data: dict[str, Any]) -> str:
    payload = json.dumps(data, ensure_ascii=True, separators=(",", ":"))
    # Inside <script> only "</" (and "<!--") could end or confuse the element; "\/" is valid JSON.
    payload = payload.replace("</", "<\\/").replace("<!--", "<\\u0021--")
    title = html.escape(f"LCM — {data['session']}")
    return _template().replace(_TITLE_TOKEN, title).replace(_DATA_TOKEN, payload)


def write_view(store: Store, session_id: str | None, path: str | os.PathLike[str]) -> str:
    """Write the page for `session_id` (default: the most recently updated session)."""
    sid = session_id or latest_session(store)
    if sid is None:
        raise LookupError("the store has no sessions yet")
    page = render_view(collect(store, sid))
    dest = Path(path).expanduser()
    dest.parent.mkdir(parents=True, exist_ok=True)
    # 0600: the page holds the conversation, keep it private
    write_text_atomic(dest, page, prefix=".lcm-view.", suffix=".html.tmp")
    return str(dest)
