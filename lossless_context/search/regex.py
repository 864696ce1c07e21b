"""lcm_grep's regex mode, bounded in time, with Python's public regex API only.

Python's `re` backtracks: ``(a+)+$`` takes exponential time on a run of a's that does not end the
text, ``.*.*=`` cubic time on a long line without ``=``, and a match running in C cannot be
stopped from another thread. So no user pattern is ever matched in the engine's process:

* every match runs in the matcher process (`regex_worker.py`, one per engine process, started on
  first use), which stops a request at its time limit and answers with what it matched until
  then; an answer that is late all the same gets the process killed and reaped (the next request
  starts another). The process ends when this one does (its input closes);
* `compile_regex` checks the syntax with `re.compile`, then matches the pattern, made to fail
  after it (``(?:pattern)(?!)``, so the engine tries every way the pattern can match), over a few
  short hostile texts: runs of the characters the pattern names and of pairs of them. Those take
  microseconds for any pattern whose cost grows polynomially and centuries for one whose cost
  grows exponentially, so a pattern not done within `PROBE_SECONDS` is rejected with advice;
* a store's regex search (`scan`) hands the matcher its rows, newest first, in batches under the
  search's time limit (`SCAN_SECONDS`) and stops there, keeping what matched; the pattern's
  `stopped` then says so (lcm_grep tells the agent).

(`google-re2` would match in linear time, but its ``\\d``, ``\\w``, ``\\b`` and ``$`` differ from
Python's and it has no back-references or look-arounds: the hits would change. Not used.)
"""

from __future__ import annotations

import atexit
import logging
import os
import pickle
import re
import select  # poll(): select() cannot watch a descriptor past 1023 (a busy process has them)
import struct
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

log = logging.getLogger(__name__)

__all__ = ["MAX_REGEX_CHARS", "MAX_SCAN_CHARS", "SCAN_ROWS", "SCAN_SECONDS", "BoundedRegex",
           "RegexUnavailable", "compile_regex", "hostile_texts", "regex_search_bounded", "scan",
           "shutdown", "matcher_pid"]

MAX_REGEX_CHARS = 500
MAX_SCAN_CHARS = 200_000  # a text is matched in its first this many characters
SCAN_SECONDS = 2.0  # a store's regex scan stops after this long (what matched so far is kept)
SCAN_ROWS = 200_000  # the newest rows a scan reads at most
PROBE_SECONDS = 0.5  # compile_regex's hostile texts: microseconds unless the cost is exponential
PROBE_CHARS = 48  # their length: 2**48 steps for (a+)+, 48**4 for a quartic pattern
START_SECONDS = 5.0  # the matcher process's start (not counted in a request's time; ~50 ms)
LATE_SECONDS = 2.0  # an answer this much later than its limit: the process is killed
BATCH_ROWS, BATCH_CHARS = 512, 4_000_000  # one request of a scan

_SLOW = ("regex rejected: it can take exponential time (a repeated group whose parts can match the "
         "same text in many ways, like (a+)+$, (\\w+\\s?)*$ or (a|aa)+); make the parts "
         "unambiguous, e.g. (\\w+\\s)*, or use an atomic group (?>...) or a possessive "
         "quantifier (a++)")
_GLOBAL_FLAGS = re.compile(r"\A(?:\(\?[aiLmsux]+\))+")  # only allowed at the start (3.11+)
_HEAD = struct.Struct(">I")
_WORKER = Path(__file__).with_name("regex_worker.py")

Span = tuple[int, int]


class RegexUnavailable(RuntimeError):
    """The matcher process cannot be started here (the reason is the message)."""


@dataclass(eq=False)
class BoundedRegex:
    """A user pattern `compile_regex` accepted; it is matched only in the matcher process.
    `stopped` is set when a scan with it stopped at its time limit (its hits are partial)."""

    pattern: str
    flags: int
    stopped: bool = field(default=False)

    def search_many(self, texts: Sequence[str], seconds: float,
                    max_chars: int = MAX_SCAN_CHARS) -> tuple[list[Span | None], bool]:
        """The first match's span in each of `texts` (in its first `max_chars` characters; ``$``
        also matches at that cut) and whether all were done within `seconds`: when not, the
        spans of the texts done before the limit (none when the matcher process cannot start)."""
        try:
            return _MATCHER.run(self.pattern, self.flags, list(texts), max(0, int(max_chars)), seconds)
        except RegexUnavailable as exc:  # (compile_regex started it, so it rarely comes to this)
            log.warning("lcm regex: %s", exc)
            return [], False


