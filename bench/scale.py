"""Scale curves: what our engine's per-request and per-pass costs do as the stored history grows.

For each size N (quick: 1k/5k; full: 1k/10k/100k/1M) two child processes run:

1. **build** — a conversation (one `conversation_id`) of "mixed" sessions from `SessionStream`
   (lazy, deterministic), sessions of ~10,000 messages cut at user turns. Each session is
   handed to `engine.ingest()` in batches of 2,000 as the host hands its list over
   (`on_session_end` flushes): the *whole growing list* each time, so every call goes
   through the real alignment path (earlier messages re-aligned, new ones stored).
   Throughput = new messages / ingest time (generation time excluded). A few user messages
   get CJK text (one unique phrase early on, a common one every 5,000 messages) so a CJK
   substring search has something to find. Above `real_cap` messages (full: 100k) the
   rest of the history is **replicated with SQL** (rows of the real sessions copied into
   more sessions of the same conversation; the FTS index is filled by the store's own
   triggers): ingest at 1M through the engine (~1,000 msgs/s here) would not fit the time
   budget. Such points are labelled `replicated` and give no ingest figure.
2. **measure** — a fresh process opens the built store (like `hermes chat -q` does), starts
   a live session in the same conversation (so its lineage — and every search — spans the
   whole history) and measures: `compress()` over many passes, each adding 20–50 messages
   (engine time = wall time minus the time spent inside `Escalator.summarize`, measured by
   wrapping it; summariser = extractive), `should_compress`, `select_context` (an unchanged
   request must return the identical cached object), `lcm_grep` (text / identifier / CJK
   substring) and `lcm_expand` (messages and summaries), store bytes and peak RSS.

Growth exponents are least-squares slopes on log-log of each cost against N.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

from . import common
from .common import dist, fit_loglog, extrapolate, peak_rss_mb

CONV = "bench-conv"
SESSION_MSGS = 10_000
BATCH = 2_000
LIVE_CONTEXT = 64_000  # the host's minimum window: compaction passes are frequent and small
CJK_UNIQUE = "青龙七号暗号"
CJK_COMMON = "数据库迁移计划"
TEXT_QUERY = "what did we decide about the retry limit for flaky webhook retries"
# An identifier most histories here hold many times (a column of the generated tool outputs, in
# ~2.7% of messages): its summary hits are folded into their originals (retrieval/originals.py)
COMMON_IDENT = "reconcile_day"
SYSTEM = "You are Hermes, an AI agent that helps with software work and everyday questions."

TARGETS = {
    "compress_p50_ms_at_100k": 25.0,
    "compress_growth_exponent": 0.2,
    "ingest_msgs_per_s": 10_000.0,
    "select_context_p50_ms": 1.0,
    "should_compress_p50_ms": 1.0,
    "grep_p50_ms_at_1m": 50.0,
}


# ----------------------------------------------------------------------------- helpers

class _Peek:
    def __init__(self, it: Iterator[dict]) -> None:
        self.it = it
        self.head: dict | None = None
        self.done = False
        self._advance()

    def _advance(self) -> None:
        try:
            self.head = next(self.it)
        except StopIteration:
            self.head, self.done = None, True

    def take(self) -> dict:
        m = self.head
        self._advance()
        return m  # type: ignore[return-value]

    def take_until_turn(self, k: int, stop_before_user: bool = True) -> list[dict]:
        """k messages, then more until the next one starts a turn (never end inside a tool group)."""
        out: list[dict] = []
        while not self.done and len(out) < k:
            out.append(self.take())
        while not self.done and self.head is not None and (
                self.head.get("role") == "tool" or (stop_before_user and self.head.get("role") != "user")):
            out.append(self.take())
        return out


def _plant_cjk(m: dict, index: int) -> dict:
    if m.get("role") != "user" or not isinstance(m.get("content"), str):
        return m
    if index == 0:
        m = dict(m, content=m["content"] + f"\n（备注：请记住，发布前的{CJK_UNIQUE}不要外传。）")
    else:
        m = dict(m, content=m["content"] + f"\n（顺便提一下：{CJK_COMMON}第{index}版已经更新。）")
    return m


# ----------------------------------------------------------------------------- build

def _is_dsn(store: str) -> bool:
    return store.startswith(("postgresql://", "postgres://"))


def _store_stats(store: str) -> dict[str, Any]:
    from lossless_context.store import open_store

    if not _is_dsn(store):
        common.checkpoint(store)
    st = open_store(store)
    try:
        return st.stats()
    finally:
        st.close()


def build(store: str, n: int, *, seed: int, real_cap: int, base_store: str | None,
          profile: bool, limit: int | None = None, deadline_s: float | None = None,
          session_msgs: int = SESSION_MSGS) -> dict[str, Any]:
    """Build the history. `limit`/`deadline_s` stop early (at a turn boundary) on the same
    deterministic stream of `n` messages, so two backends can be compared on identical data.
    `session_msgs` cuts sessions shorter: more of the batches are all-new (the commit path)."""
    from lossless_context.demo.sessions import SessionStream

    out: dict[str, Any] = {"n_requested": n}
    n_real = min(n, real_cap)
    stop_at = min(n_real, limit) if limit else n_real
    deadline = time.monotonic() + deadline_s if deadline_s else None
    if base_store and n > real_cap and os.path.exists(base_store):
        common.checkpoint(base_store)
        shutil.copyfile(base_store, store)
        base_meta = json.loads(Path(base_store + ".meta.json").read_text())
        out.update({"reused_base": True, "identifier": base_meta["identifier"],
                    "ingest": base_meta["ingest"], "sessions_real": base_meta["sessions_real"]})
    else:
        eng = common.make_engine(store, context_length=128_000)
        stream = SessionStream("mixed", n_real, seed)
        peek = _Peek(iter(stream))
        gen_s = ingest_s = 0.0
        stored = 0
        sess = 0
        user_seen = 0
        cjk_k = 0
        batch_rates: list[float] = []
        first_batch_rates: list[float] = []
        live: list[dict] = []
        stopped_early = None
        while not peek.done and stored < stop_at and stopped_early is None:
            sid = f"hist-{sess:04d}"
            eng.on_session_start(sid, conversation_id=CONV, platform="cli")
            live = []
            while not peek.done and len(live) < session_msgs and stored < stop_at:
                if deadline is not None and time.monotonic() > deadline:
                    stopped_early = "deadline"
                    break
                t0 = time.perf_counter()
                batch = peek.take_until_turn(min(BATCH, session_msgs - len(live), stop_at - stored))
                for i, m in enumerate(batch):
                    if m.get("role") == "user":
                        if user_seen == 40:
                            batch[i] = _plant_cjk(m, 0)
                        elif stored + i >= (cjk_k + 1) * 5000:
                            cjk_k += 1
                            batch[i] = _plant_cjk(m, cjk_k)
                        user_seen += 1
                gen_s += time.perf_counter() - t0
                live.extend(batch)
                t0 = time.perf_counter()
                eng.ingest(live, session_id=sid)
                dt = time.perf_counter() - t0
                ingest_s += dt
                stored += len(batch)
                batch_rates.append(len(batch) / dt)
                if len(live) == len(batch):
                    first_batch_rates.append(len(batch) / dt)
            if live:
                sess += 1
        # The store may full-text index a large append after its commit: ingest is done
        # when the last message is searchable (this wait is part of the ingest time).
        t0 = time.perf_counter()
        eng.store.wait_indexed()
        ingest_s += time.perf_counter() - t0
        if stopped_early is None and stored < n_real:
            stopped_early = "limit"
        out["stopped_early"] = stopped_early
        # Re-handing an unchanged list (what every on_session_end before a compaction does).
        t0 = time.perf_counter()
        if live:
            eng.ingest(live, session_id=f"hist-{sess - 1:04d}")
        realign_s = time.perf_counter() - t0
        ident = next((c.value for c in stream.canaries if c.kind in ("error_string", "ticket_id")),
                     stream.canaries[0].value if stream.canaries else "reconcile_day")
        out["identifier"] = ident
        out["sessions_real"] = sess
        out["ingest"] = {
            "messages": stored, "seconds": round(ingest_s, 3), "generation_seconds": round(gen_s, 3),
            "msgs_per_s": round(stored / ingest_s, 1) if ingest_s else None,
            "batch_msgs_per_s": dist(batch_rates, 1),
            "all_new_batch_msgs_per_s": dist(first_batch_rates, 1),
            "realign_msgs_per_s": round(len(live) / realign_s, 1) if realign_s and live else None,
            "method": f"sessions of ~{session_msgs:,} messages, engine.ingest() of the growing list every "
                      f"{BATCH:,} messages",
        }
        eng.store.close()
        if profile:
            out["profile_ingest"] = _profile_ingest(store + ".prof.db", seed)
    replicated = 0
    rep_s = 0.0
    if n > n_real:
        t0 = time.perf_counter()
        replicated = _replicate(store, n - n_real)
        rep_s = time.perf_counter() - t0
    st = _store_stats(store)
    total, sessions, size = st["messages"], st["sessions"], st["bytes"]
    out.update({
        "n_stored": total, "n_real": n_real, "n_replicated": replicated,
        "replicate_seconds": round(rep_s, 2), "sessions": sessions,
        "store_bytes": size, "bytes_per_1k_messages": round(size / total * 1000) if total else None,
        "build_peak_rss_mb": peak_rss_mb(),
    })
    if not _is_dsn(store):
        Path(store + ".meta.json").write_text(json.dumps(out), encoding="utf-8")
    return out


def _profile_ingest(path: str, seed: int) -> dict[str, Any]:
    """cProfile of one typical batch (2,000 new messages appended to a 2,000-message list),
    in a separate throw-away store so the measured history is not touched."""
    from lossless_context.demo.sessions import SessionStream

    from .profiling import profile

    eng = common.make_engine(path, context_length=128_000)
    msgs = list(SessionStream("mixed", 4100, seed + 1000))
    eng.on_session_start("prof-ingest", conversation_id="prof")
    eng.ingest(msgs[:2000], session_id="prof-ingest")
    try:
        return profile("scale_ingest_batch", lambda: eng.ingest(msgs[:4000], session_id="prof-ingest"))
    finally:
        eng.store.close()
        for suf in ("", "-wal", "-shm"):
            try:
                os.remove(path + suf)
            except OSError:
                pass
        shutil.rmtree(path + ".locks", ignore_errors=True)


def _replicate(store: str, extra: int) -> int:
    """Copy real history rows into more sessions of the same conversation (SQL, FTS via triggers)."""
    c = sqlite3.connect(store, isolation_level=None)
    c.execute("PRAGMA journal_mode=WAL")
    c.execute("PRAGMA synchronous=NORMAL")
    real = [r[0] for r in c.execute("SELECT id FROM sessions WHERE id LIKE 'hist-%' ORDER BY id")]
    done = 0
    k = 0
    now = time.time()
    cols = "seq, uid, ident, role, raw, text, tokens, created_at, supersedes, large, exploration"
    while done < extra:
        k += 1
        for sid in real:
            if done >= extra:
                break
            new = f"rep{k:02d}-{sid}"
            c.execute("BEGIN IMMEDIATE")
            c.execute("INSERT INTO sessions(id, conversation_id, created_at, updated_at) VALUES (?, ?, ?, ?)",
                      (new, CONV, now, now))
            cur = c.execute(
                f"INSERT INTO messages(session_id, {cols}) SELECT ?, {cols} FROM messages"
                " WHERE session_id=? ORDER BY seq LIMIT ?", (new, sid, extra - done))
            done += cur.rowcount
            c.execute("COMMIT")
    c.close()
    return done


# ----------------------------------------------------------------------------- measure

def measure(store: str, n_stored: int, *, passes: int, reps: int, identifier: str,
            profile: bool, session: str = "live") -> dict[str, Any]:
    from lossless_context.demo.sessions import SessionStream

    from .host import estimate

    common.quiet_logs()
    eng = common.make_engine(store, context_length=LIVE_CONTEXT)
    eng.update_model(model=common.MODEL, context_length=LIVE_CONTEXT, base_url="http://127.0.0.1:9/v1",
                     api_key="k", provider="custom", api_mode="chat_completions")
    sid = session  # (a new one per measurement of one store: the same id would replay the last one's)
    eng.on_session_start(sid, conversation_id=CONV, platform="cli")
    peek = _Peek(iter(SessionStream("mixed", 400 + (passes + 12) * 60, 7)))
    rng = random.Random(3)
    sys_tok = (len(SYSTEM) + 3) // 4

    def commit(before: list[dict]) -> None:
        eng.on_session_end(sid, before)
        eng.on_session_start(sid, boundary_reason="compression", old_session_id=sid, platform="cli")
        eng.last_prompt_tokens = -1

    live = peek.take_until_turn(300)
    engine_ms: list[float] = []
    compacting_ms: list[float] = []
    wall_ms: list[float] = []
    summ_ms: list[float] = []
    progressed = 0
    last_before: list[dict] = []
    with common.SummariserClock() as clock:
        out = eng.compress(live, current_tokens=sys_tok + estimate(live))  # warm-up (first, big pass)
        if out != live:
            commit(live)
            live = [m for m in out if m.get("role") != "system"]
        for _ in range(passes):
            live = live + peek.take_until_turn(rng.randint(20, 50), stop_before_user=False)
            est = sys_tok + estimate(live)
            before = list(live)
            s0 = clock.seconds
            t0 = time.perf_counter()
            out = eng.compress(live, current_tokens=est)
            wall = (time.perf_counter() - t0) * 1000
            summ = (clock.seconds - s0) * 1000
            wall_ms.append(wall)
            summ_ms.append(summ)
            engine_ms.append(max(0.0, wall - summ))
            if out != before:
                progressed += 1
                compacting_ms.append(max(0.0, wall - summ))
                commit(before)
                last_before = before
                live = [m for m in out if m.get("role") != "system"]
    res: dict[str, Any] = {
        "compress": {
            "passes": passes, "progressed": progressed,
            "engine_ms": dist(engine_ms, 3), "compacting_engine_ms": dist(compacting_ms, 3), "wall_ms": dist(wall_ms, 3), "summariser_ms": dist(summ_ms, 3),
            "live_messages_after": len(live), "live_tokens_after": sys_tok + estimate(live),
        },
    }

    # The per-request figures below are taken on a settled store: on PostgreSQL the passes'
    # writes would have autovacuum start (context_items, summaries) during them, on the same
    # two cores (seen: message expand p50 0.23 vs 0.42 ms between two runs of one build).
    res["settle_seconds"] = common.settle_postgres(store) if _is_dsn(store) else None

    # should_compress: a pure budget check.
    est = sys_tok + estimate(live)
    sc = []
    for i in range(2000):
        t0 = time.perf_counter_ns()
        eng.should_compress(est + (i % 7))
        sc.append((time.perf_counter_ns() - t0) / 1e6)
    res["should_compress_ms"] = dist(sc, 5)

    # select_context: a stale request (carries messages our committed context summarised).
    req = [{"role": "system", "content": SYSTEM}] + (last_before or live)
    t0 = time.perf_counter()
    first = eng.select_context(req)
    build_ms = (time.perf_counter() - t0) * 1000
    times, same = [], True
    for _ in range(500):
        t0 = time.perf_counter_ns()
        r = eng.select_context(req)
        times.append((time.perf_counter_ns() - t0) / 1e6)
        same = same and (r is first)
    res["select_context"] = {"first_call_ms": round(build_ms, 3), "cached_ms": dist(times, 5),
                             "replaced_request": first is not None, "same_object_every_call": same}

    # lcm_grep, once the store's deferred index has caught up with the passes above (it does
    # within moments of an append; timing searches while it works would time the two cores
    # being shared, not the search). A search never waits for it: unindexed rows are searched
    # as they are. (On SQLite also the merging of index segments those writes started.)
    common.settle_indexes(eng.store)
    grep: dict[str, Any] = {}
    for kind, q in (("text", TEXT_QUERY), ("identifier", identifier), ("cjk_substring", CJK_UNIQUE),
                    ("identifier_common", COMMON_IDENT)):
        ts = []
        cpu = []  # (the process's CPU time: on a shared machine, wall time also counts others' load)
        hits = 0
        found = False
        # (the sub-millisecond searches four times as often: their p50 from 15 calls moved by
        # a third between runs)
        for _ in range(reps if kind in ("text", "identifier_common") else reps * 4):
            t0, c0 = time.perf_counter(), time.process_time()
            r = json.loads(eng.handle_tool_call("lcm_grep", {"query": q}))
            ts.append((time.perf_counter() - t0) * 1000)
            cpu.append((time.process_time() - c0) * 1000)
            hits = r.get("hits", 0)
            found = q in json.dumps(r, ensure_ascii=False)
        grep[kind] = {"query": q, "ms": dist(ts, 3), "cpu_ms": dist(cpu, 3), "hits": hits,
                      "query_text_in_result": found}
    res["lcm_grep"] = grep

    # lcm_expand: random stored messages, and the live session's summaries.
    max_id = max(1, n_stored)  # a fresh store numbers messages 1..N
    sids = _live_summaries(eng.store, sid)
    prng = random.Random(5)
    mt, st = [], []
    for mid in [prng.randint(1, max_id) for _ in range(max(20, reps * 6))]:
        t0 = time.perf_counter()
        eng.handle_tool_call("lcm_expand", {"id": f"m{mid}"})
        mt.append((time.perf_counter() - t0) * 1000)
    for s in (prng.sample(sids, min(len(sids), 30)) if sids else []):
        t0 = time.perf_counter()
        eng.handle_tool_call("lcm_expand", {"id": f"s{s}"})
        st.append((time.perf_counter() - t0) * 1000)
    res["lcm_expand"] = {"message_ms": dist(mt, 3), "summary_ms": dist(st, 3),
                         "ms": dist(mt + st, 3), "summaries_in_live_session": len(sids)}

    if profile:
        from .profiling import profile as prof

        def more_passes() -> None:
            nonlocal live
            for _ in range(5):
                live = live + peek.take_until_turn(rng.randint(20, 50), stop_before_user=False)
                before = list(live)
                o = eng.compress(live, current_tokens=sys_tok + estimate(live))
                if o != before:
                    commit(before)
                    live = [m for m in o if m.get("role") != "system"]

        tag = f"{n_stored // 1000}k" if n_stored >= 1000 else str(n_stored)
        res["profile_compress"] = prof(f"scale_compress_passes_{tag}", more_passes)
        res["query_plans"] = _query_plans(eng.store, sid)
        res["profile_grep"] = {kind: prof(f"scale_grep_{kind}_{tag}", lambda q=q: [eng.handle_tool_call(
            "lcm_grep", {"query": q}) for _ in range(3)]) for kind, q in (
            ("text", TEXT_QUERY), ("identifier", identifier), ("cjk_substring", CJK_UNIQUE))}
    eng.store.close()
    res["store_bytes_after"] = _store_stats(store)["bytes"]
    res["measure_peak_rss_mb"] = peak_rss_mb()
    res["n_stored"] = n_stored
    return res


def _query_plans(st: Any, sid: str) -> dict[str, Any]:
    """SQLite's plan for the statements the profiles point at (same SQL as the store runs)."""
    if getattr(st, "kind", "") != "sqlite":
        return {}
    scope = st.lineage(sid)
    marks = ",".join("?" * len(scope))
    stmts = {
        "log_after": (f"SELECT id, ident, uid FROM messages WHERE session_id IN ({marks})"
                      " AND id > ? ORDER BY id LIMIT ?", (*scope, 0, 512)),
        "substring_search": (f"SELECT t.id FROM messages t WHERE (t.text LIKE ? ESCAPE '\\') AND t.session_id IN "
                             f"({marks}) ORDER BY t.id DESC LIMIT ? OFFSET ?", ("%x%", *scope, 40, 0)),
    }
    out: dict[str, Any] = {"lineage_sessions": len(scope)}
    c = st.conn()
    for name, (sql, params) in stmts.items():
        try:
            out[name] = [r[3] for r in c.execute("EXPLAIN QUERY PLAN " + sql, params)]
        except Exception as exc:  # the plan is evidence, not a requirement
            out[name] = [f"unavailable: {exc}"]
    return out


