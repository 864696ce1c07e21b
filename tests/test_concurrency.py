"""Concurrency: many threads, two processes, host timeouts and passes the host never commits.

(a) One engine shared by 8 threads x 4 sessions (compress/on_session_end/select_context with
    ``session_id=`` in kwargs, tools through per-session clones): no exception, every
    session's stored messages are exactly its inputs (in order, byte-identical), and every
    session's DAG is connected.
(b) Two OS processes (a "gateway" and a "CLI") write one SQLite file, each its own session
    and both one shared session, at the same time: no "database is locked" reaches the
    caller or the log, nothing lost or duplicated, and compaction of one session never
    runs in both processes at once (per-session compaction lock).
(c) Host timeout: compress() runs on a worker thread; while its first summariser call is
    held open the host flips ``_compression_cancelled_check`` and discards the result. Nothing is
    published, the engine stops calling the summariser right away, and whatever was staged
    is dropped by the next pass.
(d) A pass the host never commits, followed by a compress() of the OLD list: the stale
    stage is discarded and nothing of it ever becomes visible.
"""

from __future__ import annotations

import copy
import json
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from lossless_context import LCMEngine
from lossless_context.pipeline.validate import pairing_problems
from lossless_context.config import LCMConfig
from lossless_context.ops.doctor import run_doctor
from lossless_context.messages import safe_json
from lossless_context.demo.sessions import coding_session
from lossless_context.store import open_store
from lossless_context.tokens import estimate_messages_tokens
from tests.support.dagcheck import assert_connected
from tests.support.engine_worker import _tag, turn_ends
from tests.support.fake_openai import FakeOpenAI, SummariserResponder
from tests.test_hostile_input import record_counts

WORKER = Path(__file__).resolve().parent / "support" / "engine_worker.py"
COUNTS: Counter = Counter()


def _cfg(path: Path, **kw) -> LCMConfig:
    return LCMConfig.load({"store": str(path), "summarizer": "extractive", "fresh_tail_tokens": 1000,
                           "leaf_chunk_tokens": 2000, "threshold": 0.2, "soft_threshold": 0.15, "lock_timeout": 60,
                           **kw}, read_file=False)


def _stored(store, sid: str) -> list[str]:
    return [r[0] for r in store.conn().execute("SELECT raw FROM messages WHERE session_id=? ORDER BY id", (sid,))]


def _same(stored: list[str], msgs: list[dict]) -> bool:
    return len(stored) == len(msgs) and all(
        a == safe_json(b) or json.dumps(json.loads(a), sort_keys=True) == json.dumps(b, sort_keys=True)
        for a, b in zip(stored, msgs))


# --------------------------------------------------------------------------- (a) threads


