"""What an `lcm mcp` server may see, fixed when it starts (fail-closed).

* ``session``: one session's lineage, exactly as the engine's tools see it from that session
  (its ancestors, a branch's parent only up to the fork point, the sessions of its
  conversation);
* ``conversation``: a conversation key (stable across a gateway's rotations): its sessions
  and their ancestors, as the conversation's newest session sees them;
* ``all``: every session in the store (only when asked for explicitly);
* ``latest``: none of these given: the lineage of the user's most recent real session
  (never a host background fork), chosen once when the server starts. A server that could not
  read the store then chooses at its first call that reaches the store, and keeps it.

Tool calls cannot widen the scope: `session_scope: "all"` is refused unless the server
serves every session, and an id from outside the scope answers as an unknown id
(`tools.dispatch_scoped`).
"""

from __future__ import annotations

import threading
from typing import Any

from ..sessions.forks import latest_real_session
from ..tools import Scope, ToolError, session_scope

KINDS = ("session", "conversation", "all", "latest")


class ScopeError(ValueError):
    """The scope asked for does not exist in the store (a misspelt id)."""


class ServerScope:
    """The scope of one server process; `for_call` gives each tool call its `tools.Scope`."""

    def __init__(self, kind: str, ident: str | None = None) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown scope kind {kind!r}")
        if (ident is None) != (kind in ("all", "latest")):
            raise ValueError(f"scope {kind!r} {'needs' if ident is None else 'takes no'} id")
        self.kind = kind
        self.ident = ident
        self._anchor: str | None = ident if kind == "session" else None  # the session whose view is served
        self._lock = threading.Lock()

    @property
    def resolved(self) -> bool:
        return self.kind == "all" or self._anchor is not None

    @property
    def anchor(self) -> str | None:
        """The session whose lineage is served (None: every session, or not chosen yet)."""
        return self._anchor

    def resolve(self, store: Any) -> None:
        """Check the scope against the store and choose the session it stands for (once).
        Raises ScopeError for a session or conversation the store does not have, ToolError
        for a store with no session yet; store errors propagate."""
        with self._lock:
            if self.kind == "all" or (self._anchor is not None and self.kind != "session"):
                return
            if self.kind == "session":
                if store.get_session(self.ident) is None:
                    raise ScopeError(f"unknown session {self.ident!r} (see `lcm sessions`)")
                return
            sessions = store.list_sessions()
            if self.kind == "conversation":
                members = [s for s in sessions if s.get("conversation_id") == self.ident]
                if not members:
                    raise ScopeError(f"no session belongs to conversation {self.ident!r} "
                                     "(see the conversation column of `lcm sessions`)")
                self._anchor = latest_real_session(members)
                return
            anchor = latest_real_session(sessions)
            if anchor is None:
                raise ToolError("the store has no sessions yet: nothing to search")
            self._anchor = anchor

    def for_call(self, store: Any, args: dict) -> Scope:
        """The scope of one tool call (chooses the latest session first when that is still
        open); refuses a call that asks for more."""
        if args.get("session_scope") == "all" and self.kind != "all":
            raise ToolError(f"session_scope=all is outside this server's scope ({self.describe()}); "
                            "it serves every session only when started with --all-sessions")
        if self.kind == "all":
            return Scope(None, {})
        if self._anchor is None:
            self.resolve(store)
        assert self._anchor is not None
        return session_scope(store, self._anchor)

    def describe(self) -> str:
        """The scope in words (the server's instructions and its errors say it)."""
        if self.kind == "all":
            return "every session in the store (--all-sessions)"
        if self.kind == "session":
            return (f"the lineage of session {self.ident} (--session): that session, its ancestors "
                    "and the sessions of its conversation")
        if self.kind == "conversation":
            seen = f", as its newest session {self._anchor} sees them" if self._anchor else ""
            return f"conversation {self.ident} (--conversation): its sessions and their ancestors{seen}"
        if self._anchor is None:
            return ("the lineage of the most recent Hermes session, chosen at the first call that "
                    "can read the store (the store could not be read when the server started)")
        return (f"the lineage of session {self._anchor}, the most recent Hermes session when the "
                "server started: that session, its ancestors and the sessions of its conversation")
