"""A store circuit breaker, and how a session survives without its store.

Every engine copy talks to the store through a :class:`GuardedStore`. When a store call
fails because the store itself cannot be used — its path lies under a regular file, the
file or mount is read-only, PostgreSQL is down or hangs until its connect timeout — the
breaker for that store *location* opens (shared by every engine copy in the process), and
for ``cooldown`` seconds every store call fails at once with :class:`StoreUnavailable`
(the location and the reason, never a bare ``NotADirectoryError``) instead of paying the
failure or the timeout again on every host hook. After the cool-down one call is let
through to probe the store; success closes the breaker.

While the store is unavailable, the engine keeps the conversation within the window
deterministically (``trim_without_store``, with the other assembly in pipeline/assemble.py):
the newest whole turns that fit the target are kept (the head the host protects too), the oldest are dropped from the *context* (the host's own
session database still has them; nothing is imported later). The user is told once per
outage: a WARNING in the log and the reason in ``/lcm status`` and every tool answer.
"""

from __future__ import annotations

import logging
import re
import sqlite3
import threading
import time
from typing import Any, Callable

from .base import Store, StoreError

log = logging.getLogger("lossless_context")

DEFAULT_COOLDOWN = 30.0

# A SQLite OperationalError with one of these words is a busy/locked store: another
# writer, not an outage (the callers have their own waits for it).
_TRANSIENT = ("locked", "busy")
_OUTAGE_WORDS = ("cannot open store", "no connection available", "unable to open", "readonly",
                 "read-only", "disk i/o", "not a database", "connection", "timeout", "server closed",
                 "disk is full", "compaction lock failed", "needs psycopg")


class StoreUnavailable(StoreError):
    """The store cannot be used right now (the reason says why and where)."""

    def __init__(self, location: str, reason: str) -> None:
        self.location, self.reason = location, reason
        super().__init__(f"the lcm store at {location} is unavailable: {reason}")


def log_hook_failure(what: str, exc: BaseException) -> None:
    """A host hook that failed and went on: a store outage was already told once (by the
    breaker, with its reason), so each hook's failure during it is DEBUG, not another WARNING
    (a turn runs several hooks; one WARNING each made ~8 lines a minute). Anything else is a
    WARNING with its traceback: a failure nobody expected, which a bug report needs (and which
    fails the test that caused it, tests/support/errorwatch.py)."""
    if isinstance(exc, StoreUnavailable) or type(exc).__name__ == "SessionBusy":
        log.debug("lcm: %s: %s", what, exc)
    else:
        log.warning("lcm: %s: %s", what, exc, exc_info=exc)


def mask_location(location: str) -> str:
    """A DSN without its password (shown to the user)."""
    return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", re.sub(r"(?i)(password=)[^&\s]*", r"\1***", location))


def describe(exc: BaseException) -> str:
    """`TypeName: message` with the path when the OS gave one."""
    if isinstance(exc, StoreUnavailable):
        return exc.reason
    text = str(exc).strip() or type(exc).__name__
    name = type(exc).__name__
    return text if text.startswith(name) else f"{name}: {text}"


def is_outage(exc: BaseException) -> bool:
    """True when `exc` says the store cannot be used (not: bad input, a busy lock, a bug)."""
    if isinstance(exc, StoreUnavailable):
        return True
    if isinstance(exc, OSError):
        return True
    if isinstance(exc, sqlite3.OperationalError):
        msg = str(exc).lower()
        return not any(w in msg for w in _TRANSIENT)
    if isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, (sqlite3.IntegrityError,
                                                                       sqlite3.ProgrammingError)):
        return True
    mod = type(exc).__module__ or ""
    if mod.startswith(("psycopg", "psycopg_pool")):
        return type(exc).__name__ in ("OperationalError", "PoolTimeout", "ConnectionTimeout", "InterfaceError")
    if isinstance(exc, StoreError):
        msg = str(exc).lower()
        return any(w in msg for w in _OUTAGE_WORDS) and "locked" not in msg
    return False


