"""Continuity: what the agent was doing stays in view after a compaction.

The summary block ends with a short, verbatim section: the session's objective (its first
real user request), the latest user request, the latest plan (the state after the agent's
last `todo` tool call, else the last assistant message that declared a plan) and the files
the agent edited in the summarised span. Bounded in tokens, deduplicated, and nothing that
is verbatim elsewhere in the assembled context (head or tail) is repeated.

The state is gathered from each pass's input, where every message appears before it is
summarised, and kept per session in the store (`get_continuity`/`set_continuity`), so it
survives any number of compactions and a process restart.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from collections.abc import Mapping  # (isinstance against it: ~6x cheaper than typing's alias)
from typing import Any, Sequence

from .assemble import Slot
from ..messages import SUMMARY_OPEN, flatten_content
from ..records import MessageRecord
from ..store.rows import raw_json
from ..tokens import estimate_text_tokens

PLAN_TOOLS = ("todo", "todo_write", "TodoWrite", "update_plan")  # Hermes' is "todo"
EDIT_TOOLS = ("write_file", "patch", "edit_file", "str_replace", "str_replace_editor", "apply_patch",
              "create_file", "replace_in_file", "multi_edit", "edit", "write")
_PATH_KEYS = ("path", "file_path", "filename", "file", "target_file")
_PLAN_RE = re.compile(r"^\s*(?:#+\s*)?(?:\*\*)?(?:the\s+)?(?:plan|next steps|steps|todo)(?:\*\*)?\s*:|"
                      r"^\s*(?:here is|here's) (?:the|my) plan", re.IGNORECASE | re.MULTILINE)
_MARKS = {"completed": "[x]", "in_progress": "[>]", "pending": "[ ]", "cancelled": "[~]"}
MAX_FILES = 40


@dataclass
class Item:
    mid: int  # the stored message it comes from
    text: str


@dataclass
class State:
    objective: Item | None = None
    request: Item | None = None
    plan: Item | None = None  # rendered plan text
    plan_mids: list[int] = field(default_factory=list)  # the call and result it comes from
    files: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        def it(x: Item | None) -> Any:
            return None if x is None else {"mid": x.mid, "text": x.text}
        return json.dumps({"objective": it(self.objective), "request": it(self.request), "plan": it(self.plan),
                           "plan_mids": self.plan_mids, "files": self.files}, ensure_ascii=False)

    @classmethod
    def from_json(cls, data: str | None) -> "State":
        try:
            d = json.loads(data) if data else {}
        except (ValueError, RecursionError):
            d = {}
        if not isinstance(d, dict):
            d = {}

        def it(x: Any) -> Item | None:
            if isinstance(x, dict) and isinstance(x.get("mid"), int) and isinstance(x.get("text"), str):
                return Item(x["mid"], x["text"])
            return None
        files = [f for f in d.get("files") or [] if isinstance(f, str)]
        mids = [m for m in d.get("plan_mids") or [] if isinstance(m, int)]
        return cls(it(d.get("objective")), it(d.get("request")), it(d.get("plan")), mids, files)


def _user_text(rec: MessageRecord | None, msg: Any) -> str | None:
    """The text of a real user request (not our summary block, not empty)."""
    text = rec.text if rec is not None else flatten_content(msg.get("content")) if isinstance(msg, Mapping) else ""
    if not text or not text.strip() or SUMMARY_OPEN in text or "<lcm-large" in text[:40]:
        return None
    return text.strip()


def _args(tc: Any) -> tuple[str, Any]:
    fn = f if isinstance(tc, Mapping) and isinstance(f := tc.get("function"), Mapping) else {}
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except (ValueError, RecursionError):  # the host's input: any text, nested any depth
            pass
    return str(fn.get("name") or ""), args


def render_todos(todos: Any) -> str | None:
    """A todo list ({id, content, status} items) as lines with status marks."""
    if not isinstance(todos, list) or not todos:
        return None
    lines = []
    for t in todos[:64]:
        if not isinstance(t, Mapping):
            continue
        status = str(t.get("status") or "pending")
        lines.append(f"- {_MARKS.get(status, '[?]')} {t.get('id', '?')}. {str(t.get('content') or '').strip()} ({status})")
    return "\n".join(lines) or None


def _todo_state(call_args: Any, result: str | None) -> str | None:
    """The list after a todo call: the tool's result holds the full current list (Hermes
    returns {"todos": [...], "summary": {...}}); else the list the call wrote."""
    if result:
        try:
            data = json.loads(result)
        except (ValueError, RecursionError):
            data = None
        if isinstance(data, Mapping) and isinstance(data.get("todos"), list):
            return render_todos(data["todos"])
    if isinstance(call_args, Mapping) and isinstance(call_args.get("todos"), list):
        return render_todos(call_args["todos"])
    return None


def gather(prev: State, slots: Sequence[Slot], records: Mapping[int, MessageRecord]) -> tuple[State, dict[int, list[str]]]:
    """The state after this pass's input, and per slot index the files edited there."""
    st = State(prev.objective, prev.request, prev.plan, list(prev.plan_mids), list(prev.files))
    edits: dict[int, list[str]] = {}
    # A tool result's text is read only when a plan call asks for it: the stored message (a
    # tool output, often large) is decoded then, not for every result in the context.
    results: dict[str, Slot] = {}
    for s in slots:
        if s.kind == "m" and s.role == "tool" and s.result_for:
            results[s.result_for] = s
    for i, s in enumerate(slots):
        if s.kind != "m" or s.role not in ("user", "assistant"):
            continue
        mid = s.refs[0]
        rec = records.get(mid)
        if s.role == "user":
            text = _user_text(rec, s.msg)  # (the message is read only when there is no record)
            if text is None:
                continue
            if st.objective is None or mid < st.objective.mid:
                st.objective = Item(mid, text)
            if st.request is None or mid >= st.request.mid:
                st.request = Item(mid, text)
            continue
        facts = _stored_facts(js) if rec is not None and (js := raw_json(rec)) is not None else None
        if facts is None:
            raw = rec.raw if rec is not None and isinstance(rec.raw, Mapping) else s.msg
            if not isinstance(raw, Mapping):
                continue
            facts = _facts(raw)
        for cid, args in facts.plan_calls:
            rs = results.get(cid) if cid is not None else None
            res = _result(rs, records) if rs is not None else None
            plan = _todo_state(args, res[1] if res else None)
            if plan and (st.plan is None or mid >= st.plan.mid):
                st.plan = Item(mid, plan)
                st.plan_mids = [mid] + ([res[0]] if res else [])
        if facts.edits:
            edits[i] = list(facts.edits)
        if facts.plan_text is not None and (st.plan is None or mid > st.plan.mid) and not _is_todo_plan(st):
            st.plan = Item(mid, facts.plan_text)
            st.plan_mids = [mid]
    return st, edits


