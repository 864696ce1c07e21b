"""Retention: pruning a store by age and by size (`lcm prune`, the `retention:` config block).

The unit is a *lineage*: sessions joined by a parent link or a shared conversation id (a
branch and its parent, a gateway's conversation, the host's background forks), because a
branch's context may hold its parent's summaries. A lineage's last activity is the newest of
its sessions' last writes and message times (the host's times: an imported history keeps its
age). A lineage is never touched while one of its sessions is bound to an engine of this
process, nor when it was active within the last day (``MIN_AGE_DAYS``), whatever was asked.

Two modes. ``sessions`` (the default) removes whole lineages with the machinery of
``lcm forget`` (edits/forget.py): everything summarised from them goes too, another
session whose context referred to it is repaired. ``originals`` (``keep_summaries``) keeps
the summaries and the DAG and removes only the messages under them (never one an active
context still holds); each summary records how many originals went and when, which
``lcm_expand`` and ``lcm_grep`` say.

Plans first (``plan_prune``, also what ``--dry-run`` prints), then removes in small
transactions (``prune``): each takes rows while their predicted cost fits a time budget
(ops/batches.py: weighed by their text, the rate measured as it goes) and commits partway
once a deadline passes (``Store.remove_rows``: the rest leads the next), with a pause
between, so a host's write never waits long behind a prune; then the freed pages go back to
the file system (SQLite with incremental auto-vacuum; PostgreSQL leaves it to VACUUM). Every
prune is logged in the store (an interrupted one is finished by ``lcm doctor --repair``).

``schedule`` applies the configured policy in the background: a daemon thread per store and
process, at most once per ``interval_hours`` per store (the log in the store says when the
last prune ran, whichever process ran it), never on the host's turn path.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..config import RetentionPolicy
from ..edits.forget import plan_forget
from ..store.base import Store
from .batches import BatchLog, TimedBatches

log = logging.getLogger("lossless_context")

DAY = 86_400.0
MIN_AGE_DAYS = 1.0  # a lineage active within this is never pruned
# Between two transactions: other writers get the lock. A writer kept waiting retries on
# SQLite's busy-handler schedule (1, 2, 5, 10, 15, 20, 25, 25 ms ...), so a pause of 25-30 ms
# would in theory do, but on a loaded machine the waiting host is not always running when it
# comes: measured at 250,000 messages, 30 ms took the host's writes during a prune from p99
# 98 to 149 ms (over 100 ms 1.0% -> 1.8%) for x1.9 the throughput; 50 ms keeps the bound.
PAUSE_SECONDS = 0.05
LOCK_NAME = "\x00lcm-retention"  # (a compaction-lock name no session can have)
AUTO_DELAY_SECONDS = 60.0  # the background prune starts this long after the store is opened

_UNITS = {"": 1 << 20, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
          "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40}


def parse_size(text: str) -> int:
    """``500MB``, ``2G``, ``1.5GiB``, ``800k`` → bytes (a bare number is megabytes)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(text))
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in _UNITS:
        raise ValueError(f"not a size: {text!r} (e.g. 500MB, 2GB)")
    return int(float(m.group(1)) * _UNITS[unit])


def human_bytes(n: float | None) -> str:
    if n is None:
        return "?"
    n = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:,.1f} TB"  # pragma: no cover


def removed_note(span: dict[str, Any]) -> str:
    """How the tools say that a summary's originals are gone (a pruned span's record)."""
    when = time.strftime("%Y-%m-%d", time.gmtime(float(span.get("pruned_at") or 0)))
    n = int(span.get("messages") or 0)
    return (f"{n} original message{'' if n == 1 else 's'} under this summary (m{span.get('first_id')}…"
            f"m{span.get('last_id')}) removed by {span.get('reason') or 'retention'} on {when}; the summary is"
            " what remains")


# --------------------------------------------------------------------------- lineages


@dataclass
class Lineage:
    sessions: list[str]
    last_activity: float
    messages: int
    tokens: int  # messages' and published summaries' tokens: its share of the store
    message_tokens: int = 0
    live: bool = False
    est_bytes: int = 0  # what removing it gives back (estimated from its share)
    removable: int = 0  # messages a prune would remove (the originals mode: those under summaries)

    def as_dict(self, now: float) -> dict[str, Any]:
        return {"sessions": self.sessions, "last_activity": self.last_activity,
                "age_days": round((now - self.last_activity) / DAY, 1), "messages": self.messages,
                "removable_messages": self.removable, "est_bytes": self.est_bytes}


