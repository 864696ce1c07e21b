"""The engine's ingest: the plain alignment (ingest.py) with its fast paths around it.

`align_fast` gives exactly what `ingest.align` gives for every input — the same slots, the
same stored rows, the same result (tests/test_ingest_oracle.py checks) — and is faster
where the host's habits allow:

* resume (ingest_resume.py): a list that starts with the previous call's very objects,
  unchanged, continues from where that call ended; only the rest is walked, built and
  written (the store is told which part of the context it already holds);
* the identity memo (messages.IdentMemo): an unchanged message is not hashed again;
* deferred identities: past the end of the stored context a message is nearly always new,
  and its identity is computed only if something is compared with it, else while its row
  is built;
* pipelined storing: more than LAZY_ROWS new rows are built lazily while the store's
  writer thread writes the previous chunk (on_ids gives the ids before the commit), with
  the garbage collector paused meanwhile (gcpause.py). On SQLite such an append's rows are
  full-text indexed by the writer thread (while this thread builds rows, then after the
  commit: store/sqlite/index.py), so the ~100 rows a 0.19 host hands each pass cost that pass
  its row building, not FTS5's tokenising.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Sequence, cast

from . import gcpause, ingest_resume
from .assemble import Slot
from .forgotten import FORGOTTEN
from .ingest import UNUSABLE, IngestResult, Walk, context_items, new_message, slot_for, slots_to_entries
from .ingest_resume import Resume, Snapshot
from ..messages import IdentMemo, role_of
from ..records import ContextEntry, NewMessage
from ..store.base import Store, resolve_new_refs

# More new rows than this are handed to the store as they are built (pipelined); fewer (a
# turn's flush) are written on this thread at once, indexing included (no thread hand-off).
LAZY_ROWS = 32

# (slot index or -1 for a merged summary block stored verbatim, msg, ident or None, supersedes)
Pending = tuple[int, Any, "str | None", "int | None"]


def align_fast(
    store: Store,
    session_id: str,
    scope: Sequence[str],
    messages: Sequence[Any],
    context: Sequence[ContextEntry],
    *,
    large_tokens: int,
    exploration_tokens: int,
    resume: Resume | None = None,
    token_memo: dict[int, tuple[Any, int]] | None = None,
) -> IngestResult:
    """ingest.align, faster; `resume` is what the previous call over this session's list
    returned (IngestResult.resume), if the stored context is still the one it left.
    `token_memo` gets each stored message's estimate by id (tokens.measured_messages' known)."""
    memo = IdentMemo(session_id)  # the host re-sends the same list: hash only what changed
    base = resume if resume is not None and ingest_resume.resumable(resume, messages, memo) else None
    if base is not None:
        walk = Walk(store, session_id, scope, context, ident_of=memo.ident, j=base.j, last_mid=base.last_mid)
        slots: list[Slot | int] = list(base.slots)
        idents: list[str | None] = list(base.idents)
        start = len(base.objs)
    else:
        walk = Walk(store, session_id, scope, context, ident_of=memo.ident)
        slots, idents, start = [], [], 0
    pending: list[Pending] = []
    n_context = len(context)
    for msg in messages[start:] if start else messages:
        # Past the end of the stored context (new messages at the tail) the identity is
        # needed only to compare with a stored row: it is computed when one is found, or
        # else while the row is built (overlapping the store's writing, see _store_new()).
        slot, ident, supersedes, store_too = walk.place(msg, memo.ident(msg) if walk.j < n_context else None)
        idents.append(ident)
        if slot is FORGOTTEN:
            continue  # a message the user forgot, handed over again: no row, no slot (forgotten.py)
        if slot is not None:
            slots.append(slot)
            if store_too:
                pending.append((-1, msg, ident, None))
        else:
            # A placeholder ref (-1, -2, …) until its row is built: an int for a usable
            # message (its Slot is made by _store_new), an "x" slot for unusable input.
            pending.append((len(slots), msg, ident, supersedes))
            slots.append(-len(pending) if role_of(msg) not in UNUSABLE else slot_for(msg, -len(pending), 0))

    # A resumed call builds (and the store writes) only what follows the resumed prefix.
    n0 = len(base.slots) if base is not None else 0
    prefix_items = base.items if base is not None else []
    snap: list[Snapshot | None] = []

    def remember() -> None:
        snap.append(_remember(memo, messages, idents, start, base))

    new_ids: list[int] = []
    if pending:
        new_ids, items, added_entries = _store_new(
            store, session_id, slots, idents, pending, n0, base, memo.ident, remember,
            large_tokens=large_tokens, exploration_tokens=exploration_tokens, token_memo=token_memo)
        if not snap:  # (a store that stopped reading once it had every row)
            remember()
    else:
        remember()
        items = prefix_items + context_items(slots[n0:])
        added_entries = slots_to_entries(_filled(slots)[n0:])
    added = _filled(slots)[n0:]
    final = base.slots + added if base is not None else added
    entries = (base.entries if base is not None else []) + added_entries
    changed = bool(pending) or len(final) != len(context)
    state = Resume(list(messages), cast("list[str]", idents), final, len(entries),  # _remember filled them
                   max(walk.last_mid, max(new_ids, default=0)), entries, items, snap[0])
    return IngestResult(final, new_ids, changed, entries, bool(pending), state)


def _filled(slots: list[Slot | int]) -> list[Slot]:
    """`slots` once no placeholder is left: _store_new's build() replaced each int by its Slot
    (or there was nothing new). A view for the type checker; nothing is copied."""
    return cast("list[Slot]", slots)


def _remember(memo: IdentMemo, messages: Sequence[Any], idents: list[str | None], start: int,
              base: Resume | None) -> Snapshot | None:
    """What the next call resumes from, as far as it does not depend on the new ids: every
    identity filled in, the memo saved, and the snapshot of the list."""
    if None in idents:  # a tail message matched without its identity (a summary block, a large one)
        for i in range(start, len(idents)):
            if idents[i] is None:
                idents[i] = memo.ident(messages[i])
    if base is not None:
        memo.keep_previous()  # the prefix is unchanged: its memo entries still hold
    memo.save()
    if base is None:
        return Snapshot.of(messages)
    new_part = messages[start:] if start else messages
    return base.snap.extended(Snapshot.of(new_part, start)) if base.snap is not None else None


def _store_new(store: Store, session_id: str, slots: list[Slot | int], idents: list[str | None],
               pending: list[Pending], n0: int, base: Resume | None, ident_of: Callable[[Any], str],
               remember: Callable[[], None], *,
               large_tokens: int, exploration_tokens: int, token_memo: dict[int, tuple[Any, int]] | None = None,
               ) -> tuple[list[int], list[tuple[str, int]], list[ContextEntry]]:
    """Build and store the pending rows with the new active context, in ONE transaction
    (placeholders in the context name them: a crash in between cannot strand them); fill
    in their slots. Returns (new ids, the context's items, the entries slots[n0:] stand for)."""
    known = (base.version, len(base.items)) if base is not None and base.version >= 0 else None
    prefix_items = base.items if base is not None else []
    new_items = context_items(slots[n0:])

    def build() -> Iterator[NewMessage]:
        # Everything per new message is done here: a large append runs this while the
        # store's writer thread is busy with the previous chunk.
        for idx, msg, ident, supersedes in pending:
            if ident is None:
                ident = idents[idx] = ident_of(msg)
            row = new_message(msg, large_tokens, exploration_tokens, supersedes=supersedes, ident=ident)
            if token_memo is not None:
                token_memo[id(msg)] = (msg, row.tokens)  # (estimate_message_tokens(msg): new_message's)
            if idx >= 0:
                s = slots[idx]
                if isinstance(s, int):
                    slots[idx] = slot_for(msg, s, row.tokens, row.ident)
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
                _filled(slots)[idx].refs[0] = ids[k]
        resolved[:] = [prefix_items + resolve_new_refs(new_items, ids), slots_to_entries(_filled(slots)[n0:])]

    lazy = len(pending) > LAZY_ROWS
    with gcpause.paused() if lazy else contextlib.nullcontext():
        # Many rows go lazily: the store may write one chunk while the next is being built.
        new_ids = store.append_messages(session_id, build() if lazy else list(build()),
                                        context=prefix_items + new_items, context_known=known,
                                        on_ids=with_ids)
    items, added_entries = resolved  # (on_ids is always called: Store.append_messages)
    return new_ids, items, added_entries