def compile_regex(pattern: str, *, flags: int = 0,
                  max_length: int = MAX_REGEX_CHARS) -> tuple[BoundedRegex | None, str | None]:
    """Validate a user regex for ``mode=regex``; never raises. ``(regex, None)`` or ``(None,
    error_message)``: not a string, empty, too long, invalid syntax, exponential on the hostile
    texts (catastrophic backtracking), or no matcher process here."""
    if not isinstance(pattern, str):
        return None, "regex must be a string"
    if not pattern:
        return None, "regex is empty"
    if len(pattern) > max_length:
        return None, f"regex is too long ({len(pattern)} chars; the limit is {max_length})"
    try:
        flags = int(flags) & ~re.DEBUG
        with warnings.catch_warnings():  # e.g. FutureWarning "possible nested set"
            warnings.simplefilter("ignore")
            compiled = re.compile(pattern, flags)
            probe = _failing(pattern, compiled.flags)
    except re.error as exc:
        where = f" at position {exc.pos}" if exc.pos is not None else ""
        return None, f"invalid regex: {exc.msg}{where}"
    except (RecursionError, OverflowError, ValueError, TypeError, MemoryError) as exc:
        return None, f"invalid regex: {exc}"
    try:
        _spans, done = _MATCHER.run(probe, compiled.flags, hostile_texts(pattern), 1 << 30,
                                    PROBE_SECONDS)
    except RegexUnavailable as exc:
        return None, f"regex search is unavailable here: {exc}"
    return (BoundedRegex(pattern, compiled.flags), None) if done else (None, _SLOW)


def _failing(pattern: str, flags: int) -> str:
    """`pattern` followed by a match that always fails, so that a search tries every way the
    pattern can match (the global flags, only allowed first, are in `flags`); the pattern
    itself when that does not compile."""
    body = _GLOBAL_FLAGS.sub("", pattern)
    wrapped = "(?:" + body + ("\n" if flags & re.VERBOSE else "") + ")(?!)"  # (a trailing # comment)
    try:
        re.compile(wrapped, flags)
    except (re.error, RecursionError, OverflowError, ValueError, TypeError, MemoryError):
        return pattern
    return wrapped


