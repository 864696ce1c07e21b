"""The host's lists ingested as the engine runs it: an object LCMEngine owns (`engine.ingestion`).

Called with the session's lock held (the engine's `ingest()` and a pass take it). Aligns the
host's list with the stored context on the fast paths (`ingest_fast`, resuming where the last
call ended: `pipeline/ingest_resume.py`), folds a replay of originals back into their summaries
(`pipeline/ingest_replay.py`), splits our block back out of a neighbour the host merged it into
(`pipeline/unmerge.py`), adopts or drops staged passes by what the host's list carries, retracts
what the host rolled back (`edits/forget.py`), and hands new messages to the tool-stub and
semantic threads.

It keeps the per-session alignment state (the last alignment of a few sessions, the list the last
pass aligned, the parts of merged blocks) and receives the store and config (opened lazily, so as
callables), the session facts it needs (`IngestSessions`, the engine's session lifecycle), the
semantic arm, the engine's owner token and a callback counting a published pass. (It sits in the
contract layer, above the pipeline and the edits it runs: it is what the host's lists meet.)
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Callable, List, Protocol

from ..config import LCMConfig
from ..edits import forget
from ..messages import role_of, summary_node_ids
from ..pipeline.assemble import Slot
from ..pipeline.ingest import slots_to_entries, times_from_host
from ..pipeline.ingest_fast import align_fast
from ..pipeline.ingest_replay import fold_replayed
from ..pipeline.ingest_resume import PassEcho
from ..pipeline.stub_prep import prepare_new
from ..pipeline.stubs import stub_policy
from ..pipeline.unmerge import stored_raw, unmerge
from ..sessions.forks import as_host_instruction
from ..store import Store, owners

ALIGNED_SESSIONS = 4  # sessions whose last alignment an engine keeps


class IngestSessions(Protocol):
    """What ingestion needs to know of the engine's sessions (lifecycle.SessionLifecycle has it)."""

    fork: bool
    session_db: Any

    def ensure(self, session_id: str, **kw: Any) -> None: ...

    def host_history(self, session_id: str) -> list[Any]: ...


