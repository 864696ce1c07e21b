"""Automatic garbage collection paused around one bulk append.

A bulk append (thousands of new messages) allocates several long-lived objects per
message (its row, slot and context entry). Each few hundred allocations trigger a young
collection, and every tenth of those promotes into the oldest generation, whose
collection walks the whole heap — the host's as well as ours: with a long session in
memory that was 10–15% of ingest time, spent finding nothing (none of these objects form
cycles). While any bulk append runs, the collector is paused; the first one that starts
remembers whether it was enabled and the last one that ends restores that. Cyclic garbage
made meanwhile (by any thread) is collected as usual right after.

What the paused collector owes — one pass over the young objects the append made — is
paid by `settle()` at a moment the caller would otherwise wait (a pipelined append's
last rows are being written by the store's writer thread), not after the append.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from typing import Iterator

_lock = threading.Lock()
_holders = 0
_was_enabled = False


@contextlib.contextmanager
def paused() -> Iterator[None]:
    global _holders, _was_enabled
    with _lock:
        if _holders == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0 and _was_enabled:
                gc.enable()


def settle() -> None:
    """Collect the youngest generation now, if a pause left it large (see the module doc)."""
    if _holders and gc.get_count()[0] > gc.get_threshold()[0]:
        gc.collect(0)