def hostile_texts(pattern: str, length: int = PROBE_CHARS) -> list[str]:
    """Texts that make a backtracking pattern try many ways: runs of each character the pattern
    names (and of a few that common classes match), and of each pair of them side by side, each
    run ended by a character the pattern does not name. Their size is fixed and small."""
    named = [c for c in dict.fromkeys(pattern) if c.isprintable() and c not in "()[]{}?*+|^$\\"]
    chars = list(dict.fromkeys(named + list("aA0 _-.x")))[:24]
    units = chars + ["".join(p) for p in zip(named, named[1:]) if p[0] != p[1]][:24]
    end = next((c for c in "\x00!#%&~\u00a7\u2603" if c not in pattern), "\x01")
    return [u * max(1, length // len(u)) + end for u in units]


def regex_search_bounded(rx: BoundedRegex | None, text: str, max_chars: int = MAX_SCAN_CHARS,
                         seconds: float | None = None) -> Span | None:
    """The span of the first match in the first `max_chars` characters of `text`, or None (no
    match, not a string, or not found within `seconds`, by default `SCAN_SECONDS`)."""
    if rx is None or not isinstance(text, str):
        return None
    spans, _done = rx.search_many([text], SCAN_SECONDS if seconds is None else seconds, max_chars)
    return spans[0] if spans else None


def scan(rows: Iterable[Sequence[Any]], rx: BoundedRegex, *, offset: int, limit: int,
         seconds: float | None = None, text_at: int = 4) -> list[Sequence[Any]]:
    """The rows (newest first, as given) whose text (``row[text_at]``) matches `rx`: the `limit`
    after the first `offset` matches found within `seconds` (by default `SCAN_SECONDS`); a scan
    that runs out of time stops there, keeps what it found and sets ``rx.stopped``."""
    deadline = time.monotonic() + (SCAN_SECONDS if seconds is None else seconds)
    out: list[Sequence[Any]] = []
    found = 0
    batch: list[Sequence[Any]] = []
    chars = 0

    def flush() -> bool:  # True: go on
        nonlocal found, chars
        left = deadline - time.monotonic()
        spans, done = rx.search_many([_text(r, text_at) for r in batch], left) if left > 0 else ([], False)
        for row, span in zip(batch, spans):
            if span is not None:
                if found >= offset:
                    out.append(row)
                found += 1
                if len(out) >= limit:
                    return False
        if not done:
            rx.stopped = True
        batch.clear()
        chars = 0
        return done

    for row in rows:
        batch.append(row)
        chars += min(len(_text(row, text_at)), MAX_SCAN_CHARS)
        if (len(batch) >= BATCH_ROWS or chars >= BATCH_CHARS) and not flush():
            return out
    if batch:
        flush()
    return out


def _text(row: Sequence[Any], at: int) -> str:
    text = row[at]
    return text if isinstance(text, str) else ""


class _Matcher:
    """This process's matcher process, and one request at a time to it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._pid = os.getpid()

    def run(self, pattern: str, flags: int, texts: list[str], max_chars: int,
            seconds: float) -> tuple[list[Span | None], bool]:
        if not texts:
            return [], True
        start = time.monotonic()  # waiting for another search's request counts in this one's time
        if seconds <= 0 or not self._lock.acquire(timeout=seconds):
            return [], False
        try:
            seconds -= time.monotonic() - start
            if seconds <= 0:
                return [], False
            proc = self._started()
            data = pickle.dumps((pattern, flags, texts, max_chars, seconds), protocol=pickle.HIGHEST_PROTOCOL)
            deadline = time.monotonic() + seconds + LATE_SECONDS
            try:
                _write(proc, _HEAD.pack(len(data)) + data, deadline)
                (size,) = _HEAD.unpack(_read(proc, _HEAD.size, deadline))
                kind, value = pickle.loads(_read(proc, size, deadline + LATE_SECONDS))
            except (OSError, EOFError, TimeoutError, pickle.UnpicklingError, ValueError) as exc:
                log.warning("lcm regex: the matcher process was %s; stopped (the next search starts "
                            "another)", "late" if isinstance(exc, TimeoutError) else "lost")
                self._stop()
                return [], False
        finally:
            self._lock.release()
        if kind == "error":  # the pattern compiled here, so this is the process's own trouble
            log.warning("lcm regex: the matcher process failed: %s", value)
            return [], False
        return list(value), kind == "ok"

    def pid(self) -> int | None:
        """The matcher process's id (None before the first search or after `close`)."""
        proc = self._proc
        return proc.pid if proc is not None and self._pid == os.getpid() else None

    def _started(self) -> subprocess.Popen[bytes]:
        if self._pid != os.getpid():  # a forked child: the process and its pipes are the parent's
            self._proc, self._pid = None, os.getpid()
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        self._stop()
        if not sys.executable or not _WORKER.is_file():
            raise RegexUnavailable("no Python interpreter to run the matcher process with")
        try:  # -I -S: no site-packages, no user paths; the worker needs the standard library only
            proc = subprocess.Popen([sys.executable, "-I", "-S", str(_WORKER)], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, close_fds=True)
        except OSError as exc:
            raise RegexUnavailable(f"cannot start the matcher process: {exc}") from exc
        try:
            _read(proc, _HEAD.size, time.monotonic() + START_SECONDS)  # its "ready"
        except (OSError, EOFError, TimeoutError) as exc:
            _kill(proc)
            raise RegexUnavailable(f"the matcher process did not start ({type(exc).__name__})") from exc
        assert proc.stdin is not None
        os.set_blocking(proc.stdin.fileno(), False)  # writes bounded in time too (_write)
        self._proc = proc
        return proc

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            _kill(proc)

    def close(self) -> None:
        # (at exit a request may still be running on another thread: its process is killed too,
        # and that request answers "not done" when it reads the end of the pipe)
        got = self._lock.acquire(timeout=1.0)
        try:
            if self._pid == os.getpid():
                self._stop()
        finally:
            if got:
                self._lock.release()


def _ready(fd: int, event: int, seconds: float) -> bool:
    """Whether `fd` is ready for `event` (or closed: the read or write then says so) within `seconds`."""
    p = select.poll()
    p.register(fd, event)
    return bool(p.poll(max(1, int(seconds * 1000))))


def _write(proc: subprocess.Popen[bytes], data: bytes, deadline: float) -> None:
    assert proc.stdin is not None
    fd = proc.stdin.fileno()
    view = memoryview(data)
    while view:
        left = deadline - time.monotonic()
        if left <= 0 or not _ready(fd, select.POLLOUT, left):
            raise TimeoutError
        try:  # (the pipe is non-blocking: a write takes what fits)
            view = view[os.write(fd, view):]
        except BlockingIOError:
            continue


def _read(proc: subprocess.Popen[bytes], n: int, deadline: float) -> bytes:
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    buf = bytearray()
    while len(buf) < n:
        left = deadline - time.monotonic()
        if left <= 0 or not _ready(fd, select.POLLIN, left):
            raise TimeoutError
        got = os.read(fd, n - len(buf))
        if not got:
            raise EOFError
        buf += got
    return bytes(buf)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    try:
        proc.kill()
        proc.wait(timeout=5)  # reaped: no zombie left behind
    except (OSError, subprocess.TimeoutExpired):
        pass
    for f in (proc.stdin, proc.stdout):
        try:
            if f is not None:
                f.close()
        except OSError:
            pass


_MATCHER = _Matcher()
atexit.register(_MATCHER.close)


def shutdown() -> None:
    """Stop this process's matcher process (the next search starts another)."""
    _MATCHER.close()


def matcher_pid() -> int | None:
    """The id of this process's matcher process, None when none runs (for `lcm doctor` and tests)."""
    return _MATCHER.pid()
