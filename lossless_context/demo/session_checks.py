"""Checks over generated sessions: whether a session's planted canaries occur exactly once
where they were planted (`check_canaries`). Kept apart from the generators in sessions.py,
which re-exports it. (Whether a list is a valid OpenAI sequence: `pipeline.validate`.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator, Sequence

if TYPE_CHECKING:
    from .sessions import Canary

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