def lineages(store: Store, live: Sequence[str] = ()) -> list[Lineage]:
    """Every lineage of the store, oldest activity first."""
    rows = store.session_activity()
    parent: dict[str, str] = {r["id"]: r["id"] for r in rows}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(a: str, b: str) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[ra] = rb

    by_conv: dict[str, str] = {}
    for r in rows:
        if r.get("parent_id") in parent:
            union(r["id"], r["parent_id"])
        conv = r.get("conversation_id")
        if conv:
            if conv in by_conv:
                union(r["id"], by_conv[conv])
            else:
                by_conv[conv] = r["id"]
    groups: dict[str, Lineage] = {}
    live_set = set(live)
    for r in rows:
        root = find(r["id"])
        g = groups.setdefault(root, Lineage([], 0.0, 0, 0))
        g.sessions.append(r["id"])
        g.last_activity = max(g.last_activity, float(r.get("updated_at") or 0), float(r.get("last_message_at") or 0))
        g.messages += int(r.get("messages") or 0)
        g.message_tokens += int(r.get("tokens") or 0)
        g.tokens += int(r.get("tokens") or 0) + int(r.get("summary_tokens") or 0)
        g.live = g.live or r["id"] in live_set
    return sorted(groups.values(), key=lambda g: (g.last_activity, g.sessions[0]))


# --------------------------------------------------------------------------- planning


@dataclass
class PrunePlan:
    mode: str  # "sessions" | "originals"
    now: float
    older_than_days: float | None
    max_bytes: int | None
    used_bytes: int  # the store's size now (SQLite: pages in use; PostgreSQL: its tables)
    file_bytes: int
    lineages: list[Lineage] = field(default_factory=list)  # what goes, oldest first
    protected: int = 0  # lineages that would qualify but are live or active within a day

    @property
    def est_freed(self) -> int:
        return sum(g.est_bytes for g in self.lineages)

    @property
    def sessions(self) -> list[str]:
        return [s for g in self.lineages for s in g.sessions]

    def as_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "older_than_days": self.older_than_days, "max_bytes": self.max_bytes,
                "used_bytes": self.used_bytes, "file_bytes": self.file_bytes, "est_freed_bytes": self.est_freed,
                "protected_lineages": self.protected, "messages": sum(g.removable for g in self.lineages),
                "lineages": [g.as_dict(self.now) for g in self.lineages]}


def plan_prune(store: Store, *, older_than_days: float | None = None, max_bytes: int | None = None,
               keep_summaries: bool = False, live: Sequence[str] = (), now: float | None = None) -> PrunePlan:
    """What a prune would remove: by age (lineages last active before ``older_than_days``),
    then by size (the oldest of the rest until the store's estimated size is under
    ``max_bytes``). Reads only."""
    now = time.time() if now is None else now
    space = store.space()
    plan = PrunePlan("originals" if keep_summaries else "sessions", now, older_than_days, max_bytes,
                     int(space["used_bytes"]), int(space["file_bytes"]))
    groups = lineages(store, live)
    total = sum(g.tokens for g in groups) or 1
    floor = now - MIN_AGE_DAYS * DAY
    for g in groups:
        g.est_bytes = int(plan.used_bytes * g.tokens / total)
        g.removable = g.messages
    chosen: list[Lineage] = []

    def take(g: Lineage) -> bool:
        if g.live or g.last_activity >= floor:
            return False
        if keep_summaries:
            g.removable = len(store.originals_under_summaries(g.sessions))
            if not g.removable:
                return False  # pruned before (or never summarised): nothing to remove
            # (the share of its messages' tokens that the removable ones hold)
            g.est_bytes = int(plan.used_bytes * g.message_tokens * g.removable / max(1, g.messages) / total)
        chosen.append(g)
        return True

    rest = []
    for g in groups:
        if older_than_days is not None and g.last_activity < now - older_than_days * DAY:
            take(g)
        else:
            rest.append(g)
    if max_bytes is not None:
        left = plan.used_bytes - sum(g.est_bytes for g in chosen)
        for g in rest:
            if left <= max_bytes:
                break
            if take(g):
                left -= g.est_bytes
    plan.protected = sum(1 for g in groups if g not in chosen and (g.live or g.last_activity >= floor)
                         and _qualifies(g, older_than_days, now))
    plan.lineages = chosen
    return plan


