"""Tier-0 stubs made when a tool result is stored, off the pass (stubs.py shows them later).

A stub costs a few tenths of a millisecond of Python per tool result (its error lines, facts,
kind and sketch, then redaction). Made inside a pass, that is paid while the host waits; made
when the result is stored, it is ready when the result falls out of the keep window. So the
engine hands each ingest's new tool results to this module's thread (one per store location
and process), which prepares their stubs between passes: it yields to any pass in flight in
this process and writes each verdict — the stub, or "not worth one" — with the message
(`Store.prepare_representations`: kept with the row, shown by nothing until a pass promotes
it), so the verdict survives the process (`hermes chat -q` runs one per turn). A pass that
reaches a result before its stub is ready makes it itself, exactly as it would have been
prepared (the same `stubs.stub_for`).
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections import deque
from typing import Any, Callable, Sequence

from ..store.base import Store
from .assemble import Slot
from .stubs import StubPolicy, calls_by_id, prepared_text, stub_for

log = logging.getLogger("lossless_context.pipeline.stub_prep")

_PREPARERS: dict[str, "StubPreparer"] = {}
_LOCK = threading.Lock()
_PASSES = 0  # passes in flight in this process (the preparer waits for them)
_IDLE = threading.Condition(_LOCK)
BATCH = 32  # results read and written per store round trip


class pass_running:  # noqa: N801 - a context manager used like a statement
    """Marks a pass in flight: preparers in this process wait until none is."""

    def __enter__(self) -> None:
        global _PASSES
        with _LOCK:
            _PASSES += 1

    def __exit__(self, *exc: Any) -> None:
        global _PASSES
        with _LOCK:
            _PASSES -= 1
            if _PASSES == 0:
                _IDLE.notify_all()


def _wait_for_passes(timeout: float, stopped: Callable[[], bool] = lambda: False) -> None:
    with _LOCK:
        if _PASSES:
            _IDLE.wait_for(lambda: _PASSES == 0 or stopped(), timeout=timeout)


class StubPreparer:
    """One daemon thread per store location, fed message ids with their tool calls."""

    def __init__(self, store: Store, policy: StubPolicy) -> None:
        self.store = store
        self.policy = policy
        self._todo: deque[tuple[int, tuple[str, str] | None]] = deque()
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self.prepared = 0  # verdicts written (stubs and "not worth one")
        self.busy = False
        self.stopped = False  # its store closed: nothing more is read or written

    @classmethod
    def for_store(cls, location: str, store: Store, policy: StubPolicy) -> "StubPreparer":
        with _LOCK:
            p = _PREPARERS.get(location)
            if p is None or p.store is not store or p.policy != policy:
                p = _PREPARERS[location] = cls(store, policy)
                hook = getattr(store, "add_close_hook", None)
                if hook is not None:
                    # Closing a store closes the connections its threads use: a batch under way
                    # on a connection closed under it crashes the process. So the store's close
                    # first stops this thread (guard.GuardedStore runs the hook before closing).
                    hook(p.stop)
            return p

    def submit(self, items: Sequence[tuple[int, tuple[str, str] | None]]) -> None:
        if not items:
            return
        with self._cv:
            if self.stopped:
                return  # (a pass makes the stubs it needs itself)
            self._todo.extend(items)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="lcm-stub-prep", daemon=True)
                self._thread.start()
            self._cv.notify()

    @property
    def backlog(self) -> int:
        with self._cv:
            return len(self._todo) + (1 if self.busy else 0)

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """(tests and the bench) True once everything submitted is prepared."""
        with self._cv:
            return self._cv.wait_for(lambda: not self._todo and not self.busy, timeout=timeout)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop for good, waiting (bounded) for the batch under way: the store is closing."""
        with self._cv:
            self.stopped = True
            self._todo.clear()
            self._cv.notify_all()
        with _LOCK:
            _IDLE.notify_all()  # a batch waiting for passes to end gives up now
            for loc, p in list(_PREPARERS.items()):
                if p is self:
                    _PREPARERS.pop(loc)
        with self._cv:
            if not self._cv.wait_for(lambda: not self.busy, timeout=timeout):
                log.debug("lcm: the stub preparer did not stop within %.0f s", timeout)

    def _run(self) -> None:
        while True:
            with self._cv:
                if self.stopped:
                    self._thread = None
                    return
                if not self._todo:
                    self._cv.wait(timeout=30.0)
                    if not self._todo:
                        self._thread = None
                        return
                batch = [self._todo.popleft() for _ in range(min(BATCH, len(self._todo)))]
                self.busy = True
            try:
                self._prepare(batch)
            except Exception as exc:  # a pass makes what is missing: nothing is lost
                log.debug("lcm: preparing tool-output stubs failed: %s", exc)
            finally:
                with self._cv:
                    self.busy = False
                    self._cv.notify_all()

    def _prepare(self, batch: list[tuple[int, tuple[str, str] | None]]) -> None:
        _wait_for_passes(60.0, self._stopping)
        if self.stopped:
            return
        records = self.store.get_messages([mid for mid, _ in batch])
        out: list[tuple[int, str]] = []
        for mid, call in batch:
            rec = records.get(mid)
            if rec is None or rec.role != "tool" or rec.large or rec.exploration or not isinstance(rec.raw, dict):
                continue  # gone, shown by a representation already, or decided before
            if rec.tokens < self.policy.min_tokens:
                continue  # never stubbed
            _wait_for_passes(60.0, self._stopping)  # (between stubs: a pass that starts meanwhile goes first)
            if self.stopped:
                return
            out.append((mid, prepared_text(self.policy, stub_for(rec, rec.raw, call, self.policy))))
        if out and not self.stopped:
            self.store.prepare_representations(out)
            self.prepared += len(out)

    def _stopping(self) -> bool:
        return self.stopped


def prepare_new(store: Store, policy: StubPolicy, slots: Sequence[Slot], new_ids: Sequence[int]) -> None:
    """Hand an ingest's new tool results to the store's preparer: their tier-0 stubs are made
    between passes, not by the pass that first finds them old."""
    new = set(new_ids)
    results = [s for s in slots if s.kind == "m" and s.role == "tool" and s.refs[0] in new
               and (s.text_tokens or s.tokens) >= policy.min_tokens]
    if not results:
        return
    calls = calls_by_id(slots)
    StubPreparer.for_store(store.location, store, policy).submit(
        [(s.refs[0], calls.get(s.result_for or "")) for s in results])


def drop(location: str) -> None:
    """Forget a location's preparer (its store closed)."""
    with _LOCK:
        _PREPARERS.pop(location, None)


@atexit.register
def _stop_all() -> None:
    # At exit the interpreter tears down the sqlite3 module under a daemon thread still inside a
    # store call: the preparers stop their batch first (bounded; a batch is a few stubs).
    with _LOCK:
        preparers = list(_PREPARERS.values())
    for p in preparers:
        p.stop(timeout=2.0)