def test_one_engine_many_threads_and_sessions(tmp_path):
    n_threads, per_thread, n_msgs = 8, 4, 90
    engine = LCMEngine(config=_cfg(tmp_path / "lcm.db"))
    engine.update_model(model="m", context_length=64_000)
    sessions = {f"t{t}-s{k}": coding_session(n_msgs, seed=100 + t * 10 + k).messages
                for t in range(n_threads) for k in range(per_thread)}
    errors: list[str] = []
    invalid: list[str] = []
    stats: Counter = Counter()
    lock = threading.Lock()
    barrier = threading.Barrier(n_threads)

    def drive(t: int) -> None:
        try:
            mine = [f"t{t}-s{k}" for k in range(per_thread)]
            clones = {}
            for sid in mine:  # a clone per session for the tools (they answer for the bound session)
                c = engine.clone_for_agent()
                c.bind_session_state(None, sid)
                c.on_session_start(sid, platform="gateway")
                clones[sid] = c
            hosts = {sid: [] for sid in mine}
            pos = {sid: 0 for sid in mine}
            ends = {sid: turn_ends(sessions[sid]) for sid in mine}
            barrier.wait()
            step = 0
            while any(pos[s] < len(sessions[s]) for s in mine):
                for sid in mine:
                    msgs = sessions[sid]
                    if pos[sid] >= len(msgs):
                        continue
                    end = next(x for x in ends[sid] if x > pos[sid])
                    hosts[sid].extend(copy.deepcopy(msgs[pos[sid]:end]))
                    pos[sid] = end
                    step += 1
                    est = estimate_messages_tokens(hosts[sid])
                    if est > engine.threshold_tokens or step % 5 == 0:
                        before = copy.deepcopy(hosts[sid])
                        out = engine.compress(hosts[sid], current_tokens=est, force=step % 5 == 0, session_id=sid)
                        if out != before and out:
                            errs = pairing_problems(out)
                            if errs:
                                with lock:
                                    invalid.extend(errs)
                            engine.on_session_end(sid, before)
                            hosts[sid] = out
                            clones[sid].on_session_start(sid, boundary_reason="compression", old_session_id=sid)
                            with lock:
                                stats["compactions"] += 1
                    sel = engine.select_context(copy.deepcopy(hosts[sid]), session_id=sid)
                    assert sel is None or pairing_problems(sel) == []
                    if step % 3 == 0:
                        res = json.loads(clones[sid].handle_tool_call(
                            "lcm_grep", {"query": "pytest failed"}, messages=copy.deepcopy(hosts[sid])))
                        assert "error" not in res, res
                        with lock:
                            stats["tool_calls"] += 1
            for sid in mine:
                engine.on_session_end(sid, copy.deepcopy(hosts[sid]))
        except BaseException as exc:  # noqa: BLE001 - reported below
            with lock:
                errors.append(f"thread {t}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=drive, args=(t,)) for t in range(n_threads)]
    t0 = time.monotonic()
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=300)
    elapsed = time.monotonic() - t0
    assert not errors, errors
    assert not invalid, invalid[:5]
    reason = engine.get_status().get("lcm_last_reason") or ""
    assert not reason.startswith("error"), reason
    store = engine.store
    for sid, msgs in sessions.items():
        assert _same(_stored(store, sid), msgs), f"session {sid}: stored rows differ from its messages"
        assert_connected(store, sid)
    total = store.stats()["messages"]
    assert total == sum(len(m) for m in sessions.values()), "no row lost or duplicated"
    rep = run_doctor(store)
    assert all(c.ok for c in rep.checks if c.name != "no stale staged work"), rep.render_text()
    assert stats["compactions"] >= len(sessions)
    COUNTS.update({"threads": n_threads, "thread_sessions": len(sessions), "thread_messages": total,
                   "thread_compactions": stats["compactions"], "thread_tool_calls": stats["tool_calls"]})
    COUNTS["thread_seconds"] = round(elapsed, 1)
    record_counts("concurrency", COUNTS)


# --------------------------------------------------------------------------- (b) processes


def test_two_processes_share_one_store_and_one_session(tmp_path):
    n_msgs, force_every = 160, 4
    names = {"gateway": 1, "cli": 2}
    procs = {name: subprocess.Popen([sys.executable, str(WORKER), "writer", str(tmp_path), name, str(seed),
                                     str(n_msgs), str(force_every)], stderr=subprocess.PIPE)
             for name, seed in names.items()}
    time.sleep(0.3)
    (tmp_path / "go").touch()
    errs = {}
    for name, p in procs.items():
        _, err = p.communicate(timeout=240)
        errs[name] = err.decode(errors="replace")
        assert p.returncode == 0, f"{name} failed: {errs[name][-3000:]}"
    results = {name: json.loads((tmp_path / f"{name}.result.json").read_text()) for name in names}
    for name, res in results.items():
        assert not res["errors"], (name, res["errors"][:5])
        assert not res["reasons"], (name, res["reasons"][:5])
        locked = [r for r in res["log"] if "locked" in r or "busy" in r]
        assert not locked, (name, locked[:5])
        assert "database is locked" not in errs[name]

    store = open_store(str(tmp_path / "lcm" / "lcm.db"))
    try:
        for name, seed in names.items():
            own = coding_session(n_msgs, seed=seed).messages
            assert _same(_stored(store, f"own-{name}"), own), f"{name}'s own session: rows lost/duplicated/changed"
        shared_rows = store.conn().execute("SELECT raw FROM messages WHERE session_id='shared' ORDER BY id").fetchall()
        shared = [json.dumps(json.loads(r[0]), sort_keys=True) for r in shared_rows]
        dups = 0
        for name, seed in names.items():
            mine = [json.dumps(_tag(m, name), sort_keys=True)
                    for m in coding_session(n_msgs, seed=seed + 1000).messages]
            wanted = set(mine)
            first_seen = list(dict.fromkeys(m for m in shared if m in wanted))
            assert first_seen == mine, f"{name}'s messages in the shared session: lost or reordered"
            dups += sum(1 for m in shared if m in wanted) - len(mine)
        COUNTS["shared_session_duplicates_seen"] = dups
        assert dups == 0, f"{dups} messages of the shared session stored twice"
        con = store.conn()
        assert con.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    finally:
        store.close()

    # Compaction of one session never ran in both processes at once.
    by_session: dict[str, list[tuple[float, float, str]]] = {}
    for name, res in results.items():
        for sid, a, b in res["intervals"]:
            by_session.setdefault(sid, []).append((a, b, name))
    shared_iv = sorted(by_session.get("shared", []))
    assert {n for _, _, n in shared_iv} == set(names), "both processes compacted the shared session"
    for (a1, b1, n1), (a2, b2, n2) in zip(shared_iv, shared_iv[1:]):
        assert a2 >= b1, f"compactions of 'shared' interleaved: {n1} [{a1:.3f},{b1:.3f}] and {n2} [{a2:.3f},{b2:.3f}]"
    COUNTS.update({"writer_processes": len(names), "shared_session_compactions": len(shared_iv),
                   "process_messages": 4 * n_msgs})
    record_counts("concurrency", COUNTS)


