"""Several processes writing one store at once (both backends).

Four spawned processes each write their own session; two of them also write one shared
session concurrently: appends, compare-and-set context updates, and stage/publish passes
under ``compaction_lock``. Afterwards nothing may be lost, duplicated or reordered, every
message must be reachable from its session's context, and no two processes may ever
have held the same session's compaction lock at once.
"""

from __future__ import annotations

import json
import multiprocessing
import time
import traceback
from pathlib import Path

import pytest

from lossless_context.records import ContextEntry, NewMessage, NewSummary
from lossless_context.store import StoreError, open_store

N_PROCS = 4
SHARED_WRITERS = 2
ITERATIONS = 24
COMPACT_EVERY = 4
SHARED = "shared"


@pytest.fixture(params=["sqlite", "postgres"])
def location(request, tmp_path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "lcm" / "lcm.db")
    return request.getfixturevalue("pg_fresh_dsn")


def _text(proc: int, k: int, j: int) -> str:
    return f"proc{proc} iter{k} part{j} payload words for the index"


def _batch(k: int) -> int:
    return 1 + k % 3


def _set_context_cas(store, sid: str, new_ids: list[int]) -> int:
    """Append message refs to the published context; retry when another writer won."""
    for _ in range(200):
        version, entries = store.get_context(sid)
        try:
            return store.set_context(sid, [*entries, *(ContextEntry("m", i) for i in new_ids)],
                                     expected_version=version)
        except StoreError as exc:
            if "changed concurrently" not in str(exc):
                raise
            time.sleep(0.001)
    raise AssertionError("context CAS never succeeded")


def _compact(store, sid: str, proc: int, k: int, intervals: list) -> bool:
    with store.compaction_lock(sid, 30) as ok:
        if not ok:
            raise AssertionError(f"compaction lock on {sid} timed out")
        # CLOCK_MONOTONIC is one clock for every process on the machine and, unlike the wall
        # clock, never steps back: the intervals of different processes compare.
        enter = time.monotonic()
        version, entries = store.get_context(sid)
        half = len(entries) // 2
        prefix, rest = entries[:half], entries[half:]
        msg_ids = [e.ref for e in prefix if e.kind == "m"]
        sum_ids = [e.ref for e in prefix if e.kind == "s"]
        summaries: list[NewSummary] = []
        top: str | int | None = None
        if msg_ids:
            summaries.append(NewSummary(
                key="L", kind="leaf", depth=0, text=f"leaf by proc{proc} at {k}", tokens=5, source_tokens=50,
                level="normal", summarizer="mp", t_start=None, t_end=None, n_messages=len(msg_ids),
                message_ids=msg_ids))
            top = "L"
        if sum_ids and (msg_ids or len(sum_ids) > 1):
            summaries.append(NewSummary(
                key="C", kind="condensed", depth=1, text=f"condensed by proc{proc} at {k}", tokens=5,
                source_tokens=50, level="normal", summarizer="mp", t_start=None, t_end=None,
                n_messages=len(msg_ids), child_keys=[*sum_ids, *(["L"] if msg_ids else [])]))
            top = "C"
        if top is None:
            published = False
        else:
            pass_id = f"{sid}-p{proc}-k{k}"
            items = [("s", top), *((e.kind, e.ref) for e in rest)]
            store.stage_pass(sid, pass_id, summaries, items, version, len(entries))
            time.sleep(0.005)  # let the other writer move the context meanwhile
            published = store.publish_pass(pass_id)
        exit_ = time.monotonic()
        intervals.append((sid, enter, exit_, proc))
        return published


def _worker(location: str, proc: int, out_dir: str, barrier) -> None:
    result: dict = {"proc": proc, "errors": [], "published": {}}
    intervals: list = []
    store = None
    try:
        store = open_store(location)
        barrier.wait(60)
        own = f"own{proc}"
        targets = [own] + ([SHARED] if proc < SHARED_WRITERS else [])
        for sid in targets:
            store.ensure_session(sid, platform="mp")
        for k in range(ITERATIONS):
            for sid in targets:
                rows = [NewMessage(raw={"role": "user", "content": _text(proc, k, j), "n": [proc, k, j]},
                                   role="user", ident=f"{proc}-{k}-{j}", uid=None, text=_text(proc, k, j),
                                   tokens=10, created_at=time.time())
                        for j in range(_batch(k))]
                ids = store.append_messages(sid, rows)
                _set_context_cas(store, sid, ids)
                if k % COMPACT_EVERY == COMPACT_EVERY - 1:
                    if _compact(store, sid, proc, k, intervals):
                        result["published"][sid] = result["published"].get(sid, 0) + 1
    except BaseException:
        result["errors"].append(traceback.format_exc())
        barrier.abort()  # never leave the others waiting
    finally:
        if store is not None:
            store.close()
        result["intervals"] = intervals
        Path(out_dir, f"worker{proc}.json").write_text(json.dumps(result))


def _reachable(store, sid: str) -> set[int]:
    seen: set[int] = set()
    stack = [(e.kind, e.ref) for e in store.get_context(sid)[1]]
    while stack:
        kind, ref = stack.pop()
        if kind == "m":
            seen.add(ref)
        else:
            kids, msgs = store.summary_children(ref)
            seen.update(msgs)
            stack.extend(("s", c) for c in kids)
    return seen


