"""The engine's session lifecycle: an object LCMEngine owns (`engine.sessions`).

Which session a call acts on; the live session (the one the user is in) and the host's
background forks (forks.py); `bind_session_state`, `on_session_start`/`_end`/`_reset`; the
host's own session record (read only) for turns we were never handed; and the commit signal
that publishes a staged pass. Lock order: `session_lock` (per store location and session) is
taken before any store lock (docs/concurrency.md).

It holds the session state (the session bound, the fork flag, the host's session database, the
passes waiting for a commit) and receives what it needs of the engine through its constructor:
the store and the config (both opened lazily, so as callables), the family the copies of one
engine share, and the two engine operations it calls (`SessionEngine`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any, Callable, Dict, Iterator, List, Protocol

from ..config import LCMConfig

from ..sessions import forks
from ..store import owners
from ..store import Store
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


class SessionEngine(Protocol):
    """The engine operations the lifecycle calls (LCMEngine implements them)."""

    def ingest(self, messages: List[Any], session_id: str | None = None,
               lock_wait: float | None = None, flush: bool = False) -> list[Any]: ...

    def upgrade_leftovers(self, sid: str) -> None: ...


class SessionLifecycle:
    """Session binding, routing and the commit signal, for one engine (one copy per agent)."""

    def __init__(self, engine: SessionEngine, me: Callable[[], Any], store: Callable[[], Store],
                 config: Callable[[], LCMConfig], family: dict[str, Any], owner: Any,
                 on_publish: Callable[[], None]) -> None:
        self._engine = engine  # (the engine's operations; it owns this object)
        self._me = me  # the engine itself, weakly (a weakref): the family's "live" entry names it
        self._store, self._config = store, config
        self._family = family
        self._owner = owner  # names the engine in the passes it stages (store/owners.py)
        self._on_publish = on_publish  # counts a published pass in the engine's figures
        self.session_id: str | None = None
        self.conversation_id: str | None = None
        self.fork = False  # a host background fork (forks.py): never the live session
        self.session_db: Any = None  # the host's own session database (read only)
        self._known_sessions: set[str] = set()
        self._reconciled: set[str] = set()
        self._pending: dict[str, str] = {}  # per session, the pass this engine staged last

    @property
    def store(self) -> Store:
        return self._store()

    @property
    def config(self) -> LCMConfig:
        return self._config()

    def sid(self, kwargs: dict[str, Any] | None = None) -> str:
        """The session a call acts on: the one it names, else the bound one, else the family's last."""
        if kwargs:
            sid = kwargs.get("session_id")
            if isinstance(sid, str) and sid:
                return sid
        return self.session_id or self._family.get("last_session") or DEFAULT_SESSION

    def _set_session(self, session_id: str) -> None:
        self.session_id = session_id
        if not self.fork:
            self._family["last_session"] = session_id

    # -- the live session (the one the user is in; forks.py) ------------------------------

    def mark_live(self, session_id: str | None = None) -> None:
        """This engine's copy is the one the user's agent drives (never a fork)."""
        if not self.fork:
            self._family["live"] = (self._me, session_id or self.session_id)

    def live_engine(self) -> Any:
        """The copy of the engine the user's agent drives (None when none did yet)."""
        live = self._family.get("live")
        return live[0]() if live else None

    def route(self, sid: str, messages: List[Any]) -> str:
        """The session a list is stored under: a background fork's own, linked session."""
        if not self.fork and forks.is_review_list(messages):
            self._become_fork()
        if self.fork:
            own = self.session_id
            live = self._family.get("live")
            if own and (not live or live[1] != own):
                return own
            return sid
        self.mark_live(sid)
        return sid

    def _become_fork(self) -> None:
        self.fork = True
        live = self._family.get("live")
        parent = live[1] if live else self._family.get("last_session")
        own = self.session_id
        if own and own != parent:
            try:
                self.ensure(own, parent_id=parent, boundary_reason=forks.BACKGROUND)
                forks.seed_fork(self.store, own, parent)
            except Exception as exc:
                log.debug("lcm: cannot link the background fork %s: %s", own, exc)

    def ensure(self, session_id: str, **kw: Any) -> None:
        """The session exists in the store (once per engine copy unless `kw` says more)."""
        if session_id in self._known_sessions and not kw:
            return
        self.store.ensure_session(session_id, **kw)
        self._known_sessions.add(session_id)

    def bind(self, session_db: Any = None, session_id: str | None = None) -> None:
        """bind_session_state: the host's session database and the session the engine acts on."""
        self.session_db = session_db
        if session_db is not None:
            self._family["bound_with_db"] = True
        elif self._family.get("bound_with_db") and self._family.get("live"):
            self.fork = True  # R19's review fork: built with persistence off (forks.py)
        live = self._family.get("live")
        if session_db is None and session_id == "" and self.session_id and live and live[0]() is not self._me():
            # 0.22 detaches a review fork's engine this way (its agent then shares the parent's
            # session id): it keeps the session it was started with, as a background fork.
            if not self.fork:
                self._become_fork()
            return
        if isinstance(session_id, str) and session_id:
            self._set_session(session_id)
            if session_db is not None:
                self.mark_live(session_id)
            # /branch and /resume rebind without on_session_start: the host's own session row
            # names the parent, which keeps the branch's lineage (and its search scope) intact.
            parent = self._host_parent(session_id)
            if parent:
                try:
                    self.ensure(session_id, parent_id=parent)
                    # a new /branch: bounded at the fork, starting from the parent's context
                    forks.seed_branch(self.store, session_id, parent, host_copy=lambda: self.host_history(session_id),
                                      store_parent=lambda msgs: self._engine.ingest(msgs, session_id=parent))
                except Exception as exc:
                    log.debug("lcm: cannot record the parent of %s: %s", session_id, exc)

    def _host_parent(self, session_id: str) -> str | None:
        getter = getattr(self.session_db, "get_session", None)
        if not callable(getter):
            return None
        try:
            row = getter(session_id)
        except Exception:
            return None
        parent = row.get("parent_session_id") if isinstance(row, dict) else None
        return parent if isinstance(parent, str) and parent and parent != session_id else None

    def start(self, session_id: str, **kwargs: Any) -> None:
        """on_session_start (never raises)."""
        try:
            self._on_session_start(session_id, **kwargs)
        except Exception as exc:
            log_hook_failure("on_session_start failed (continuing)", exc)

    def _on_session_start(self, session_id: str, **kwargs: Any) -> None:
        if not isinstance(session_id, str) or not session_id:
            return
        conv = kwargs.get("conversation_id")
        if isinstance(conv, str) and conv:
            self.conversation_id = conv
        old = kwargs.get("old_session_id")
        reason = kwargs.get("boundary_reason")
        parent = old if isinstance(old, str) and old and old != session_id else None
        platform = kwargs.get("platform") if isinstance(kwargs.get("platform"), str) else None
        model = kwargs.get("model") if isinstance(kwargs.get("model"), str) else None
        self._set_session(session_id)
        if self.fork:
            live = self._family.get("live")
            parent = parent or (live[1] if live and live[1] != session_id else None)
            reason = forks.BACKGROUND
        elif not self._family.get("live") or reason == "compression":
            self.mark_live(session_id)
        self.ensure(session_id, parent_id=parent, conversation_id=self.conversation_id,
                    platform=platform, model=model, boundary_reason=reason if parent else None)
        if self.fork and parent:
            # The conversation it copies is the parent's. (A fork never commits: `reason` is
            # "background" here, so nothing it stages is ever published into the parent.)
            forks.seed_fork(self.store, session_id, parent)
        if reason == "compression":
            self._commit(old if isinstance(old, str) and old else session_id, session_id)
        else:
            self._reconcile(session_id)
        self._engine.upgrade_leftovers(session_id)  # outlines a process that ended left (background.py)

    def _reconcile(self, session_id: str) -> None:
        """Turns after the last compaction of a process that died were never handed to us;
        the host's own session database (read-only) still has them: ingest what is new."""
        if session_id in self._reconciled:
            return
        self._reconciled.add(session_id)
        msgs = self.host_history(session_id)
        if msgs:
            self._engine.ingest(msgs, session_id=session_id)

    def sync_from_host(self, lock_wait: float | None = None) -> int:
        """Store what the host holds of the current session and the engine has not seen yet.

        Below the compression threshold a 0.19.0 host hands the engine no message list, so a
        slash command would otherwise look at a store without the latest turns. Reads the
        host's own session record; returns how many messages it holds (0 without one).
        `lock_wait`: at most this long behind a running pass (else SessionBusy)."""
        sid = self.session_id
        msgs = self.host_history(sid) if sid and not self.fork else []
        if msgs:
            self._engine.ingest(msgs, session_id=sid, lock_wait=lock_wait)
        return len(msgs)

    def host_history(self, session_id: str) -> list[Any]:
        """The host's own record of a session (its session database, read only); [] if none."""
        loader = getattr(self.session_db, "get_messages_as_conversation", None)
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
            self._on_publish()

    def staged(self, session_id: str, pass_id: str | None) -> None:
        """This engine staged `pass_id` for `session_id`: the host's commit signal publishes it."""
        self._pending[session_id] = pass_id or ""

    def settle_fork_pass(self, session_id: str) -> None:
        """A background fork's pass is published into the fork's own session as soon as it is
        made. 0.22 compacts a review fork's transcript in memory, uses the result at once and
        never sends a commit signal; the fork may end right after the pass (its last call, or
        cancelled by the user's next turn) and the host calls nothing when it does. A stage
        waiting for that commit would wait forever (`lcm doctor`: stale work). The fork's
        session is its own (`boundary_reason = background`): nothing reaches the parent, whose
        passes still wait for the host's commit."""
        if not self.fork:
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

    def end(self, session_id: str, messages: List[Dict[str, Any]]) -> None:
        """on_session_end (never raises). Also fired before every committed compaction: flush
        only, never close shared things."""
        try:
            if isinstance(messages, list) and messages:
                self._engine.ingest(messages, session_id=session_id or self.sid(), flush=True)
        except Exception as exc:
            log_hook_failure("on_session_end flush failed (nothing lost from the host)", exc)

    def reset(self) -> None:
        """on_session_reset: the next session names its own conversation (or none)."""
        self.conversation_id = None
        self._pending.clear()
