"""The store interface shared by the SQLite and PostgreSQL backends.

The engine, the tools and the CLI talk only to this interface. Every method is safe to
call from several threads; each backend owns its connections (one per thread or a pool).
"""

from __future__ import annotations

import abc
import contextlib
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Protocol, Sequence, TypeVar

from ..records import ContextEntry, MessageRecord, NewMessage, NewSummary, StagedPass, SummaryRecord
from ..search.query import QueryPlan
from ..search.regex import BoundedRegex

if TYPE_CHECKING:
    from .migrate import MigrationState


class StoreError(RuntimeError):
    """A store operation failed in a way the caller should report, not crash on."""


T = TypeVar("T")


class ResultCursor(Protocol):
    """What one statement run by :meth:`Store.write_rows` answers (a DB-API cursor)."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


class Execute(Protocol):
    """``execute(sql, params)``: one statement in the portable SQL of :meth:`Store.query_rows`."""

    def __call__(self, sql: str, params: Sequence[Any] = ()) -> ResultCursor: ...


@dataclass
class StoreCheck:
    """One line of `lcm doctor` that only the backend can tell (its own integrity check, its
    full-text index, what the server lacks): data, turned into the report by ops/doctor.py."""

    name: str
    ok: bool
    detail: str = ""
    repaired: bool = False
    info: bool = False  # a finding to know about, not a failure


_KEY_RE = re.compile(r"\bnew(\d+)\b")


def cost_totals(rows: Sequence[Sequence[Any]]) -> dict[str, Any]:
    """(model, nodes, calls, tokens in, tokens out, ms) rows per model → the summed figures."""
    out: dict[str, Any] = {"nodes": 0, "calls": 0, "input_tokens": 0, "output_tokens": 0, "ms": 0.0, "models": []}
    for model, nodes, calls, tin, tout, ms in rows:
        out["nodes"] += int(nodes or 0)
        out["calls"] += int(calls or 0)
        out["input_tokens"] += int(tin or 0)
        out["output_tokens"] += int(tout or 0)
        out["ms"] += float(ms or 0)
        out["models"].append(model)
    out["ms"] = round(out["ms"], 1)
    return out


def resolve_keys(text: str, keymap: dict[str, int]) -> str:
    """Replace a pass's temporary node keys (`new3`) cited in summary text by real ids (`s812`)."""
    if "new" not in text:
        return text
    return _KEY_RE.sub(lambda m: f"s{keymap[m.group(0)]}" if m.group(0) in keymap else m.group(0), text)


def resolve_new_refs(items: Sequence[tuple[str, int]], new_ids: Sequence[int], known: int = 0) -> list[tuple[str, int]]:
    """Context items whose negative message refs (-k) name the k-th row just inserted; the
    first `known` items are the stored context already (no new rows among them)."""
    return [*items[:known], *((k, new_ids[-r - 1]) if k == "m" and r < 0 else (k, r) for k, r in items[known:])]


def with_appended(items: Sequence[tuple[str, int]], extra_rows: Sequence[tuple[Any, Any]]) -> list[tuple[str, int]]:
    """A staged context plus what the published one gained after the stage's base, given as
    (message_id, summary_id) context rows: publishing never drops a message reference."""
    out: list[tuple[str, int]] = [(x[0], x[1]) for x in items]
    have = set(out)
    for mid, sid in extra_rows:
        it = ("m", mid) if mid is not None else ("s", sid)
        if it not in have:
            out.append(it)
            have.add(it)
    return out