def _qualifies(g: Lineage, older_than_days: float | None, now: float) -> bool:
    return older_than_days is not None and g.last_activity < now - older_than_days * DAY


# --------------------------------------------------------------------------- removing


@dataclass
class PruneReport:
    plan: PrunePlan
    sessions: int = 0
    messages: int = 0
    summaries: int = 0
    skipped: list[str] = field(default_factory=list)  # lineages (first session) that came alive meanwhile
    batch_log: BatchLog = field(default_factory=BatchLog)
    bytes_returned: int = 0
    used_after: int = 0
    file_after: int = 0
    seconds: float = 0.0
    run_id: int | None = None

    @property
    def transactions(self) -> int:
        return self.batch_log.transactions

    @property
    def longest_tx_ms(self) -> float:
        return self.batch_log.longest_s * 1000

    def as_dict(self) -> dict[str, Any]:
        return {"plan": self.plan.as_dict(), "sessions": self.sessions, "messages": self.messages,
                "summaries": self.summaries, "skipped_now_active": self.skipped, "transactions": self.transactions,
                "longest_transaction_ms": round(self.longest_tx_ms, 1),
                "stopped_at_deadline": self.batch_log.stopped,
                "longest_lock_wait_ms": round(self.batch_log.longest_wait_s * 1000, 1), "bytes_returned": self.bytes_returned,
                "used_bytes_after": self.used_after, "file_bytes_after": self.file_after,
                "seconds": round(self.seconds, 2), "run_id": self.run_id}


def _batches(store: Store, rep: PruneReport, pause: float, clock: Callable[[], float] | None = None) -> TimedBatches:
    """The prune's transactions (ops/batches.py), counted in its report as they run."""
    groups = store.removal_groups
    b = TimedBatches(pause=pause, groups=groups) if clock is None else TimedBatches(pause=pause, groups=groups,
                                                                                    clock=clock)
    b.log = rep.batch_log
    return b


def _still_idle(store: Store, g: Lineage, floor: float, live: Callable[[], set[str]]) -> bool:
    """Re-checked just before a lineage is touched: no session of it was written since the
    plan, or is bound to an engine here now."""
    alive = live()
    for sid in g.sessions:
        if sid in alive:
            return False
        row = store.get_session(sid)
        if row is not None and float(row.get("updated_at") or 0) >= floor:
            return False
    return True


def prune(store: Store, plan: PrunePlan, *, trigger: str = "cli", pause: float = PAUSE_SECONDS,
          live: Callable[[], set[str]] | None = None, reclaim_seconds: float = 120.0,
          clock: Callable[[], float] | None = None) -> PruneReport:
    """Carry out ``plan`` (see the module doc). Runs beside live sessions. ``clock``: what
    the transactions are timed by (tests inject one)."""
    t0 = time.monotonic()
    rep = PruneReport(plan)
    live_fn = live or (lambda: set())
    floor = min(plan.now, time.time()) - MIN_AGE_DAYS * DAY
    rep.run_id = store.retention_run_start(plan.mode, trigger, {"sessions": plan.sessions,
                                                                "older_than_days": plan.older_than_days,
                                                                "max_bytes": plan.max_bytes, "pid": os.getpid(),
                                                                "host": socket.gethostname()}, plan.used_bytes)
    _RUNNING.add((store.location, rep.run_id))
    try:
        with store.merges_held():  # (the pauses are the host's: this process merges after)
            _carry_out(store, plan, rep, _batches(store, rep, pause, clock), live_fn, floor)
            rep.bytes_returned = store.reclaim_space(reclaim_seconds, pause)
        space = store.space()
        rep.used_after, rep.file_after = int(space["used_bytes"]), int(space["file_bytes"])
        store.retention_run_finish(rep.run_id, rep.sessions, rep.messages, rep.summaries, rep.used_after)
    finally:
        _RUNNING.discard((store.location, rep.run_id))
    rep.seconds = time.monotonic() - t0
    log.info("lcm retention (%s, %s): removed %d sessions, %d messages, %d summaries in %d transactions "
             "(longest %.0f ms); store %s → %s", trigger, plan.mode, rep.sessions, rep.messages, rep.summaries,
             rep.transactions, rep.longest_tx_ms, human_bytes(plan.used_bytes), human_bytes(rep.used_after))
    return rep


