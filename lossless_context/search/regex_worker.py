"""The matcher process of lcm_grep's regex mode: started by `regex.py`, the standard library only.

Run as a script (``python -I -S regex_worker.py``), it reads requests on stdin and answers on
stdout, one frame each: a 4-byte big-endian length, then a pickle. A request is ``(pattern,
flags, texts, max_chars, seconds)``; the answer is ``("ok", spans)`` (the span of the first match
in each text's first `max_chars` characters, or None), ``("timeout", spans)`` (the spans of the
texts done before `seconds` ran out) or ``("error", message)``.

Why a process: Python's regex engine backtracks, and a match running in C cannot be stopped from
another thread. It does check for signals as it backtracks, so a SIGALRM armed for the request's
`seconds` stops a match that would run for hours here, in the process's main thread, where the
handler runs; the process answers and waits for the next request. (The caller kills the process
when an answer is late all the same.) The process ends at the end of its input, when the caller
closes the pipe, exits or dies; and while it matches, the timer's handler looks every `TICK`
seconds whether the caller is still its parent, and ends it when not.
"""

from __future__ import annotations

import pickle
import re
import os
import signal
import struct
import sys
import time
from typing import Any, BinaryIO

MAX_SECONDS = 60.0  # no request runs longer
TICK = 0.25  # how often a running match looks at the clock and at its parent
_HEAD = struct.Struct(">I")
_PARENT = os.getppid()
_deadline = 0.0


class _Expired(Exception):
    """The request's time ran out (raised by the SIGALRM handler inside a match)."""


def _tick(signum: int, frame: Any) -> None:
    if os.getppid() != _PARENT:  # the caller died: this process was handed to another parent
        sys.exit(0)  # (SystemExit passes every handler of `answer` and `main`)
    if time.monotonic() >= _deadline:
        raise _Expired()


def _read(inp: BinaryIO, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        got = inp.read(n - len(buf))
        if not got:
            raise EOFError
        buf += got
    return buf


def answer(req: Any, cache: dict[tuple[str, int], re.Pattern[str]]) -> tuple[str, Any]:
    """The answer to one request (see the module docstring)."""
    spans: list[tuple[int, int] | None] = []
    try:
        pattern, flags, texts, max_chars, seconds = req
        rx = cache.get((pattern, flags))
        if rx is None:
            rx = cache[(pattern, flags)] = re.compile(pattern, flags)
            if len(cache) > 32:
                cache.pop(next(iter(cache)))
        global _deadline
        seconds = min(MAX_SECONDS, max(0.001, float(seconds)))
        _deadline = time.monotonic() + seconds
        signal.setitimer(signal.ITIMER_REAL, min(seconds, TICK), TICK)
        try:
            for text in texts:
                m = rx.search(text, 0, max_chars)
                spans.append(m.span() if m else None)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _Expired:
        return ("ok", spans) if len(spans) == len(texts) else ("timeout", spans)
    except (re.error, RecursionError, OverflowError, ValueError, TypeError, MemoryError) as exc:
        return "error", f"{type(exc).__name__}: {exc}"
    return "ok", spans


def main() -> None:
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    signal.signal(signal.SIGALRM, _tick)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the terminal's Ctrl-C is for the caller
    cache: dict[tuple[str, int], re.Pattern[str]] = {}
    out.write(_HEAD.pack(0))  # ready
    out.flush()
    while True:
        try:
            (size,) = _HEAD.unpack(_read(inp, _HEAD.size))
            req = pickle.loads(_read(inp, size))
        except (EOFError, OSError, pickle.UnpicklingError):
            return
        data = pickle.dumps(answer(req, cache), protocol=pickle.HIGHEST_PROTOCOL)
        try:
            out.write(_HEAD.pack(len(data)) + data)
            out.flush()
        except OSError:  # the caller is gone
            return


if __name__ == "__main__":
    main()
