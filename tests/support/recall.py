"""Recovering a stored message through the agent's own tools, as the original.

A test that says "recovered verbatim" must not pass because a summary or a snippet merely
mentions the canary: `expand_original` pages through `lcm_expand` of one message id (following
`next_cursor`) and rebuilds the message the tool shows; `recovered` is true only when one of the
hits rebuilds to exactly the original message (same keys, same values).
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Optional

MAX_PAGES = 400


def expand_original(engine: Any, message_id: str, max_tokens: int = 12_000) -> Optional[dict[str, Any]]:
    """The message `lcm_expand` shows for `message_id` ("m12"), all pages joined; None when the
    answer is an error or not a message."""
    args: dict[str, Any] = {"id": message_id, "max_tokens": max_tokens}
    first = json.loads(engine.handle_tool_call("lcm_expand", args))
    if "error" in first:
        return None
    if "message" in first:
        return first["message"]
    if "page" not in first:
        return None
    pages, page = [first["page"]], first
    for _ in range(MAX_PAGES):
        if not page.get("next_cursor"):
            break
        page = json.loads(engine.handle_tool_call("lcm_expand", {**args, "cursor": page["next_cursor"]}))
        if "page" not in page:
            return None
        pages.append(page["page"])
    text = "".join(pages)
    if first.get("paged_field") == "message_json":
        return json.loads(text)
    return {**first.get("message_fields", {}), "content": text}


def recovered(engine: Any, message_ids: Iterable[str], original: dict[str, Any]) -> bool:
    """True when one of `message_ids` expands to exactly `original`."""
    want = json.dumps(original, sort_keys=True)
    for mid in message_ids:
        got = expand_original(engine, mid)
        if got is not None and json.dumps(got, sort_keys=True) == want:
            return True
    return False


def message_hits(grep_answer: dict[str, Any]) -> list[str]:
    """The ids of the message hits in an `lcm_grep` answer, in its order."""
    return [h["id"] for g in grep_answer.get("groups", []) for h in g["hits"] if h["kind"] == "message"]