def _carry_out(store: Store, plan: PrunePlan, rep: PruneReport, batches: TimedBatches,
               live_fn: Callable[[], set[str]], floor: float) -> None:
    todo = list(plan.lineages)
    done: set[str] = set()
    while todo:
        g = todo.pop(0)
        done.add(g.sessions[0])
        if not _still_idle(store, g, floor, live_fn):
            rep.skipped.append(g.sessions[0])
        elif plan.mode == "originals":
            rep.messages += _run_originals(store, g.sessions, batches, plan.now)
        else:
            _remove_sessions(store, g.sessions, batches, rep)
        if not todo and plan.max_bytes is not None:
            # The plan's sizes are estimates: where the store measures what is in use (SQLite's
            # pages), go on with the next oldest until it is really under the limit.
            space = store.space()
            if space.get("measured") and space["used_bytes"] > plan.max_bytes:
                nxt = plan_prune(store, max_bytes=plan.max_bytes, keep_summaries=plan.mode == "originals",
                                 live=sorted(live_fn()))
                todo = [x for x in nxt.lineages if x.sessions[0] not in done][:1]


def _run_originals(store: Store, sessions: Sequence[str], batches: TimedBatches, at: float) -> int:
    """The originals under summaries that stay: each summary records what went (in the
    transaction that removes them), then the messages go as `lcm forget` removes them."""
    ids = store.originals_under_summaries(sessions)
    return batches.run(ids, lambda groups, seconds: store.remove_rows(
        "messages", groups, seconds=seconds, clock=batches.clock, pruned_at=at),
        store.removal_tokens(ids, [])["messages"])


def _remove_sessions(store: Store, sessions: Sequence[str], batches: TimedBatches, rep: PruneReport) -> None:
    """`lcm forget` of these sessions, in small transactions: other sessions' contexts
    repaired first, then the messages, then the summaries, then the sessions themselves."""
    existing = [s for s in sessions if store.get_session(s) is not None]
    if not existing:
        return
    fp = plan_forget(store, existing, every_stage=False)
    if fp.contexts:
        store.forget_records([], [], [], fp.contexts)
    tokens = store.removal_tokens(fp.message_ids, fp.summary_ids)

    def remove(kind: str) -> Callable[[list[list[int]], float], tuple[int, int, float]]:
        return lambda groups, seconds: store.remove_rows(kind, groups, seconds=seconds, clock=batches.clock)

    rep.messages += batches.run(fp.message_ids, remove("messages"), tokens["messages"])
    rep.summaries += batches.run(fp.summary_ids, remove("summaries"), tokens["summaries"])
    # what arrived meanwhile (nothing, unless a session came alive after the last check)
    late_m = [m for t in fp.targets for m in store.session_message_ids(t)]
    late_s = [s for t in fp.targets for s in store.session_summary_ids(t)]
    counts = store.forget_records(fp.targets, late_m, late_s, {})
    rep.messages += counts.get("messages", 0)
    rep.summaries += counts.get("summaries", 0)
    rep.sessions += counts.get("sessions", 0)


def run_policy(store: Store, policy: RetentionPolicy, *, trigger: str = "auto",
               live: Callable[[], set[str]] | None = None, pause: float = PAUSE_SECONDS) -> PruneReport | None:
    """Apply a configured policy once, unless another process is pruning this store now."""
    if not policy.enabled:
        return None
    with store.compaction_lock(LOCK_NAME, 0) as got:
        if not got:
            return None
        plan = plan_prune(store, older_than_days=policy.max_age_days or None,
                          max_bytes=int(policy.max_store_mb * (1 << 20)) or None,
                          keep_summaries=policy.keep_summaries, live=sorted(live() if live else ()))
        return prune(store, plan, trigger=trigger, pause=pause, live=live)


_RUNNING: set[tuple[str, int]] = set()  # (store location, run id) of prunes running in this process
STALE_REMOTE_SECONDS = 6 * 3600.0  # a prune of another machine unfinished after this is taken as dead


