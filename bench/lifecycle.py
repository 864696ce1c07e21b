"""Issue 43's measurements: what encryption at rest costs, and how long a host's calls wait
while a large store is pruned.

1. **encryption** — the scale part's build and measure (`bench/scale.py`: `engine.ingest()` of
   growing lists of the generated "mixed" sessions, then `lcm_grep` text / identifier / CJK
   substring in a fresh process) at N messages (full: 100,000), once on a plaintext store and
   once with `LCM_ENCRYPTION_KEY` set (the store is made encrypted: SQLCipher), in one run:
   builds first, then measurements, so both see the same machine. Ratios encrypted/plaintext.
   The scale part repeats one question, so its searches find every page in the page cache;
   **cold** asks ten different questions once each in a fresh process (then each again),
   plaintext and encrypted in turn, ``COLD_ROUNDS`` times: what a page read from the file
   costs (an encrypted page is decrypted and HMAC-checked on every cache miss), in wall and
   CPU time.
2. **prune_wait** — a store of N messages (full: 1,000,000: 100,000 built by the engine, the
   rest copied with SQL into sessions of their own lineage, each given an age: 400, 200, 120
   or 30 days) is pruned with `lcm prune --older-than 90` semantics in one process while
   another process plays the host on a live session: every ~20 ms it stores a new turn
   (`on_session_end` with the grown list: a write) and runs `lcm_grep` (a read), timing each
   call. Reported: the calls' p50 / p99 / max before the prune and while it runs, the prune's
   duration, transactions and longest transaction, and the file before and after.

Big stores go under ``--data-dir`` (default: the bench's scratch directory), never the tree.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from . import common

KEY = "bench key: a long passphrase"
AGES = (400, 200, 120, 30)  # days, round-robin over the copied sessions
OLDER_THAN = 90
COLD_ROUNDS = 3
# Ten questions, each asked once in a fresh process (their pages not yet in the page cache).
COLD_QUESTIONS = (
    "what did we decide about the retry limit for flaky webhook retries",
    "how did we fix the database migration timeout", "which port does the staging server listen on",
    "what was the error in the payment reconciliation job", "did we agree on the cache eviction policy",
    "who owns the deployment pipeline for the billing service", "what is the plan for rotating the api keys",
    "why did the nightly backup fail last week", "summary of the discussion about rate limits",
    "what threshold did we pick for the memory alert",
)


def _scale(args: list[str], timeout: float, env_extra: dict[str, str] | None = None) -> dict[str, Any]:
    from .scale import worker

    saved = {k: os.environ.get(k) for k in (env_extra or {})}
    os.environ.update(env_extra or {})
    try:
        return worker(args, timeout)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _encryption(n: int, work: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"n": n}
    stores = {"plaintext": str(work / f"enc-plain-{n}.db"), "encrypted": str(work / f"enc-cipher-{n}.db")}
    env = {"plaintext": {}, "encrypted": {"LCM_ENCRYPTION_KEY": KEY}}
    builds, measures = {}, {}
    for name, store in stores.items():
        t0 = time.perf_counter()
        try:
            builds[name] = _scale(["build", "--store", store, "--n", str(n)], 7200, env[name])
        except RuntimeError as exc:  # (a crashed child: said in the results, built once more)
            out.setdefault("build_retries", []).append(f"{name}: {str(exc)[:300]}")
            for suf in ("", "-wal", "-shm", ".meta.json"):
                Path(store + suf).unlink(missing_ok=True)
            builds[name] = _scale(["build", "--store", store, "--n", str(n)], 7200, env[name])
        print(f"  encryption: built {name} {n:,} in {time.perf_counter() - t0:.0f} s", flush=True)
    for name, store in stores.items():
        measures[name] = _scale(["measure", "--store", store, "--n", str(builds[name]["n_stored"]), "--passes", "12",
                                 "--reps", "15", "--identifier", builds[name]["identifier"]], 3600, env[name])
    out["cold"] = _cold(stores, env)
    with open(stores["encrypted"], "rb") as fh:
        out["encrypted_file_starts_as_sqlite"] = fh.read(16) == b"SQLite format 3\x00"
    for name in stores:
        b, m = builds[name], measures[name]
        out[name] = {
            "ingest_msgs_per_s": common.get_path(b, "ingest.msgs_per_s"),
            "store_bytes": _checkpointed_bytes(stores[name], env[name]),
            "grep_text_p50_ms": common.get_path(m, "lcm_grep.text.ms.p50"),
            "grep_identifier_p50_ms": common.get_path(m, "lcm_grep.identifier.ms.p50"),
            "grep_cjk_p50_ms": common.get_path(m, "lcm_grep.cjk_substring.ms.p50"),
            "grep_text_cpu_p50_ms": common.get_path(m, "lcm_grep.text.cpu_ms.p50"),
            "grep_identifier_cpu_p50_ms": common.get_path(m, "lcm_grep.identifier.cpu_ms.p50"),
            "grep_cjk_cpu_p50_ms": common.get_path(m, "lcm_grep.cjk_substring.cpu_ms.p50"),
            "compress_engine_p50_ms": common.get_path(m, "compress.engine_ms.p50"),
            "expand_p50_ms": common.get_path(m, "lcm_expand.ms.p50"),
        }
    p, e = out["plaintext"], out["encrypted"]
    out["ratios"] = {
        "ingest_time": _ratio(p["ingest_msgs_per_s"], e["ingest_msgs_per_s"]),  # time per message: enc/plain
        **{k: _ratio(e[k], p[k]) for k in ("grep_text_p50_ms", "grep_identifier_p50_ms", "grep_cjk_p50_ms",
                                            "grep_text_cpu_p50_ms", "grep_identifier_cpu_p50_ms",
                                            "grep_cjk_cpu_p50_ms", "compress_engine_p50_ms", "expand_p50_ms",
                                            "store_bytes")},
    }
    out["plain_store"] = stores["plaintext"]
    for suf in ("", "-wal", "-shm", ".meta.json"):
        Path(stores["encrypted"] + suf).unlink(missing_ok=True)
    shutil.rmtree(stores["encrypted"] + ".locks", ignore_errors=True)
    return out


def cold_greps(store: str, out: str) -> None:
    """In this (fresh) process: each of COLD_QUESTIONS once (the first search of it: its pages
    read from the file), then each again (best of 3: from the page cache); wall and CPU ms."""
    from .scale import CONV

    eng = common.make_engine(store, context_length=200_000)
    eng.on_session_start(f"cold-{os.getpid()}", conversation_id=CONV, platform="cli")
    first: list[tuple[float, float]] = []
    again: list[tuple[float, float]] = []
    for rep, sink in ((1, first), (3, again)):
        for q in COLD_QUESTIONS:
            best = (float("inf"), float("inf"))
            for _ in range(rep):
                t0, c0 = time.perf_counter(), time.process_time()
                json.loads(eng.handle_tool_call("lcm_grep", {"query": q}))
                best = min(best, ((time.perf_counter() - t0) * 1000, (time.process_time() - c0) * 1000))
            sink.append(best)
    eng.store.close()
    Path(out).write_text(json.dumps({"first": first, "again": again}), encoding="utf-8")


def _cold_rounds(stores: dict[str, str], env: dict[str, dict[str, str]], rounds: int) -> dict[str, Any]:
    """cold_greps on each store in turn (a fresh process each), ``rounds`` times; per store the
    median over rounds of each figure: first searches and repeated ones, p50 and total, wall
    and CPU ms."""
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in stores}
    for _ in range(rounds):
        for name, store in stores.items():
            res = store + ".cold.json"
            r = subprocess.run([sys.executable, "-m", "bench.lifecycle", "cold", "--store", store, "--out", res],
                               cwd=common.ROOT, env={**os.environ, **env[name]}, capture_output=True, text=True,
                               timeout=1800)
            if r.returncode != 0:
                raise RuntimeError(f"cold greps ({name}) failed: {r.stderr[-3000:]}")
            data = json.loads(Path(res).read_text())
            Path(res).unlink()
            row: dict[str, float] = {}
            for part in ("first", "again"):
                for k, label in ((0, "wall"), (1, "cpu")):
                    vals = sorted(x[k] for x in data[part])
                    row[f"{part}_{label}_p50_ms"] = vals[len(vals) // 2]
                    row[f"{part}_{label}_sum_ms"] = sum(vals)
            runs[name].append(row)
    return {name: {k: round(sorted(r[k] for r in rows)[len(rows) // 2], 2) for k in rows[0]}
            for name, rows in runs.items()}


def _cold(stores: dict[str, str], env: dict[str, dict[str, str]]) -> dict[str, Any]:
    """cold_greps on the plaintext and the encrypted store in turn, COLD_ROUNDS times; the
    ratios encrypted/plaintext."""
    out: dict[str, Any] = {"questions": len(COLD_QUESTIONS), "rounds": COLD_ROUNDS,
                           **_cold_rounds(stores, env, COLD_ROUNDS)}
    out["ratios"] = {k: _ratio(out["encrypted"][k], out["plaintext"][k]) for k in out["plaintext"]}
    return out


def _page_formats(n: int, work: Path, rounds: int) -> dict[str, Any]:
    """What the page format costs a first search: one encrypted store of ``n`` messages built by
    this code (HMAC-SHA256 pages), a copy of it rewritten with SQLCipher 4's default HMAC-SHA512
    (the format of stores encrypted before; same key, salt and rows) and a plaintext copy (`lcm
    decrypt`'s copy); cold_greps on the three in turn, ``rounds`` times, CPU and wall ms; ratios
    to plaintext per format."""
    from lossless_context.store.sqlite import cipher

    env = {"LCM_ENCRYPTION_KEY": KEY}
    sha256 = str(work / f"fmt-sha256-{n}.db")
    for suf in ("", "-wal", "-shm", ".meta.json"):
        Path(sha256 + suf).unlink(missing_ok=True)
    _scale(["build", "--store", sha256, "--n", str(n)], 7200, env)
    key = cipher.StoreKey.for_file(sha256, KEY.encode())
    stores = {"plaintext": str(work / f"fmt-plain-{n}.db"), "sha256": sha256, "sha512": str(work / f"fmt-sha512-{n}.db")}
    src = cipher.connect(sha256, key)
    try:
        for name, copy_key, algorithm in (("plaintext", "''", None), ("sha512", key.pragma(), "HMAC_SHA512")):
            Path(stores[name]).unlink(missing_ok=True)
            src.execute(f"ATTACH DATABASE ? AS fmt KEY {copy_key}", (stores[name],))
            if algorithm:
                src.execute(f"PRAGMA fmt.cipher_page_size = {cipher.CIPHER_PAGE_SIZE}")
                src.execute("PRAGMA fmt.cipher_hmac_algorithm = HMAC_SHA512")
            else:
                src.execute(f"PRAGMA fmt.page_size = {cipher.CIPHER_PAGE_SIZE}")
            src.execute("SELECT sqlcipher_export('fmt')").fetchall()
            src.execute(f"PRAGMA fmt.user_version = {int(src.execute('PRAGMA main.user_version').fetchone()[0])}")
            src.execute("DETACH DATABASE fmt")
    finally:
        src.close()
    envs = {"plaintext": {}, "sha256": env, "sha512": env}
    out: dict[str, Any] = {"n": n, "rounds": rounds, "questions": len(COLD_QUESTIONS)}
    out.update({name: {k: v for k, v in row.items() if k.startswith("first_") and k.endswith("_sum_ms")}
                for name, row in _cold_rounds(stores, envs, rounds).items()})
    for name in ("sha256", "sha512"):
        out[f"{name}_ratio"] = {k: _ratio(out[name][k], out["plaintext"][k]) for k in out["plaintext"]}
    for store in stores.values():
        for suf in ("", "-wal", "-shm", ".meta.json"):
            Path(store + suf).unlink(missing_ok=True)
    return out


def _interleaved(n: int, work: Path, rounds: int) -> dict[str, Any]:
    """Ingest of ``n`` messages, plaintext then encrypted, ``rounds`` times over (each build a
    process of its own): on a shared machine the load drifts over minutes, so each round's
    ratio compares two builds made one after the other, and the median is reported."""
    out: dict[str, Any] = {"n": n, "rounds": []}
    for r in range(rounds):
        row: dict[str, Any] = {}
        for name, env in (("plaintext", {}), ("encrypted", {"LCM_ENCRYPTION_KEY": KEY})):
            store = str(work / f"inter-{name}-{r}.db")
            b = _scale(["build", "--store", store, "--n", str(n), "--seed", str(r + 1)], 3600, env)
            row[name] = common.get_path(b, "ingest.msgs_per_s")
            for suf in ("", "-wal", "-shm", ".meta.json"):
                Path(store + suf).unlink(missing_ok=True)
            shutil.rmtree(store + ".locks", ignore_errors=True)
        row["ratio"] = _ratio(row["plaintext"], row["encrypted"])
        out["rounds"].append(row)
        print(f"  encryption (interleaved) round {r + 1}: {row}", flush=True)
    ratios = sorted(x["ratio"] for x in out["rounds"] if x["ratio"] is not None)
    out["median_ingest_time_ratio"] = ratios[len(ratios) // 2] if ratios else None
    return out


def _checkpointed_bytes(store: str, env: dict[str, str]) -> int:
    """The file's size with its WAL folded in (through the store: an encrypted one needs its key)."""
    from lossless_context.store import open_store

    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        st = open_store(store)
        try:
            st.conn().execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()  # type: ignore[attr-defined]
        finally:
            st.close()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return common.store_bytes(store)


def _ratio(a: Any, b: Any) -> float | None:
    try:
        return round(float(a) / float(b), 3)
    except (TypeError, ValueError, ZeroDivisionError):
        return None


def _aged_copies(store: str, extra: int) -> dict[str, Any]:
    """Copy the engine-built sessions' rows into new sessions, each a lineage of its own with
    an age from AGES (its messages' times and its last write moved back by that many days)."""
    c = sqlite3.connect(store, isolation_level=None)
    c.execute("PRAGMA synchronous=NORMAL")
    real = [r[0] for r in c.execute("SELECT id FROM sessions WHERE id LIKE 'hist-%' ORDER BY id")]
    cols = "seq, uid, ident, role, raw, text, tokens, created_at, supersedes, large, exploration"
    now, done, k, by_age = time.time(), 0, 0, {a: 0 for a in AGES}
    t0 = time.perf_counter()
    while done < extra:
        for sid in real:
            if done >= extra:
                break
            age = AGES[k % len(AGES)]
            k += 1
            new, shift = f"aged{k:04d}-{age}d", age * 86_400.0
            c.execute("BEGIN IMMEDIATE")
            c.execute("INSERT INTO sessions(id, conversation_id, created_at, updated_at) VALUES (?, ?, ?, ?)",
                      (new, new, now - shift, now - shift))
            cur = c.execute(
                f"INSERT INTO messages(session_id, {cols})"
                f" SELECT ?, {cols.replace('created_at', 'MIN(created_at, ?) - ?')} FROM messages"
                " WHERE session_id=? ORDER BY seq LIMIT ?", (new, now, shift, sid, extra - done))
            done += cur.rowcount
            by_age[age] += cur.rowcount
            c.execute("COMMIT")
    c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    c.close()
    return {"copied": done, "sessions": k, "messages_by_age_days": by_age, "seconds": round(time.perf_counter() - t0, 1)}


def host_loop(store: str, out: str, stop: str, seconds: float) -> None:
    """The host on a live session: a write and a grep every ~20 ms, each timed."""
    eng = common.make_engine(store, context_length=200_000)
    sid = f"host-{os.getpid()}"
    eng.on_session_start(sid, conversation_id=sid, platform="cli")
    msgs: list[dict[str, Any]] = []
    rows: list[tuple[float, str, float]] = []
    deadline = time.monotonic() + seconds
    i = 0
    while time.monotonic() < deadline and not os.path.exists(stop):
        i += 1
        msgs += [{"role": "user", "content": f"host turn {i}: check the reconcile_day job and ticket T-{i}"},
                 {"role": "assistant", "content": f"turn {i}: reconcile_day ran; ticket T-{i} noted"}]
        if len(msgs) > 400:
            msgs = msgs[-40:]
            sid = f"host-{os.getpid()}-{i}"
            eng.on_session_start(sid, conversation_id=sid, platform="cli")
        t0 = time.perf_counter()
        eng.on_session_end(sid, list(msgs))
        rows.append((time.time(), "write", (time.perf_counter() - t0) * 1000))
        t0 = time.perf_counter()
        eng.handle_tool_call("lcm_grep", {"query": f"ticket T-{max(1, i - 7)}", "limit": 5})
        rows.append((time.time(), "grep", (time.perf_counter() - t0) * 1000))
        time.sleep(0.02)
    Path(out).write_text(json.dumps(rows), encoding="utf-8")


def prune_once(store: str, out: str) -> None:
    from contextlib import contextmanager

    from lossless_context.ops import retention
    from lossless_context.store import open_store

    st = open_store(store)
    held: list[float] = []
    commits: list[float] = []
    real_tx = st.tx  # type: ignore[attr-defined]

    @contextmanager
    def timed_tx():  # type: ignore[no-untyped-def]
        # how long each of the prune's transactions holds the write lock: from BEGIN IMMEDIATE
        # granted to COMMIT done (a wait for the lock is not holding it)
        with real_tx() as c:
            t = time.perf_counter()
            yield c
            body = time.perf_counter()
        held.append((time.perf_counter() - t) * 1000)
        commits.append((time.perf_counter() - body) * 1000)  # (COMMIT, and a checkpoint it ran)

    st.tx = timed_tx  # type: ignore[attr-defined]
    holds: list[tuple[str, float, float]] = []  # (what, wall start, wall end) of the prune process's writes
    slow = _trace_slow(st, held, holds)
    t0 = time.perf_counter()
    plan = retention.plan_prune(st, older_than_days=OLDER_THAN)
    plan_s = time.perf_counter() - t0
    t1 = time.time()
    rep = retention.prune(st, plan, trigger="bench")
    st.close()
    Path(out).write_text(json.dumps({"plan_seconds": round(plan_s, 2), "started": t1, "ended": time.time(),
                                     "lock_held_ms": {**common.dist(held, 1), "max": round(max(held), 1) if held else None,
                                                      "over_100ms": sum(1 for h in held if h > 100)},
                                     "commit_ms": {**common.dist(commits, 1), "max": round(max(commits), 1) if commits else None,
                                                   "over_50ms": sum(1 for h in commits if h > 50),
                                                   "of_held_over_100ms": [round(c, 1) for h, c in zip(held, commits) if h > 100]},
                                     # (rows, units, seconds) of the slowest removal calls, where the code logs them
                                     "slowest_batches": sorted(getattr(getattr(rep, "batch_log", None), "batches", []),
                                                               key=lambda b: -b[2])[:8],
                                     # the slowest transactions: where their time went, statement by statement
                                     "slow_transactions": slow, "holds": holds,
                                     **rep.as_dict()}, default=str), encoding="utf-8")


def _trace_slow(st: Any, held: list[float], holds: list[tuple[str, float, float]],
                keep: int = 8) -> list[dict[str, Any]]:
    """Statement by statement, where the prune's slowest transactions spent their time: a
    trace callback on its connection stamps each statement (and each trigger's and FTS5's own
    statements inside it) as it starts; when a transaction ends held over 100 ms, its longest
    gaps are kept with the statement they followed, the rows it changed (FTS5's shadow-table
    writes count: a segment flush or merge shows as many), its thread CPU time against its
    wall time (CPU-bound, or waiting: disk, or a core taken by another process), and the ids
    and sizes of the rows it removed; and the vacuum steps' times. Only with LCM_BENCH_TRACE
    set (it slows the prune); the transactions' and merge steps' times are always kept in
    ``holds``. ``held`` is the list timed_tx appends to."""
    c = st.conn()
    ev: list[tuple[float, int, str]] = []
    out: list[dict[str, Any]] = []
    state: dict[str, Any] = {"n": len(held), "cpu": time.thread_time()}

    def cb(sql: str) -> None:
        ev.append((time.perf_counter(), c.total_changes, sql[:160]))
        now = time.time()
        if state.get("vac") is not None:  # (a vacuum step ended when the next statement began, less the pause)
            kind = state.pop("vac_kind", "vacuum")
            holds.append((kind, state["vac"], now - (0.05 if kind == "vacuum" else 0.0)))
            state["vac"] = None
        if sql.startswith("PRAGMA incremental_vacuum"):
            state["vac"] = now
        elif sql.startswith("PRAGMA wal_checkpoint"):
            state["vac"] = now
            state["vac_kind"] = "checkpoint"
        if sql.startswith("BEGIN"):
            del ev[:-1]
            state["cpu"] = time.thread_time()

    def after_commit() -> None:
        if len(held) == state["n"] or held[-1] <= 100:
            state["n"] = len(held)
            return
        state["n"] = len(held)
        rows, state["rows"] = state.get("rows"), None
        ev.append((time.perf_counter(), c.total_changes, "(end)"))
        gaps = sorted(((ev[i + 1][0] - ev[i][0], i) for i in range(len(ev) - 1)), reverse=True)[:4]
        out.append({"held_ms": round(held[-1], 1), "cpu_ms": round((time.thread_time() - state["cpu"]) * 1000, 1),
                    "statements": len(ev), "changes": ev[-1][1] - ev[0][1], "rows": rows,
                    "gaps": [{"ms": round(g * 1000, 1), "changes": ev[i + 1][1] - ev[i][1], "sql": ev[i][2],
                              "next": ev[i + 1][2][:80]} for g, i in gaps]})
        out.sort(key=lambda d: -d["held_ms"])
        del out[keep:]

    if os.environ.get("LCM_BENCH_TRACE"):  # (a Python call per statement, FTS5's own too: slows the prune)
        c.set_trace_callback(cb)
    real_tx = st.tx
    from contextlib import contextmanager

    @contextmanager
    def tx():  # type: ignore[no-untyped-def]
        with real_tx() as cc:
            t = time.time()
            yield cc
        holds.append(("prune", t, time.time()))
        after_commit()

    # the background index merger's steps (their own connection): from the lock granted (the
    # first statement after BEGIN) to COMMIT
    real_connect = st.merger._connect
    mstate: dict[str, Any] = {}

    def mconnect() -> Any:
        m = real_connect()

        def mcb(sql: str) -> None:
            now = time.time()
            if sql.startswith("BEGIN"):
                mstate["begin"] = True
            elif mstate.pop("begin", None):
                mstate["t"] = now
            if sql == "COMMIT" and "t" in mstate:
                holds.append(("merge", mstate.pop("t"), now))
        m.set_trace_callback(mcb)
        return m

    st.merger._connect = mconnect

    st.tx = tx
    real_remove = st.remove_rows

    def remove_rows(kind: str, groups: Any, **kw: Any) -> Any:
        # the rows' sizes, read before they go (outside the transaction): count, text bytes
        # (all, and the largest row's), tokens, and how many are in the CJK index too
        ids = [int(i) for g in groups for i in g]
        table = "messages" if kind == "messages" else "summaries"
        r = c.execute(f"SELECT COUNT(*), SUM(length(text)), MAX(length(text)), SUM(tokens), MIN(id), MAX(id),"
                      f" SUM(text GLOB '*[⺀-鿿가-힯぀-ヿ]*') FROM {table} WHERE id IN ({','.join('?' * len(ids))})",
                      ids).fetchone()
        state["rows"] = {"kind": kind, "groups": len(groups), "rows": r[0], "text_bytes": r[1], "largest_text": r[2],
                         "tokens": r[3], "ids": [r[4], r[5]], "cjk_rows": r[6]}
        return real_remove(kind, groups, **kw)

    st.remove_rows = remove_rows
    return out


def _hold_dist(hs: list[Any]) -> dict[str, Any]:
    ms = [(b - a) * 1000 for _k, a, b in hs]
    return {**common.dist(ms, 1), "max": round(max(ms), 1) if ms else None, "over_100ms": sum(1 for v in ms if v > 100)}


def _blame(rows: list[Any], holds: list[Any], lo: float, hi: float) -> dict[str, Any]:
    """Each host write over 100 ms while the prune ran, by what of the prune process held the
    write lock during it for longest (none: the host's own work, or its own merger/checkpoint)."""
    out: dict[str, Any] = {"n": 0, "by": {}, "longest": []}
    for t, op, ms in rows:
        if op != "write" or ms <= 100 or not lo <= t <= hi:
            continue
        a = t - ms / 1000
        best, who = 0.0, "none"
        held: dict[str, float] = {}
        for k, s0, s1 in holds:
            ov = min(t, s1) - max(a, s0)
            if ov > 0:
                held[k] = held.get(k, 0.0) + ov
            if ov > best:
                best, who = ov, k
        out["n"] += 1
        out["by"][who] = out["by"].get(who, 0) + 1
        # (the longest ones: when, and how much of each the prune process's holds covered)
        out["longest"].append({"ms": round(ms, 1), "at_s": round(a - lo, 2),
                               "held_by": {k: round(v * 1000, 1) for k, v in held.items()}})
    out["longest"] = sorted(out["longest"], key=lambda d: -d["ms"])[:6]
    return out


def _dist(rows: list[tuple[float, str, float]], op: str, lo: float, hi: float) -> dict[str, Any]:
    vals = [ms for t, o, ms in rows if o == op and lo <= t <= hi]
    d = common.dist(vals, 1)
    d["max"] = round(max(vals), 1) if vals else None
    d["p99"] = round(common.percentile(vals, 99), 1) if vals else None
    d["over_100ms"] = sum(1 for v in vals if v > 100)
    return d


def _prune_wait(n: int, base: str | None, work: Path, baseline_s: float, code: str | None = None,
                host_code: str | None = None) -> dict[str, Any]:
    """``code``: another checkout whose retention code runs the prune (the commit before a
    change: before/after in one session); ``host_code``: one whose engine runs the host
    (a change to how the host's writes wait); else this checkout's."""
    store = str(work / f"prune-{n}.db")
    if base and os.path.exists(base):
        common.checkpoint(base)
        shutil.copyfile(base, store)
        meta = json.loads(Path(base + ".meta.json").read_text()) if os.path.exists(base + ".meta.json") else {}
        real = int(meta.get("n_stored") or 0)
    else:
        b = _scale(["build", "--store", store, "--n", str(min(n, 100_000))], 7200)
        real = int(b["n_stored"])
    out: dict[str, Any] = {"n": n, "engine_built": real}
    out["copies"] = _aged_copies(store, max(0, n - real)) if n > real else {"copied": 0}
    out["file_bytes_before"] = common.store_bytes(store)
    host_out, prune_out, stop = store + ".host.json", store + ".prune.json", store + ".stop"
    Path(stop).unlink(missing_ok=True)
    env = dict(os.environ)
    host = subprocess.Popen([sys.executable, "-m", "bench.lifecycle", "host", "--store", store, "--out", host_out,
                             "--stop", stop, "--seconds", "7200"], cwd=host_code or common.ROOT, env=env)
    time.sleep(5)  # (its engine open, its first turns stored)
    t_base = time.time()
    time.sleep(baseline_s)
    t_prune = time.time()
    r = subprocess.run([sys.executable, "-m", "bench.lifecycle", "prune", "--store", store, "--out", prune_out],
                       cwd=code or common.ROOT, env=env, capture_output=True, text=True, timeout=7200)
    t_end = time.time()
    time.sleep(baseline_s)  # (the same host, as long again after the prune: a second baseline)
    t_after = time.time()
    Path(stop).write_text("stop")
    host.wait(timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"prune failed: {r.stderr[-3000:]}")
    rows = [tuple(x) for x in json.loads(Path(host_out).read_text())]
    pr = json.loads(Path(prune_out).read_text())
    out["prune"] = {k: pr[k] for k in ("plan_seconds", "sessions", "messages", "summaries", "transactions",
                                       "longest_transaction_ms", "bytes_returned", "file_bytes_after", "seconds",
                                       "lock_held_ms", "commit_ms", "slowest_batches", "stopped_at_deadline",
                                       "slow_transactions") if k in pr}
    out["prune"]["removal_started_after_s"] = round(pr["started"] - t_prune, 1)
    out["host"] = {
        "before": {op: _dist(rows, op, t_base, t_prune) for op in ("write", "grep")},  # type: ignore[arg-type]
        "during": {op: _dist(rows, op, pr["started"], pr["ended"]) for op in ("write", "grep")},  # type: ignore[arg-type]
        "during_plan": {op: _dist(rows, op, t_prune, pr["started"]) for op in ("write", "grep")},  # type: ignore[arg-type]
        "after": {op: _dist(rows, op, t_end, t_after) for op in ("write", "grep")},  # type: ignore[arg-type]
    }
    out["host_waits_over_100ms"] = _blame(rows, pr.get("holds") or [], pr["started"], t_end)
    out["prune_process_holds"] = {k: _hold_dist([h for h in pr.get("holds") or [] if h[0] == k])
                                  for k in ("prune", "merge", "vacuum", "checkpoint")}
    out["wall_prune_process_s"] = round(t_end - t_prune, 1)
    for suf in ("", "-wal", "-shm", ".host.json", ".prune.json", ".stop"):
        Path(store + suf).unlink(missing_ok=True)
    shutil.rmtree(store + ".locks", ignore_errors=True)
    return out


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    quick = cfg["quick"]
    work = Path(cfg.get("data_dir") or (Path(common.isolate_env()) / "lifecycle"))
    work.mkdir(parents=True, exist_ok=True)
    n_enc = cfg.get("enc_size") or (600 if quick else 100_000)
    n_prune = cfg.get("prune_size") or (2_000 if quick else 1_000_000)
    res: dict[str, Any] = {}
    enc = _encryption(n_enc, work)
    enc["interleaved"] = _interleaved(min(n_enc, 20_000), work, 1 if quick else 3)
    base = enc.pop("plain_store")
    res["encryption"] = enc
    res["prune_wait"] = _prune_wait(n_prune, base, work, 2.0 if quick else 120.0)
    for suf in ("", "-wal", "-shm", ".meta.json"):
        Path(base + suf).unlink(missing_ok=True)
    shutil.rmtree(base + ".locks", ignore_errors=True)
    return res


def prune_ab(n: int, engine_n: int, before_code: str, work: Path, baseline_s: float, rounds: int,
             before_host: bool = False) -> dict[str, Any]:
    """The prune part before and after a change, in one session: one engine-built base, then
    the prune with the host beside it, before / after alternating (ABBA...). ``before_host``:
    the before runs' host is the before checkout too (a change to the host's side)."""
    base = str(work / f"ab-base-{engine_n}.db")
    b = _scale(["build", "--store", base, "--n", str(engine_n)], 7200)
    Path(base + ".meta.json").write_text(json.dumps({"n_stored": b["n_stored"]}), encoding="utf-8")
    order = [("before", before_code), ("after", None)]
    runs = []
    for k in range(rounds):
        for label, code in (order if k % 2 == 0 else order[::-1]):
            r = _prune_wait(n, base, work, baseline_s, code, code if before_host else None)
            r["code"] = label
            runs.append(r)
            print(json.dumps({"code": label, "prune": r["prune"], "host": r["host"]}, default=str), flush=True)
    for suf in ("", "-wal", "-shm", ".meta.json"):
        Path(base + suf).unlink(missing_ok=True)
    shutil.rmtree(base + ".locks", ignore_errors=True)
    return {"n": n, "engine_built": engine_n, "runs": runs}


def lock_poll_cpu(work: Path, hold_s: float = 3.0, rounds: int = 3) -> dict[str, Any]:
    """What a writer waiting for the write lock costs in CPU: another connection holds it
    ``hold_s`` seconds; the waiter's thread CPU time against its wall time, polled
    (store/sqlite/writelock.py) and in SQLite's busy handler, alternating."""
    import sqlite3
    import threading

    from lossless_context.store.sqlite import writelock

    path = str(work / "lock-poll.db")
    sqlite3.connect(path, isolation_level=None).execute("PRAGMA journal_mode=WAL").fetchall()
    out: dict[str, list[dict[str, float]]] = {"polled": [], "busy_handler": []}
    for k in range(rounds):
        for how in (("polled", "busy_handler") if k % 2 == 0 else ("busy_handler", "polled")):
            h = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            h.execute("BEGIN IMMEDIATE")
            t = threading.Timer(hold_s, h.execute, args=("COMMIT",))
            w = sqlite3.connect(path, isolation_level=None)
            w.execute("PRAGMA busy_timeout=30000")
            t.start()
            t0, c0 = time.perf_counter(), time.thread_time()
            if how == "polled":
                writelock.begin_immediate(w, 30.0, 30000)
            else:
                w.execute("BEGIN IMMEDIATE")
            wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
            w.execute("COMMIT")
            t.join()
            w.close()
            h.close()
            out[how].append({"wall_s": round(wall, 3), "cpu_ms": round(cpu * 1000, 2),
                             "cpu_pct_of_a_core": round(100 * cpu / wall, 3),
                             "late_ms": round((wall - hold_s) * 1000, 1)})
    for suf in ("", "-wal", "-shm"):
        Path(path + suf).unlink(missing_ok=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.lifecycle")
    ap.add_argument("mode", choices=["host", "prune", "run", "enc", "cold", "prune-ab", "formats", "lock-poll"])
    ap.add_argument("--before-code", help="prune-ab: a checkout of the code before the change")
    ap.add_argument("--before-host", action="store_true",
                    help="prune-ab: the before runs' host process runs the before checkout too")
    ap.add_argument("--engine-size", type=int, default=20_000)
    ap.add_argument("--baseline-seconds", type=float, default=30.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--store")
    ap.add_argument("--out")
    ap.add_argument("--stop")
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--enc-size", type=int)
    ap.add_argument("--prune-size", type=int)
    ap.add_argument("--data-dir")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args(argv)
    common.isolate_env()
    common.quiet_logs()
    if a.mode == "host":
        host_loop(a.store, a.out, a.stop, a.seconds)
    elif a.mode == "prune":
        prune_once(a.store, a.out)
    elif a.mode == "prune-ab":  # the prune part alone, before/after a change (see prune_ab)
        work = Path(a.data_dir or (Path(common.isolate_env()) / "lifecycle"))
        work.mkdir(parents=True, exist_ok=True)
        res = prune_ab(a.prune_size or 150_000, a.engine_size, a.before_code, work, a.baseline_seconds, a.rounds,
                       a.before_host)
        Path(a.out).write_text(json.dumps({"prune_ab": res}, indent=1, default=str), encoding="utf-8")
    elif a.mode == "lock-poll":  # what a writer polling for the write lock costs in CPU
        work = Path(a.data_dir or (Path(common.isolate_env()) / "lifecycle"))
        work.mkdir(parents=True, exist_ok=True)
        res = lock_poll_cpu(work, rounds=a.rounds)
        Path(a.out).write_text(json.dumps({"lock_poll": res}, indent=1), encoding="utf-8")
        print(json.dumps(res, indent=1))
    elif a.mode == "cold":
        cold_greps(a.store, a.out)
    elif a.mode == "formats":  # what the encrypted page format costs a first search (see _page_formats)
        work = Path(a.data_dir or (Path(common.isolate_env()) / "lifecycle"))
        work.mkdir(parents=True, exist_ok=True)
        res = _page_formats(a.enc_size or 100_000, work, a.rounds)
        Path(a.out).write_text(json.dumps({"page_formats": res}, indent=1, default=str), encoding="utf-8")
        print(json.dumps(res, indent=1))
    elif a.mode == "enc":  # the encryption measurements alone (the prune part takes an hour at 1M)
        work = Path(a.data_dir or (Path(common.isolate_env()) / "lifecycle"))
        work.mkdir(parents=True, exist_ok=True)
        res = _encryption(a.enc_size or 100_000, work)
        res["interleaved"] = _interleaved(min(a.enc_size or 100_000, 20_000), work, a.rounds)
        base = res.pop("plain_store")
        for suf in ("", "-wal", "-shm", ".meta.json"):
            Path(base + suf).unlink(missing_ok=True)
        Path(a.out).write_text(json.dumps({"encryption": res}, indent=1, default=str), encoding="utf-8")
    else:
        res = run({"quick": a.quick, "enc_size": a.enc_size, "prune_size": a.prune_size, "data_dir": a.data_dir})
        Path(a.out).write_text(json.dumps(res, indent=1, default=str), encoding="utf-8")
        print(json.dumps(res, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
