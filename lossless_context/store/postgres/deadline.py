"""Client-side deadlines for PostgreSQL calls: a server that stops answering costs one bounded wait.

``statement_timeout`` is enforced by the server, and TCP keepalives and ``tcp_user_timeout``
by the kernel; none of them ends a call to a server that is *frozen* (a paused VM, a
SIGSTOPped postmaster, a storage stall): its kernel still accepts and acknowledges every
packet, and psycopg waits on the socket for as long as it takes. So every store call runs
under a :func:`watch`: one process-wide thread (``lcm-pg-deadline``) shuts down the socket of
a call still running at its deadline. The waiting thread then wakes with "server closed the
connection", the connection is dropped (never reused), and the caller turns the error into
an outage (:func:`fired` tells it that the deadline, not the server, ended the call).

Registering a call costs one lock round and a dict entry; the thread sleeps until the
earliest deadline and is woken only by a call whose deadline comes before that.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from typing import Any, Iterator


class Watch:
    """One watched call: the connection's socket and when the call must have ended."""

    __slots__ = ("fd", "expires", "seconds", "fired")

    def __init__(self, fd: int, seconds: float) -> None:
        self.fd = fd
        self.seconds = seconds
        self.expires = time.monotonic() + seconds
        self.fired = False


class _Watchdog:
    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._watches: dict[int, Watch] = {}
        self._wake_at = float("inf")  # when the thread wakes next (inf: nothing to watch)
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    def add(self, w: Watch) -> None:
        with self._cond:
            if self._pid != os.getpid():  # a forked child: the parent's thread is not here
                self._pid, self._thread, self._watches = os.getpid(), None, {}
                self._wake_at = float("inf")
            self._watches[id(w)] = w
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="lcm-pg-deadline", daemon=True)
                self._thread.start()
            elif w.expires < self._wake_at:  # (calls of one bound in a row: no wake-up at all)
                self._wake_at = w.expires
                self._cond.notify()

    def remove(self, w: Watch) -> None:
        with self._cond:
            self._watches.pop(id(w), None)

    def _run(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                for key, w in list(self._watches.items()):
                    if w.expires <= now:
                        del self._watches[key]
                        w.fired = True
                        _shut(w.fd)
                if not self._watches:
                    self._wake_at = float("inf")
                    self._cond.wait()
                    continue
                self._wake_at = min(w.expires for w in self._watches.values())
                self._cond.wait(max(0.0, self._wake_at - now) + 0.01)


def _shut(fd: int) -> None:
    """End the TCP (or unix-socket) conversation under a blocked reader: it wakes with EOF.
    The descriptor itself stays open (libpq owns it and closes it with the connection)."""
    try:
        s = socket.socket(fileno=os.dup(fd))
    except OSError:
        return
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        s.close()


_DOG = _Watchdog()


@contextlib.contextmanager
def watch(conn: Any, seconds: float) -> Iterator[Watch | None]:
    """Bound everything run on `conn` inside the block to `seconds` (None: no socket to watch)."""
    try:
        fd = conn.pgconn.socket
    except Exception:  # already closed: the call fails by itself
        yield None
        return
    w = Watch(fd, max(0.05, float(seconds)))
    _DOG.add(w)
    try:
        yield w
    finally:
        _DOG.remove(w)


def fired(w: Watch | None) -> bool:
    """Whether the deadline ended the watched call."""
    return w is not None and w.fired
