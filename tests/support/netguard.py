"""No test reaches an outside address: the guard behind the suite's autouse `no_outside_calls`.

Everything a test talks to runs on this machine (the fake OpenAI-compatible server, the
throw-away PostgreSQL server, Chromium over a local port). A real host, though, has its own
ideas: Hermes' auxiliary client falls back to its default providers (OpenRouter, Nous) when a
test forgets to give it a local model, and a test then "passes" on the fallback after a
connection attempt that left the machine (or, here, failed on DNS). The guard refuses, in this
process, a name lookup of a name that is not local and a connect to an address that is not
loopback, and records the attempt: the fixture fails the test that made it. Child processes
(the e2e runs of `hermes`) are not covered.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import threading
from typing import Any, Iterator

_LOCAL_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback", ""}


def _local_host(host: Any) -> bool:
    if host is None:
        return True  # (getaddrinfo(None, port): the wildcard/loopback address of a bind)
    if isinstance(host, bytes):
        host = host.decode("ascii", "replace")
    name = str(host).strip("[]").split("%", 1)[0].lower()
    if name in _LOCAL_NAMES or name.endswith(".localhost"):
        return True
    try:
        ip = ipaddress.ip_address(name)
    except ValueError:
        return False
    return ip.is_loopback or ip.is_unspecified


class OutsideCall(OSError):
    """A test tried to reach an address outside this machine."""


class Guard:
    """The attempts seen while installed (thread-safe: servers and workers run on threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.attempts: list[str] = []

    def _refuse(self, what: str) -> OutsideCall:
        with self._lock:
            self.attempts.append(what)
        return OutsideCall(f"tests may not reach outside addresses: {what}")

    def take(self) -> list[str]:
        with self._lock:
            seen, self.attempts = self.attempts, []
        return seen


@contextlib.contextmanager
def installed(guard: Guard) -> Iterator[Guard]:
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex
    real_getaddrinfo = socket.getaddrinfo

    def _check(sock: socket.socket, address: Any) -> None:
        if sock.family in (socket.AF_INET, socket.AF_INET6) and isinstance(address, tuple) \
                and not _local_host(address[0]):
            raise guard._refuse(f"connect to {address[0]}:{address[1]}")

    def connect(self: socket.socket, address: Any) -> None:
        _check(self, address)
        return real_connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> int:
        _check(self, address)
        return real_connect_ex(self, address)

    def getaddrinfo(host: Any, *args: Any, **kw: Any) -> Any:
        if not _local_host(host):
            raise socket.gaierror(socket.EAI_NONAME, str(guard._refuse(f"lookup of {host}")))
        return real_getaddrinfo(host, *args, **kw)

    socket.socket.connect = connect  # type: ignore[method-assign]  # (the guard's whole point)
    socket.socket.connect_ex = connect_ex  # type: ignore[method-assign]
    socket.getaddrinfo = getaddrinfo
    try:
        yield guard
    finally:
        socket.socket.connect, socket.socket.connect_ex = real_connect, real_connect_ex  # type: ignore[method-assign]
        socket.getaddrinfo = real_getaddrinfo