class Breaker:
    """Open/closed state of one store location, shared by every engine copy."""

    def __init__(self, location: str, cooldown: float = DEFAULT_COOLDOWN,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.location = location
        self.cooldown = float(cooldown)
        self._clock = clock
        self._lock = threading.Lock()
        self.reason: str | None = None
        self.since: float | None = None  # wall-clock time of the first failure of this outage
        self.failures = 0
        self.fast_failures = 0  # calls refused without touching the store
        self._open_until = 0.0
        self._probing = False

    @property
    def is_open(self) -> bool:
        return self.reason is not None

    def before_call(self) -> None:
        with self._lock:
            if self.reason is None:
                return
            if self._clock() < self._open_until or self._probing:
                self.fast_failures += 1
                raise StoreUnavailable(self.location, f"{self.reason} (retrying in "
                                       f"{max(0, int(self._open_until - self._clock()))} s)")
            self._probing = True  # one call probes the store after the cool-down

    def failed(self, exc: BaseException) -> None:
        with self._lock:
            first = self.reason is None
            self.reason = describe(exc)
            self.failures += 1
            self._open_until = self._clock() + self.cooldown
            self._probing = False
            if first:
                self.since = time.time()
        if first:
            log.warning("lcm: %s — the session goes on without it: the context is kept within the "
                        "window by dropping the oldest turns (they stay in the host's own history), "
                        "nothing new is stored until it is back (checked again every %d s)",
                        StoreUnavailable(self.location, self.reason or ""), int(self.cooldown))

    def succeeded(self) -> None:
        if self.reason is None and not self._probing:
            return
        with self._lock:
            was = self.reason
            self.reason, self.since, self._probing, self._open_until = None, None, False, 0.0
        if was:
            log.warning("lcm: the store at %s is usable again", self.location)

    def status(self) -> dict[str, Any] | None:
        if self.reason is None:
            return None
        return {"location": self.location, "reason": self.reason, "since": self.since,
                "failures": self.failures, "fast_failures": self.fast_failures}


_BREAKERS: dict[str, Breaker] = {}
_BREAKERS_LOCK = threading.Lock()


def breaker_for(location: str, cooldown: float = DEFAULT_COOLDOWN) -> Breaker:
    """The process-wide breaker of a store location (its cool-down follows the newest config)."""
    shown = mask_location(location)
    with _BREAKERS_LOCK:
        b = _BREAKERS.get(location)
        if b is None:
            b = _BREAKERS[location] = Breaker(shown, cooldown)
        b.cooldown = float(cooldown)
        return b


class GuardedStore:
    """A :class:`Store` whose every call goes through the location's breaker.

    The real store is opened on first use; an open that fails counts as a failed call."""

    def __init__(self, location: str, opener: Callable[[str], Store], cooldown: float = DEFAULT_COOLDOWN) -> None:
        self._target = location
        self._opener = opener
        self._inner: Store | None = None
        self._open_lock = threading.Lock()
        self.breaker = breaker_for(location, cooldown)
        self._close_hooks: list[Callable[[], None]] = []
        self._in_flight: dict[int, float] = {}  # thread → when its current store call began

    def busy_for(self, thread_id: int | None = None) -> float:
        """Seconds the store call now running on `thread_id` (default: any thread's oldest)
        has taken so far; 0 when none runs. `/lcm` answers "busy" from this rather than wait."""
        calls = dict(self._in_flight)
        began = calls.get(thread_id) if thread_id is not None else min(calls.values(), default=None)
        return 0.0 if began is None else max(0.0, time.monotonic() - began)

    def add_close_hook(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` when the store is closed, before it closes (a thread that uses the store
        in the background stops, rather than open it again)."""
        self._close_hooks.append(fn)

    def close(self) -> None:
        hooks, self._close_hooks = self._close_hooks, []
        for fn in hooks:
            try:
                fn()
            except Exception as exc:  # a hook must not keep the store open
                log.debug("lcm: a close hook failed: %s", exc)
        inner = self._inner
        if inner is not None:  # (never opened: nothing to close)
            inner.close()

    @property
    def location(self) -> str:
        inner = self._inner
        return inner.location if inner is not None else self.breaker.location

    @property
    def kind(self) -> str:
        inner = self._inner
        if inner is not None:
            return inner.kind
        return "postgres" if self._target.startswith(("postgresql://", "postgres://")) else "sqlite"

    @property
    def inner(self) -> Store:
        """The real store (opened, and counted by the breaker, on first use)."""
        if self._inner is None:
            with self._open_lock:
                if self._inner is None:
                    self.breaker.before_call()
                    try:
                        self._inner = self._opener(self._target)
                    except Exception as exc:
                        self.breaker.failed(exc)
                        raise StoreUnavailable(self.breaker.location, describe(exc)) from exc
        return self._inner

    def _reset_connections(self) -> None:
        inner = self._inner
        if inner is not None:
            try:
                inner.reset_connections()
            except Exception as exc:  # best effort: the next call reconnects either way
                log.debug("lcm: dropping the store's connections failed: %s", exc)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr
        breaker = self.breaker

        in_flight = self._in_flight

        def call(*args: Any, **kwargs: Any) -> Any:
            breaker.before_call()
            me = threading.get_ident()
            outer = me not in in_flight
            if outer:
                in_flight[me] = time.monotonic()
            try:
                out = attr(*args, **kwargs)
            except Exception as exc:
                if is_outage(exc):
                    breaker.failed(exc)
                    self._reset_connections()
                    raise StoreUnavailable(breaker.location, describe(exc)) from exc
                breaker.succeeded()  # the store answered (the call itself was wrong)
                raise
            finally:
                if outer:
                    in_flight.pop(me, None)
            if name in _LOCKING:
                # Making the context manager touched nothing: its entry is the store call, and
                # only that may tell the breaker the store answered (else every pass during an
                # outage would "recover" and warn again).
                return _GuardedContext(out, breaker, self._reset_connections, in_flight)
            breaker.succeeded()
            return out

        call.__name__ = name
        self.__dict__[name] = call  # built once per method: later calls skip __getattr__
        return call


_LOCKING = frozenset({"compaction_lock", "maintenance_connection"})  # methods returning a context manager that does store work


class _GuardedContext:
    """A store's context manager whose entry counts as a store call."""

    def __init__(self, cm: Any, breaker: Breaker, on_outage: Callable[[], None],
                 in_flight: dict[int, float]) -> None:
        self._cm, self._breaker, self._on_outage, self._in_flight = cm, breaker, on_outage, in_flight

    def __enter__(self) -> Any:
        me = threading.get_ident()
        outer = me not in self._in_flight
        if outer:
            self._in_flight[me] = time.monotonic()
        try:
            got = self._cm.__enter__()
        except Exception as exc:
            if is_outage(exc):
                self._breaker.failed(exc)
                self._on_outage()
                raise StoreUnavailable(self._breaker.location, describe(exc)) from exc
            self._breaker.succeeded()  # the store answered (the call itself was wrong)
            raise
        finally:
            if outer:
                self._in_flight.pop(me, None)
        self._breaker.succeeded()
        return got

    def __exit__(self, *exc_info: Any) -> Any:
        return self._cm.__exit__(*exc_info)