@dataclass(frozen=True)
class _Facts:
    """What gather reads of one assistant message: its plan-tool calls (call id, arguments)
    in order, the paths its edit-tool calls write, and its text when it declares a plan (a
    message without tool calls)."""
    plan_calls: tuple[tuple[str | None, Any], ...]
    edits: tuple[str, ...]
    plan_text: str | None


def _facts(raw: Mapping[str, Any]) -> _Facts:
    calls = c if isinstance(c := raw.get("tool_calls"), list) else []
    plan_calls: list[tuple[str | None, Any]] = []
    edits: list[str] = []
    for tc in calls:
        name, args = _args(tc)
        if name in PLAN_TOOLS:
            plan_calls.append((cid if isinstance(tc, Mapping) and isinstance(cid := tc.get("id"), str) else None, args))
        elif name in EDIT_TOOLS and isinstance(args, Mapping):
            path = next((args[k] for k in _PATH_KEYS if isinstance(args.get(k), str) and args[k]), None)
            if path:
                edits.append(path)
    text = flatten_content(raw.get("content"))
    plan_text = text.strip() if not calls and text and _PLAN_RE.search(text) else None
    return _Facts(tuple(plan_calls), tuple(edits), plan_text)


# An assistant message's facts, kept by the stored text of the message: every pass gathers
# over the whole context, where most assistant messages were read by the pass before (their
# JSON decoded, their calls' arguments parsed). A function of the text, so the memo cannot
# change an answer (what it returns is only read). Texts up to _MEMO_CHARS characters.
_MEMO_CHARS = 65_536


