"""Ingestion, the plain algorithm: align the host's message list with what the store knows.

The same messages reach the engine many times (every compress(), on_session_end, tool
calls), and on the released host they carry no ids. So the incoming list is aligned, in
order, with the session's active context (what we last returned plus what was appended),
then with the log stored after the last matched message; only what is left is new. A
user who really says "continue" twice gets two stored messages. Cost is proportional to
the incoming list (bounded by the window), never to the stored history.

This module is the algorithm as a newcomer should read it: `Walk.place` decides where one
message stands (steps 1-6), `align` runs it over the list and stores what is new. The
engine runs `ingest_fast.align_fast`, the same walk with fast paths around it (resuming
the previous call, an identity memo, pipelined storing); it gives exactly the results
`align` gives (tests/test_ingest_oracle.py checks both on the same inputs).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from typing import TYPE_CHECKING, Any, Callable, Sequence

from .assemble import LARGE_OPEN, Slot
from ..messages import (
    absorbed_uids,
    content_ident,
    flatten_content,
    is_summary_message,
    message_text,
    message_uid,
    role_of,
    safe_json,
    summary_node_ids,
    tool_call_ids,
)
from ..records import ContextEntry, NewMessage
from ..store.base import Store
from ..tokens import estimate_message_tokens
from ..sessions.forks import HOST_INSTRUCTION, HOST_ROLE
from .forgotten import FORGOTTEN, is_forgotten
from .ingest_replay import opened

if TYPE_CHECKING:
    from .ingest_resume import Resume

log = logging.getLogger("lossless_context.pipeline.ingest")

LOOKAHEAD = 64
LOG_WINDOW = 512
TEXT_INDEX_LIMIT = 1_000_000  # chars of a message indexed for search (raw is kept whole)
UNUSABLE = ("invalid", "unknown")  # role_of() of input that is stored but never sent


@dataclass
class IngestResult:
    slots: list[Slot]
    new_ids: list[int]
    changed: bool
    entries: list[ContextEntry]  # the active context the slots stand for (as the store holds it)
    context_written: bool = False  # the store already holds the new active context
    resume: Resume | None = None  # how the next call over a longer list can skip this one (fast path only)


# Where one incoming message stands (Walk.place), as a plain tuple (one per message: quick to build):
# (slot: the stored message or summary it is, None if it is new and to be stored, FORGOTTEN if
#  the user forgot it (forgotten.py: nothing stored, no slot);
#  ident: its content identity, None if it was never needed (see Walk.place);
#  supersedes: (new) the stored version of the same message uid it replaces, else None;
#  store_too: (a summary block) the host merged it with text, to be stored verbatim as well)
Placed = tuple["Slot | None", "str | None", "int | None", bool]


class Walk:
    """The alignment's position: how far the host's list has matched the stored context
    (`j`) and the stored log (`last_mid`, the newest stored message matched so far;
    `prev_mid`, the stored row of the list's previous message, when it had one)."""

    def __init__(self, store: Store, session_id: str, scope: Sequence[str], context: Sequence[ContextEntry],
                 ident_of: Callable[[Any], str] = content_ident, j: int = 0, last_mid: int = 0) -> None:
        self.store, self.session_id, self.scope, self.context = store, session_id, scope, context
        self.ident_of = ident_of
        self.j = j
        self.last_mid = last_mid
        self.prev_mid = last_mid
        self.log: list[tuple[int, str, str | None]] | None = None  # a window of the log after last_mid
        self.log_pos = 0
        self.blocks: set[int] = set()  # summaries the list carried as our summary blocks
        self.opened: dict[int, tuple[str | None, list[ContextEntry]]] = {}  # (ingest_replay.opened)

    # Built on first use only: most lists never need them.
    @cached_property
    def by_ref(self) -> dict[int, ContextEntry]:
        return {e.ref: e for e in self.context if e.kind == "m"}

    @cached_property
    def aliases(self) -> dict[str, int]:
        refs = list(self.by_ref)
        return self.store.aliases_for(refs) if refs else {}

    @cached_property
    def summaries(self) -> set[int]:
        return {e.ref for e in self.context if e.kind == "s"}

    @cached_property
    def forget_marks(self) -> dict[int, set[str]]:
        """What the user forgot in this lineage (forgotten.py), read once per list that holds
        something new."""
        return self.store.forget_marks(self.scope)

    def place(self, msg: Any, ident: str | None) -> Placed:
        """Where `msg`, the next message of the host's list, stands; moves past it.

        `ident` is content_ident(msg), or None when the caller deferred it (the fast path
        does past the end of the context, where the identity is often never compared):
        then it is computed here only where a comparison needs it."""
        context, store = self.context, self.store
        # 1. Our own summary block (possibly merged into a neighbour by the host).
        if is_summary_message(msg):
            nodes = summary_node_ids(msg)
            valid = [n for n in nodes if n in self.summaries]
            in_context = bool(valid)
            if not valid and nodes:
                # Not in the stored context: another host writing this same session (a gateway
                # and a CLI) replaced it. The block is still ours if its nodes are this
                # session's published summaries.
                valid = [n for n, rec in sorted(store.get_summaries(nodes).items())
                         if rec.session_id == self.session_id and rec.state == "published"]
            if valid:
                self.blocks.update(valid)
                slot = Slot("s", valid, None, role_of(msg), estimate_message_tokens(msg))
                while in_context and self.j < len(context) and not (
                        context[self.j].kind == "s" and context[self.j].ref in valid):
                    self.j += 1
                while in_context and self.j < len(context) and context[self.j].kind == "s":
                    self.j += 1
                # Everything the block covers is behind us: a later message equal to one of
                # those is new, not that old row.
                self.last_mid = self.prev_mid = max(self.last_mid, _last_covered(store, valid[-1]))
                if _is_merged(msg):
                    ident = ident if ident is not None else self.ident_of(msg)
                    # stored verbatim once: the host re-sends the same merged message with
                    # every later call (each used to store another copy)
                    if store.find_ident(self.session_id, ident, 0) is None:
                        log.info("lcm: our summary was merged with a neighbour by the host; the merged "
                                 "message is stored verbatim and the summary nodes kept")
                        return slot, ident, None, True
                return slot, ident, None, False
        # 2. A large message we represented by its exploration summary (or a tier-0 stub).
        lref = _large_ref(msg)
        if lref is not None:
            e = self.by_ref.get(lref)
            if e is None:
                # Not in this context (another copy's pass covered it meanwhile): the
                # representation names its stored message, which is never stored again.
                rec = store.get_messages([lref]).get(lref)
                e = ContextEntry("m", lref, rec.ident, rec.role, rec.tokens) if rec is not None \
                    and rec.large and rec.session_id in self.scope else None
            if e is not None:
                slot = slot_for(msg, lref, estimate_message_tokens(msg), e.ident)
                slot.text_tokens = e.tokens
                self.last_mid = max(self.last_mid, lref)
                self.prev_mid = lref
                return slot, ident, None, False
        # 3. The active context, in order, with a bounded lookahead (host may drop items).
        j = self.j
        if j < len(context):  # (past its end — new messages at the tail — nothing to look up)
            if ident is None:
                ident = self.ident_of(msg)
            if context[j].kind == "s":  # (the list may replay its originals: opened to align them)
                context = self._open(j, ident)
            found = None
            if context[j].ident == ident and context[j].kind == "m":
                found = j  # the usual case, a re-sent list: the very next entry (the scan finds it first too)
            else:
                alias_of = self.aliases.get(ident)
                for k in range(j, min(len(context), j + LOOKAHEAD)):
                    e = context[k]
                    if e.kind == "m" and (e.ident == ident or e.ref == alias_of):
                        found = k
                        break
            if found is not None:
                e = context[found]
                self.j = found + 1
                self.prev_mid = e.ref
                if e.ref > self.last_mid:
                    self.last_mid = e.ref
                return slot_for(msg, e.ref, e.tokens, e.ident), ident, None, False
        # 4. A known uid: same content is the same message; new content is a new version.
        uid = message_uid(msg)
        if uid:
            if ident is None:
                ident = self.ident_of(msg)
            hit = store.find_uid(self.scope, uid)
            if hit is not None:
                if hit[1] == ident:
                    self.last_mid = max(self.last_mid, hit[0])
                    self.prev_mid = hit[0]
                    return slot_for(msg, hit[0], estimate_message_tokens(msg), ident), ident, None, False
                return None, ident, hit[0], False
        # 5. Unusable input (stored, never sent) is in no context: the log is its only place,
        #    and it follows the list's previous message there — which an edit earlier in the
        #    list (a newer version row, now the newest matched) must not hide: else every
        #    fresh alignment of the same list would store it once more.
        if self.prev_mid < self.last_mid and role_of(msg) in UNUSABLE:
            ident = ident if ident is not None else self.ident_of(msg)
            again = store.find_ident(self.session_id, ident, self.prev_mid)
            if again is not None:
                self.prev_mid = again[0]
                return slot_for(msg, again[0], 0, ident), ident, None, False
        # 6. The log stored after the last matched message (e.g. a /compress head prefix
        #    whose verbatim tail the host re-appended, or a flush by on_session_end).
        hit_mid, ident = self._in_log(msg, ident, uid)
        if hit_mid is not None:
            self.last_mid = self.prev_mid = hit_mid
            return slot_for(msg, hit_mid, estimate_message_tokens(msg), ident or ""), ident, None, False
        # 7. New — unless it is a message the user forgot, which a live host hands over again
        #    (its own history still holds it): aligned as FORGOTTEN, never stored (forgotten.py).
        if self.forget_marks and self.prev_mid in self.forget_marks:
            ident = ident if ident is not None else self.ident_of(msg)
            if is_forgotten(store, self.forget_marks, self.prev_mid, ident):
                return FORGOTTEN, ident, None, False
        return None, ident, None, False

    def _open(self, j: int, ident: str) -> Sequence[ContextEntry]:
        """The context, with the summary at ``j`` opened when the list replays its originals
        from here (its first message is this one: ingest_replay.py); else as it was."""
        ref = self.context[j].ref
        if ref not in self.opened:
            self.opened[ref] = opened(self.store, ref, self.blocks)
        first, entries = self.opened[ref]
        if first is not None and first == ident:
            self.context = list(self.context[:j]) + entries + list(self.context[j + 1:])
            for name in ("by_ref", "aliases", "summaries"):  # (built from the context: again)
                self.__dict__.pop(name, None)
        return self.context

    def _in_log(self, msg: Any, ident: str | None, uid: str | None) -> tuple[int | None, str | None]:
        """(the stored message of this session's log after last_mid that `msg` repeats, or
        None; its identity, if it had to be computed)."""
        store, window = self.store, self.log
        if window is None or (self.log_pos >= len(window) and len(window) == LOG_WINDOW):
            # Only this session's own log: a message repeating one from an ancestor
            # session is a new message here, never that old row.
            window = self.log = store.log_after([self.session_id], self.last_mid, LOG_WINDOW)
            self.log_pos = 0
        if ident is None and (self.log_pos < len(window) or len(window) == LOG_WINDOW):
            ident = self.ident_of(msg)  # (an empty log compares nothing: a deferred identity stays so)
        for k in range(self.log_pos, len(window)):
            mid, mident, muid = window[k]
            if mid > self.last_mid and mident == ident and (muid is None or uid is None or muid == uid):
                self.log_pos = k + 1
                return mid, ident
        if len(window) == LOG_WINDOW and ident is not None:  # (a full window computed it above)
            # The log after the last match is longer than the window (another host writes
            # this same session): look the message up by its identity instead.
            found = store.find_ident(self.session_id, ident, self.last_mid)
            if found is not None and (found[1] is None or uid is None or found[1] == uid):
                self.log = None
                return found[0], ident
        return None, ident


def align(
    store: Store,
    session_id: str,
    scope: Sequence[str],
    messages: Sequence[Any],
    context: Sequence[ContextEntry],
    *,
    large_tokens: int,
    exploration_tokens: int,
    token_memo: dict[int, tuple[Any, int]] | None = None,
) -> IngestResult:
    """Map every incoming message to a stored one (or store it) and return the slots.
    `token_memo` gets each stored message's estimate by id (tokens.measured_messages' known)."""
    walk = Walk(store, session_id, scope, context)
    slots: list[Slot] = []
    rows: list[NewMessage] = []  # the new messages to store, in order
    new_slots: list[Slot] = []  # their slots (the merged summary blocks stored verbatim have none)
    for msg in messages:
        slot, ident, supersedes, store_too = walk.place(msg, content_ident(msg))
        if slot is FORGOTTEN:
            continue  # (no row, no slot: in no context)
        if slot is None:
            row = new_message(msg, large_tokens, exploration_tokens, supersedes=supersedes, ident=ident)
            rows.append(row)
            if token_memo is not None:
                token_memo[id(msg)] = (msg, row.tokens)
            # A placeholder ref -k names the k-th new row until the store gives it an id.
            slot = new_slot(msg, -len(rows), row)
            new_slots.append(slot)
        elif store_too:
            rows.append(new_message(msg, large_tokens, exploration_tokens, ident=ident))
            if token_memo is not None:
                token_memo[id(msg)] = (msg, rows[-1].tokens)
        slots.append(slot)
    new_ids: list[int] = []
    if rows:
        # The new rows and the new active context go in ONE transaction (placeholders in the
        # context name them): a crash in between cannot strand them.
        new_ids = store.append_messages(session_id, rows, context=context_items(slots))
        for s in new_slots:
            s.refs[0] = new_ids[-s.refs[0] - 1]
    changed = bool(rows) or len(slots) != len(context)
    return IngestResult(slots, new_ids, changed, slots_to_entries(slots), context_written=bool(rows))


def host_time(msg: Any) -> float | None:
    """The host's `timestamp` of a message (epoch seconds, or an ISO string as the released
    host writes for some rows), None without a usable one."""
    ts = msg.get("timestamp") if isinstance(msg, dict) else None
    if isinstance(ts, (int, float)) and not isinstance(ts, bool) and 0 < ts < 1e11:
        return float(ts)
    if isinstance(ts, str) and 10 <= len(ts) <= 40:
        try:
            dt = datetime.fromisoformat(ts.replace("Z", "+00:00"))
            return dt.timestamp() if 0 < dt.timestamp() < 1e11 else None
        except ValueError:
            pass
    return None


def _msg_created_at(msg: Any) -> float:
    """When the message was said: the host's `timestamp`, else now."""
    ts = host_time(msg)
    return time.time() if ts is None else ts


def times_from_host(store: Store, slots: Sequence[Slot], new_ids: Sequence[int],
                    host_record: Callable[[], list[Any]]) -> int:
    """Give rows just stored without a time of their own (0.19.0's live list carries none) the
    time the host's own record of the session has for them (`host_record()`: its session
    database, read only), matched by identity, the latest first. Rows of the turn in flight
    are left at "now" (the host may not have written them yet; now is when they were said),
    so a turn's tool calls do not read the host's record. Returns the rows re-timed."""
    new = set(new_ids)
    last_user = max((i for i, s in enumerate(slots) if s.role == "user"), default=len(slots))
    want = [(s.refs[0], s.msg) for s in slots[:last_user]
            if s.kind == "m" and s.refs and s.refs[0] in new and host_time(s.msg) is None]
    if not want:
        return 0
    times: dict[str, list[float]] = {}
    for m in host_record():
        ts = host_time(m)
        if ts is not None:
            times.setdefault(content_ident(m), []).append(ts)
    pairs = []
    for mid, msg in reversed(want):
        found = times.get(content_ident(msg))
        if found:
            pairs.append((mid, found.pop()))
    if pairs:
        store.set_message_times(pairs)
    return len(pairs)


def new_message(msg: Any, large_tokens: int, exploration_tokens: int, supersedes: int | None = None,
                ident: str | None = None) -> NewMessage:
    """The row to store for `msg`; `ident` if the caller already has content_ident(msg)."""
    role = role_of(msg)
    if role == "user" and isinstance(msg, dict) and msg.get(HOST_INSTRUCTION):
        role = HOST_ROLE  # the host's review prompt in a background fork: not user speech (forks.py)
    text = message_text(msg, limit=TEXT_INDEX_LIMIT)
    tokens = estimate_message_tokens(msg)
    raw = msg if isinstance(msg, dict) else {"_lcm_unparsed": safe_json(msg)}
    large = tokens > large_tokens
    exploration = None
    if large:
        hint = msg.get("name") if isinstance(msg, dict) else None
        try:
            from ..text.explore import explore  # (only for large outputs: keeps the plugin's load light)

            exploration = explore(text, max_tokens=exploration_tokens, hint=hint)
        except Exception as exc:  # exploration is a convenience; storing must not fail
            log.warning("lcm: exploration summary failed: %s", exc)
            exploration = text[: exploration_tokens * 4]
    return NewMessage(
        raw=raw, role=role, ident=ident or content_ident(msg), uid=message_uid(msg), text=text,
        tokens=tokens, created_at=_msg_created_at(msg), supersedes=supersedes,
        absorbed=absorbed_uids(msg), large=large, exploration=exploration,
    )


def slot_for(msg: Any, mid: int, tokens: int, ident: str = "") -> Slot:
    """The slot of `msg` as stored message `mid` (unusable input: stored, never sent)."""
    role = role_of(msg)
    if role in UNUSABLE:
        return Slot("x", [mid], None, role, 0)
    return Slot(
        "m", [mid], msg, role, tokens,
        call_ids=tool_call_ids(msg) or (),
        result_for=msg.get("tool_call_id") if role == "tool" else None,
        text_tokens=tokens, ident=ident,
    )


def new_slot(msg: Any, mid: int, row: NewMessage) -> Slot:
    """The slot of a message just stored as `row` (an unusable one keeps the row's
    identity and tokens too, though it is never sent)."""
    s = slot_for(msg, mid, row.tokens, row.ident)
    if s.kind == "x":
        s.ident, s.text_tokens = row.ident, row.tokens
    return s


def _large_ref(msg: Any) -> int | None:
    if not isinstance(msg, dict):
        return None
    c = msg.get("content")
    if isinstance(c, str) and c.startswith(LARGE_OPEN):
        rest = c[len(LARGE_OPEN):]
        num = rest[1: rest.find('"')] if rest.startswith("m") else ""
        if num.isdigit():
            return int(num)
    return None


def _last_covered(store: Store, node: int) -> int:
    """The newest message under a summary (its last child, all the way down)."""
    for _ in range(64):
        kids, mids = store.summary_children(node)
        if mids:
            return max(mids)
        if not kids:
            return 0
        node = kids[-1]
    return 0


def _is_merged(msg: Any) -> bool:
    text = flatten_content(msg.get("content")) if isinstance(msg, dict) else ""
    stripped = text.strip()
    return not (stripped.startswith("<lcm-summary") and stripped.endswith("</lcm-summary>"))


def context_items(slots: Sequence[Slot | int]) -> list[tuple[str, int]]:
    """(kind, ref) of slots_to_entries(slots), without building the records (O(context) per
    call); an int is a new message's placeholder ref."""
    out: list[tuple[str, int]] = []
    for s in slots:
        if isinstance(s, int):
            out.append(("m", s))
        elif s.kind == "m":
            out.append(("m", s.refs[0]))
        elif s.kind == "s":
            out.extend(("s", r) for r in s.refs)
    return out


def slots_to_entries(slots: Sequence[Slot]) -> list[ContextEntry]:
    out: list[ContextEntry] = []
    for s in slots:
        if s.kind == "s":
            out.extend(ContextEntry("s", r, "", "summary", 0) for r in s.refs)
        elif s.kind == "m":
            out.append(ContextEntry("m", s.refs[0], s.ident, s.role, s.text_tokens or s.tokens))
    return out


def cheap_slots(messages: Sequence[Any]) -> list[Slot]:
    """Slots without the store: enough to see what head/tail protection leaves."""
    out = []
    for m in messages:
        role = role_of(m)
        if role == "system":
            continue
        if summary_node_ids(m):
            out.append(Slot("s", summary_node_ids(m), m, role, estimate_message_tokens(m)))
            continue
        out.append(Slot("m", [0], m, role, estimate_message_tokens(m), call_ids=tool_call_ids(m),
                        result_for=m.get("tool_call_id") if role == "tool" else None))
    return out