def _live_summaries(st: Any, sid: str) -> list[int]:
    """Every published summary reachable from the live session's context (any backend)."""
    _, ctx = st.get_context(sid)
    todo = [e.ref for e in ctx if e.kind == "s"]
    seen: list[int] = []
    while todo:
        s = todo.pop()
        if s in seen:
            continue
        seen.append(s)
        kids, _ = st.summary_children(s)
        todo.extend(kids)
    return seen


# ----------------------------------------------------------------------------- orchestration

def worker(args: list[str], timeout: float) -> dict[str, Any]:
    out = Path(common.isolate_env()) / f"scale-{os.getpid()}-{time.time_ns()}.json"
    cmd = [sys.executable, "-m", "bench.scale", *args, "--out", str(out)]
    r = subprocess.run(cmd, cwd=common.ROOT, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:3])} failed ({r.returncode}):\n{r.stderr[-4000:]}")
    data = json.loads(out.read_text())
    out.unlink()
    return data


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    quick = cfg["quick"]
    sizes = cfg.get("scale_sizes") or ([1_000, 5_000] if quick else [1_000, 10_000, 100_000, 1_000_000])
    real_cap = cfg.get("real_cap") or (100_000 if not quick else 10**9)
    passes = 10 if quick else 40
    reps = 5 if quick else 15
    work = Path(common.isolate_env()) / "scale"
    work.mkdir(parents=True, exist_ok=True)
    points = []
    stores: dict[int, str] = {}
    largest_real = max([s for s in sizes if s <= real_cap] or [0])
    for n in sizes:
        store = str(work / f"scale-{n}.db")
        base = stores.get(-real_cap) if n > real_cap else None
        prof = (not quick) and cfg.get("profile", True) and n == largest_real
        t0 = time.perf_counter()
        b = worker(["build", "--store", store, "--n", str(n), "--real-cap", str(real_cap)]
                    + (["--base", base] if base else []) + (["--profile"] if prof else []), 7200)
        b["wall_seconds"] = round(time.perf_counter() - t0, 1)
        if n == real_cap and any(x > real_cap for x in sizes):
            # A pristine copy (before the measuring process adds its live session) for the
            # replicated points to start from.
            pristine = str(work / f"scale-{n}-base.db")
            common.checkpoint(store)
            shutil.copyfile(store, pristine)
            shutil.copyfile(store + ".meta.json", pristine + ".meta.json")
            stores[-n] = pristine
        t0 = time.perf_counter()
        m = worker(["measure", "--store", store, "--n", str(b["n_stored"]), "--passes", str(passes),
                     "--reps", str(reps), "--identifier", b["identifier"]]
                    + (["--profile"] if (not quick and cfg.get("profile", True)
                                         and n >= min(real_cap, max(sizes))) else []),
                    3600)
        m["wall_seconds"] = round(time.perf_counter() - t0, 1)
        points.append({"n": n, "build": b, "measure": m})
        stores[n] = store
        print(f"  scale n={n:,}: built {b['n_stored']:,} in {b['wall_seconds']}s, measured in "
              f"{m['wall_seconds']}s", flush=True)
    for s in stores.values():
        for suf in ("", "-wal", "-shm", ".meta.json"):
            try:
                os.remove(s + suf)
            except OSError:
                pass
        shutil.rmtree(s + ".locks", ignore_errors=True)
    return summarise(points, real_cap)


