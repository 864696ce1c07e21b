"""The engine's session lifecycle (a mixin of LCMEngine).

Which session a call acts on; the live session (the one the user is in) and the host's
background forks (forks.py); `bind_session_state`, `on_session_start`/`_end`/`_reset`; the
host's own session record (read only) for turns we were never handed; and the commit signal
that publishes a staged pass. Lock order: `session_lock` (per store location and session) is
taken before any store lock (docs/concurrency.md).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref
from typing import Any, Dict, Iterator, List

from ..sessions import forks
from ..store import owners
from ..store.guard import log_hook_failure

log = logging.getLogger("lossless_context")

DEFAULT_SESSION = "default"
_SESSION_LOCKS: dict[tuple[str, str], threading.RLock] = {}
_SESSION_LOCKS_GUARD = threading.Lock()


def session_lock(location: str, session_id: str) -> threading.RLock:
    with _SESSION_LOCKS_GUARD:
        lk = _SESSION_LOCKS.get((location, session_id))
        if lk is None:
            lk = _SESSION_LOCKS[(location, session_id)] = threading.RLock()
        return lk


class SessionBusy(Exception):
    """Another thread holds the session (a pass is running) longer than the caller may wait.
    Nothing is lost: the host hands the whole list again on its next call."""


@contextlib.contextmanager
def held(location: str, session_id: str, wait: float) -> Iterator[None]:
    """The session's lock, waited for at most `wait` seconds (else SessionBusy): no host hook
    and no command waits unbounded behind a pass."""
    lock = session_lock(location, session_id)
    if not lock.acquire(timeout=max(0.0, wait)):
        raise SessionBusy(f"session {session_id} is busy (a compaction pass has held it for over {wait:g} s)")
    try:
        yield
    finally:
        lock.release()


class SessionLifecycle:
    """Session binding, routing and the commit signal; state lives on the engine."""

    # The engine's state this mixin writes (LCMEngine._init_runtime_state sets them).
    _session_id: str | None
    _conversation_id: str | None
    _no_progress_at: int | None

    def _sid(self, kwargs: dict[str, Any] | None = None) -> str:
        if kwargs:
            sid = kwargs.get("session_id")
            if isinstance(sid, str) and sid:
                return sid
        return self._session_id or self._family.get("last_session") or DEFAULT_SESSION

    def _set_session(self, session_id: str) -> None:
        self._session_id = session_id
        if not self._fork:
            self._family["last_session"] = session_id

    # -- the live session (the one the user is in; forks.py) ------------------------------

    def _mark_live(self, session_id: str | None = None) -> None:
        if not self._fork:
            self._family["live"] = (weakref.ref(self), session_id or self._session_id)

    def current_session(self) -> str:
        """The session this engine acts on now (the tools' and /lcm's scope)."""
        return self._sid()

    def live_engine(self) -> Any:
        """The copy of this engine the user's agent drives (this one when none did yet)."""
        live = self._family.get("live")
        eng = live[0]() if live else None
        return eng if eng is not None else self

    def _route(self, sid: str, messages: List[Any]) -> str:
        """The session a list is stored under: a background fork's own, linked session."""
        if not self._fork and forks.is_review_list(messages):
            self._become_fork()
        if self._fork:
            own = self._session_id
            live = self._family.get("live")
            if own and (not live or live[1] != own):
                return own
            return sid
        self._mark_live(sid)
        return sid

    def _become_fork(self) -> None:
        self._fork = True
        live = self._family.get("live")
        parent = live[1] if live else self._family.get("last_session")
        own = self._session_id
        if own and own != parent:
            try:
                self._ensure(own, parent_id=parent, boundary_reason=forks.BACKGROUND)
                forks.seed_fork(self.store, own, parent)
            except Exception as exc:
                log.debug("lcm: cannot link the background fork %s: %s", own, exc)

    def _ensure(self, session_id: str, **kw: Any) -> None:
        if session_id in self._known_sessions and not kw:
            return
        self.store.ensure_session(session_id, **kw)
        self._known_sessions.add(session_id)

    def bind_session_state(self, session_db: Any = None, session_id: str | None = None, *args: Any,
                           **kwargs: Any) -> None:
        self._session_db = session_db
        if session_db is not None:
            self._family["bound_with_db"] = True
        elif self._family.get("bound_with_db") and self._family.get("live"):
            self._fork = True  # R19's review fork: built with persistence off (forks.py)
        live = self._family.get("live")
        if session_db is None and session_id == "" and self._session_id and live and live[0]() is not self:
            # 0.22 detaches a review fork's engine this way (its agent then shares the parent's
            # session id): it keeps the session it was started with, as a background fork.
            if not self._fork:
                self._become_fork()
            return
        if isinstance(session_id, str) and session_id:
            self._set_session(session_id)
            if session_db is not None:
                self._mark_live(session_id)
            # /branch and /resume rebind without on_session_start: the host's own session row
            # names the parent, which keeps the branch's lineage (and its search scope) intact.
            parent = self._host_parent(session_id)
            if parent:
                try:
                    self._ensure(session_id, parent_id=parent)
                    # a new /branch: bounded at the fork, starting from the parent's context
                    forks.seed_branch(self.store, session_id, parent, host_copy=lambda: self._host_history(session_id),
                                      store_parent=lambda msgs: self.ingest(msgs, session_id=parent))
                except Exception as exc:
                    log.debug("lcm: cannot record the parent of %s: %s", session_id, exc)

    def _host_parent(self, session_id: str) -> str | None:
        getter = getattr(self._session_db, "get_session", None)
        if not callable(getter):
            return None
        try:
            row = getter(session_id)
        except Exception:
            return None
        parent = row.get("parent_session_id") if isinstance(row, dict) else None
        return parent if isinstance(parent, str) and parent and parent != session_id else None

    def on_session_start(self, session_id: str, **kwargs: Any) -> None:
        try:
            self._on_session_start(session_id, **kwargs)
        except Exception as exc:
            log_hook_failure("on_session_start failed (continuing)", exc)

    def _on_session_start(self, session_id: str, **kwargs: Any) -> None:
        if not isinstance(session_id, str) or not session_id:
            return
        conv = kwargs.get("conversation_id")
        if isinstance(conv, str) and conv:
            self._conversation_id = conv
        old = kwargs.get("old_session_id")
        reason = kwargs.get("boundary_reason")
        parent = old if isinstance(old, str) and old and old != session_id else None
        platform = kwargs.get("platform") if isinstance(kwargs.get("platform"), str) else None
        model = kwargs.get("model") if isinstance(kwargs.get("model"), str) else None
        self._set_session(session_id)
        if self._fork:
            live = self._family.get("live")
            parent = parent or (live[1] if live and live[1] != session_id else None)
            reason = forks.BACKGROUND
        elif not self._family.get("live") or reason == "compression":
            self._mark_live(session_id)
        self._ensure(session_id, parent_id=parent, conversation_id=self._conversation_id,
                     platform=platform, model=model, boundary_reason=reason if parent else None)
        if self._fork and parent:
            # The conversation it copies is the parent's. (A fork never commits: `reason` is
            # "background" here, so nothing it stages is ever published into the parent.)
            forks.seed_fork(self.store, session_id, parent)
        if reason == "compression":
            self._commit(old if isinstance(old, str) and old else session_id, session_id)
        else:
            self._reconcile(session_id)
        self.upgrade_leftovers(session_id)  # outlines a process that ended left (background.py)

    def _reconcile(self, session_id: str) -> None:
        """Turns after the last compaction of a process that died were never handed to us;
        the host's own session database (read-only) still has them: ingest what is new."""
        if session_id in self._reconciled:
            return
        self._reconciled.add(session_id)
        msgs = self._host_history(session_id)
        if msgs:
            self.ingest(msgs, session_id=session_id)

    def sync_from_host(self, lock_wait: float | None = None) -> int:
        """Store what the host holds of the current session and the engine has not seen yet.

        Below the compression threshold a 0.19.0 host hands the engine no message list, so a
        slash command would otherwise look at a store without the latest turns. Reads the
        host's own session record; returns how many messages it holds (0 without one).
        `lock_wait`: at most this long behind a running pass (else SessionBusy)."""
        sid = self._session_id
        msgs = self._host_history(sid) if sid and not self._fork else []
        if msgs:
            self.ingest(msgs, session_id=sid, lock_wait=lock_wait)
        return len(msgs)

    def _host_history(self, session_id: str) -> list[Any]:
        """The host's own record of a session (its session database, read only); [] if none."""
        loader = getattr(self._session_db, "get_messages_as_conversation", None)
        if not callable(loader):
            return []
        try:
            msgs = loader(session_id)
        except Exception as exc:
            log.debug("lcm: cannot read the host's session %s: %s", session_id, exc)
            return []
        return msgs if isinstance(msgs, list) else []

    def _commit(self, source_session: str, target_session: str) -> None:
        """The host adopted our last pass: publish it (the only commit signal)."""
        with held(self.store.location, source_session, self.config.lock_timeout):
            stages = self.store.staged_passes(source_session)
            own = self._pending.get(source_session)
            # Our own pass; else the newest stage no other live engine is waiting to commit
            # (another host may write this same session: see owners.py).
            staged = next((s for s in stages if s.pass_id == own), None) or next(
                (s for s in stages if not owners.held_by_other(s.pass_id, s.created_at, self._owner)), None)
            if staged is None:
                return
            self.store.publish_pass(staged.pass_id, into_session=target_session)
            self._pending.pop(source_session, None)
            with self._stats_lock:
                self._stats["compactions"] += 1

    def _settle_fork_pass(self, session_id: str) -> None:
        """A background fork's pass is published into the fork's own session as soon as it is
        made. 0.22 compacts a review fork's transcript in memory, uses the result at once and
        never sends a commit signal; the fork may end right after the pass (its last call, or
        cancelled by the user's next turn) and the host calls nothing when it does. A stage
        waiting for that commit would wait forever (`lcm doctor`: stale work). The fork's
        session is its own (`boundary_reason = background`): nothing reaches the parent, whose
        passes still wait for the host's commit."""
        if not self._fork:
            return
        live = self._family.get("live")
        if live is not None and live[1] == session_id:
            return  # (never the user's live session, whatever routed the list here)
        try:
            if not forks.is_background(self.store.get_session(session_id)):
                return
            self._commit(session_id, session_id)
        except Exception as exc:
            # (left staged: the next pass of the fork, or `lcm doctor --repair`, drops it)
            log_hook_failure(f"cannot publish the background fork's pass in {session_id}", exc)

    def on_session_end(self, session_id: str, messages: List[Dict[str, Any]], *args: Any, **kwargs: Any) -> None:
        # Also fired before every committed compaction: flush only, never close shared things.
        try:
            if isinstance(messages, list) and messages:
                self.ingest(messages, session_id=session_id or self._sid(), flush=True)
        except Exception as exc:
            log_hook_failure("on_session_end flush failed (nothing lost from the host)", exc)

    def on_session_reset(self, *args: Any, **kwargs: Any) -> None:
        super().on_session_reset()  # type: ignore[misc]  # the host's ContextEngine, after this mixin in LCMEngine's MRO
        self._conversation_id = None  # the next session names its own conversation (or none)
        self._no_progress_at = None
        self._overhead = 0
        self.last_real_prompt_tokens = 0
        self._pending.clear()