def test_two_hosts_writing_one_session_store_each_message_once(tmp_path):
    base = LCMEngine(config=_cfg(tmp_path / "lcm.db"))
    base.update_model(model="m", context_length=64_000)
    lists = {name: [_tag(m, name) for m in coding_session(300, seed=seed).messages]
             for name, seed in (("gateway", 31), ("cli", 32))}
    engines, hosts, pos = {}, {}, {}
    for name in lists:
        e = base.clone_for_agent()
        e.bind_session_state(None, "shared")
        e.on_session_start("shared", platform=name)
        engines[name], hosts[name], pos[name] = e, [], 0
    ends = {name: turn_ends(m) for name, m in lists.items()}
    while any(pos[n] < len(lists[n]) for n in lists):
        for name, msgs in lists.items():  # strictly alternating turns: deterministic
            if pos[name] >= len(msgs):
                continue
            e = engines[name]
            end = next(x for x in ends[name] if x > pos[name])
            hosts[name].extend(copy.deepcopy(msgs[pos[name]:end]))
            pos[name] = end
            est = estimate_messages_tokens(hosts[name])
            if e.should_compress(est):
                before = copy.deepcopy(hosts[name])
                out = e.compress(hosts[name], current_tokens=est)
                if out != before:
                    e.on_session_end("shared", before)
                    hosts[name] = out
                    e.on_session_start("shared", boundary_reason="compression", old_session_id="shared")
            else:
                e.on_turn_complete(copy.deepcopy(hosts[name]))
    rows = [json.loads(r[0]) for r in base.store.conn().execute(
        "SELECT raw FROM messages WHERE session_id='shared' ORDER BY id")]
    blocks = [m for m in rows if "<lcm-summary" in str(m.get("content"))]
    assert not blocks, f"{len(blocks)} of our own summary blocks stored as messages"
    got = Counter(json.dumps(m, sort_keys=True) for m in rows)
    want = Counter(json.dumps(m, sort_keys=True) for msgs in lists.values() for m in msgs)
    assert got == want, f"{sum((got - want).values())} duplicated, {sum((want - got).values())} lost"


