"""Resuming an alignment: skip the part of the host's list the previous call already aligned.

The host hands the same growing list over and over (every compress(), on_session_end, tool
call). When the new list starts with the very same message objects, unchanged, and the
stored context is still the one the previous alignment left, that prefix maps to the same
slots again; only the rest needs aligning. This module keeps what such a call resumes from
(`Resume`), what its messages' identities were computed from (`Snapshot`), and decides
whether resuming is safe (`resumable`). ingest_fast.align_fast uses it; the plain
alignment (ingest.align) never resumes. `PassEcho` knows a host's flush of the very list a
pass just aligned (nothing to align again).
"""

from __future__ import annotations

import copy
import itertools
import operator
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from .assemble import Slot
from ..messages import IdentMemo, plain_tool_calls
from ..records import ContextEntry

FIELDS = ("content", "role", "tool_call_id", "name")  # the fields an identity is computed from (and tool_calls)
_STR, _STR_OR_NONE, _DICT = {str}, {str, type(None)}, {dict}


def column(msgs: Sequence[Any], key: str) -> list[Any]:
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
        fields = tuple(column(msgs, k) for k in FIELDS)
        calls = column(msgs, "tool_calls")
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
    one builds and writes only what it adds. (One exception, kept as it was: unusable input
    behind a message that became a newer row — a plain walk stores that input again, a
    resumed call keeps its row; see tests/test_ingest_oracle.py::test_known_divergence_below.)"""

    objs: list[Any]  # the previous list's messages (the host's own objects)
    idents: list[str]  # their content identities
    slots: list[Slot]  # what they aligned to
    j: int  # the position in the context after them
    last_mid: int  # the newest stored message they reference
    entries: list[ContextEntry] = field(default_factory=list)  # the active context they stand for
    items: list[tuple[str, int]] = field(default_factory=list)  # (kind, ref) of those entries
    snap: Snapshot | None = None
    version: int = -1  # the stored context version (set by the engine once it knows it)


def resumable(resume: Resume, messages: Sequence[Any], memo: IdentMemo) -> bool:
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
        if any(column(head, k) != was for k, was in zip(FIELDS, snap.fields)):
            return False
        now = column(head, "tool_calls")
        if now != snap.calls:
            # Some tool calls differ from the copy: the identity decides (it renders them).
            for i, (a, b) in enumerate(zip(now, snap.calls)):
                if (a is None) != (b is None) or (a != b and memo.ident(head[i]) != resume.idents[i]):
                    return False
    except Exception:  # a hostile __eq__: align the whole list instead
        return False
    # A part list (or another non-string field) may have been changed in place.
    return all(memo.ident(head[i]) == resume.idents[i] for i in snap.complex)


_SCALARS = (str, int, float, bool, type(None))


class PassEcho:
    """The list each session's last pass aligned, to know the host's flush of that very list.

    A host that commits a pass first hands the list it gave the pass back in `on_session_end`
    (Hermes 0.19's flush, a copy of it): aligned again against the stored context the pass's
    ingest left, it would store nothing and change nothing — the same rows, the same slots,
    no fold (a pass's ingest that folded a replay is not remembered) — yet it cost a walk over
    the whole context. So the engine remembers, per session, what the pass's ingest was given
    (each message's values as they were: a copy of its fields, of its tool calls, and of any
    other nested value) with the context version it left, and a flush whose messages are all
    equal to those, while the context is still at that version, is known to be a no-op. A list
    with content parts or tool calls of another shape is not remembered (its identity is not
    read from plain strings). Kept for the last few sessions only, behind its own lock."""

    SESSIONS = 4

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_session: "OrderedDict[str, tuple[int, list[dict[str, Any]]]]" = OrderedDict()

    def remember(self, session_id: str, messages: Sequence[Any], version: int) -> None:
        self.forget(session_id)
        snap = Snapshot.of(messages)
        if snap is None or snap.complex or not messages:
            return  # (content parts, unusual tool calls: not worth a copy)
        frozen = []
        for msg, calls in zip(messages, snap.calls):
            copy_ = dict(msg)
            for k, v in copy_.items():
                if k == "tool_calls":
                    copy_[k] = calls  # (Snapshot's copy of plain tool calls, or None)
                elif not isinstance(v, _SCALARS):
                    copy_[k] = copy.deepcopy(v)
            frozen.append(copy_)
        with self._lock:
            self._by_session[session_id] = (version, frozen)
            while len(self._by_session) > self.SESSIONS:
                self._by_session.popitem(last=False)

    def forget(self, session_id: str) -> None:
        with self._lock:
            self._by_session.pop(session_id, None)

    def repeats(self, session_id: str, messages: Sequence[Any], version_now: Callable[[], int]) -> bool:
        """True when `messages` equal what the session's last pass aligned, value for value,
        and the stored context is still the version that pass's ingest left."""
        with self._lock:
            entry = self._by_session.get(session_id)
        if entry is None:
            return False
        version, frozen = entry
        if len(messages) != len(frozen) or not set(map(type, messages)) <= _DICT:
            return False
        try:
            if list(messages) != frozen:
                return False
        except Exception:  # a hostile __eq__: align it
            return False
        return version_now() == version