class Store(abc.ABC):
    location: str
    kind: str
    read_only: bool = False  # opened for inspection only (store/sqlite/readonly.py): writes raise
    # How many groups a prune's transaction is split into (remove_rows; ops/batches.py): each
    # boundary is a point where a transaction past its deadline commits, and each group costs
    # its statements once. SQLite: one write lock for every writer, so many stop points.
    removal_groups: int = 8

    def reset_connections(self) -> None:  # noqa: B027  (optional: a file store has nothing to reset)
        """Forget pooled connections after an outage (store/guard.py calls it); the next call
        reconnects. Nothing to do for a file store."""

    # -- sessions -----------------------------------------------------------
    @abc.abstractmethod
    def ensure_session(
        self,
        session_id: str,
        *,
        parent_id: str | None = None,
        conversation_id: str | None = None,
        platform: str | None = None,
        model: str | None = None,
        boundary_reason: str | None = None,
    ) -> None: ...

    @abc.abstractmethod
    def get_session(self, session_id: str) -> dict[str, Any] | None: ...

    @abc.abstractmethod
    def list_sessions(self) -> list[dict[str, Any]]: ...

    @abc.abstractmethod
    def lineage(self, session_id: str) -> list[str]:
        """Sessions whose history `session_id` may see: ancestors and same conversation."""

    # -- messages -----------------------------------------------------------
    @abc.abstractmethod
    def append_messages(self, session_id: str, rows: Iterable[NewMessage],
                        context: Sequence[tuple[str, int]] | None = None,
                        context_known: tuple[int, int] | None = None,
                        on_ids: Callable[[list[int]], None] | None = None) -> list[int]:
        """Store rows; with `context`, also replace the session's active context in the same
        transaction (a negative message ref -k names the k-th new row). `rows` may be a lazy
        iterable (consumed once, inside the write).

        `context_known=(version, k)` says the stored context, if still at `version`, already
        holds `context[:k]`: then only the rest is written (checked under the write lock;
        any other version gets the full comparison).

        `on_ids(ids)` is called once on the calling thread with the new rows' ids as soon as
        they are known — possibly before the commit (a pipelined SQLite append: while its
        writer thread inserts the last rows and commits) — so the caller can prepare what
        depends on them meanwhile. If the append then fails it raises as usual, and whatever
        on_ids prepared must be dropped by the caller."""

    @abc.abstractmethod
    def get_messages(self, ids: Sequence[int]) -> dict[int, MessageRecord]: ...

    @abc.abstractmethod
    def log_after(self, session_ids: Sequence[str], after_id: int, limit: int) -> list[tuple[int, str, str | None]]:
        """(id, ident, uid) of messages stored after `after_id` in these sessions, in order."""

    @abc.abstractmethod
    def find_uid(self, session_ids: Sequence[str], uid: str) -> tuple[int, str] | None:
        """(id, ident) of the newest stored version of a message uid."""

    @abc.abstractmethod
    def find_ident(self, session_id: str, ident: str, after_id: int) -> tuple[int, str | None] | None:
        """(id, uid) of the first message of ``session_id`` stored after ``after_id`` with this
        content identity (an indexed lookup, however long the log in between)."""

    @abc.abstractmethod
    def add_aliases(self, pairs: Sequence[tuple[str, int]]) -> None:
        """Record that a message we emitted in a repaired form (ident) stands for a stored one."""

    @abc.abstractmethod
    def aliases_for(self, message_ids: Sequence[int]) -> dict[str, int]:
        """alias ident → message id, for these messages."""

    # -- costs, history and continuity (migration 013 / 009) ------------------
    @abc.abstractmethod
    def put_summary_costs(self, rows: Sequence[tuple[int, str, int, int, int, float]]) -> None:
        """(summary id, model, calls, input tokens, output tokens, ms) per node."""

    @abc.abstractmethod
    def get_summary_costs(self, ids: Sequence[int]) -> dict[int, dict[str, Any]]:
        """summary id → {model, calls, input_tokens, output_tokens, ms} (nodes without a row: absent)."""

    @abc.abstractmethod
    def summary_cost_totals(self, session_id: str | None = None) -> dict[str, Any]:
        """Summed node costs of published summaries (one session, or the whole store):
        {nodes, calls, input_tokens, output_tokens, ms, models}."""

    @abc.abstractmethod
    def replace_summary(self, summary_id: int, text: str, tokens: int, level: str, summarizer: str) -> None:
        """New text for a node; the previous text goes to its history (the id stays valid)."""

    @abc.abstractmethod
    def summary_history(self, summary_id: int) -> list[dict[str, Any]]:
        """Earlier texts of a node, oldest first."""

    @abc.abstractmethod
    def get_continuity(self, session_id: str) -> str | None:
        """The continuity state (JSON) a session's summary block keeps in view."""

    @abc.abstractmethod
    def set_continuity(self, session_id: str, state: str) -> None: ...

    @abc.abstractmethod
    def set_representations(self, pairs: Sequence[tuple[int, str]]) -> set[int]:
        """Show these messages by a representation (a tier-0 stub) from now on: sets
        `large` and `exploration` of each message that has none yet (the raw message stays
        verbatim). Returns the ids it set; one that already had one keeps it (stable)."""

    @abc.abstractmethod
    def prepare_representations(self, pairs: Sequence[tuple[int, str]]) -> None:
        """Keep a note with each message that is not shown by a representation (`large`
        stays false, so nothing shows it): tier 0's verdict that a stub would not pay
        (stubs.py). A message shown by a representation keeps it untouched."""

    @abc.abstractmethod
    def session_messages(self, session_id: str, after_seq: int = -1, limit: int = 1000) -> list[MessageRecord]: ...

    def session_messages_in(self, session_id: str, ranges: Sequence[tuple[int, int]]) -> list[MessageRecord]:
        """For each (lo, hi): the session's first hi - lo + 1 messages from seq lo on (all of
        lo..hi while seqs have no gaps), merged in seq order. One query per range here; a store
        with costly round trips answers all ranges at once."""
        out: dict[int, MessageRecord] = {}
        for lo, hi in ranges:
            if hi >= lo:
                for r in self.session_messages(session_id, after_seq=lo - 1, limit=hi - lo + 1):
                    out[r.seq] = r
        return [out[k] for k in sorted(out)]

    def messages_in(self, spans: Sequence[tuple[str, int, int]]) -> list[MessageRecord]:
        """:meth:`session_messages_in` over several sessions: for each (session, lo, hi) that
        session's messages from seq lo on, each once. By default one call per session."""
        by: dict[str, list[tuple[int, int]]] = {}
        for sid, lo, hi in spans:
            by.setdefault(sid, []).append((lo, hi))
        return [r for sid, ranges in by.items() for r in self.session_messages_in(sid, ranges)]

    # -- active context and staged passes ----------------------------------
    @abc.abstractmethod
    def get_context(self, session_id: str) -> tuple[int, list[ContextEntry]]: ...

    @abc.abstractmethod
    def context_version(self, session_id: str) -> int:
        """The session's context version alone (0 for an unknown session): bumped by every
        write of its active context, so a cached copy of the context is valid while equal."""

    def cached_context_version(self, session_id: str) -> int:
        """The context version, without a query where the store can know it (PostgreSQL:
        LISTEN/NOTIFY, postgres/versions.py); by default a read of the row."""
        return self.context_version(session_id)

    @abc.abstractmethod
    def set_context(self, session_id: str, entries: Sequence[ContextEntry], expected_version: int | None = None) -> int: ...

    @abc.abstractmethod
    def stage_pass(
        self,
        session_id: str,
        pass_id: str,
        summaries: Sequence[NewSummary],
        items: Sequence[tuple[str, Any]],
        base_version: int,
        base_len: int,
    ) -> tuple[dict[str, int], list[tuple[str, int]]]:
        """Write staged summaries and the staged context; returns key→id and resolved items."""

    def latest_staged(self, session_id: str) -> StagedPass | None:
        """The newest staged pass of a session, if any."""
        staged = self.staged_passes(session_id)
        return staged[0] if staged else None

    @abc.abstractmethod
    def staged_passes(self, session_id: str) -> list[StagedPass]:
        """Every staged pass of a session, newest first."""

    @abc.abstractmethod
    def publish_pass(self, pass_id: str, into_session: str | None = None) -> bool: ...

    @abc.abstractmethod
    def discard_pass(self, pass_id: str) -> None: ...

    @abc.abstractmethod
    def discard_stale(self, session_id: str, keep: str | None = None) -> int: ...

    # -- summaries -----------------------------------------------------------
    @abc.abstractmethod
    def get_summaries(self, ids: Sequence[int], include_staged: bool = False) -> dict[int, SummaryRecord]: ...

    @abc.abstractmethod
    def summary_children(self, summary_id: int) -> tuple[list[int], list[int]]:
        """(child summary ids, message ids) in order."""

    def summary_outline(self, summary_id: int) -> tuple[SummaryRecord | None, list[tuple[str, int, int]]]:
        """A published summary and its children in order (child summaries, then messages), each
        as (``"s"`` or ``"m"``, id, tokens): what lays out a page of ``lcm_expand`` before any
        child's text is read. (None, []) for an unknown or unpublished summary; children that no
        longer exist or are not published are left out. This default reads the records."""
        rec = self.get_summaries([summary_id]).get(summary_id)
        if rec is None:
            return None, []
        kids, mids = self.summary_children(summary_id)
        sums, msgs = self.get_summaries(kids), self.get_messages(mids)
        return rec, ([("s", k, sums[k].tokens) for k in kids if k in sums]
                     + [("m", m, msgs[m].tokens) for m in mids if m in msgs])

    @abc.abstractmethod
    def summary_parents(self, summary_id: int) -> list[int]: ...

    @abc.abstractmethod
    def message_summaries(self, message_id: int) -> list[int]:
        """Published leaf summaries covering a message."""

    def message_summaries_many(self, message_ids: Sequence[int]) -> dict[int, list[int]]:
        """`message_summaries` of several messages (every id is a key; [] when not covered)."""
        return {m: self.message_summaries(m) for m in dict.fromkeys(message_ids)}

    def summary_parents_many(self, summary_ids: Sequence[int]) -> dict[int, list[int]]:
        """`summary_parents` of several summaries (every id is a key; [] at the top)."""
        return {s: self.summary_parents(s) for s in dict.fromkeys(summary_ids)}

    def summary_chains(self, message_ids: Sequence[int],
                       summary_ids: Sequence[int]) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
        """What naming the chains of search hits up the DAG needs, in one call: the published
        leaves covering each message (`message_summaries_many`), and the published parents
        (`summary_parents_many`) of the given summaries, of each message's first leaf, and of
        every first parent above them up to the top (each of those ids a key; [] at the top).
        This default reads level by level; a store with costly round trips reads it at once."""
        covering = self.message_summaries_many(message_ids) if message_ids else {}
        parents: dict[int, list[int]] = {}
        level = set(summary_ids) | {c[0] for c in covering.values() if c}
        while level:
            got = self.summary_parents_many([s for s in level if s not in parents])
            parents.update(got)
            level = {p[0] for p in got.values() if p and p[0] not in parents}
        return covering, parents

    def hit_details(self, message_ids: Sequence[int], summary_ids: Sequence[int]) -> tuple[
            set[int], dict[int, MessageRecord], dict[int, list[int]], dict[int, list[int]]]:
        """What showing a page of search hits reads, in one call: which of the messages are
        retracted (`retracted`), the messages (`get_messages`), and the hits' chains up the
        DAG (`summary_chains`). This default makes the three reads; a store with costly
        round trips sends them together."""
        mids = list(dict.fromkeys(message_ids))
        hidden = self.retracted(mids) if mids else set()
        msgs = self.get_messages(mids) if mids else {}
        covering, parents = self.summary_chains(mids, summary_ids)
        return hidden, msgs, covering, parents

    # -- message vectors (the optional semantic arm: retrieval/semantic.py) -------------------
    @abc.abstractmethod
    def put_vectors(self, model: str, rows: Sequence[tuple[int, bytes]]) -> int:
        """Keep each message's vector from ``model`` (raw bytes; the arm decides the format).
        A message that already has one keeps it; a message that no longer exists gets none.
        Returns how many were kept."""

    @abc.abstractmethod
    def vectors_after(self, model: str, session_ids: Sequence[str] | None, after: int,
                      limit: int) -> list[tuple[int, int, bytes]]:
        """(seq, message id, vector) of ``model``'s vectors kept after ``after`` (``seq`` is
        the order they were kept in), of these sessions' messages (every session's when
        None), at most ``limit``, oldest first."""

    @abc.abstractmethod
    def vector_counts(self) -> dict[str, int]:
        """Messages with a vector, per model (`lcm status`)."""

    @abc.abstractmethod
    def messages_to_embed(self, model: str, after_id: int, limit: int) -> list[tuple[int, str]]:
        """(id, text) of messages with ids above ``after_id`` that have no vector from
        ``model`` yet, in id order, at most ``limit``."""

    @abc.abstractmethod
    def update_summary_text(self, summary_id: int, text: str, tokens: int, level: str, summarizer: str) -> None: ...

    @abc.abstractmethod
    def rebalance_summary(self, summary_id: int, summaries: Sequence[NewSummary],
                          child_keys: Sequence[str | int], depth: int) -> dict[str, int]:
        """One transaction: publish `summaries` (new condensed nodes between `summary_id` and
        its descendants) and make `child_keys` the node's children at `depth`. No node is
        deleted and every id stays valid (dag_rebalance.py). Returns key→id."""

    # -- summaries prepared ahead of a pass (background compaction) --------------
    @abc.abstractmethod
    def put_presummary(self, session_id: str, span_key: str, text: str, tokens: int, source_tokens: int,
                       level: str, summarizer: str) -> None: ...

    @abc.abstractmethod
    def get_presummary(self, session_id: str, span_key: str) -> dict[str, Any] | None: ...

    @abc.abstractmethod
    def count_presummaries(self, session_id: str | None = None) -> int: ...

    # -- search (what a grep reads: store/search_api.py) --------------------------
    @abc.abstractmethod
    def search(
        self,
        target: str,
        session_ids: Sequence[str] | None,
        plan: QueryPlan,
        *,
        mode: str = "fts",  # fts | substring | regex
        regex: BoundedRegex | None = None,
        role: str | None = None,
        since: float | None = None,
        until: float | None = None,
        under_summary: int | None = None,
        limit: int = 10,
        offset: int = 0,
        order: str = "rank",  # fts only: rank (best first) | recent (newest matches first)
    ) -> list[dict[str, Any]]:
        """Rows with id, session_id, role (messages), created_at, text, rank."""

    @abc.abstractmethod
    def term_counts(self, target: str, plans: Sequence[QueryPlan], cap: int, newest: int | None = None) -> list[int]:
        """How many rows of ``target`` (whole store, any session; only the ``newest`` rows by id
        when given) match each plan's full-text query (as :meth:`search` reads it), counted up
        to ``cap + 1``: the cost and rarity estimates of a ranked search."""

    def search_substrings(self, asks: Sequence[tuple[str, dict[str, Any]]]) -> list[list[dict[str, Any]]]:
        """:meth:`search` with ``mode="substring"`` for several (target, arguments) at once, in
        order (the arguments: ``session_ids``, ``plan`` and the filters, ``limit``, ``offset``).
        This default searches one target at a time; a store with costly round trips sends the
        searches together."""
        out = []
        for target, kw in asks:
            kw = dict(kw)
            out.append(self.search(target, kw.pop("session_ids", None), kw.pop("plan"), mode="substring", **kw))
        return out

    def search_under_summaries(self, session_ids: Sequence[str] | None, asks: Sequence[tuple[int, QueryPlan]], *,
                               role: str | None = None, since: float | None = None, until: float | None = None,
                               limit: int = 10) -> list[list[dict[str, Any]]]:
        """The newest messages under each summary that match its plan (a :meth:`search` of
        ``"messages"`` with ``mode="fts"``, ``order="recent"`` and ``under_summary``), for
        several (summary id, plan) at once, in order. This default searches one at a time; a
        store with costly round trips sends them together."""
        return [self.search("messages", session_ids, plan, mode="fts", order="recent", role=role, since=since,
                            until=until, under_summary=sid, limit=limit, offset=0) for sid, plan in asks]

    def term_counts_many(self, asks: Sequence[tuple[str, Sequence[QueryPlan]]], cap: int) -> list[list[int]]:
        """:meth:`term_counts` of several (target, plans) at once, in order. This default asks
        one target at a time; a store with costly round trips asks them together."""
        return [self.term_counts(target, plans, cap) for target, plans in asks]

    def any_match(self, target: str, plans: Sequence[QueryPlan], seconds: float) -> list[bool | None]:
        """Whether each plan's full-text query matches at least one row of ``target`` (whole
        store), tested in the given order until ``seconds`` have passed; None for the plans
        left untested. By default one capped count per plan; a store may answer all at once."""
        deadline = time.monotonic() + seconds
        out: list[bool | None] = []
        for plan in plans:
            if time.monotonic() > deadline:
                out.append(None)
                continue
            out.append(self.term_counts(target, [plan], 0)[0] > 0)
        return out

    @abc.abstractmethod
    def max_row_id(self, target: str) -> int:
        """The largest id in ``target`` (messages or summaries): a free size estimate."""

    def wait_indexed(self) -> None:  # noqa: B027  (optional: a store that indexes at commit waits for nothing)
        """Return once every stored message is in the full-text index. A store may index a
        large append after its commit; its own :meth:`search` and :meth:`term_counts` wait
        for that themselves (this is for callers that time or inspect the index)."""

    # -- rolled-back messages, fork points, forgetting (forget.py, forks.py) -----
    @abc.abstractmethod
    def retract_messages(self, message_ids: Sequence[int]) -> int:
        """Hide messages the host rolled back (undo, retry) from search; kept, restorable."""

    @abc.abstractmethod
    def restore_messages(self, message_ids: Sequence[int]) -> int:
        """Un-hide retracted messages (the host sent them again)."""

    @abc.abstractmethod
    def retracted(self, message_ids: Sequence[int]) -> set[int]:
        """Which of these messages are retracted."""

    @abc.abstractmethod
    def set_fork_point(self, session_id: str) -> None:
        """Record (once) that ``session_id`` branched off now: its ancestors' rows stored
        later are not its history."""

    @abc.abstractmethod
    def fork_point(self, session_id: str) -> tuple[int, int] | None:
        """(newest message id, newest summary id) the branch may see of its ancestors."""

    def ancestry(self, session_id: str, limit: int = 256) -> list[tuple[str, str | None, tuple[int, int] | None]]:
        """The session and its ancestors, child first: (session, its parent, its fork point).
        Stops at an unknown session, a cycle or `limit`. (Two reads per session here; a store
        with costly round trips answers in one.)"""
        out: list[tuple[str, str | None, tuple[int, int] | None]] = []
        sid: str | None = session_id
        seen: set[str] = set()
        while sid and sid not in seen and len(seen) < limit:
            seen.add(sid)
            row = self.get_session(sid)
            if row is None:
                break
            parent = row.get("parent_id")
            out.append((sid, parent, self.fork_point(sid)))
            sid = parent
        return out

    @abc.abstractmethod
    def session_message_ids(self, session_id: str) -> list[int]: ...

    @abc.abstractmethod
    def session_summary_ids(self, session_id: str) -> list[int]:
        """Every summary of a session, staged ones included."""

    @abc.abstractmethod
    def summaries_over(self, message_ids: Sequence[int], summary_ids: Sequence[int]) -> set[int]:
        """Summaries (any session, any state) with one of these messages or summaries as a child."""

    @abc.abstractmethod
    def forget_records(self, session_ids: Sequence[str], message_ids: Sequence[int], summary_ids: Sequence[int],
                       contexts: dict[str, list[tuple[str, int]]]) -> dict[str, int]:
        """In one transaction: write the repaired active ``contexts`` of other sessions, then
        delete these sessions, messages and summaries with every row that refers to them
        (edges, context items, aliases, staged passes, index rows); children of a deleted
        session hang from its parent afterwards. Returns the counts deleted."""

    @abc.abstractmethod
    def forget_salt(self) -> bytes:
        """The store's random salt for the marks of forgotten messages (pipeline/forgotten.py):
        32 bytes made on first use, kept in the store, never changed."""

    def forget_marks(self, scope: Sequence[str]) -> dict[int, set[str]]:
        """The marks of messages forgotten in these sessions: anchor (the message kept before
        each) -> digests. A store without them forgets nothing at ingest."""
        return {}

    @abc.abstractmethod
    def add_forget_marks(self, marks: Sequence[tuple[str, int, str]], moved: dict[int, int]) -> None:
        """Keep ``(session, anchor, digest)`` marks and move the marks anchored at a message
        that goes to the one kept before it (``moved``: message id -> new anchor)."""

    @abc.abstractmethod
    def set_message_times(self, pairs: Sequence[tuple[int, float]]) -> None:
        """Set when messages were said (``(id, epoch seconds)``): the host's own record of a
        message stored without a time of its own."""

    @abc.abstractmethod
    def rewrite_summaries(self, rows: Sequence[tuple[int, str, int, int]], sessions: Sequence[str]) -> None:
        """In one transaction: summaries rebuilt without forgotten messages get their new text
        (``(id, text, tokens, n_messages)``, the id kept) and lose their earlier texts
        (``summary_history``); the prepared summaries and continuity state of ``sessions``
        go too (their text may quote what was forgotten; both are rebuilt as needed)."""

    def scrub(self) -> dict[str, Any]:
        """After deleting rows for good (``lcm forget``): leave nothing of them on disk that
        the backend can remove — stale full-text index entries, deleted row versions, old
        pages. Costs a rewrite of the indexes, in steps that let other writers in; returns what
        was done."""
        return {}

    # -- retention (ops/retention.py; store/sqlite/lifecycle.py, store/postgres/lifecycle.py) ----
    @abc.abstractmethod
    def session_activity(self) -> list[dict[str, Any]]:
        """Every session with what retention weighs: id, parent_id, conversation_id,
        boundary_reason, created_at, updated_at, last_message_at (the newest message time),
        messages, tokens, summaries and summary_tokens (published)."""

    @abc.abstractmethod
    def messages_since(self, since: float) -> int:
        """How many messages were stored with a time from ``since`` on (growth per day)."""

    @abc.abstractmethod
    def originals_under_summaries(self, session_ids: Sequence[str]) -> list[int]:
        """Messages of these sessions that a published summary of theirs covers and no active
        context holds: what a prune that keeps the summaries may remove."""

    def removal_tokens(self, message_ids: Sequence[int], summary_ids: Sequence[int]) -> dict[str, dict[int, int]]:
        """{"messages": {id: tokens}, "summaries": {id: tokens}} of these rows: what removing
        each costs beyond a fixed per-row part (its text leaves the full-text indexes token
        by token), so a prune can size its transactions by time (ops/batches.py). A row
        missing from the answer counts as its fixed part only."""
        return {"messages": {}, "summaries": {}}

    @abc.abstractmethod
    def remove_rows(self, kind: str, groups: Sequence[Sequence[int]], *, seconds: float,
                    clock: Callable[[], float] = time.perf_counter, pruned_at: float | None = None,
                    reason: str = "retention") -> tuple[int, int, float]:
        """A prune's transaction that can stop partway (ops/batches.py): in ONE transaction,
        remove these ``kind`` rows (``"messages"`` or ``"summaries"``) group after group, each
        as :meth:`forget_records` removes them, and commit as soon as ``seconds`` have passed
        since the transaction began — the clock is read between two groups, the first group
        always goes — so a batch that runs long on a busy machine holds the write lock for
        about ``seconds`` plus one group. With ``pruned_at`` (messages only), each group's
        messages are first recorded under the summaries that keep them (how many of each
        summary's originals go, their id span, when and why: :meth:`pruned_spans`) in the same
        transaction. Returns (groups done, rows removed, seconds from the
        transaction's lock granted to its commit, on ``clock``): the groups not done are the
        caller's to remove in its next transaction; the time waited for the lock before is
        not the rows' cost (ops/batches.py learns from the time held)."""

    @abc.abstractmethod
    def pruned_spans(self, summary_ids: Sequence[int]) -> dict[int, dict[str, Any]]:
        """summary id → {messages, tokens, first_id, last_id, pruned_at, reason} for those whose
        originals a prune removed."""

    @abc.abstractmethod
    def pruned_message(self, message_id: int) -> dict[str, Any] | None:
        """{summary_id, session_id, pruned_at, reason} of a pruned span holding this id, if any."""

    @abc.abstractmethod
    def pruned_totals(self) -> dict[str, Any]:
        """{summaries, messages, last_pruned_at} over every pruned span."""

    @abc.abstractmethod
    def retention_run_start(self, mode: str, trigger: str, plan: dict[str, Any], bytes_before: int | None) -> int:
        """Log the start of a prune (its plan: the sessions it will touch); returns its id."""

    @abc.abstractmethod
    def retention_run_finish(self, run_id: int, sessions: int, messages: int, summaries: int,
                             bytes_after: int | None) -> None: ...

    @abc.abstractmethod
    def retention_runs(self, limit: int = 5) -> list[dict[str, Any]]:
        """The newest prunes first (an unfinished one has no finished_at)."""

    @abc.abstractmethod
    def space(self) -> dict[str, Any]:
        """{file_bytes, used_bytes, free_bytes, auto_vacuum} (PostgreSQL: the tables' size,
        and dead rows per table)."""

    def merges_held(self) -> contextlib.AbstractContextManager[None]:
        """While entered, this process's background index merging starts no step (a prune:
        the pauses between its transactions are for the host's writes); it merges once after."""
        return contextlib.nullcontext()

    def reclaim_space(self, seconds: float = 60.0, pause: float = 0.05) -> int:
        """Give freed space back to the file system in short steps; the bytes given back."""
        return 0

    def vacuum(self) -> None:
        """Rewrite the store to give every free page back (`lcm vacuum`; SQLite only)."""
        raise StoreError(f"{self.kind}: the server reclaims space (VACUUM, VACUUM FULL or pg_repack there)")

    # -- operations (ops/: export, import, viewer, doctor) -----------------------
    # The SQL of these methods is *portable*: `?` is a placeholder (and nothing else), and only
    # what SQLite and PostgreSQL both read alike is used; the backend translates the placeholders.

    @abc.abstractmethod
    def query_rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """The rows of one read-only statement in portable SQL (ops' whole-table listings and
        checks: export, viewer, doctor). Bounded like the store's maintenance work; never writes."""

    @abc.abstractmethod
    def write_rows(self, fn: Callable[[Execute], T], explicit_ids: Sequence[str] = ()) -> T:
        """``fn(execute)`` in one write transaction (`lcm import jsonl` writes rows as they
        are); ``execute(sql, params)`` runs one portable statement and answers its cursor. An
        exception rolls everything back. ``explicit_ids``: the tables fn inserted rows into with
        ids of its own; the backend moves their id counters past them before the commit. A
        read-only store raises StoreError."""

    @abc.abstractmethod
    def messages_containing(self, needles: Sequence[str], roles: Sequence[str]) -> list[tuple[int, str]]:
        """(id, session) of every message of these roles whose text contains each needle
        (exact, case-sensitive), by id."""

    @abc.abstractmethod
    def delete_orphan_staged(self) -> None:
        """Drop staged summaries whose pass is gone (`lcm doctor --repair`)."""

    @abc.abstractmethod
    def reattach_messages(self, by_session: dict[str, list[int]]) -> None:
        """Append stored messages that nothing reaches to their session's active context, in
        id order (`lcm doctor --repair`); each such session's context version moves on."""

    @abc.abstractmethod
    def encryption(self) -> str:
        """What protects the data: "sqlcipher" (an SQLite file encrypted at rest) or "none" (in
        plaintext); for a server, what protects the connection: "local" (this machine), "tls"
        or "unencrypted" (`lcm status`, `lcm doctor`)."""

    @abc.abstractmethod
    def migration_state(self) -> MigrationState:
        """The store's schema migrations: applied, pending (required, optional) and the ones a
        newer lcm recorded (store/migrate.py; `lcm doctor` shows them)."""

    @abc.abstractmethod
    def self_checks(self, repair: bool = False) -> list[StoreCheck]:
        """The lines of `lcm doctor` only this backend can tell (its own integrity checks, its
        full-text index, what its server lacks), in the order shown; with ``repair``, each one
        the backend can fix safely is fixed and marked repaired. Call `wait_indexed` first."""

    # -- maintenance ----------------------------------------------------------
    @abc.abstractmethod
    def stats(self, session_id: str | None = None) -> dict[str, Any]: ...

    @abc.abstractmethod
    def compaction_lock(self, session_id: str, timeout: float) -> contextlib.AbstractContextManager[bool]:
        """Per-session lock across threads and processes; yields False on timeout."""

    @abc.abstractmethod
    def close(self) -> None: ...

    @abc.abstractmethod
    def iter_all_messages(self, batch: int = 1000) -> Iterator[MessageRecord]: ...
