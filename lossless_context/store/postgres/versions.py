"""Session context versions on PostgreSQL without a query per call (LISTEN/NOTIFY).

``select_context`` runs before every provider call and only needs to know whether a
session's published context changed. Migration 010 makes every change of
``sessions.context_version`` (and every session deletion) send ``NOTIFY lcm_context``. One
listener per DSN and process holds a dedicated connection that LISTENs; a version read once
is then kept current by the notifications (other processes and hosts) and dropped by this
process's own commits (``forget``, called after the transaction), so a call while nothing
changed asks the server nothing. Versions only grow, so a notification and a concurrent read
arriving in either order keep the larger. While the listener is not connected (not started
yet, server restarting) the cache answers nothing and callers read the row as before.

The same listener keeps each session's *scope* — its lineage and its ancestry with fork
points, read by every tool call — so a tool call does not spend two round trips on it.
Migration 011 announces every change of a session's place in a lineage (a session created or
deleted; its parent, conversation or fork point set) as "-3 *lineage"; any such notice, a
reconnect, or this process's own change of those columns (:func:`touch_scopes`, applied after
the commit) drops every kept scope. A scope read is kept under the generation it was read in,
so a read that raced a notice is never served.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

log = logging.getLogger("lossless_context.store")

CHANNEL = "lcm_context"
LINEAGE = "*lineage"  # the payload "-3 *lineage": a session's place in a lineage changed
MAX_SCOPES = 4096  # scopes kept per DSN and process (all dropped when full)
APPLICATION_NAME = "lcm-versions"  # names the listener's session in pg_stat_activity
PROBE_SECONDS = 10.0  # how long the listener waits for its own test notification
_RETRY_MAX = 30.0  # seconds between reconnect attempts of a listener that lost its server


class VersionCache:
    """The listener thread of one DSN and the versions it keeps."""

    def __init__(self, dsn: str, conn_kwargs: dict[str, Any]) -> None:
        self._dsn, self._kwargs = dsn, dict(conn_kwargs)
        self._lock = threading.Lock()
        self._versions: dict[str, int] = {}
        self._gen = 0  # scope generation: bumped by every lineage notice and reconnect
        self._scopes: dict[tuple[Any, ...], tuple[int, Any]] = {}
        self._live = False
        self._users = 0
        self._stop = threading.Event()
        self._ready = threading.Event()  # set while LISTEN is in effect
        self._conn: Any = None
        self._thread: threading.Thread | None = None

    # -- the cache ---------------------------------------------------------------------
    def get(self, session_id: str) -> int | None:
        with self._lock:
            return self._versions.get(session_id) if self._live else None

    def note(self, session_id: str, version: int) -> None:
        with self._lock:
            if self._live and version > self._versions.get(session_id, -1):
                self._versions[session_id] = version

    def forget(self, session_id: str) -> None:
        with self._lock:
            self._versions.pop(session_id, None)

    def scope_generation(self) -> int | None:
        """The current scope generation, or None while scopes cannot be kept (not listening)."""
        with self._lock:
            return self._gen if self._live else None

    def scope_get(self, key: tuple[Any, ...]) -> Any | None:
        with self._lock:
            hit = self._scopes.get(key) if self._live else None
            return hit[1] if hit is not None and hit[0] == self._gen else None

    def scope_put(self, key: tuple[Any, ...], generation: int, value: Any) -> None:
        """Keep a scope read in ``generation`` — unless a change was noticed since."""
        with self._lock:
            if self._live and generation == self._gen:
                if len(self._scopes) >= MAX_SCOPES:
                    self._scopes.clear()
                self._scopes[key] = (generation, value)

    def scopes_changed(self) -> None:
        with self._lock:
            self._gen += 1
            self._scopes.clear()

    def wait_ready(self, timeout: float) -> bool:
        """Whether the listener is (or within `timeout` becomes) connected and listening."""
        return self._ready.wait(timeout)

    # -- the listener ------------------------------------------------------------------
    def acquire(self) -> None:
        with self._lock:
            self._users += 1
            if self._thread is None:
                self._stop.clear()
                self._thread = threading.Thread(target=self._run, name="lcm-pg-versions", daemon=True)
                self._thread.start()

    def release(self) -> bool:
        """One user fewer; the last one stops the listener. True when it stopped."""
        with self._lock:
            self._users -= 1
            if self._users > 0:
                return False
            self._live, thread = False, self._thread
            self._ready.clear()
            self._versions.clear()
            self._scopes.clear()
            self._gen += 1
            self._thread = None
            self._stop.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)
        return True

    def _run(self) -> None:
        import psycopg

        delay = 0.5
        while not self._stop.is_set():
            conn = None
            try:
                conn = psycopg.connect(self._dsn, **{**self._kwargs, "autocommit": True,
                                                     "application_name": APPLICATION_NAME})
                conn.execute(f"LISTEN {CHANNEL}")
                if not self._delivers(conn):
                    # e.g. a transaction-mode pooler between us and the server: stay off for
                    # good rather than trust a channel that never speaks (versions are read).
                    log.info("lcm store: LISTEN/NOTIFY does not reach this connection (a transaction"
                             " pooler?); select_context reads the context version on every call")
                    conn.close()
                    return
                with self._lock:
                    if self._stop.is_set():
                        return
                    self._conn = conn
                    self._versions.clear()  # anything read before LISTEN may have missed a change
                    self._scopes.clear()
                    self._gen += 1
                    self._live = True
                    self._ready.set()
                delay = 0.5
                while not self._stop.is_set():
                    for n in conn.notifies(timeout=1.0):
                        self._apply(n.payload)
            except Exception as exc:  # the server went away: fall back to reading rows
                log.debug("lcm store: version listener lost its connection: %s", exc)
            finally:
                with self._lock:
                    self._ready.clear()
                    self._live = False
                    self._conn = None
                    self._versions.clear()
                    self._scopes.clear()
                    self._gen += 1
                if conn is not None:
                    try:
                        conn.close()
                    except Exception:  # pragma: no cover
                        pass
            self._stop.wait(delay)
            delay = min(_RETRY_MAX, delay * 2)

    @staticmethod
    def _delivers(conn: Any) -> bool:
        """Whether a notification this connection sends comes back to it (a session hears
        its own NOTIFY when LISTEN and NOTIFY reach the same server session)."""
        token = f"-2 probe-{os.getpid()}-{threading.get_ident()}"
        conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, token))
        return any(n.payload == token for n in conn.notifies(timeout=PROBE_SECONDS, stop_after=50))

    def _apply(self, payload: str) -> None:
        version, _, sid = payload.partition(" ")
        if sid == LINEAGE:
            self.scopes_changed()
            return
        try:
            v = int(version)
        except ValueError:
            return
        with self._lock:
            if v < 0:
                self._versions.pop(sid, None)  # the session was deleted
            elif sid in self._versions and v > self._versions[sid]:
                self._versions[sid] = v


_CACHES: dict[tuple[int, str], VersionCache] = {}
_CACHES_LOCK = threading.Lock()


def cache_for(dsn: str, conn_kwargs: dict[str, Any]) -> VersionCache:
    """The process's cache of this DSN (a forked child gets its own)."""
    key = (os.getpid(), dsn)
    with _CACHES_LOCK:
        c = _CACHES.get(key)
        if c is None:
            c = _CACHES[key] = VersionCache(dsn, conn_kwargs)
        return c


def peek(dsn: str) -> VersionCache | None:
    """The cache of this DSN if this process made one (writers drop their sessions from it)."""
    return _CACHES.get((os.getpid(), dsn))


_SCOPE_WRITES = threading.local()


def touch_scopes() -> None:
    """Called inside a write transaction that changes a session's place in a lineage: this
    process's kept scopes are dropped once it ends (``take_touched``)."""
    _SCOPE_WRITES.touched = True


def take_touched() -> bool:
    """Whether this thread's transaction changed a lineage (and reset the mark)."""
    touched = getattr(_SCOPE_WRITES, "touched", False)
    _SCOPE_WRITES.touched = False
    return touched