def interrupted(store: Store) -> list[dict[str, Any]]:
    """Prunes that never finished and are not running: their process is gone (or, on another
    machine, they started more than STALE_REMOTE_SECONDS ago)."""
    out = []
    for r in store.retention_runs(20):
        if r["finished_at"] is not None or (store.location, r["id"]) in _RUNNING:
            continue
        host, pid = r["plan"].get("host"), int(r["plan"].get("pid") or 0)
        if host == socket.gethostname():
            if pid != os.getpid() and _alive(pid):
                continue
        elif r["started_at"] > time.time() - STALE_REMOTE_SECONDS:
            continue
        out.append(r)
    return out


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # (someone else's process: alive)
        return True
    return True


def finish_interrupted(store: Store) -> int:
    """Carry out what interrupted prunes had planned (`lcm doctor --repair`): the sessions of
    the plan still there are removed (``sessions`` mode) or lose the originals under their
    summaries (``originals``). Returns the prunes finished."""
    done = 0
    for run in interrupted(store):
        sessions = [s for s in run["plan"].get("sessions", []) if store.get_session(s) is not None]
        plan = PrunePlan(run["mode"], time.time(), run["plan"].get("older_than_days"), run["plan"].get("max_bytes"),
                         0, 0)
        if sessions:
            plan.lineages = [Lineage(sessions, 0.0, 0, 0)]
        rep = PruneReport(plan)
        batches = _batches(store, rep, PAUSE_SECONDS)
        if sessions and run["mode"] == "originals":
            rep.messages += _run_originals(store, sessions, batches, time.time())
        elif sessions:
            _remove_sessions(store, sessions, batches, rep)
        store.retention_run_finish(run["id"], rep.sessions, rep.messages, rep.summaries, None)
        done += 1
    return done


# --------------------------------------------------------------------------- in the background


class _Scheduler:
    def __init__(self, store: Store, policy: RetentionPolicy, live: Callable[[], set[str]], delay: float) -> None:
        self.store, self.policy, self.live, self.delay = store, policy, live, delay
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="lcm-retention", daemon=True)
        self.last: PruneReport | None = None
        self.error: str | None = None

    def _due(self) -> bool:
        runs = self.store.retention_runs(1)
        return not runs or runs[0]["started_at"] < time.time() - self.policy.interval_hours * 3600

    def _run(self) -> None:
        wait = self.delay
        while not self.stop.wait(wait):
            wait = min(3600.0, self.policy.interval_hours * 3600)
            try:
                if self._due():
                    self.last = run_policy(self.store, self.policy, trigger="auto", live=self.live)
                    self.error = None
            except Exception as exc:  # the store is down, or the file went: try again later
                self.error = f"{type(exc).__name__}: {exc}"
                log.warning("lcm retention: the background prune failed: %s", self.error)


_SCHEDULERS: dict[str, _Scheduler] = {}
_SCHEDULERS_LOCK = threading.Lock()


def schedule(store: Any, policy: RetentionPolicy, live: Callable[[], set[str]],
             delay: float | None = None) -> bool:
    """Apply ``policy`` to ``store`` in the background (one thread per store location and
    process; touches nothing on the caller's thread). False when retention is off."""
    if not policy.enabled or getattr(store, "read_only", False):
        return False
    key = str(getattr(store, "location", id(store)))
    with _SCHEDULERS_LOCK:
        cur = _SCHEDULERS.get(key)
        if cur is not None and cur.thread.is_alive():
            cur.policy = policy
            return True
        sch = _SCHEDULERS[key] = _Scheduler(store, policy, live, AUTO_DELAY_SECONDS if delay is None else delay)
        sch.thread.start()
    hook = getattr(store, "add_close_hook", None)
    if callable(hook):
        hook(lambda: unschedule(key))
    return True


def unschedule(location: str) -> None:
    with _SCHEDULERS_LOCK:
        sch = _SCHEDULERS.pop(location, None)
    if sch is not None:
        sch.stop.set()


def scheduled(location: str) -> dict[str, Any] | None:
    """The background prune of a store in this process: its policy and last result."""
    sch = _SCHEDULERS.get(location)
    if sch is None:
        return None
    return {"policy": sch.policy.as_dict(), "alive": sch.thread.is_alive(), "error": sch.error,
            "last": sch.last.as_dict() if sch.last is not None else None}
