"""Zero-wait compaction: a bounded background worker that summarises between turns.

Above the soft threshold the worker summarises the spans the next compaction will take
and keeps them as *presummaries* keyed by the exact stored messages they cover; compress()
then adopts them without a model call. On the released host, compress() summarises
missing spans deterministically (milliseconds) and the worker upgrades those nodes with
the model afterwards; the better text is used from the next pass on. The worker never
holds a store transaction while waiting on the network, runs one job per session at a
time, and its daemon threads never keep a process alive.
"""

from __future__ import annotations

import atexit
import logging
import queue
import threading
import time
from typing import Any, Callable

from .assemble import Slot
from .compaction import Budget, Compactor, plan_region, show_representations, source_text, span_key
from ..records import Source
from ..messages import tool_call_ids
from ..store.base import Store
from .stubs import StubPolicy, apply_stubs
from ..summarizers.summarize import OUTLINE, Escalator, SummaryRequest, SummaryResult, deterministic_summary
from ..tokens import estimate_text_tokens

log = logging.getLogger("lossless_context.pipeline.background")

_WORKERS: dict[str, "BackgroundWorker"] = {}
_WORKERS_LOCK = threading.Lock()


class BackgroundWorker:
    """Daemon threads fed by a queue; at most one job per session in flight."""

    def __init__(self, concurrency: int = 2) -> None:
        self.concurrency = max(1, int(concurrency))
        self._q: queue.Queue[tuple[str, Callable[[Callable[[], bool]], object], Any] | None] = queue.Queue()
        self._busy: set[str] = set()
        self._queued: set[str] = set()
        self._lock = threading.Lock()
        self._store_idle = threading.Condition(self._lock)
        # Per store object (by id; the dicts hold it, so an id is never reused meanwhile): the
        # stores whose close stops their jobs first, those closed, and the jobs running on each.
        self._hooked: dict[int, Any] = {}
        self._closed: dict[int, Any] = {}
        self._using: dict[int, int] = {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.jobs_done = 0
        self.jobs_failed = 0
        self.model_seconds = 0.0  # time spent summarising off the critical path
        self.max_parallel = 0
        self._running = 0
        for i in range(self.concurrency):
            t = threading.Thread(target=self._loop, name=f"lcm-bg-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    @classmethod
    def for_store(cls, location: str, concurrency: int) -> "BackgroundWorker":
        with _WORKERS_LOCK:
            w = _WORKERS.get(location)
            if w is None or w.stopped:
                w = _WORKERS[location] = cls(concurrency)
            return w

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    @property
    def backlog(self) -> int:
        with self._lock:
            return len(self._queued) + len(self._busy)

    def submit(self, session_id: str, job: Callable[[Callable[[], bool]], object], store: Any = None) -> bool:
        """Queue a job unless one for this session is already queued (the newest plan wins
        when it runs, so coalescing loses nothing). `store`: the store the job works on —
        its close first stops the job (a job writing on a connection closed under it crashes
        the process), and its queued jobs are dropped."""
        if self._stop.is_set():
            return False
        hook = None
        with self._lock:
            if session_id in self._queued or (store is not None and id(store) in self._closed):
                return False
            self._queued.add(session_id)
            if store is not None and id(store) not in self._hooked:
                self._hooked[id(store)] = store
                hook = getattr(store, "add_close_hook", None)
        if hook is not None:
            hook(lambda: self.release_store(store))
        self._q.put((session_id, job, store))
        return True

    def release_store(self, store: Any, timeout: float = 10.0) -> bool:
        """The store is closing: its queued jobs are dropped, its running ones see their stop
        flag before the next model call, and this waits (bounded) until none runs on it."""
        key = id(store)
        with self._store_idle:
            self._closed[key] = store
            self._hooked.pop(key, None)
            done = self._store_idle.wait_for(lambda: not self._using.get(key), timeout=timeout)
        if not done:
            log.debug("lcm: a background job on %s did not stop within %.0f s", getattr(store, "location", store),
                      timeout)
        return done

    def _stop_check(self, store: Any) -> Callable[[], bool]:
        """A job's stop flag: the process ends, or its store is closing."""
        key = id(store)
        return lambda: self._stop.is_set() or (store is not None and key in self._closed)

    def released(self, store: Any) -> bool:
        """Whether `store`'s close has stopped its jobs here."""
        with self._lock:
            return id(store) in self._closed

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                item = self._q.get(timeout=0.5)
            except queue.Empty:
                continue
            if item is None:
                return
            sid, job, store = item
            key = id(store)
            with self._lock:
                if store is not None and key in self._closed:  # its store closed: dropped
                    self._queued.discard(sid)
                    continue
                if sid in self._busy:  # one job per session: wait behind the running one
                    requeue = True  # (stays marked as queued, so the backlog never reads 0 here)
                else:
                    self._queued.discard(sid)
                    self._busy.add(sid)
                    self._running += 1
                    self.max_parallel = max(self.max_parallel, self._running)
                    self._using[key] = self._using.get(key, 0) + 1
                    requeue = False
            if requeue:
                time.sleep(0.05)
                self._q.put((sid, job, store))
                continue
            started = time.monotonic()
            ok = False
            try:
                job(self._stop_check(store))
                ok = True
            except Exception as exc:  # a failed job loses only staged work
                # (the store's outage was told by its breaker; anything else with its traceback)
                log.warning("lcm background job for %s failed: %s", sid, exc,
                            exc_info=None if type(exc).__name__ == "StoreUnavailable" else exc)
            finally:
                # The counters are read-modify-write from several threads: under the lock, or a
                # count may be lost.
                with self._lock:
                    if ok:
                        self.jobs_done += 1
                    else:
                        self.jobs_failed += 1
                    self.model_seconds += time.monotonic() - started
                    self._busy.discard(sid)
                    self._running -= 1
                    self._using[key] -= 1
                    if not self._using[key]:
                        del self._using[key]
                        self._store_idle.notify_all()

    def wait_idle(self, timeout: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.backlog == 0:
                return True
            time.sleep(0.02)
        return False

    def shutdown(self, wait: float = 0.0) -> bool:
        """Stop promptly: jobs see the stop flag before and after each model call. `wait`: how
        long to wait for the running ones to end (whether they did)."""
        self._stop.set()
        for _ in self._threads:
            self._q.put(None)
        with self._store_idle:
            return self._store_idle.wait_for(lambda: self._running == 0, timeout=wait)


@atexit.register
def _shutdown_all() -> None:
    # At exit the interpreter tears down the sqlite3 module under any daemon thread still inside
    # a store call (a crash as the process ends): let the running jobs reach their stop check,
    # bounded (a job inside a model call stops at its return, writing nothing).
    with _WORKERS_LOCK:
        workers = list(_WORKERS.values())
    deadline = time.monotonic() + 5.0
    for w in workers:
        w.shutdown(wait=max(0.0, deadline - time.monotonic()))


class UpgradeQueue:
    """Node ids waiting for the worker's model summary, per session. A pass adds its ids and one
    job per session drains them when it runs: a job already queued (the worker coalesces a
    session's jobs) takes a later pass's ids too, so none is left an outline."""

    def __init__(self) -> None:
        self._ids: dict[str, set[int]] = {}
        self._lock = threading.Lock()

    def add(self, session_id: str, node_ids: list[int]) -> None:
        with self._lock:
            self._ids.setdefault(session_id, set()).update(node_ids)

    def take(self, session_id: str) -> list[int]:
        with self._lock:
            return sorted(self._ids.pop(session_id, ()))


class SessionGrowth:
    """The spend bound of summarising ahead: a summary made before a pass needs it is spent for
    nothing if the session never reaches its threshold (a short task that ends, a session left
    open). So the worker summarises ahead only for a session that grew in each of its last
    turns, the last two within GROWTH_IDLE_SECONDS of each other (one that sat idle has to grow
    twice again), and whose growth per turn reaches the compaction threshold within
    AHEAD_TURNS turns. One engine's record; a new process (`hermes chat -q`, one per turn,
    whose worker would not outlive the turn) never summarises ahead."""

    GROWTH_IDLE_SECONDS = 900.0
    AHEAD_TURNS = 4
    MIN_GROWTH = 50  # tokens: less is no growth (a re-sent list)
    SESSIONS = 64

    def __init__(self) -> None:
        self._seen: dict[str, list[tuple[float, int]]] = {}
        self._lock = threading.Lock()

    def note(self, session_id: str, tokens: int) -> Callable[[int], bool]:
        """Record a turn's size; returns whether summarising ahead pays for a threshold."""
        now = time.monotonic()
        with self._lock:
            seen = self._seen.pop(session_id, [])
            seen = (seen + [(now, int(tokens))])[-(self.AHEAD_TURNS + 1):]
            self._seen[session_id] = seen  # (re-inserted: the newest session is the last to go)
            while len(self._seen) > self.SESSIONS:
                self._seen.pop(next(iter(self._seen)))
            turns = list(seen)

        def pays(threshold: int) -> bool:
            if len(turns) < 3:
                return False
            (t0, a), (t1, b), (t2, c) = turns[-3:]
            if b - a < self.MIN_GROWTH or c - b < self.MIN_GROWTH or t2 - t1 > self.GROWTH_IDLE_SECONDS:
                return False
            per_turn = (c - turns[0][1]) / (len(turns) - 1)
            return threshold - c <= self.AHEAD_TURNS * per_turn

        return pays


def context_slots(store: Store, session_id: str) -> tuple[list[Slot], dict[int, Any]]:
    """The session's published context as slots, with its message records."""
    _, ctx = store.get_context(session_id)
    records = store.get_messages([e.ref for e in ctx if e.kind == "m"])
    slots: list[Slot] = []
    for e in ctx:
        if e.kind == "s":
            if slots and slots[-1].kind == "s":
                slots[-1].refs.append(e.ref)
            else:
                slots.append(Slot("s", [e.ref], None, "summary", e.tokens))
            continue
        rec = records.get(e.ref)
        if rec is None or not isinstance(rec.raw, dict) or rec.role in ("invalid", "unknown"):
            slots.append(Slot("x", [e.ref], None, e.role, 0))
            continue
        raw = rec.raw
        slots.append(Slot("m", [e.ref], raw, rec.role, e.tokens, call_ids=tool_call_ids(raw),
                          result_for=raw.get("tool_call_id") if rec.role == "tool" else None,
                          text_tokens=e.tokens))
    return slots, records


Observer = Callable[[SummaryResult], None]


def _observed(observe: Observer | None, res: SummaryResult) -> None:
    if observe is not None and res.calls:
        observe(res)  # the engine counts the worker's model calls and spend with its passes'


def counting(stats: dict[str, Any], lock: Any, ledger: Any, session_id: str) -> Observer:
    """An observer that counts the worker's model calls with the passes' (/lcm status reads
    `stats` under `lock`) and adds their spend to the session's in `ledger` (costs.SpendLedger)."""
    def seen(res: SummaryResult) -> None:
        with lock:
            for k, v in (("summarizer_calls", res.calls), ("summarizer_failures", res.failures),
                         ("background_calls", res.calls)):
                stats[k] = stats.get(k, 0) + v
        ledger.record_background(session_id, res.spend)
    return seen


def presummarize(store: Store, esc: Escalator, session_id: str, budget: Budget,
                 stop: Callable[[], bool], stubs: StubPolicy | None = None,
                 observe: Observer | None = None) -> int:
    """Summarise, with the model, the stable chunks the next compaction will take.

    The chunks are planned the way compaction plans them: over what the model is shown
    (tier-0 stubs, which are made once and persisted, and huge messages' representations),
    so the spans match and compress() adopts these summaries."""
    slots, records = context_slots(store, session_id)
    h = Compactor.head_end(slots, budget.protect_first_n)
    if stubs is not None:
        apply_stubs(store, slots, records, stubs, head_end=h)
    show_representations(slots, records)
    t = Compactor.tail_start(slots, h, budget.fresh_tail)
    done = 0
    for kind, chunk, full in plan_region(slots, h, t, records, budget.leaf_chunk):
        if kind != "chunk" or not full or stop():
            continue
        mids = [s.refs[0] for s in chunk]
        key = span_key(mids)
        if store.get_presummary(session_id, key) is not None:
            continue
        sources = [Source(f"m{s.refs[0]}", s.role, text, None)
                   for s in chunk if (text := source_text(s, records)) is not None]
        if not sources:
            continue
        src_tokens = sum(estimate_text_tokens(x.text) for x in sources)
        target = min(budget.leaf_summary, max(32, src_tokens // 2))
        res = esc.summarize(SummaryRequest(sources, target, "leaf"), cancelled=stop)
        _observed(observe, res)
        if stop():
            break
        if res.level == "deterministic":
            continue  # the model was unavailable: compress() will do it
        store.put_presummary(session_id, key, res.text, estimate_text_tokens(res.text), src_tokens,
                             res.level, res.summarizer)
        done += 1
    return done


def upgrade_nodes(store: Store, esc: Escalator, session_id: str, node_ids: list[int], budget: Budget,
                  stop: Callable[[], bool], observe: Observer | None = None) -> int:
    """Replace deterministic summaries written on the critical path by model summaries."""
    done = 0
    for nid in node_ids:
        if stop():
            break
        rec = store.get_summaries([nid], include_staged=True).get(nid)
        if rec is None or rec.level != "deterministic":
            continue  # discarded stage, or already upgraded
        kids, mids = store.summary_children(nid)
        if rec.kind == "leaf":
            records = store.get_messages(mids)
            sources = [Source(f"m{m}", records[m].role, text, None) for m in mids if m in records
                       and (text := source_text(Slot("m", [m], None, records[m].role, 0), records)) is not None]
            target = min(budget.leaf_summary, max(32, rec.source_tokens // 2))
        else:
            children = store.get_summaries(kids, include_staged=True)
            sources = [Source(f"s{k}", "summary", children[k].text, None) for k in kids if k in children]
            target = min(budget.condensed_summary, max(32, rec.source_tokens // 2))
        if not sources:
            continue
        res = esc.summarize(SummaryRequest(sources, target, rec.kind), cancelled=stop)
        _observed(observe, res)
        if stop():
            break  # (its store is closing, or the process ends: nothing more is written)
        if (sp := res.spend).calls:  # booked on the node, as a pass books its own calls (lcm_describe)
            store.put_summary_costs([(nid, sp.model, sp.calls, sp.input_tokens, sp.output_tokens,
                                      round(sp.seconds * 1000, 1))])
        if res.level == "deterministic":
            if rec.summarizer == OUTLINE and not stop():
                # No model summary now: the pass's outline gives way to the extractive summary
                # (made here, off the host's time); the node stays deterministic.
                text = deterministic_summary(SummaryRequest(sources, target, rec.kind), esc.do_redact)
                store.update_summary_text(nid, text, estimate_text_tokens(text), "deterministic", "extractive")
            continue
        store.update_summary_text(nid, res.text, estimate_text_tokens(res.text), res.level, res.summarizer)
        if rec.kind == "leaf":
            store.put_presummary(session_id, span_key(mids), res.text, estimate_text_tokens(res.text),
                                 rec.source_tokens, res.level, res.summarizer)
        done += 1
    return done


def leftover_outlines(store: Store, session_id: str) -> list[int]:
    """The outline placeholders still in a session's published context: their upgrade was lost
    when the process that made them ended first (a `hermes chat -q` turn exits right after its
    reply; the worker's daemon threads never hold a process), so the next engine to serve the
    session queues them again."""
    _, ctx = store.get_context(session_id)
    ids = [e.ref for e in ctx if e.kind == "s"]
    if not ids:
        return []
    recs = store.get_summaries(ids)
    return [i for i in ids if (r := recs.get(i)) is not None and r.summarizer == OUTLINE]
