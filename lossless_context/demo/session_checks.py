"""Checks over generated (or any) chat-completions message lists: whether a list is a valid
OpenAI sequence (`validate_openai_sequence`) and whether a session's planted canaries occur
exactly once where they were planted (`check_canaries`). Kept apart from the generators in
sessions.py, which re-exports both.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Iterator, Sequence

if TYPE_CHECKING:
    from .sessions import Canary

_ROLES = ("system", "developer", "user", "assistant", "tool")
_PARTS = {"system": {"text"}, "developer": {"text"}, "tool": {"text"}, "assistant": {"text", "refusal"},
          "user": {"text", "image_url", "input_audio", "file"}}


def _content_problem(role: str, content: Any) -> str | None:
    if isinstance(content, str) or (content is None and role == "assistant"):
        return None
    if not isinstance(content, list):
        return "content is None" if content is None else f"content has type {type(content).__name__}"
    if not content:
        return "content is an empty list"
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") not in _PARTS[role]:
            return f"content part {j} is not a valid {role} part"
        if part["type"] in ("text", "refusal") and not isinstance(part.get(part["type"]), str):
            return f"content part {j} has no string {part['type']!r}"
    return None


def _call_problem(tc: Any) -> str | None:
    fn = tc.get("function") if isinstance(tc, dict) else None
    if tc.get("type") != "function":
        return f"has type {tc.get('type')!r}"
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        return "has no function name"
    try:
        if isinstance(fn.get("arguments"), str) and isinstance(json.loads(fn["arguments"]), dict):
            return None
    except ValueError:
        pass
    return "arguments are not a JSON object string"


def validate_openai_sequence(messages: Sequence[Any]) -> list[str]:
    """Problems that make `messages` an invalid chat-completions sequence (empty list if valid).

    Each assistant tool call needs exactly one tool result, and the results must follow it
    contiguously (nothing but tool messages until all calls are answered, in any order); a tool
    result needs a matching call; roles must be known; content, tool_calls and arguments (a JSON
    object string) must be well typed. Call ids may repeat across assistant messages, not within one."""
    problems: list[str] = []
    pending: dict[str, None] = {}  # ids of the open assistant message still awaiting results
    answered: set[str] = set()
    owner: int | None = None  # index of the assistant message whose results may follow
    for i, m in enumerate(messages):
        role = m.get("role") if isinstance(m, dict) else None
        if role != "tool":
            if pending:
                problems.append(f"message {owner}: no result for tool call(s) {list(pending)} before message {i}")
            pending, owner = {}, None
        if not isinstance(m, dict) or role not in _ROLES:
            problems.append(f"message {i}: " + (f"unknown role {role!r}" if isinstance(m, dict)
                                                 else f"not a dict ({type(m).__name__})"))
            continue
        if role != "assistant" and "tool_calls" in m:
            problems.append(f"message {i}: tool_calls on a {role} message")
        if role != "assistant" and "content" not in m:
            problems.append(f"message {i}: {role} message has no content")
        elif (p := _content_problem(role, m.get("content"))) is not None:
            problems.append(f"message {i}: {p}")
        if role == "tool":
            cid = m.get("tool_call_id")
            if not isinstance(cid, str) or not cid:
                problems.append(f"message {i}: tool message without a tool_call_id")
            elif owner is None:
                problems.append(f"message {i}: orphan tool result {cid!r} (no preceding assistant tool call)")
            elif cid in pending:
                del pending[cid]
                answered.add(cid)
            else:
                what = "duplicate tool result for" if cid in answered else "tool result matches no call:"
                problems.append(f"message {i}: {what} {cid!r} of message {owner}")
        elif role == "assistant" and (calls := m.get("tool_calls")) is not None:
            if not isinstance(calls, list) or not calls:
                problems.append(f"message {i}: tool_calls must be a non-empty list")
                continue
            owner, answered = i, set()
            for j, tc in enumerate(calls):
                cid = tc.get("id") if isinstance(tc, dict) else None
                if not isinstance(cid, str) or not cid:
                    problems.append(f"message {i}: tool call {j} has no id")
                    continue
                if cid in pending:
                    problems.append(f"message {i}: tool call id {cid!r} repeated within the message")
                pending[cid] = None
                if (p := _call_problem(tc)) is not None:
                    problems.append(f"message {i}: tool call {cid!r} {p}")
        elif role == "assistant" and m.get("content") is None:
            problems.append(f"message {i}: assistant message with neither content nor tool_calls")
    if pending:
        problems.append(f"message {owner}: no result for tool call(s) {list(pending)} before the end")
    return problems


def _strings(m: dict) -> Iterator[str]:
    c = m.get("content")
    if isinstance(c, str):
        yield c
    elif isinstance(c, list):
        yield from (p.get("text", "") for p in c if isinstance(p, dict))
    for tc in m.get("tool_calls") or ():
        yield tc.get("id", "")
        yield tc.get("function", {}).get("name", "")
        yield tc.get("function", {}).get("arguments", "")
    if "tool_call_id" in m:
        yield m["tool_call_id"]


def check_canaries(messages: Sequence[dict], canaries: Sequence[Canary]) -> list[str]:
    """Problems with canaries: each value must occur exactly once, inside its message_index."""
    blobs = ["\x1f".join(_strings(m)) for m in messages]
    problems = []
    for c in canaries:
        hits = [i for i, b in enumerate(blobs) for _ in range(b.count(c.value))]
        if hits != [c.message_index]:
            problems.append(f"canary {c.key} {c.value!r}: found at {hits[:5]}, planted at {c.message_index}")
    if len({c.value for c in canaries}) != len(canaries):
        problems.append("canary values are not unique")
    return problems