@pytest.mark.parametrize("seed", range(8))
def test_two_hosts_interleaving_compress_and_commit_store_each_message_once(tmp_path, seed):
    """Like two processes on one session id, in one deterministic schedule: a host's pass is
    staged, the other host runs turns and passes of its own, and only then does the first
    host commit. Neither host's stage may be discarded or published by the other."""
    rng = random.Random(seed)
    base = LCMEngine(config=_cfg(tmp_path / "lcm.db"))
    base.update_model(model="m", context_length=64_000)
    lists = {name: [_tag(m, name) for m in coding_session(160, seed=s).messages]
             for name, s in (("gateway", 1001 + seed), ("cli", 2001 + seed))}
    engines, hosts, pos, waiting = {}, {}, {}, {}
    for name in lists:
        e = base.clone_for_agent()
        e.bind_session_state(None, "shared")
        e.on_session_start("shared", platform=name)
        engines[name], hosts[name], pos[name], waiting[name] = e, [], 0, None
    ends = {name: turn_ends(m) for name, m in lists.items()}
    step = commits = 0
    while any(pos[n] < len(lists[n]) or waiting[n] for n in lists):
        name = rng.choice(sorted(lists))
        e = engines[name]
        if waiting[name] is not None:  # the host commits a pass it got back earlier
            before, out = waiting[name]
            waiting[name] = None
            e.on_session_end("shared", before)
            hosts[name] = out
            e.on_session_start("shared", boundary_reason="compression", old_session_id="shared")
            commits += 1
            continue
        if pos[name] >= len(lists[name]):
            continue
        end = next(x for x in ends[name] if x > pos[name])
        hosts[name].extend(copy.deepcopy(lists[name][pos[name]:end]))
        pos[name] = end
        step += 1
        est = estimate_messages_tokens(hosts[name])
        if e.should_compress(est) or step % 4 == 0:
            before = copy.deepcopy(hosts[name])
            out = e.compress(hosts[name], current_tokens=est, force=step % 4 == 0)
            assert not pairing_problems(out), pairing_problems(out)
            if out != before and out:
                waiting[name] = (before, out)
        else:
            e.on_turn_complete(copy.deepcopy(hosts[name]))
    for name, e in engines.items():
        e.on_session_end("shared", copy.deepcopy(hosts[name]))
    assert commits >= 4
    rows = [json.loads(r[0]) for r in base.store.conn().execute(
        "SELECT raw FROM messages WHERE session_id='shared' ORDER BY id")]
    assert not [m for m in rows if "<lcm-summary" in str(m.get("content"))], "a summary block stored as a message"
    got = Counter(json.dumps(m, sort_keys=True) for m in rows)
    want = Counter(json.dumps(m, sort_keys=True) for msgs in lists.values() for m in msgs)
    assert got == want, f"{sum((got - want).values())} duplicated, {sum((want - got).values())} lost"
    published = base.store.conn().execute(
        "SELECT COUNT(*) FROM summaries WHERE session_id='shared' AND state='published'").fetchone()[0]
    assert published, "no pass of either host was published"
    assert not base.store.staged_passes("shared"), "a stage was left behind after both hosts committed"


# --------------------------------------------------------------------------- (c) host timeout


def test_host_timeout_cancels_the_pass_and_nothing_is_published(tmp_path):
    """Decided, not raced: the host cancels while the pass's first summariser call is held
    open by the server; that call is then answered, and no call may start after it."""
    arrived = threading.Event()  # the pass's first summariser call reached the server
    answer = threading.Event()  # the server may answer it
    base = SummariserResponder(max_chars=900)

    def held(req):
        arrived.set()
        answer.wait(60)
        return base(req)

    with FakeOpenAI(responder=held) as srv:
        e = LCMEngine(config=_cfg(tmp_path / "lcm.db", summarizer="openai", summary_base_url=srv.base_url,
                                  summary_model="summ", summary_timeout=120, breaker_failures=1000,
                                  max_summarizer_calls=10**6))
        e.update_model(model="m", context_length=64_000)
        e.on_session_start("s1")
        msgs = coding_session(220, seed=9).messages
        cancelled = [False]
        e._compression_cancelled_check = lambda: cancelled[0]
        result: dict = {}

        def worker() -> None:  # the host's thread pool: a private deep copy of the messages
            try:
                result["out"] = e.compress(copy.deepcopy(msgs), current_tokens=estimate_messages_tokens(msgs))
            except BaseException as exc:  # noqa: BLE001
                result["exc"] = exc

        th = threading.Thread(target=worker)
        th.start()
        try:
            assert arrived.wait(60), "the pass did call the summariser before the timeout"
            cancelled[0] = True  # the host's timeout won: it gives up and discards the result
            t_cancel = time.monotonic()
            n_before = len(srv.chat_requests)  # the one call in flight (the engine calls one at a time)
        finally:
            answer.set()
        th.join(timeout=60)
        stopped_after = time.monotonic() - t_cancel  # (recorded, not asserted: not a speed test)
        assert not th.is_alive() and "exc" not in result
        assert n_before == 1
        late = len(srv.chat_requests) - n_before
        assert not late, f"{late} summariser calls started after the host cancelled"
        st = e.store.stats()
        assert st["summaries_by_depth"] == {}, "nothing is published without the commit signal"
        staged_first = {r[0] for r in e.store.conn().execute("SELECT id FROM summaries WHERE state='staged'")}

        # The host retries later (no cancellation, fast summariser): the next pass drops any
        # stale stage of the cancelled one, and only the adopted pass is ever published.
        cancelled[0] = False  # (the server answers at once from now on: `answer` is set)
        before = copy.deepcopy(msgs)
        out = e.compress(copy.deepcopy(msgs), current_tokens=estimate_messages_tokens(msgs))
        assert out != before
        e.on_session_end("s1", before)
        e.on_session_start("s1", boundary_reason="compression", old_session_id="s1")
        published = {r[0] for r in e.store.conn().execute("SELECT id FROM summaries WHERE state='published'")}
        assert published and not (published & staged_first)
        left = {r[0] for r in e.store.conn().execute("SELECT id FROM summaries WHERE state='staged'")}
        assert not (left & staged_first), "the cancelled pass's stage was dropped"
        for sid in staged_first:
            assert json.loads(e.handle_tool_call("lcm_describe", {"id": f"s{sid}"}))["error"].startswith("unknown id")
        COUNTS.update({"timeout_requests_before_cancel": n_before,
                       "timeout_stop_seconds": round(stopped_after, 2)})
    record_counts("concurrency", COUNTS)