@functools.lru_cache(maxsize=2_048)
def _memo_facts(raw_text: str) -> _Facts | None:
    try:
        raw = json.loads(raw_text)
    except ValueError:
        return None  # (the record's raw is then that text: no message, as below)
    return _facts(raw) if isinstance(raw, Mapping) else None


def _stored_facts(raw_text: str) -> _Facts | None:
    """The facts of the stored message whose JSON is `raw_text`; None when it is no message
    (gather then reads the host's copy, as it does for a record whose raw is no mapping)."""
    return _memo_facts(raw_text) if len(raw_text) <= _MEMO_CHARS else None


def _result(s: Slot, records: Mapping[int, MessageRecord]) -> tuple[int, str]:
    """A tool result slot's message id and text (the stored message's, else the host's)."""
    rec = records.get(s.refs[0])
    raw = rec.raw if rec is not None else s.msg
    content = raw.get("content") if isinstance(raw, Mapping) else None
    return s.refs[0], content if isinstance(content, str) else flatten_content(content)


def _is_todo_plan(st: State) -> bool:
    # A todo list is the plan of record: a later "Plan:" paragraph does not replace it.
    return st.plan is not None and st.plan.text.startswith("- [")


def with_files(st: State, edits: Mapping[int, list[str]], a: int, b: int) -> State:
    """The state with the files edited in slots [a, b) (the summarised span) added."""
    files = list(st.files)
    for i in sorted(edits):
        if a <= i < b:
            for p in edits[i]:
                if p in files:
                    files.remove(p)
                files.append(p)
    return State(st.objective, st.request, st.plan, st.plan_mids, files[-MAX_FILES:])


def _bounded(text: str, mid: int, limit_tokens: int) -> str:
    if estimate_text_tokens(text) <= limit_tokens:
        return text
    keep = max(40, limit_tokens * 4 - 80)
    return text[:keep].rstrip() + f" …[{len(text) - keep} more chars: lcm_expand(id=\"m{mid}\")]"


def render(st: State, visible: set[int], limit_tokens: int) -> str:
    """The continuity section, or "" when there is nothing to add. `visible` holds the
    message ids verbatim elsewhere in the assembled context (they are not repeated)."""
    if limit_tokens <= 0:
        return ""
    parts: list[str] = []
    share = max(60, limit_tokens // 3)
    if st.objective is not None and st.objective.mid not in visible:
        parts.append(f"Objective (first request, m{st.objective.mid}):\n{_bounded(st.objective.text, st.objective.mid, share)}")
    if st.request is not None and st.request.mid not in visible and (
            st.objective is None or st.request.mid != st.objective.mid):
        parts.append(f"Latest user request (m{st.request.mid}):\n{_bounded(st.request.text, st.request.mid, share)}")
    if st.plan is not None and not any(m in visible for m in st.plan_mids):
        label = "Current plan (state after the last todo call" if st.plan.text.startswith("- [") else \
            "Latest plan (declared"
        parts.append(f"{label}, m{st.plan.mid}):\n{_bounded(st.plan.text, st.plan.mid, share)}")
    if st.files:
        parts.append("Files edited in the summarised span: " + ", ".join(st.files))
    if not parts:
        return ""
    text = "## Continuity (kept verbatim across compactions)\n" + "\n".join(parts)
    while estimate_text_tokens(text) > limit_tokens and len(parts) > 1:
        parts.pop()  # files go first, then the plan: the objective is what must survive
        text = "## Continuity (kept verbatim across compactions)\n" + "\n".join(parts)
    if estimate_text_tokens(text) > limit_tokens:
        text = text[: limit_tokens * 4]
    return text


def stored_section(store: Any, session_id: str, visible: set[int], limit_tokens: int) -> str:
    """The section as the last committed pass left it (for renderings outside a pass, such as
    `select_context`): the state persisted per session, minus what is `visible` verbatim."""
    if limit_tokens <= 0:
        return ""
    data = store.get_continuity(session_id)
    return render(State.from_json(data), visible, limit_tokens) if data else ""