class SessionIngest:
    """The engine's ingestion of host lists, with the state that makes a re-sent list cheap."""

    def __init__(self, store: Callable[[], Store], config: Callable[[], LCMConfig], sessions: IngestSessions,
                 semantic_arm: Callable[[], Any], owner: Any, on_publish: Callable[[], None]) -> None:
        self._store, self._config = store, config
        self._sessions = sessions
        self._semantic_arm = semantic_arm  # the semantic search arm when on (else None)
        self._owner = owner
        self._on_publish = on_publish
        # Per session: (context version, context entries, Resume) left by the last ingest,
        # so re-sending a longer list costs the new part only (see ingest_resume.Resume).
        self.aligned: "OrderedDict[str, tuple[int, list[Any], Any]]" = OrderedDict()
        self._aligned_lock = threading.Lock()
        self._echo = PassEcho()  # the list each session's last pass aligned (its flush is a no-op)
        self._unmerged: dict[int, Any] = {}  # the parts of host merges of our block (unmerge.py)

    @property
    def store(self) -> Store:
        return self._store()

    def align_locked(self, sid: str, messages: List[Any], for_pass: bool = False,
                     flush: bool = False, token_memo: dict[int, tuple[Any, int]] | None = None,
                     ) -> tuple[list[Slot], int, int, int | None]:
        """Align the host's list (ingest.py) and keep the active context; the slots, the
        context's version and length, and (for a pass) the first slot it must not summarise
        (ingest_replay.fold_replayed). The caller holds the session's lock. `token_memo` gets
        the estimate of each message stored now (ingest_fast.align_fast)."""
        sessions = self._sessions
        sessions.ensure(sid)
        body = messages[1:] if messages and role_of(messages[0]) == "system" else messages
        body = as_host_instruction(body) if sessions.fork else body  # (review prompt: not user speech; forks.py)
        self._adopt_or_drop_stage(sid, body, for_pass)
        if flush and self._echo.repeats(sid, body, lambda: self.store.context_version(sid)):
            return [], -1, 0, None  # the list the last pass aligned, against the same context
        raw_body = body
        with self._aligned_lock:
            cached = self.aligned.pop(sid, None)
        resume = None
        if cached is not None and not for_pass and self.store.context_version(sid) == cached[0]:
            version, ctx, resume = cached  # the context is still what our last ingest left
        else:
            # A pass (it may rewrite slots) or anything else wrote the context: read it afresh.
            version, ctx = self.store.get_context(sid)
        body = unmerge(body, ctx, stored_raw(self.store), self._unmerged)  # (our block merged by the host)
        scope = self.store.lineage(sid)
        cfg = self._config()
        res = align_fast(self.store, sid, scope, body, ctx, large_tokens=cfg.large_message_tokens,
                         exploration_tokens=cfg.exploration_tokens, resume=resume, token_memo=token_memo)
        slots, entries = res.slots, res.entries
        # A list replaying the originals of summaries in our context (a host that lost our
        # compacted list) keeps those summaries: nothing is summarised twice (ingest_replay.py).
        folded, hold = fold_replayed(self.store, sid, ctx, slots, leaves=for_pass)
        if folded is not None:
            slots, entries, res.resume = folded, slots_to_entries(folded), None  # (next call: walk afresh)
        same = [(e.kind, e.ref) for e in entries] == [(e.kind, e.ref) for e in ctx]
        if res.context_written and folded is None:
            version = self.store.context_version(sid)
        elif res.context_written or not same:  # (not when only the slot count differs: a summary slot holds several refs)
            version = self.store.set_context(sid, entries)
        # The host's full list (a pass's too): what it rolled back (undo, retry) leaves search
        # (forget.py); a manual /compress of a prefix hides the tail the host re-appends only
        # until its next list holds it again.
        forget.retract_rolled_back(self.store, ctx, entries, res.new_ids)
        if res.new_ids and sessions.session_db is not None and not sessions.fork:
            # 0.19.0's lists carry no times: the host's record has when each was said
            times_from_host(self.store, slots, res.new_ids, lambda: sessions.host_history(sid))
        if res.new_ids:
            arm = self._semantic_arm()
            if arm is not None:
                arm.notify()  # new messages to embed (in the arm's thread, off this path)
            if cfg.tool_stubs:
                prepare_new(self.store, stub_policy(cfg), slots, res.new_ids)
        if for_pass:  # (a pass that folded a replay: its list is aligned afresh next time)
            self._echo.remember(sid, raw_body, version) if folded is None else self._echo.forget(sid)
        elif res.resume is not None:
            res.resume.version = version
            with self._aligned_lock:
                self.aligned[sid] = (version, entries, res.resume)
                while len(self.aligned) > ALIGNED_SESSIONS:
                    self.aligned.popitem(last=False)
        return slots, version, len(entries), hold

    def _adopt_or_drop_stage(self, sid: str, body: List[Any], for_pass: bool) -> None:
        """Without a commit signal, the host's list itself tells whether it adopted a stage."""
        stages = self.store.staged_passes(sid)
        if not stages:
            return
        seen: set[int] = set()
        for m in body:
            seen.update(summary_node_ids(m))
        for staged in stages:
            if staged.top_nodes and set(staged.top_nodes) <= seen:
                self.store.publish_pass(staged.pass_id)
                self._on_publish()
                return
        if for_pass:
            # A new pass starts from the host's list: a stage it does not carry was not adopted
            # — unless another live engine (a second host on this session) still may commit it.
            for staged in stages:
                if not owners.held_by_other(staged.pass_id, staged.created_at, self._owner):
                    self.store.discard_pass(staged.pass_id)
