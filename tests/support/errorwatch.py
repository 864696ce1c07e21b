"""Errors are failures: the watcher behind the suite's autouse fixture (tests/conftest.py).

The engine swallows its own failures on purpose — `compress()` returns the host's list, a tool
answers `{"error": "internal error in ..."}` — because that is its contract with the host. A test
that only looks at the returned value therefore cannot see a failure it exists for. The watcher
looks past the swallowing: during every test it records

- each record of the `lossless_context` logger tree at ERROR or above, or carrying a traceback
  (`log.exception`, `exc_info=...`), whatever thread logged it;
- each tool answer that carries ``internal error`` (`tools._answer` builds every answer, of the
  engine's tools and of `lcm mcp`'s; the watcher wraps it, and `tools.dispatch` where it is not);

and fails the test at teardown when any of them was not declared as expected.

A test that provokes such an error on purpose declares it, either for the whole test::

    @pytest.mark.lcm_errors("compress failed")      # regexes searched in the message
    def test_...

(``@pytest.mark.lcm_errors()`` with no pattern allows any), or for a block, and then asserts it
happened::

    def test_...(lcm_errors):
        with lcm_errors.expected("tool lcm_grep failed"):
            ...
        assert lcm_errors.matched("tool lcm_grep failed")

What a test declares is still recorded (`lcm_errors.records`, `lcm_errors.answers`), so it can
assert that the error it provoked is the one that was logged.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
from dataclasses import dataclass, field
from typing import Iterator, List, Optional, Sequence

LOGGER = "lossless_context"
INTERNAL = "internal error"


@dataclass
class Seen:
    """One error the watcher saw: a log record or a tool answer."""

    kind: str  # "log" or "answer"
    text: str
    where: str
    allowed: bool = False

    def describe(self) -> str:
        return f"[{self.kind}] {self.where}: {self.text}"


@dataclass
class ErrorWatch:
    """What one test logged or answered; see the module docstring."""

    allowed: List[re.Pattern[str]] = field(default_factory=list)
    allow_all: bool = False
    seen: List[Seen] = field(default_factory=list)
    _scopes: List[List[re.Pattern[str]]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # -- declaring -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def expected(self, *patterns: str) -> Iterator["ErrorWatch"]:
        """Inside the block, errors matching one of `patterns` (regexes; none: any) are allowed."""
        scope = [re.compile(p) for p in patterns] or [re.compile("")]
        with self._lock:
            self._scopes.append(scope)
        try:
            yield self
        finally:
            with self._lock:
                self._scopes.remove(scope)

    def allow(self, *patterns: str) -> None:
        """From now to the end of the test, errors matching one of `patterns` are allowed."""
        with self._lock:
            self.allowed.extend(re.compile(p) for p in patterns)
            if not patterns:
                self.allow_all = True

    # -- reading -------------------------------------------------------------------------------

    @property
    def records(self) -> List[str]:
        return [s.text for s in self.seen if s.kind == "log"]

    @property
    def answers(self) -> List[str]:
        return [s.text for s in self.seen if s.kind == "answer"]

    def matched(self, pattern: str) -> bool:
        rx = re.compile(pattern)
        return any(rx.search(s.text) for s in self.seen)

    def unexpected(self) -> List[Seen]:
        return [s for s in self.seen if not s.allowed]

    # -- recording -----------------------------------------------------------------------------

    def note(self, kind: str, text: str, where: str) -> None:
        with self._lock:
            pats: Sequence[re.Pattern[str]] = [p for scope in self._scopes for p in scope] + self.allowed
            allowed = self.allow_all or any(p.search(text) for p in pats)
            self.seen.append(Seen(kind, text, where, allowed))


class _Handler(logging.Handler):
    def __init__(self, watch: ErrorWatch) -> None:
        super().__init__(logging.NOTSET)
        self.watch = watch

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno < logging.ERROR and not record.exc_info:
            return
        try:
            text = record.getMessage()
        except Exception:  # a broken format string is an error too
            text = str(record.msg)
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            text = f"{text} [{type(exc).__name__}: {exc}]"
        self.watch.note("log", text, f"{record.name} ({record.levelname}, {record.threadName})")


@contextlib.contextmanager
def watching(watch: ErrorWatch, monkeypatch: Optional[object] = None) -> Iterator[ErrorWatch]:
    """Attach the watcher to the logger tree and to the tools' dispatch for the block."""
    handler = _Handler(watch)
    lib = logging.getLogger(LOGGER)
    lib.addHandler(handler)
    old_level = lib.level
    if lib.getEffectiveLevel() > logging.ERROR:  # something silenced the tree: still see errors
        lib.setLevel(logging.ERROR)
    undo = _watch_answers(watch)
    try:
        yield watch
    finally:
        undo()
        lib.removeHandler(handler)
        if lib.level == logging.ERROR and old_level != logging.ERROR:
            lib.setLevel(old_level)


def _watch_answers(watch: ErrorWatch):  # type: ignore[no-untyped-def]
    """Wrap the function that builds every tool answer (looked up at call time) to see them."""
    try:
        from lossless_context import tools
    except Exception:  # the package itself broken: the tests will say so
        return lambda: None
    attr = "_answer" if callable(getattr(tools, "_answer", None)) else "dispatch"
    original = getattr(tools, attr)

    def wrapped(*args, **kwargs):  # type: ignore[no-untyped-def]
        answer = original(*args, **kwargs)
        if isinstance(answer, str) and INTERNAL in answer:
            name = args[0] if attr == "_answer" else args[1]
            watch.note("answer", answer, f"tool {name}")
        return answer

    wrapped.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(tools, attr, wrapped)

    def undo() -> None:
        if getattr(tools, attr) is wrapped:
            setattr(tools, attr, original)

    return undo


def verdict(watch: ErrorWatch) -> Optional[str]:
    """The failure message for the errors nobody declared, or None."""
    bad = watch.unexpected()
    if not bad:
        return None
    lines = [s.describe() for s in bad[:12]]
    if len(bad) > 12:
        lines.append(f"... and {len(bad) - 12} more")
    return ("the engine logged or answered an internal error this test did not declare "
            "(declare it with @pytest.mark.lcm_errors(pattern) or `with lcm_errors.expected(pattern):`, "
            "see tests/support/errorwatch.py):\n  " + "\n  ".join(lines))