METRICS = {
    "compress_engine_p50_ms": "measure.compress.engine_ms.p50",
    "compress_engine_p95_ms": "measure.compress.engine_ms.p95",
    "compress_compacting_engine_p50_ms": "measure.compress.compacting_engine_ms.p50",
    "compress_wall_p50_ms": "measure.compress.wall_ms.p50",
    "should_compress_p50_ms": "measure.should_compress_ms.p50",
    "select_context_cached_p50_ms": "measure.select_context.cached_ms.p50",
    "select_context_first_ms": "measure.select_context.first_call_ms",
    "grep_text_p50_ms": "measure.lcm_grep.text.ms.p50",
    "grep_identifier_p50_ms": "measure.lcm_grep.identifier.ms.p50",
    "grep_cjk_p50_ms": "measure.lcm_grep.cjk_substring.ms.p50",
    "expand_p50_ms": "measure.lcm_expand.ms.p50",
    "expand_p95_ms": "measure.lcm_expand.ms.p95",
    "bytes_per_1k_messages": "build.bytes_per_1k_messages",
    "measure_peak_rss_mb": "measure.measure_peak_rss_mb",
    "build_peak_rss_mb": "build.build_peak_rss_mb",
}


def summarise(points: list[dict[str, Any]], real_cap: int) -> dict[str, Any]:
    xs = [p["build"]["n_stored"] for p in points]
    fits = {name: fit_loglog(xs, [common.get_path(p, path) for p in points]) for name, path in METRICS.items()}
    real = [p for p in points if not p["build"].get("n_replicated")]
    fits_real = {name: fit_loglog([p["build"]["n_stored"] for p in real], [common.get_path(p, path) for p in real])
                 for name, path in METRICS.items()} if len(real) < len(points) else None
    rows = []
    for p in points:
        row = {"n": p["n"], "n_stored": p["build"]["n_stored"], "replicated": p["build"]["n_replicated"] > 0}
        for name, path in METRICS.items():
            row[name] = common.get_path(p, path)
        ing = p["build"].get("ingest") or {}
        row["ingest_msgs_per_s"] = None if p["build"].get("reused_base") else ing.get("msgs_per_s")
        rows.append(row)
    at = lambda n: next((r for r in rows if r["n"] == n), None)  # noqa: E731
    targets = []
    r100 = at(100_000)
    if r100 is None:  # quick run: extrapolate from the fit, clearly labelled
        v = extrapolate(fits["compress_engine_p50_ms"], 100_000)
        targets.append(_target("compress() engine time p50 at 100k messages", v, "<", TARGETS["compress_p50_ms_at_100k"],
                                "ms", extrapolated=True))
    else:
        targets.append(_target("compress() engine time p50 at 100k messages", r100["compress_engine_p50_ms"], "<",
                               TARGETS["compress_p50_ms_at_100k"], "ms"))
    f = fits["compress_engine_p50_ms"]
    targets.append(_target("compress() engine time growth exponent", f["exponent"] if f else None, "<=",
                           TARGETS["compress_growth_exponent"], ""))
    if fits_real and fits_real.get("compress_engine_p50_ms"):
        targets.append(_target("compress() engine time growth exponent, really-ingested points only",
                               fits_real["compress_engine_p50_ms"]["exponent"], "<=",
                               TARGETS["compress_growth_exponent"], ""))
    rates = [r["ingest_msgs_per_s"] for r in rows if r["ingest_msgs_per_s"]]
    targets.append(_target("ingest throughput (slowest real point)", min(rates) if rates else None, ">=",
                           TARGETS["ingest_msgs_per_s"], "msgs/s"))
    worst = lambda key: max((r[key] for r in rows if r[key] is not None), default=None)  # noqa: E731
    targets.append(_target("select_context p50 (cached, worst size)", worst("select_context_cached_p50_ms"), "<",
                           TARGETS["select_context_p50_ms"], "ms"))
    targets.append(_target("should_compress p50 (worst size)", worst("should_compress_p50_ms"), "<",
                           TARGETS["should_compress_p50_ms"], "ms"))
    r1m = at(1_000_000)
    for kind in ("text", "identifier", "cjk"):
        key = f"grep_{kind}_p50_ms"
        if r1m is not None:
            targets.append(_target(f"lcm_grep {kind} p50 at 1M messages", r1m[key], "<", TARGETS["grep_p50_ms_at_1m"],
                                   "ms", note="1M store partly replicated with SQL" if r1m["replicated"] else ""))
        else:
            targets.append(_target(f"lcm_grep {kind} p50 at 1M messages", extrapolate(fits[key], 1_000_000), "<",
                                   TARGETS["grep_p50_ms_at_1m"], "ms", extrapolated=True))
    return {"points": points, "rows": rows, "fits": fits, "fits_real_points": fits_real, "targets": targets,
            "real_cap": real_cap}


