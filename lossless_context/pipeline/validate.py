"""What makes a chat-completions message list valid, checked in one place.

* `pairing_problems` — tool calls and results paired: what every output of the engine
  guarantees by construction (the host may hand over messages of any shape; those are kept
  as they are, so types are not checked here), but for a tool call its input ends waiting
  for (`pending_calls`: the host appends its results right after the output);
* `sequence_problems` — pairing plus known roles, well-typed content, tool calls and JSON-object
  arguments: what a generated or imported session must satisfy. A list it accepts is accepted by
  `pairing_problems` too (tests/test_validate.py).
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from ..messages import tool_call_ids


def pending_calls(messages: Sequence[Any]) -> list[str]:
    """The tool calls a list ends waiting for: the ids of its last assistant message's calls
    not yet answered, when nothing but its results follow it (the host appends the rest next).
    A pass keeps that call last in its output (assemble.pending_start)."""
    pending: list[str] = []
    for m in messages:
        role = m.get("role") if isinstance(m, dict) else None
        if role == "tool":
            if m.get("tool_call_id") in pending:
                pending.remove(m.get("tool_call_id"))
            continue
        pending = list(tool_call_ids(m)) if role == "assistant" else []
    return pending


def pairing_problems(messages: Sequence[Any], pending: Sequence[str] = ()) -> list[str]:
    """Where tool calls and tool results are not paired (empty when they are): every call
    answered by the tool messages right after it, no result without its call. What every
    assembled output guarantees by construction, whatever the types inside the messages.
    ``pending``: calls the list may end waiting for — an output's input's own
    (`pending_calls(input)`), whose results the host appends right after the output."""
    errs = []
    waiting: list[str] = []
    for idx, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            errs.append(f"{idx}: not a message")
            continue
        role = m["role"]
        if role == "tool":
            tid = m.get("tool_call_id")
            if tid not in waiting:
                errs.append(f"{idx}: orphan tool result {tid!r}")
            else:
                waiting.remove(tid)
            continue
        if waiting:
            errs.append(f"{idx}: tool calls without results: {waiting}")
            waiting = []
        if role == "assistant":
            waiting = list(tool_call_ids(m))
    left = [p for p in waiting if p not in pending]
    if left:
        errs.append(f"end: tool calls without results: {left}")
    return errs


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
    except (ValueError, RecursionError):  # (nested too deep for the parser: not usable either)
        pass
    return "arguments are not a JSON object string"


def sequence_problems(messages: Sequence[Any]) -> list[str]:
    """Everything that makes `messages` an invalid chat-completions sequence (empty if valid):
    the pairing of `pairing_problems` and the types a provider checks.

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