def test_concurrent_processes(location, tmp_path):
    out = tmp_path / "results"
    out.mkdir()
    # Create and migrate the store first; racing first opens are test_concurrent_first_open's.
    first = open_store(location)
    first.ensure_session("setup")
    first.close()
    mp = multiprocessing.get_context("spawn")
    barrier = mp.Barrier(N_PROCS)
    procs = [mp.Process(target=_worker, args=(location, i, str(out), barrier)) for i in range(N_PROCS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)  # a hang guard: how long the processes take is bench/'s, not a test's
    for p in procs:
        if p.is_alive():  # pragma: no cover - a hang is a failure, not a leak
            p.kill()
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]

    results = [json.loads((out / f"worker{i}.json").read_text()) for i in range(N_PROCS)]
    errors = [e for r in results for e in r["errors"]]
    assert not errors, "\n".join(errors)
    assert not any("locked" in e or "busy" in e for e in errors)

    store = open_store(location)
    try:
        per_proc = sum(_batch(k) for k in range(ITERATIONS))
        expected = {f"own{i}": {i: per_proc} for i in range(N_PROCS)}
        expected[SHARED] = {i: per_proc for i in range(SHARED_WRITERS)}
        assert {s["id"] for s in store.list_sessions()} == {*expected, "setup"}
        all_ids: list[int] = []
        for sid, by_proc in expected.items():
            msgs = store.session_messages(sid, limit=100_000)
            all_ids.extend(m.id for m in msgs)
            # seq is unique and gap-free; ids grow with seq (one writer per session at a time).
            assert [m.seq for m in msgs] == list(range(sum(by_proc.values()))), sid
            assert [m.id for m in msgs] == sorted(m.id for m in msgs), sid
            for proc, n in by_proc.items():
                mine = [m.text for m in msgs if m.text.startswith(f"proc{proc} ")]
                want = [_text(proc, k, j) for k in range(ITERATIONS) for j in range(_batch(k))]
                assert len(mine) == n and mine == want, (sid, proc)  # nothing lost, duplicated or reordered
            assert {m.raw["n"][0] for m in msgs} == set(by_proc)
            # Every message stays reachable from the active context (directly or via the DAG).
            assert _reachable(store, sid) == {m.id for m in msgs}, sid
            assert store.latest_staged(sid) is None
            published = sum(r["published"].get(sid, 0) for r in results)
            assert published > 0 and store.get_session(sid)["compactions"] == published, sid
        assert len(all_ids) == len(set(all_ids))
        assert store.stats()["messages"] == len(all_ids)
        assert store.stats()["staged_summaries"] == 0

        # The compaction lock was never held by two processes at once.
        intervals = sorted((tuple(iv) for r in results for iv in r["intervals"]), key=lambda iv: (iv[0], iv[1]))
        shared = [iv for iv in intervals if iv[0] == SHARED]
        assert {iv[3] for iv in shared} == set(range(SHARED_WRITERS))
        for a, b in zip(intervals, intervals[1:]):
            if a[0] == b[0]:
                assert b[1] >= a[2], f"overlapping compaction locks on {a[0]}: {a} and {b}"
    finally:
        store.close()


# -- many processes opening a brand-new store at the same instant --------------------------------

OPEN_PROCS = 6


class LockedOnFirstOpen(AssertionError):
    """Only "database is locked" errors from opening a new SQLite store (a reported bug)."""


def _open_worker(locations: list[str], proc: int, barrier, q) -> None:
    errors: list[str] = []
    for loc in locations:
        try:
            barrier.wait(60)
        except Exception:  # pragma: no cover - another worker died
            errors.append(traceback.format_exc())
            break
        store = None
        try:
            store = open_store(loc)
            store.ensure_session(f"p{proc}")
            store.append_messages(f"p{proc}", [NewMessage(raw={"p": proc}, role="user", ident=str(proc), uid=None,
                                                          text=f"hello from {proc}", tokens=1, created_at=1.0)])
            if "001_initial" not in store.applied_migrations():
                errors.append(f"{loc}: migrations not recorded")
        except BaseException:
            errors.append(traceback.format_exc())
        finally:
            if store is not None:
                store.close()
    q.put((proc, errors))


def test_concurrent_first_open(backend, request, tmp_path):
    """Processes opening a new store at the same instant: each migrates or waits for the
    one that does (PostgreSQL: pg_advisory_xact_lock; SQLite: write locks), none fails."""
    if backend == "sqlite":
        locations = [str(tmp_path / f"round{i}" / "lcm.db") for i in range(30)]
    else:
        server = request.getfixturevalue("pg_server")
        locations = [server.dsn(server.create_database("firstopen")) for _ in range(3)]
    mp = multiprocessing.get_context("spawn")
    barrier = mp.Barrier(OPEN_PROCS)
    q = mp.Queue()
    procs = [mp.Process(target=_open_worker, args=(locations, i, barrier, q)) for i in range(OPEN_PROCS)]
    for p in procs:
        p.start()
    results = dict(q.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(30)
    errors = [e for errs in results.values() for e in errs]
    for loc in locations:
        store = open_store(loc)
        try:
            assert store.applied_migrations().count("001_initial") == 1
            assert {s["id"] for s in store.list_sessions()} == {f"p{i}" for i in range(OPEN_PROCS)} or errors
            assert store.stats()["messages"] == OPEN_PROCS or errors
        finally:
            store.close()
    if backend == "postgres":
        for loc in locations:
            server.drop_database(loc.rsplit("/", 1)[1].split("?")[0])
    if errors and all("database is locked" in e for e in errors):
        raise LockedOnFirstOpen(f"{len(errors)} opens failed:\n" + errors[0])
    assert not errors, "\n".join(errors)


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request):
    return request.param
