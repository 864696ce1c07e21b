"""The engine's own tool traffic among search hits: it ranks below the originals it quotes.

Each search the agent runs leaves messages that repeat the query: the question that asked
for it, the ``lcm_grep(...)`` call, the JSON answer (which quotes every hit) and the reply
that reads the answer back. Three searches for ``svc-kappa-5`` filled the first page with
them and pushed the one message that said it to page 2. :func:`mark` flags such hits
(``r["traffic"] = True``); the ranking puts them after the other hits of their block, and
``lcm_expand_query`` leaves them out when originals were found.

A hit is traffic when it is

* an assistant message whose tool calls are all the engine's tools (``→ lcm_grep({...})``
  lines, as ``messages.message_text`` renders calls) with little text of its own;
* a tool result holding one of the engine's JSON answers (a grep page, a node or message
  from ``lcm_describe`` / ``lcm_expand``, an ``lcm_expand_query`` answer, a tool error);
* a user message whose next message (same session) is such a call and quotes what the user
  message matched (the question that asked for the search);
* an assistant reply right after such an answer whose matched items the answer holds too
  (it reads the answer back).

Backend-neutral: one ``Store.get_messages`` for the neighbours of the rows looked at.
"""

from __future__ import annotations

import json
import re
from typing import Any, Sequence

from ..store.search_api import SearchAPI

TOOLS = ("lcm_grep", "lcm_describe", "lcm_expand", "lcm_expand_query")
_CALL = re.compile(r"^→ ([A-Za-z0-9_.-]+)\(", re.M)
_NODE_ID = re.compile(r"[ms]\d+")
OWN_TEXT = 200  # characters of its own a call message may carry ("Let me search…") and stay traffic


def is_call(role: str | None, text: str) -> bool:
    """An assistant message that only calls the engine's tools."""
    if role != "assistant" or "→ lcm_" not in text:
        return False
    names = _CALL.findall(text)
    if not names or not all(n in TOOLS for n in names):
        return False
    first = text.find("→ ")
    return len(text[:first].strip()) <= OWN_TEXT


def is_answer(role: str | None, text: str) -> bool:
    """A tool result that is one of the engine's JSON answers."""
    if role != "tool":
        return False
    t = text.lstrip()
    if not t.startswith("{"):
        return False
    try:
        d = json.loads(t)
    except ValueError:
        head = t[:200]  # a result the host cut to a preview: the answer's first keys
        return head.startswith(('{"query":', '{"prompt":')) or bool(re.match(r'\{"id": "[ms]\d+"', head))
    if not isinstance(d, dict):
        return False
    if "groups" in d and "query" in d:  # lcm_grep
        return True
    if "prompt" in d and "sources" in d:  # lcm_expand_query
        return True
    nid = d.get("id")
    if isinstance(nid, str) and _NODE_ID.fullmatch(nid):  # lcm_describe / lcm_expand
        return True
    return set(d) == {"error"} and isinstance(d.get("error"), str)


def _holds_all(text: str, items: Sequence[str], source: str) -> bool:
    low, src = text.casefold(), source.casefold()
    found = [i for i in items if i in low]
    return bool(found) and all(i in src for i in found)


def mark(store: SearchAPI, rows: list[dict[str, Any]], items: Sequence[str], top: int | None = None) -> None:
    """Flag the message rows among ``rows`` that are the engine's own traffic (see the module
    doc); ``items``: the query's items (what a hit matched). The neighbours (one store read)
    are looked at for the ``top`` best-scored questions and replies only: what can reach the
    page asked for."""
    msgs = [r for r in rows if r.get("kind", "m") == "m" and "traffic" not in r]
    if not msgs:
        return
    low_items = [i.casefold() for i in items if i and i.strip()]
    rest = []
    for r in msgs:
        text, role = r.get("text") or "", r.get("role")
        r["traffic"] = is_call(role, text) or is_answer(role, text)
        if not r["traffic"] and role in ("user", "assistant") and low_items:
            rest.append(r)
    if not rest:
        return
    if top is not None and len(rest) > top:
        rest = sorted(rest, key=lambda r: (-(r.get("score") or 0.0), -(r.get("created_at") or 0)))[:top]
    want = sorted({r["id"] + 1 for r in rest if r["role"] == "user"} | {r["id"] - 1 for r in rest if r["role"] == "assistant"})
    near = store.get_messages(want)
    for r in rest:
        other = near.get(r["id"] + 1 if r["role"] == "user" else r["id"] - 1)
        if other is None or other.session_id != r.get("session_id", other.session_id):
            continue
        text = other.text or ""
        if r["role"] == "user" and is_call(other.role, text):
            r["traffic"] = _holds_all(r.get("text") or "", low_items, text)
        elif r["role"] == "assistant" and is_answer(other.role, text):
            r["traffic"] = _holds_all(r.get("text") or "", low_items, text)
