"""Ingestion: align the host's message list with what the store already knows.

The same messages reach the engine many times (every compress(), on_session_end, tool
calls), and on the released host they carry no ids. So the incoming list is aligned, in
order, with the session's active context (what we last returned plus what was appended),
then with the log stored after the last matched message; only what is left is new. A
user who really says "continue" twice gets two stored messages. Cost is proportional to
the incoming list (bounded by the window), never to the stored history.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import operator
import time
from datetime import datetime
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

from . import gcpause
from .assemble import LARGE_OPEN, Slot
from ..messages import IdentMemo, absorbed_uids, content_ident, flatten_content, is_summary_message, message_text, message_uid, plain_tool_calls, role_of, safe_json, summary_node_ids, tool_call_ids
from ..records import ContextEntry, NewMessage
from ..store.base import Store, resolve_new_refs
from ..tokens import estimate_message_tokens

log = logging.getLogger("lossless_context.pipeline.ingest")

LOOKAHEAD = 64
LOG_WINDOW = 512
LAZY_ROWS = 256  # more new rows than this are handed to the store as they are built (pipelined)
TEXT_INDEX_LIMIT = 1_000_000  # chars of a message indexed for search (raw is kept whole)


_UNUSABLE = ("invalid", "unknown")  # role_of() of input that is stored but never sent
_FIELDS = ("content", "role", "tool_call_id", "name")
_STR, _STR_OR_NONE, _DICT = {str}, {str, type(None)}, {dict}


def _column(msgs: Sequence[Any], key: str) -> list[Any]:
    """msg.get(key) of every message at C speed (dict.get unbound: ~4x quicker than a
    methodcaller); TypeError for anything that is not a dict."""
    return list(map(dict.get, msgs, itertools.repeat(key)))


def _plain_calls(tcs: Any) -> list | None:
    """A copy of plain tool calls (dicts whose id, type, function name and arguments are
    str/None — all the identity reads of them), else None. Equal to the live list as long
    as nothing the identity depends on was changed in place; compared at C speed."""
    calls = plain_tool_calls(tcs)
    return None if calls is None else [{**tc, "function": {**fn}} for _, tc, fn in calls]


@dataclass
class Snapshot:
    """What the identities of a list's messages were computed from, to tell cheaply (at C
    speed, no hashing) that the same message objects still hold the same values.

    Per message: the content/role/tool_call_id/name objects (compared by identity or
    equality) and a copy of its tool calls (a list may be changed in place); and the
    positions whose fields are not plain strings (a content part list may be changed in
    place), whose identity is recomputed on every check instead."""

    fields: tuple[list[Any], ...]
    calls: list[Any]  # per message: None, a copy of plain tool calls, or (complex) the live object
    complex: list[int]

    @classmethod
    def of(cls, msgs: Sequence[Any], offset: int = 0) -> "Snapshot | None":
        if not set(map(type, msgs)) <= _DICT:
            return None  # not all plain dicts (a subclass may answer get() its own way): no shortcut
        fields = tuple(_column(msgs, k) for k in _FIELDS)
        calls = _column(msgs, "tool_calls")
        content, role, tcid, name = fields
        if set(map(type, role)) <= _STR and all(set(map(type, f)) <= _STR_OR_NONE for f in (content, tcid, name)):
            complex_ = []  # the usual list: every field a str or None (checked at C speed)
        else:
            complex_ = [offset + i for i, (c, r, t, n) in enumerate(zip(*fields))
                        if not ((c is None or type(c) is str) and type(r) is str
                                and (t is None or type(t) is str) and (n is None or type(n) is str))]
        for i, t in enumerate(calls):
            if t is not None:
                copy = _plain_calls(t)
                if copy is None:
                    complex_.append(offset + i)  # kept as the live object: equal to itself
                else:
                    calls[i] = copy
        complex_.sort()
        return cls(fields, calls, complex_)

    def extended(self, more: "Snapshot | None") -> "Snapshot | None":
        if more is None:
            return None
        return Snapshot(tuple(a + b for a, b in zip(self.fields, more.fields)),
                        self.calls + more.calls, self.complex + more.complex)


@dataclass
class Resume:
    """Where a previous alignment of this session's list ended, to pick up from there.

    Valid only while the stored context is the one that alignment left (same version) and
    the list starts with the very same message objects, unchanged (checked against the
    snapshot, or through the ident memo): then the prefix maps to the same slots, and only
    the rest needs aligning. It also keeps the context that alignment wrote, so the next
    one builds and writes only what it adds."""

    objs: list[Any]  # the previous list's messages (the host's own objects)
    idents: list[str]  # their content identities
    slots: list[Slot]  # what they aligned to
    j: int  # the position in the context after them
    last_mid: int  # the newest stored message they reference
    entries: list[ContextEntry] = field(default_factory=list)  # the active context they stand for
    items: list[tuple[str, int]] = field(default_factory=list)  # (kind, ref) of those entries
    snap: Snapshot | None = None
    version: int = -1  # the stored context version (set by the engine once it knows it)


@dataclass
class IngestResult:
    slots: list[Slot]
    new_ids: list[int]
    changed: bool
    entries: list[ContextEntry]  # the active context the slots stand for (as the store holds it)
    context_written: bool = False  # the store already holds the new active context
    resume: Resume | None = None  # how the next call over a longer list can skip this one


def _msg_created_at(msg: Any) -> float:
    """When the message was said: the host's `timestamp` (epoch seconds, or an ISO string as
    the released host writes for some rows), else now."""
    ts = msg.get("timestamp") if isinstance(msg, dict) else None
    if isinstance(ts, (int, float)) and not isinstance(ts, bool) and 0 < ts < 1e11:
        return float(ts)
    if isinstance(ts, str) and 10 <= len(ts) <= 40:
        try:
            dt = datetime.fromisoformat(ts.replace("Z", "+00:00"))
            return dt.timestamp() if 0 < dt.timestamp() < 1e11 else time.time()
        except ValueError:
            pass
    return time.time()


def new_message(msg: Any, large_tokens: int, exploration_tokens: int, supersedes: int | None = None,
                ident: str | None = None) -> NewMessage:
    """The row to store for `msg`; `ident` if the caller already has content_ident(msg)."""
    role = role_of(msg)
    text = message_text(msg, limit=TEXT_INDEX_LIMIT)
    tokens = estimate_message_tokens(msg)
    raw = msg if isinstance(msg, dict) else {"_lcm_unparsed": safe_json(msg)}
    large = tokens > large_tokens
    exploration = None
    if large:
        hint = msg.get("name") if isinstance(msg, dict) else None
        try:
            from ..summarizers.explore import explore  # (only for large outputs: keeps the plugin's load light)

            exploration = explore(text, max_tokens=exploration_tokens, hint=hint)
        except Exception as exc:  # exploration is a convenience; storing must not fail
            log.warning("lcm: exploration summary failed: %s", exc)
            exploration = text[: exploration_tokens * 4]
    return NewMessage(
        raw=raw, role=role, ident=ident or content_ident(msg), uid=message_uid(msg), text=text,
        tokens=tokens, created_at=_msg_created_at(msg), supersedes=supersedes,
        absorbed=absorbed_uids(msg), large=large, exploration=exploration,
    )


def _slot_for(msg: Any, mid: int, tokens: int, ident: str = "") -> Slot:
    role = role_of(msg)
    if role in _UNUSABLE:
        return Slot("x", [mid], None, role, 0)
    return Slot(
        "m", [mid], msg, role, tokens,
        call_ids=tool_call_ids(msg) or (),
        result_for=msg.get("tool_call_id") if role == "tool" else None,
        text_tokens=tokens, ident=ident,
    )


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


def align(
    store: Store,
    session_id: str,
    scope: Sequence[str],
    messages: Sequence[Any],
    context: Sequence[ContextEntry],
    *,
    large_tokens: int,
    exploration_tokens: int,
    resume: Resume | None = None,
) -> IngestResult:
    """Map every incoming message to a stored one (or store it) and return the slots."""
    slots: list[Slot | int] = []  # (int: a new message's placeholder ref until its row is built)
    pending: list[tuple[int, Any, str | None, int | None]] = []  # (slot index, msg, ident, supersedes)
    j = 0
    last_mid = 0
    log_cache: list[tuple[int, str, str | None]] | None = None
    log_pos = 0
    memo = IdentMemo(session_id)  # the host re-sends the same list: hash only what changed
    idents: list[str] = []
    start = 0
    base: Resume | None = None
    if resume is not None and _resumable(resume, messages, memo):
        base = resume
        slots, idents, j, last_mid, start = list(resume.slots), list(resume.idents), resume.j, \
            resume.last_mid, len(resume.objs)
    lazy: dict[str, Any] = {}

    def ctx_by_ref() -> dict[int, ContextEntry]:
        if "by_ref" not in lazy:
            lazy["by_ref"] = {e.ref: e for e in context if e.kind == "m"}
        return lazy["by_ref"]

    def aliases() -> dict[str, int]:
        if "aliases" not in lazy:
            refs = list(ctx_by_ref())
            lazy["aliases"] = store.aliases_for(refs) if refs else {}
        return lazy["aliases"]

    def known_summaries() -> set[int]:
        if "summaries" not in lazy:
            lazy["summaries"] = {e.ref for e in context if e.kind == "s"}
        return lazy["summaries"]

    for msg in messages[start:] if start else messages:
        # Past the end of the stored context (new messages at the tail) the identity is
        # needed only to compare with a stored row: it is computed when one is found, or
        # else while the row is built (overlapping the store's writing, see build()).
        ident = memo.ident(msg) if j < len(context) else None
        idents.append(ident)  # type: ignore[arg-type]  # (None: filled in below)
        # 1. Our own summary block (possibly merged into a neighbour by the host).
        if is_summary_message(msg):
            nodes = summary_node_ids(msg)
            valid = [n for n in nodes if n in known_summaries()]
            in_context = bool(valid)
            if not valid and nodes:
                # Not in the stored context: another host writing this same session (a gateway
                # and a CLI) replaced it. The block is still ours if its nodes are this
                # session's published summaries.
                valid = [n for n, rec in sorted(store.get_summaries(nodes).items())
                         if rec.session_id == session_id and rec.state == "published"]
            if valid:
                slots.append(Slot("S", valid, None, role_of(msg), estimate_message_tokens(msg)))
                while in_context and j < len(context) and not (context[j].kind == "s" and context[j].ref in valid):
                    j += 1
                while in_context and j < len(context) and context[j].kind == "s":
                    j += 1
                # Everything the block covers is behind us: a later message equal to one of
                # those is new, not that old row.
                last_mid = max(last_mid, _last_covered(store, valid[-1]))
                if _is_merged(msg):
                    log.info("lcm: our summary was merged with a neighbour by the host; the merged "
                             "message is stored verbatim and the summary nodes kept")
                    pending.append((-1, msg, memo.ident(msg), None))
                continue
        # 2. A large message we represented by its exploration summary (or a tier-0 stub).
        lref = _large_ref(msg)
        if lref is not None:
            e = ctx_by_ref().get(lref)
            if e is None:
                # Not in this context (another copy's pass covered it meanwhile): the
                # representation names its stored message, which is never stored again.
                rec = store.get_messages([lref]).get(lref)
                e = ContextEntry("m", lref, rec.ident, rec.role, rec.tokens) if rec is not None \
                    and rec.large and rec.session_id in scope else None
            if e is not None:
                s = _slot_for(msg, lref, estimate_message_tokens(msg), e.ident)
                s.text_tokens = e.tokens
                slots.append(s)
                last_mid = max(last_mid, lref)
                continue
        uid = message_uid(msg)
        # 3. The active context, in order, with a bounded lookahead (host may drop items).
        found = None
        if j < len(context) and context[j].ident == ident and context[j].kind == "m":
            found = j  # the usual case, a re-sent list: the very next entry (the scan finds it first too)
        elif j < len(context):  # (past its end — new messages at the tail — nothing to look up)
            alias_of = aliases().get(ident)
            for k in range(j, min(len(context), j + LOOKAHEAD)):
                e = context[k]
                if e.kind == "m" and (e.ident == ident or e.ref == alias_of):
                    found = k
                    break
        if found is not None:
            e = context[found]
            slots.append(_slot_for(msg, e.ref, e.tokens, e.ident))
            j = found + 1
            if e.ref > last_mid:
                last_mid = e.ref
            continue
        supersedes = None
        # 4. A known uid: same content is the same message; new content is a new version.
        if uid:
            if ident is None:
                ident = idents[-1] = memo.ident(msg)
            hit = store.find_uid(scope, uid)
            if hit is not None:
                if hit[1] == ident:
                    slots.append(_slot_for(msg, hit[0], estimate_message_tokens(msg), ident))
                    last_mid = max(last_mid, hit[0])
                    continue
                supersedes = hit[0]
        # 5. The log stored after the last matched message (e.g. a /compress head prefix
        #    whose verbatim tail the host re-appended, or a flush by on_session_end).
        if supersedes is None:
            if log_cache is None or (log_pos >= len(log_cache) and len(log_cache) == LOG_WINDOW):
                # Only this session's own log: a message repeating one from an ancestor
                # session is a new message here, never that old row.
                log_cache = store.log_after([session_id], last_mid, LOG_WINDOW)
                log_pos = 0
            if ident is None and (log_pos < len(log_cache) or len(log_cache) == LOG_WINDOW):
                ident = idents[-1] = memo.ident(msg)
            hit_mid = None
            for k in range(log_pos, len(log_cache)):
                mid, mident, muid = log_cache[k]
                if mid > last_mid and mident == ident and (muid is None or uid is None or muid == uid):
                    hit_mid = mid
                    log_pos = k + 1
                    break
            if hit_mid is None and len(log_cache) == LOG_WINDOW:
                # The log after the last match is longer than the window (another host writes
                # this same session): look the message up by its identity instead.
                found_row = store.find_ident(session_id, ident, last_mid)
                if found_row is not None and (found_row[1] is None or uid is None or found_row[1] == uid):
                    hit_mid = found_row[0]
                    log_cache = None
            if hit_mid is not None:
                slots.append(_slot_for(msg, hit_mid, estimate_message_tokens(msg), ident))
                last_mid = hit_mid
                continue
        # 6. New: a placeholder ref (-1, -2, …) until its row is built (see build()).
        pending.append((len(slots), msg, ident, supersedes))
        slots.append(-len(pending) if role_of(msg) not in _UNUSABLE else _slot_for(msg, -len(pending), 0))

    new_ids: list[int] = []
    context_written = False
    # A resumed call builds (and the store writes) only what follows the resumed prefix.
    n0 = len(base.slots) if base is not None else 0
    prefix_items = base.items if base is not None else []
    snap: list[Snapshot | None] = []

    def remember() -> None:
        """What the next call resumes from, as far as it does not depend on the new ids."""
        if None in idents:  # a tail message matched without its identity (a summary block, a large one)
            for i in range(start, len(idents)):
                if idents[i] is None:
                    idents[i] = memo.ident(messages[i])
        if base is not None:
            memo.keep_previous()  # the prefix is unchanged: its memo entries still hold
        memo.save()
        new_part = messages[start:] if start else messages
        snap.append(base.snap.extended(Snapshot.of(new_part, start)) if base is not None and base.snap is not None
                    else (Snapshot.of(messages) if base is None else None))

    if pending:
        # The new rows and the new active context go in ONE transaction (placeholders in the
        # context name them): a crash in between cannot strand them.
        known = (base.version, len(base.items)) if base is not None and base.version >= 0 else None
        new_items = _context_items(slots[n0:])

        def build() -> Iterator[NewMessage]:
            # Everything per new message is done here: a large append runs this while the
            # store's writer thread is busy with the previous chunk.
            for idx, msg, ident, supersedes in pending:
                if ident is None:
                    ident = idents[idx] = memo.ident(msg)
                row = new_message(msg, large_tokens, exploration_tokens, supersedes=supersedes, ident=ident)
                if idx >= 0:
                    s = slots[idx]
                    if type(s) is int:
                        slots[idx] = _slot_for(msg, s, row.tokens, row.ident)
                    else:  # unusable input: stored, never sent
                        s.ident, s.text_tokens = row.ident, row.tokens
                yield row
            remember()  # (while the writer thread inserts the last rows and commits)
            gcpause.settle()  # (likewise)

        resolved: list[Any] = []

        def with_ids(ids: list[int]) -> None:
            # (a large append calls this while its writer thread still inserts and commits)
            for k, (idx, *_) in enumerate(pending):
                if idx >= 0:
                    slots[idx].refs[0] = ids[k]
            resolved[:] = [prefix_items + resolve_new_refs(new_items, ids), slots_to_entries(slots[n0:])]

        with gcpause.paused() if len(pending) > LAZY_ROWS else contextlib.nullcontext():
            # Many rows go lazily: the store may write one chunk while the next is being built.
            new_ids = store.append_messages(session_id, build() if len(pending) > LAZY_ROWS else list(build()),
                                            context=prefix_items + new_items, context_known=known,
                                            on_ids=with_ids)
        if not snap:  # (a store that stopped reading once it had every row)
            remember()
        context_written = True
        items, added_entries = resolved  # (on_ids is always called: Store.append_messages)
    else:
        remember()
        items = prefix_items + _context_items(slots[n0:])
        added_entries = slots_to_entries(slots[n0:])
    added = slots[n0:]
    final = base.slots + added if base is not None else added
    entries = (base.entries if base is not None else []) + added_entries
    changed = bool(pending) or len(final) != len(context)
    state = Resume(list(messages), idents, final, len(entries), max(last_mid, max(new_ids, default=0)),
                   entries, items, snap[0])
    return IngestResult(final, new_ids, changed, entries, context_written, state)


def _resumable(resume: Resume, messages: Sequence[Any], memo: IdentMemo) -> bool:
    """True when ``messages`` starts with ``resume``'s messages, the same objects unchanged."""
    n = len(resume.objs)
    if len(messages) < n or len(resume.idents) != n:
        return False
    head = messages[:n]
    if not all(map(operator.is_, head, resume.objs)):
        return False
    snap = resume.snap
    if snap is None:
        # No snapshot (a list with non-mapping items): compare every identity via the memo.
        return all(memo.ident(m) == ident for m, ident in zip(head, resume.idents))
    try:
        # Same objects (or equal values) in every field the identity is computed from.
        if any(_column(head, k) != was for k, was in zip(_FIELDS, snap.fields)):
            return False
        now = _column(head, "tool_calls")
        if now != snap.calls:
            # Some tool calls differ from the copy: the identity decides (it renders them).
            for i, (a, b) in enumerate(zip(now, snap.calls)):
                if (a is None) != (b is None) or (a != b and memo.ident(head[i]) != resume.idents[i]):
                    return False
    except Exception:  # a hostile __eq__: align the whole list instead
        return False
    # A part list (or another non-string field) may have been changed in place.
    return all(memo.ident(head[i]) == resume.idents[i] for i in snap.complex)


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


def _context_items(slots: Sequence[Slot | int]) -> list[tuple[str, int]]:
    """(kind, ref) of slots_to_entries(slots), without building the records (O(context) per
    call); an int is a new message's placeholder ref."""
    out: list[tuple[str, int]] = []
    for s in slots:
        if type(s) is int:
            out.append(("m", s))
        elif s.kind == "m":
            out.append(("m", s.refs[0]))
        elif s.kind == "S":
            out.extend(("s", r) for r in s.refs)
    return out


def slots_to_entries(slots: Sequence[Slot]) -> list[ContextEntry]:
    out: list[ContextEntry] = []
    for s in slots:
        if s.kind == "S":
            out.extend(ContextEntry("s", r, "", "summary", 0) for r in s.refs)
        elif s.kind == "m":
            out.append(ContextEntry("m", s.refs[0], s.ident, s.role, s.text_tokens or s.tokens))
    return out