def _target(name: str, value: Any, op: str, limit: float, unit: str, *, extrapolated: bool = False,
            note: str = "") -> dict[str, Any]:
    met = None
    if value is not None:
        met = {"<": value < limit, "<=": value <= limit, ">=": value >= limit}[op]
    return {"target": name, "value": None if value is None else round(float(value), 4), "op": op, "limit": limit,
            "unit": unit, "met": met, "extrapolated": extrapolated, "note": note}


# ----------------------------------------------------------------------------- worker entry

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.scale")
    ap.add_argument("mode", choices=["build", "measure"])
    ap.add_argument("--store", required=True)
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--real-cap", type=int, default=10**9)
    ap.add_argument("--base")
    ap.add_argument("--passes", type=int, default=12)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--identifier", default="reconcile_day")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--session", default="live")
    ap.add_argument("--limit", type=int)
    ap.add_argument("--deadline", type=float)
    ap.add_argument("--session-msgs", type=int, default=SESSION_MSGS)
    a = ap.parse_args(argv)
    common.isolate_env()
    common.quiet_logs()
    if a.mode == "build":
        res = build(a.store, a.n, seed=a.seed, real_cap=a.real_cap, base_store=a.base, profile=a.profile,
                    limit=a.limit, deadline_s=a.deadline, session_msgs=a.session_msgs)
    else:
        res = measure(a.store, a.n, passes=a.passes, reps=a.reps, identifier=a.identifier, profile=a.profile,
                      session=a.session)
    Path(a.out).write_text(json.dumps(res, default=str), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
