"""The turn hooks of newer Hermes hosts (0.20, the 0.22 line): select_context before each provider
call, on_turn_complete after each turn, prune_tool_results_only; answered by an object LCMEngine
owns (`engine.turn_hooks`). Their compaction-state questions: compaction_state.py.

Never required: 0.19.0 does not call them. When called they must be cheap
(select_context runs before every provider call) and correct: a replacement keeps the
system message verbatim, adds no system message, keeps every tool result paired, strips
persistence-only fields, and is the *same* list object while nothing changed so the
provider's prompt cache keeps hitting.

The object receives the store and config (opened lazily, so as callables), the session a call
acts on, and the few engine operations and figures it uses (`TurnEngine`).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Dict, List, Optional, Protocol

from ..config import LCMConfig
from ..pipeline.assemble import large_representation, render_summary, repair
from ..pipeline.continuity import stored_section
from ..messages import content_ident, is_summary_message, provider_view, role_of
from ..pipeline.unmerge import stored_raw, unmerge
from ..store import Store
from ..store.guard import log_hook_failure
from ..tokens import estimate_messages_tokens

log = logging.getLogger("lossless_context")


class TurnEngine(Protocol):
    """The engine operations and figures the turn hooks use (LCMEngine has them)."""

    threshold_tokens: int
    protect_first_n: int

    def ingest(self, messages: List[Any], session_id: str | None = None,
               lock_wait: float | None = None, flush: bool = False) -> list[Any]: ...

    def maybe_presummarize(self, messages: List[Any], session_id: str | None = None) -> bool: ...

    def summary_block_tokens(self) -> int: ...


class TurnHooks:
    """select_context, on_turn_complete and prune_tool_results_only, for one engine."""

    def __init__(self, engine: TurnEngine, store: Callable[[], Store], config: Callable[[], LCMConfig],
                 sid: Callable[[dict[str, Any] | None], str]) -> None:
        self._engine = engine
        self._store, self._config = store, config
        self._sid = sid  # the session a call acts on (the lifecycle's)
        self._select_cache: dict[str, tuple[tuple, Any]] = {}  # per session: (key, selection)
        self._select_lock = threading.Lock()

    @property
    def store(self) -> Store:
        return self._store()

    def _select_state(self) -> tuple[dict, threading.Lock]:
        return self._select_cache, self._select_lock

    @staticmethod
    def _fingerprint(req: list[Any]) -> tuple:
        n = len(req)
        picks = {0, 1, n // 2, n - 2, n - 1}
        return (n,) + tuple(content_ident(req[i]) for i in sorted(picks) if 0 <= i < n)

    def select_context(self, request_messages: List[Dict[str, Any]], budget_tokens: int,
                       kwargs: dict[str, Any]) -> Optional[List[Dict[str, Any]]]:
        try:
            return self._select(request_messages, budget_tokens, kwargs)
        except Exception as exc:
            log_hook_failure("select_context failed; leaving the request alone", exc)
            return None

    def _select(self, req: Any, budget_tokens: int, kwargs: dict) -> Optional[list]:
        if not isinstance(req, list) or not req:
            return None
        sid = self._sid(kwargs)
        cache, lock = self._select_state()
        fp = self._fingerprint(req)
        version = self._context_version(sid)
        with lock:
            hit = cache.get(sid)
            if hit is not None and hit[0] == (fp, version):
                return hit[1]
        result = self._build_selection(req, sid, budget_tokens)
        with lock:
            prev = cache.get(sid)
            # Same content as last time → hand back the identical object (prompt cache).
            if prev is not None and result is not None and prev[1] is not None and prev[1] == result:
                result = prev[1]
            cache[sid] = ((fp, version), result)
        return result

    def _context_version(self, sid: str) -> int:
        # Tells whether a pass was committed meanwhile: one primary-key read on SQLite, none
        # on PostgreSQL while the listener keeps the version (store/postgres/versions.py).
        return int(self.store.cached_context_version(sid))

    def _build_selection(self, req: list, sid: str, budget_tokens: int) -> Optional[list]:
        budget = budget_tokens if isinstance(budget_tokens, int) and budget_tokens > 0 else self._engine.threshold_tokens
        tokens = estimate_messages_tokens(req)
        system = req[0] if role_of(req[0]) == "system" else None
        body = req[1:] if system is not None else req
        _, ctx = self.store.get_context(sid)
        has_summary = any(e.kind == "s" for e in ctx)
        if budget and tokens <= budget and not self._request_is_stale(body, ctx):
            return None
        if not has_summary and not self._shows_stubs(ctx):
            return None  # (a stubs-only pass commits no summary: its stubs are worth swapping in too)
        rendered = self._render_context(sid, body)
        if rendered is None:
            return None
        out = ([system] if system is not None else []) + rendered
        out = repair(out)
        if estimate_messages_tokens(out) >= tokens:
            return None
        if any(role_of(m) == "system" for m in out[1 if system is not None else 0:]):
            return None
        if any(m.get("role") == "tool" and not m.get("tool_call_id") for m in out):
            return None
        return out

    def _shows_stubs(self, ctx: list) -> bool:
        """Does the committed context show a message by a representation (a tier-0 stub)?"""
        recs = self.store.get_messages([e.ref for e in ctx if e.kind == "m"])
        return any(r.large and r.exploration for r in recs.values())

    def _request_is_stale(self, body: list, ctx: list) -> bool:
        """The request still carries messages our committed context already summarised."""
        from ..messages import summary_node_ids

        in_req: set[int] = set()
        for m in body:
            in_req.update(summary_node_ids(m))
        top = {e.ref for e in ctx if e.kind == "s"}
        return bool(top) and not top <= in_req

    def _render_context(self, sid: str, body: list) -> Optional[list]:
        """Published context rendered from the store, plus request messages it lacks."""
        _, ctx = self.store.get_context(sid)
        body = unmerge(body, ctx, stored_raw(self.store))  # (our block merged by the host)
        idents_in_ctx = {e.ident for e in ctx if e.kind == "m"}
        msgs = self.store.get_messages([e.ref for e in ctx if e.kind == "m"])
        sums = self.store.get_summaries([e.ref for e in ctx if e.kind == "s"])
        out: list[dict] = []
        block: list = []
        prev_role = None
        # The continuity section, as compress() renders it (continuity.py), minus what is shown verbatim.
        visible = {e.ref for e in ctx if e.kind == "m"}
        extra = stored_section(self.store, sid, visible, int(getattr(self._config(), "continuity_tokens", 0) or 0))

        def flush_block(next_role: str | None) -> None:
            nonlocal block
            if block:
                from ..pipeline.assemble import choose_summary_role

                role = choose_summary_role(prev_role, next_role) or "user"
                # Within the block budget, as compress() renders it (summary_view.py).
                limit = self._engine.summary_block_tokens()
                out.append(render_summary(block, sum(n.n_messages for n in block), role, max_tokens=limit,
                                          extra=extra))
                block = []

        for e in ctx:
            if e.kind == "s":
                if e.ref in sums:
                    block.append(sums[e.ref])
                continue
            rec = msgs.get(e.ref)
            if rec is None or not isinstance(rec.raw, dict) or rec.role in ("invalid", "unknown"):
                continue
            flush_block(rec.role)
            m = provider_view(rec.raw)
            if rec.large and rec.exploration:
                m = large_representation(rec.raw, rec.id, rec.tokens, rec.exploration)
            out.append(m)
            prev_role = rec.role
        flush_block(None)
        # Messages of the request the store has not seen in its context yet (this turn).
        last_known = -1
        for i, m in enumerate(body):
            if isinstance(m, dict) and content_ident(m) in idents_in_ctx:
                last_known = i
        out.extend(provider_view(m) for m in body[last_known + 1:] if isinstance(m, dict)
                   and not is_summary_message(m))
        return out

    def on_turn_complete(self, messages: List[Dict[str, Any]], kwargs: dict[str, Any]) -> None:
        try:
            if isinstance(messages, list) and messages:
                sid = self._sid(kwargs)
                self._engine.ingest(messages, session_id=sid)
                self._engine.maybe_presummarize(messages, session_id=sid)
        except Exception as exc:
            log_hook_failure("on_turn_complete ingestion failed (the host keeps its copy)", exc)

    def prune_tool_results_only(self, messages: List[Dict[str, Any]]) -> Any:
        # Tier 0 only (stubs.py): old tool results become stubs, the originals stay in the store.
        try:
            from ..pipeline.compaction import Compactor
            from ..pipeline.stubs import prune, stub_policy

            if not isinstance(messages, list) or not messages:
                return messages, 0
            sid = self._sid(None)
            slots = self._engine.ingest(messages, session_id=sid)
            head = Compactor.head_end(slots, max(0, int(self._engine.protect_first_n)))
            return prune(self.store, slots, messages, stub_policy(self._config()), head)
        except Exception as exc:
            log_hook_failure("prune_tool_results_only failed; leaving the list alone", exc)
            return messages, 0
