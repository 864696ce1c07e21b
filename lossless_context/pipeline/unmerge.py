"""Our summary block, recognised on either side of a host merge, and the list as it was before.

Before every request Hermes repairs the message sequence: two user messages in a row become one
(`first + "\\n\\n" + second`), two assistant messages in a row become one (their texts stripped
and joined by a newline, the second's tool calls appended to the first's). The merged message is
the *first* one's dict, keys and all, and that is what the live history holds afterwards. So our
block can reach the engine inside a head message (a user-role block after the head's last user
message), with the next message inside it (a user-role block before the new question), or with
a neighbouring assistant turn.

`split` gives the parts back: the text before the block (the first message, with its own host
keys), the block itself, and the text after it (with the tool calls, if any). Each part is then
aligned like any message (ingest.py) — against the row it was before the merge when the context
knows it, word for word (`resolve`): so the block is never stored as a message and the head
message it was merged into keeps its place in the context. Nothing is split that is not our
block with plain text around it (list content is never merged by the host).
"""

from __future__ import annotations

from collections.abc import Mapping  # (isinstance against it: ~6x cheaper than typing's alias)
from typing import Any, Callable, Sequence

from ..messages import SUMMARY_OPEN, flatten_content, role_of, summary_node_ids
from ..records import ContextEntry

SUMMARY_CLOSE = "</lcm-summary>"
_SEPARATORS = {"user": "\n\n", "assistant": "\n"}  # what the host puts between merged texts


def block_span(text: str) -> tuple[int, int] | None:
    """(start, end) of our block inside `text`, or None."""
    start = text.find(SUMMARY_OPEN)
    if start < 0:
        return None
    end = text.find(SUMMARY_CLOSE, start)
    return None if end < 0 else (start, end + len(SUMMARY_CLOSE))


def split(msg: Any) -> tuple[str, str, str] | None:
    """(text before, block, text after) of a message holding our block merged with other text
    by the host, separators removed; None when `msg` is not such a merge (no block, the block
    alone, or content the host never merges)."""
    if not isinstance(msg, dict) or role_of(msg) not in _SEPARATORS:
        return None
    text = msg.get("content")
    if not isinstance(text, str):
        return None
    span = block_span(text)
    if span is None:
        return None
    before, block, after = text[:span[0]], text[span[0]:span[1]], text[span[1]:]
    if not before.strip() and not after.strip():
        return None
    sep = _SEPARATORS[role_of(msg)]
    before = before[:-len(sep)] if before.endswith(sep) else before.rstrip()
    after = after[len(sep):] if after.startswith(sep) else after.lstrip()
    return before, block, after


Known = Callable[[str, str, str, tuple], "Mapping[str, Any] | None"]


def parts(msg: dict[str, Any], pieces: tuple[str, str, str], known: Known | None = None) -> list[dict[str, Any]]:
    """The messages `msg` was merged from. The first part is the merged dict's own message (it
    keeps the host's keys: its uid, its persistence marker); the tool calls go with the last
    part; the second part of a merge takes the first uid the host recorded as absorbed.
    `known(role, text, side, call ids)` may return the stored original a part stands for
    ("before" / "after"), whose exact content then replaces the part's (the host strips
    assistant texts, and an empty text may have been None or "")."""
    before, block, after = pieces
    role = role_of(msg)
    calls = msg.get("tool_calls") if isinstance(msg.get("tool_calls"), list) and msg.get("tool_calls") else None
    absorbed = msg.get("_absorbed_message_uids")
    out: list[dict[str, Any]] = []
    if before.strip():
        first = {k: v for k, v in msg.items() if k not in ("content", "tool_calls", "_absorbed_message_uids")}
        first["content"] = _original(known, role, before, "before", ())
        out.append(first)
    out.append({"role": role, "content": block})
    if after.strip() or calls:
        last: dict[str, Any] = {"role": role}
        ids = tuple(tc.get("id") for tc in calls or () if isinstance(tc, Mapping))
        last["content"] = _original(known, role, after, "after", ids, default=after if after.strip() else None)
        if calls:
            last["tool_calls"] = calls
        if isinstance(absorbed, list) and absorbed and isinstance(absorbed[0], str):
            last["message_uid"] = absorbed[0]
        out.append(last)
    return out


_MISSING = object()


def _original(known: Known | None, role: str, text: str, side: str, ids: tuple, default: Any = _MISSING) -> Any:
    rec = known(role, text, side, ids) if known is not None else None
    if isinstance(rec, Mapping) and "content" in rec:
        return rec["content"]
    return text if default is _MISSING else default


def stored_raw(store: Any) -> Callable[[int], Any]:
    """`raw_of` for `unmerge`: a stored message's raw dict by id (None when there is none)."""
    def raw_of(mid: int) -> Any:
        rec = store.get_messages([mid]).get(mid)
        return rec.raw if rec is not None else None

    return raw_of


def same_text(a: str, b: str) -> bool:
    """Equal as the host's merge leaves them (assistant texts are stripped)."""
    return a == b or a.strip() == b.strip()


def unmerge(messages: Sequence[Any], context: Sequence[ContextEntry], raw_of: Callable[[int], Any],
            cache: dict[int, tuple[Any, Any, list[dict[str, Any]]]] | None = None) -> list[Any]:
    """`messages` with every merge of our block split back into its parts (the same list when
    there is none). A part is resolved against the context entry beside the block's summaries
    (`raw_of(message id)` reads the stored original), so it aligns with the row it was.
    `cache` (by id of the merged dict) hands back the same part objects while its content is
    unchanged, so the engine's resume fast path still sees an unchanged list."""
    out: list[Any] | None = None
    for i, msg in enumerate(messages):
        pieces = split(msg)
        if pieces is None:
            if out is not None:
                out.append(msg)
            continue
        if out is None:
            out = list(messages[:i])
        hit = cache.get(id(msg)) if cache is not None else None
        if hit is not None and hit[0] is msg and hit[1] == msg.get("content"):
            out.extend(hit[2])
            continue
        split_parts = parts(msg, pieces, _resolver(context, summary_node_ids(msg), raw_of))
        if cache is not None:
            if len(cache) > 64:
                cache.clear()
            cache[id(msg)] = (msg, msg.get("content"), split_parts)
        out.extend(split_parts)
    return messages if out is None else out  # type: ignore[return-value]  # nothing split: the very list given back (callers compare identity)


def _resolver(context: Sequence[ContextEntry], nodes: Sequence[int], raw_of: Callable[[int], Any]) -> Known:
    """known(role, text, side, call ids): the stored original just before ("before") or after
    ("after") the block's summaries in the context, when it has that role, text and calls."""
    wanted = set(nodes)
    where = [k for k, e in enumerate(context) if e.kind == "s" and e.ref in wanted]

    def known(role: str, text: str, side: str, ids: tuple) -> Mapping[str, Any] | None:
        if not where:
            return None
        k = where[0] - 1 if side == "before" else where[-1] + 1
        while 0 <= k < len(context) and context[k].kind == "s":  # (other summaries of the block)
            k += -1 if side == "before" else 1
        if not 0 <= k < len(context) or context[k].kind != "m" or context[k].role != role:
            return None
        raw = raw_of(context[k].ref)
        if not isinstance(raw, Mapping) or not same_text(flatten_content(raw.get("content")), text):
            return None
        calls = raw.get("tool_calls")
        own = tuple(tc.get("id") for tc in calls if isinstance(tc, Mapping)) if isinstance(calls, list) else ()
        return raw if own == ids else None

    return known
