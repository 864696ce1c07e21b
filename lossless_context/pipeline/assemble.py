"""Context assembly: slots → a valid OpenAI message list.

A *slot* is one element of the host's list as the engine understands it: a stored raw
message, or our summary block. Groups keep an assistant `tool_calls` message together with
all its results, so a list cut at group boundaries is valid by construction. The final
`repair` pass guarantees validity whatever the input was: no orphan results, no call
without its result, nothing invented. Without a store, `trim_without_store` assembles the
newest whole turns that fit (system + head + tail, no summary): the engine's way on while the
store is unavailable (store/guard.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timezone
from collections.abc import Mapping  # (isinstance against it: ~6x cheaper than typing's alias)
from typing import Any, Sequence

from ..messages import SUMMARY_OPEN, flatten_content, is_summary_message, provider_view, role_of, tool_call_ids
from ..records import SummaryRecord
from .summary_view import fit_block
from ..tokens import estimate_message_tokens, estimate_messages_tokens

log = logging.getLogger("lossless_context.pipeline.assemble")

LARGE_OPEN = '<lcm-large id="'
STUB_MARK = "[tool-output stub]"  # first line of a tier-0 stub (stubs.py makes them)


@dataclass(slots=True)  # (thousands live per session: no per-instance dict)
class Slot:
    kind: str  # "m" raw message | "s" summary block | "x" unusable input (stored, never sent): the
    # codes of ContextEntry.kind ("m"/"s"), plus "x" for input that is stored but never sent
    refs: list[int]
    msg: dict[str, Any] | None  # the dict to emit for "m" slots
    role: str
    tokens: int
    call_ids: Sequence[str] = ()  # assistant tool_calls ids
    result_for: str | None = None  # tool result's tool_call_id
    text_tokens: int = 0  # tokens of the stored original (before large-message representation)
    ident: str = ""  # the stored row's content identity ("m" slots), as the context holds it


def groups(slots: Sequence[Slot]) -> list[tuple[int, int]]:
    """Half-open index ranges; an assistant with tool_calls owns the tool results after it."""
    out: list[tuple[int, int]] = []
    i, n = 0, len(slots)
    while i < n:
        s = slots[i]
        j = i + 1
        if s.kind == "m" and s.call_ids:
            pending = set(s.call_ids)
            while j < n and slots[j].kind == "m" and slots[j].role == "tool" and pending:
                pending.discard(slots[j].result_for or "")
                j += 1
        out.append((i, j))
        i = j
    return out


def fmt_time(ts: float | None) -> str:
    if not ts:
        return "?"
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M")


def neutralise_tags(text: str) -> str:
    """`text` with our block's tags written so they no longer parse: a summarised message that
    quoted them (a user pasting `</lcm-summary>`) would end the block early or name nodes, and
    the block would read as a host merge of it (unmerge.py) and be split."""
    return text.replace("</lcm-summary>", "<\\/lcm-summary>").replace(SUMMARY_OPEN, '<lcm-summary nodes=\\"')


def render_summary(nodes: Sequence[SummaryRecord], covered: int, role: str,
                   max_tokens: int | None = None, extra: str = "") -> dict[str, Any]:
    """The summary block; with `max_tokens` (the message's tokens), node bodies are shortened to fit
    (summary_view.py) — every node is still named, so every older message is represented."""
    ids = ",".join(f"s{n.id}" for n in nodes)
    starts = [n.t_start for n in nodes if n.t_start]
    ends = [n.t_end for n in nodes if n.t_end]
    span = f" ({fmt_time(min(starts))} – {fmt_time(max(ends))})" if starts and ends else ""
    head = [
        f'{SUMMARY_OPEN}{ids}">',
        f"[Lossless context: {covered} earlier messages{span} are condensed below; nothing was "
        "deleted. While the lcm tools are offered, lcm_grep(query) searches the full history and "
        "lcm_describe(id) / lcm_expand(id) open any id below (s… = summary, m… = original message) "
        "verbatim.]",
    ]

    def render(bodies: Sequence[str] | None) -> str:
        lines = list(head)
        if bodies is None:
            lines.append(f"[{len(nodes)} summaries, oldest first, too many to show here: "
                         + ", ".join(f"s{n.id} (depth {n.depth}, {n.n_messages} messages)" for n in nodes) + "]")
            if measure("\n".join(lines + ["</lcm-summary>"])) > (max_tokens or 0):
                lines[-1] = f"[{len(nodes)} summaries listed in the marker above, oldest first]"
        else:
            for n, body in zip(nodes, bodies):
                lines.append("")
                lines.append(
                    f"## s{n.id} · depth {n.depth} · {n.n_messages} messages · "
                    f"{fmt_time(n.t_start)} – {fmt_time(n.t_end)}"
                )
                if body:
                    lines.append(body)
        if extra:  # the continuity section (continuity.py): inside the block, so a merge keeps it ours
            lines.append("")
            lines.append(extra.strip())
        lines.append("</lcm-summary>")
        return "\n".join(lines)

    def measure(text: str) -> int:
        return estimate_message_tokens({"role": role, "content": text})

    bodies = [neutralise_tags(n.text.strip()) for n in nodes]
    extra = neutralise_tags(extra)
    if max_tokens is None:
        return {"role": role, "content": render(bodies)}
    return {"role": role, "content": fit_block(render, bodies, [n.id for n in nodes], max_tokens, measure)}


def large_representation(msg: Mapping[str, Any], mid: int, tokens: int, exploration: str) -> dict[str, Any]:
    """A huge message shown as its exploration summary; pairing fields kept intact."""
    out = provider_view(msg)
    if exploration.startswith(STUB_MARK):  # a tier-0 stub of an older tool result (stubs.py)
        note = f"[Older tool output shown as a stub; lcm_expand(id=\"m{mid}\") returns it verbatim.]"
    else:
        note = (f"[Large content ({tokens} tokens) kept verbatim in the store. lcm_expand(id=\"m{mid}\") "
                "pages through it; lcm_grep searches it.]")
    out["content"] = f'{LARGE_OPEN}m{mid}" tokens="{tokens}">\n{note}\n{exploration}\n</lcm-large>'
    return out


def choose_summary_role(prev_role: str | None, next_role: str | None, *,
                        assistant_ok: bool = True) -> str | None:
    """A role differing from both neighbours (the host merges same-role neighbours).

    `assistant_ok=False` when the block stands where the host looks for the reply it just
    delivered (a pass had to fold that reply: `reply_anchor`): an assistant row there is "a
    different assistant row in its slot" to a 0.22 host, which then drops the reply from view."""
    for cand in ("user", "assistant") if assistant_ok else ("user",):
        if cand != prev_role and cand != next_role:
            return cand
    return None


def reply_anchor(slots: Sequence[Slot], start: int = 0) -> int | None:
    """Index of the host's *reply anchor* at or after `start`: the last assistant message with
    visible text and no tool calls (the reply the user is reading). A 0.22 host checks after
    every committed pass that this row is still in the list, word for word; a pass keeps it
    verbatim unless keeping it would stop the pass from shrinking the context at all (then
    the host lets it fold too). Our own summary blocks are not replies."""
    for i in range(len(slots) - 1, start - 1, -1):
        s = slots[i]
        if s.kind == "m" and s.role == "assistant" and not s.call_ids and s.msg is not None:
            if flatten_content(s.msg.get("content")).strip() and not is_summary_message(s.msg):
                return i
    return None


def pending_start(slots: Sequence[Slot]) -> int | None:
    """Where the list's last turn group starts when it is an assistant's tool call still waiting
    for its results (none or only some of them follow it, up to the list's end), else None.
    The host appends those results right after the call, so the group belongs to the fresh
    tail: a pass keeps it verbatim, last in its output (`repair(pending_end=True)`). Folded
    into a leaf or dropped, the call would leave the results the host appends next orphaned,
    and its row under a leaf whose span a replay of the list no longer holds as one run."""
    i = len(slots) - 1
    while i >= 0 and slots[i].kind == "m" and slots[i].role == "tool":
        i -= 1
    if i < 0 or slots[i].kind != "m" or slots[i].role != "assistant" or not slots[i].call_ids:
        return None
    if groups(slots[i:]) != [(0, len(slots) - i)]:
        return None  # a result past the call's own: nothing is waiting for the host
    answered = {s.result_for for s in slots[i + 1:]}
    return i if any(c not in answered for c in slots[i].call_ids) else None


def repair(messages: list[Any], changes: list[tuple[dict, dict]] | None = None, *,
           pending_end: bool = False) -> list[dict[str, Any]]:
    """Drop what cannot be valid: non-dicts, orphan tool results, calls without results.

    An assistant message whose calls lack results keeps its text (if any) without the
    unanswered calls, so nothing is invented and no provider rejects the list. Each
    message replaced by a repaired copy is reported in `changes` as (original, copy).
    ``pending_end``: the input ends in a tool call whose results the host is about to append
    (`pending_start`); when the list still ends in it, it stays as it is, with the results
    that came already — repaired, the results appended next would be orphans.
    """
    out: list[dict[str, Any]] = []
    n = len(messages)
    i = 0
    while i < n:
        m = messages[i]
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            i += 1
            continue
        role = m["role"]
        if role == "tool":
            i += 1  # a tool result not consumed by its assistant below is an orphan
            continue
        ids = tool_call_ids(m)
        if role == "assistant" and isinstance(m.get("tool_calls"), list) and m.get("tool_calls"):
            j = i + 1
            results: list[dict[str, Any]] = []
            seen: set[str] = set()
            while j < n and isinstance(messages[j], dict) and messages[j].get("role") == "tool":
                tid = messages[j].get("tool_call_id")
                if tid in ids and tid not in seen:
                    results.append(messages[j])
                    seen.add(tid)
                j += 1
            answered = [tc for tc in m["tool_calls"]
                        if isinstance(tc, Mapping) and tc.get("id") in seen]
            if pending_end and j == n and len(ids) == len(m["tool_calls"]) > len(answered):
                out.append(m)  # (the host's newest call: its remaining results come next)
                out.extend(results)
            elif len(answered) == len(m["tool_calls"]) and len(ids) == len(m["tool_calls"]):
                out.append(m)
                out.extend(results)
            elif answered:
                fixed = dict(m)
                fixed["tool_calls"] = answered
                out.append(fixed)
                if changes is not None:
                    changes.append((m, fixed))
                by_id = {r.get("tool_call_id"): r for r in results}
                out.extend(by_id[tc["id"]] for tc in answered)
            else:
                text = m.get("content")
                if text:
                    fixed = {k: v for k, v in m.items() if k != "tool_calls"}
                    out.append(fixed)
                    if changes is not None:
                        changes.append((m, fixed))
            i = j
            continue
        out.append(m)
        i += 1
    return out


def total_tokens(messages: Sequence[Any]) -> int:
    return sum(estimate_message_tokens(m) for m in messages)


def trim_without_store(messages: Sequence[Any], target_tokens: int, protect_first_n: int = 3) -> list[Any]:
    """The newest whole turns that fit `target_tokens` (plus the system message and the first
    `protect_first_n` messages up to the first turn boundary), in order; the input itself when
    it already fits or no cut keeps a user turn. A cut is made only before a user message, so
    every tool call keeps its results and no result loses its call."""
    msgs = list(messages)
    if estimate_messages_tokens(msgs) <= target_tokens:
        return msgs
    system = [msgs[0]] if msgs and role_of(msgs[0]) == "system" else []
    body = msgs[len(system):]
    users = [i for i, m in enumerate(body) if role_of(m) == "user"]
    if len(users) < 2:
        return msgs
    # The protected head: the first messages up to (not including) the second user turn.
    head_end = min(users[1], max(1, protect_first_n)) if protect_first_n > 0 else 0
    while head_end < len(body) and head_end not in users:
        head_end += 1  # never split a turn: extend the head to the next turn boundary
    head = body[:head_end]
    budget = target_tokens - estimate_messages_tokens(system + head)
    tokens = [estimate_message_tokens(m) for m in body]
    cut = None
    total = 0
    for i in range(len(body) - 1, head_end - 1, -1):
        total += tokens[i]
        if i in users and i >= head_end:
            if total > budget and cut is not None:
                break
            cut = i
            if total > budget:
                break
    if cut is None or cut <= head_end:
        return msgs
    return system + head + body[cut:]