# --------------------------------------------------------------------------- (d) never committed


def test_uncommitted_pass_with_old_list_is_discarded_and_never_visible(tmp_path):
    e = LCMEngine(config=_cfg(tmp_path / "lcm.db"))
    e.update_model(model="m", context_length=64_000)
    e.on_session_start("s1")
    sess = coding_session(300, seed=21).messages
    old = copy.deepcopy(sess[:200])
    out1 = e.compress(copy.deepcopy(old), force=True)
    assert out1 != old
    con = e.store.conn()
    stage1 = {r[0] for r in con.execute("SELECT id FROM summaries WHERE state='staged'")}
    assert stage1, "the first pass staged its summaries"

    def visible(ids: set[int]) -> set[int]:
        seen = set()
        for sid in ids:
            if "error" not in json.loads(e.handle_tool_call("lcm_describe", {"id": f"s{sid}"})):
                seen.add(sid)
            if "error" not in json.loads(e.handle_tool_call("lcm_expand", {"id": f"s{sid}"})):
                seen.add(sid)
        text = " ".join(r[0] for r in con.execute(
            f"SELECT text FROM summaries WHERE id IN ({','.join('?' * len(ids))})", list(ids))) if ids else ""
        for w in [w for w in text.split() if w.isalpha() and len(w) > 6][:5]:
            g = json.loads(e.handle_tool_call("lcm_grep", {"query": w, "scope": "summaries", "limit": 100}))
            seen |= {int(h["id"][1:]) for grp in g.get("groups", []) for h in grp["hits"]} & ids
        return seen

    assert not visible(stage1), "a staged pass is invisible to the tools"
    e.on_session_end("s1", copy.deepcopy(old))  # a flush does not publish it either
    assert not visible(stage1)
    e.select_context(copy.deepcopy(old))
    assert e.store.stats()["summaries_by_depth"] == {}

    # The host did not adopt: its next compress() gets the OLD list plus the new turns.
    old2 = copy.deepcopy(sess[:260])
    out2 = e.compress(copy.deepcopy(old2), force=True)
    assert out2 != old2
    still = {r[0] for r in con.execute("SELECT id FROM summaries WHERE state='staged'")}
    assert not (still & stage1), "the stale stage was discarded by the next pass"
    e.on_session_end("s1", old2)
    e.on_session_start("s1", boundary_reason="compression", old_session_id="s1")
    published = {r[0] for r in con.execute("SELECT id FROM summaries WHERE state='published'")}
    assert published and not (published & stage1), "nothing of the stale stage is ever published"
    assert not visible(stage1)
    # and the adopted pass keeps everything reachable
    host = [m for m in out2]
    e.on_session_end("s1", host + copy.deepcopy(sess[260:]))
    assert_connected(e.store, "s1")
    assert _same(_stored(e.store, "s1"), sess)
