"""Issue #43, retention: `lcm prune` by age and by size, in both modes, on both backends.

Stores are built through the real engine (message times from the host's ``timestamp``
keys), exported, aged (the sessions' last writes set to their messages' times) and imported:
an imported history keeps its age, as a user's restored backup would.
"""

from __future__ import annotations

import copy
import json
import os
import time
from pathlib import Path

import pytest

from lossless_context import LCMEngine
from lossless_context.config import LCMConfig, RetentionPolicy
from lossless_context.ops import retention
from lossless_context.ops.doctor import run_doctor
from lossless_context.ops.export import import_jsonl, iter_export
from lossless_context.edits.forget import forget_session
from lossless_context.store import open_store

DAY = 86_400.0


@pytest.fixture(params=["sqlite", "postgres"])
def location(request, tmp_path, monkeypatch):
    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "hermes"))
    for k in list(os.environ):
        if k.startswith("LCM_"):
            monkeypatch.delenv(k)
    if request.param == "sqlite":
        return str(tmp_path / "lcm.db")
    return request.getfixturevalue("pg_fresh_dsn")


def _engine(location: str, **over) -> LCMEngine:
    e = LCMEngine(config=LCMConfig.load({"store": location, "summarizer": "extractive", **over}, read_file=False))
    e.update_model("m", 24_000)
    return e


def _history(tag: str, turns: int, t0: float) -> list[dict]:
    out = []
    for i in range(turns):
        pad = f" {tag} filler sentence number {i} about the deployment of service {tag}-{i}." * 30
        out.append({"role": "user", "content": f"{tag} question {i}: what about CANARY-{tag}-{i}?" + pad,
                    "timestamp": t0 + 60 * i})
        out.append({"role": "assistant", "content": f"{tag} answer {i}, noted CANARY-{tag}-{i}." + pad,
                    "timestamp": t0 + 60 * i + 30})
    return out


def _drive(e: LCMEngine, sid: str, hist: list[dict], parent: str | None = None) -> None:
    """A host session: compress whenever the list is over the threshold, like the host."""
    e.on_session_start(sid, conversation_id=None) if parent is None else None
    e.bind_session_state(None, sid)
    shown: list[dict] = []
    for k in range(0, len(hist), 4):
        shown = shown + hist[k:k + 4]
        if e.should_compress(sum(len(m["content"]) for m in shown) // 4):
            shown = e.compress(shown)
            e.on_session_start(sid, boundary_reason="compression", old_session_id=sid)
    e.on_session_end(sid, shown)


def build_store(location: str, tmp_path: Path, specs: list[tuple[str, float, int, str | None]]) -> None:
    """specs: (session, age in days, turns, parent). Built in a scratch store, aged, imported."""
    now = time.time()
    scratch = str(tmp_path / f"scratch-{time.monotonic_ns()}.db")
    e = _engine(scratch)
    for sid, age, turns, parent in specs:
        if parent:
            e.store.ensure_session(sid, parent_id=parent, boundary_reason="branch")
        _drive(e, sid, _history(sid, turns, now - age * DAY), parent)
    lines = list(iter_export(e.store))
    e.store.close()
    last = {}
    for ln in lines[1:]:
        r = json.loads(ln)
        if r["type"] == "message":
            last[r["session_id"]] = max(last.get(r["session_id"], 0.0), r["created_at"])
    aged = [lines[0]]
    for ln in lines[1:]:
        r = json.loads(ln)
        if r["type"] == "session":
            r["updated_at"] = r["created_at"] = last.get(r["id"], now)
        aged.append(json.dumps(r))
    store = open_store(location)
    try:
        import_jsonl(store, aged)
    finally:
        store.close()


SPECS = [("old-a", 200, 20, None), ("old-a-branch", 190, 6, "old-a"), ("old-b", 120, 20, None),
         ("mid", 40, 20, None), ("fresh", 0.2, 8, None)]


def _grep_all(store, word: str) -> list[str]:
    e = LCMEngine(config=LCMConfig.load({"store": store.location, "summarizer": "extractive",
                                         "cross_session_search": True}, read_file=False))
    e._store = store  # (the test's own store object: no second connection pool)
    sid = store.list_sessions()[-1]["id"]
    e.bind_session_state(None, sid)
    ans = json.loads(e.handle_tool_call("lcm_grep", {"query": word, "limit": 50, "session_scope": "all"}))
    assert "error" not in ans, ans
    return [h["id"] for g in ans["groups"] for h in g["hits"]]


def _size(location: str) -> int:
    return sum(os.path.getsize(location + s) for s in ("", "-wal") if os.path.exists(location + s))


def _sessions(store) -> set[str]:
    return {s["id"] for s in store.list_sessions()}


def test_prune_by_age_removes_whole_lineages_and_the_file_shrinks(location, tmp_path):
    build_store(location, tmp_path, SPECS)
    store = open_store(location)
    try:
        assert run_doctor(store).ok
        before = _size(location) if not location.startswith("postgres") else 0
        assert _grep_all(store, "CANARY-old-a-3") and _grep_all(store, "CANARY-mid-3")
        plan = retention.plan_prune(store, older_than_days=90)
        assert sorted(plan.sessions) == ["old-a", "old-a-branch", "old-b"]
        assert plan.est_freed > 0 and plan.protected == 0
        # each row is weighed by its text before a transaction takes it (ops/batches.py)
        ids, sums = store.session_message_ids("old-a"), store.session_summary_ids("old-a")
        weights = store.removal_tokens(ids + [10**9], sums)
        assert weights["messages"] == {i: m.tokens for i, m in store.get_messages(ids).items()}
        assert set(weights["summaries"]) == set(sums) and min(weights["summaries"].values()) > 0
        rep = retention.prune(store, plan, pause=0)
        assert rep.sessions == 3 and rep.messages > 0 and rep.summaries > 0 and not rep.skipped
        assert rep.transactions == len(rep.batch_log.batches) >= 2
        assert sum(n for n, _u, _s in rep.batch_log.batches) == rep.messages + rep.summaries
        assert all(units > rows for rows, units, _s in rep.batch_log.batches)  # (their tokens counted)
        assert _sessions(store) == {"mid", "fresh"}
        # gone from search, messages and summaries alike; the rest untouched
        assert _grep_all(store, "CANARY-old-a-3") == [] and _grep_all(store, "CANARY-old-b-7") == []
        assert _grep_all(store, "CANARY-mid-3") and _grep_all(store, "CANARY-fresh-2")
        doc = run_doctor(store)
        assert doc.ok, doc.render_text()
        if not location.startswith("postgres"):
            assert _size(location) < before * 0.85, (before, _size(location))  # (fixed pages: ~0.7 MB)
            assert rep.bytes_returned > 0
        runs = store.retention_runs(1)
        assert runs[0]["finished_at"] and runs[0]["sessions"] == 3
    finally:
        store.close()


def test_prune_by_size_takes_the_oldest_first(location, tmp_path):
    build_store(location, tmp_path, SPECS)
    store = open_store(location)
    try:
        used = store.space()["used_bytes"]
        plan = retention.plan_prune(store, max_bytes=int(used * 0.75))
        order = [g.sessions[0] for g in plan.lineages]
        assert order and order[0] == "old-a"  # oldest lineage first
        assert "fresh" not in plan.sessions and "mid" not in order[:1]
        retention.prune(store, plan, pause=0)
        left = _sessions(store)
        assert "old-a" not in left and "fresh" in left
        if not location.startswith("postgres"):  # measured: under the limit, or only what must stay is left
            assert store.space()["used_bytes"] <= used * 0.75 or left == {"fresh"}
        assert run_doctor(store).ok
        # a size no prune can reach: everything but the lineage active today goes, never that one
        plan = retention.plan_prune(store, max_bytes=1)
        retention.prune(store, plan, pause=0)
        assert _sessions(store) == {"fresh"}
        assert run_doctor(store).ok
    finally:
        store.close()


def test_keep_summaries_drops_originals_and_says_so(location, tmp_path):
    build_store(location, tmp_path, SPECS)
    store = open_store(location)
    try:
        msgs_before = store.stats()["messages"]
        old_sums = set(store.session_summary_ids("old-b"))
        assert old_sums
        plan = retention.plan_prune(store, older_than_days=90, keep_summaries=True)
        assert plan.mode == "originals" and sorted(plan.sessions) == ["old-a", "old-a-branch", "old-b"]
        rep = retention.prune(store, plan, pause=0)
        assert rep.sessions == 0 and rep.summaries == 0 and rep.messages > 0
        assert store.stats()["messages"] == msgs_before - rep.messages
        assert set(store.session_summary_ids("old-b")) == old_sums  # the DAG stays
        # the active context still holds what it held (its unsummarised tail kept)
        _v, ctx = store.get_context("old-b")
        assert ctx and all(e.kind == "s" or store.get_messages([e.ref]) for e in ctx)
        doc = run_doctor(store)
        assert doc.ok, doc.render_text()
        # the tools say plainly what happened
        e = _engine(location, cross_session_search=True)
        e._store = store
        e.bind_session_state(None, "old-b")
        leaf = next(s for s, r in store.get_summaries(sorted(old_sums)).items() if r.kind == "leaf")
        ans = json.loads(e.handle_tool_call("lcm_expand", {"id": f"s{leaf}"}))
        day = time.strftime("%Y-%m-%d", time.gmtime())
        assert "removed by retention on " + day in ans["originals_removed"], ans
        assert ans["text"]
        span = store.pruned_spans([leaf])[leaf]
        gone = json.loads(e.handle_tool_call("lcm_expand", {"id": f"m{span['first_id']}"}))
        assert "removed by retention on " + day in gone["error"] and f"s{leaf}" in gone["error"], gone
        # search: the originals are gone, the summaries that kept their words are marked
        hits = json.loads(e.handle_tool_call("lcm_grep", {"query": "deployment of service old-b", "limit": 20}))
        kinds = [h for g in hits["groups"] for h in g["hits"]]
        assert kinds and all(h["kind"] == "summary" or h["id"] in {f"m{x.ref}" for x in ctx} for h in kinds)
        assert any("originals_removed" in h for h in kinds if h["kind"] == "summary")
        # a second prune finds nothing more to take
        again = retention.plan_prune(store, older_than_days=90, keep_summaries=True)
        assert again.lineages == []
        # forget still works on a pruned lineage (its pruned-span records go with it)
        forget_session(store, "old-b")
        assert store.pruned_spans(sorted(old_sums)) == {}
        assert run_doctor(store).ok
    finally:
        store.close()


def test_a_live_session_and_one_active_today_are_never_touched(location, tmp_path):
    build_store(location, tmp_path, SPECS)
    store = open_store(location)
    try:
        plan = retention.plan_prune(store, older_than_days=0, live=["old-b"])
        assert "old-b" not in plan.sessions and "fresh" not in plan.sessions
        assert plan.protected == 2
        # a session that comes alive between the plan and the removal is left alone
        plan = retention.plan_prune(store, older_than_days=90)
        rep = retention.prune(store, plan, pause=0, live=lambda: {"old-b"})
        assert rep.skipped == ["old-b"] and "old-b" in _sessions(store)
        assert run_doctor(store).ok
    finally:
        store.close()


def test_undo_and_forget_guarantees_hold_after_a_prune(location, tmp_path):
    build_store(location, tmp_path, SPECS)
    e = _engine(location)
    e.bind_session_state(None, "today")
    base = [{"role": "user", "content": "hello there"}, {"role": "assistant", "content": "hi"}]
    e.on_session_end("today", base + [{"role": "user", "content": "my token is UNDONE-SECRET-42"},
                                      {"role": "assistant", "content": "ok"}])
    e.on_session_end("today", base)  # /undo
    store = e.store
    retention.prune(store, retention.plan_prune(store, older_than_days=30), pause=0)
    assert "today" in _sessions(store) and "mid" not in _sessions(store)
    hits = json.loads(e.handle_tool_call("lcm_grep", {"query": "UNDONE-SECRET-42"}))
    assert [h for g in hits["groups"] for h in g["hits"]] == []
    retention.prune(store, retention.plan_prune(store, older_than_days=0), pause=0)
    assert "today" in _sessions(store) and "fresh" in _sessions(store)
    assert run_doctor(store).ok


def test_an_interrupted_prune_is_reported_and_finished_by_doctor_repair(tmp_path, monkeypatch):
    location = str(tmp_path / "lcm.db")
    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "hermes"))
    build_store(location, tmp_path, SPECS)
    store = open_store(location)
    try:
        plan = retention.plan_prune(store, older_than_days=90)
        real = store.remove_rows

        def crash(kind, groups, **kw):  # killed once the messages are gone, before the summaries
            if kind == "summaries":
                raise KeyboardInterrupt("killed mid-prune")
            return real(kind, groups, **kw)

        monkeypatch.setattr(store, "remove_rows", crash)
        with pytest.raises(KeyboardInterrupt):
            retention.prune(store, plan, pause=0)
        monkeypatch.setattr(store, "remove_rows", real)
        assert retention.interrupted(store)
        doc = run_doctor(store)
        assert not doc.ok and "no interrupted prune" in doc.render_text()
        fixed = run_doctor(store, repair=True)
        assert fixed.ok, fixed.render_text()
        assert not _interrupted(store) and _sessions(store) == {"mid", "fresh"}
        assert run_doctor(store).ok
    finally:
        store.close()


class StallingClock:
    """What a prune's transactions are timed by in the tests below: every read 60 ms later than
    the last, past the deadline (ops/batches.py DEADLINE_SECONDS) at the first look between two
    groups — so every transaction of more than one group stops after its first. Deterministic;
    nothing waits. (With the batch sizes held at their first estimate: see ``_fixed_rate``.)"""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 0.06
        return self.now


@pytest.fixture
def _fixed_rate(monkeypatch):
    """The batches' rate kept at its first estimate: these tests are about where a transaction
    stops and what the next one does, not about how the batches are sized (test_retention_batches)."""
    from lossless_context.ops.batches import TimedBatches

    monkeypatch.setattr(TimedBatches, "observe", lambda self, units, seconds: None)


def test_transactions_that_stop_partway_remove_every_lineage_row_once(location, tmp_path, monkeypatch, _fixed_rate):
    build_store(location, tmp_path, SPECS)
    store = open_store(location)
    try:
        plan = retention.plan_prune(store, older_than_days=90)
        gone_m = sorted(m for s in plan.sessions for m in store.session_message_ids(s))
        gone_s = sorted(x for s in plan.sessions for x in store.session_summary_ids(s))
        kept = {s: (store.session_message_ids(s), store.session_summary_ids(s)) for s in ("mid", "fresh")}
        swept: list[tuple[int, int]] = []  # what the last, untimed transaction found left
        real = store.forget_records

        def forget(sessions, mids, sids, contexts):
            if sessions:
                swept.append((len(mids), len(sids)))
            return real(sessions, mids, sids, contexts)

        monkeypatch.setattr(store, "forget_records", forget)
        rep = retention.prune(store, plan, pause=0, clock=StallingClock())
        assert rep.batch_log.stopped >= 2, rep.batch_log.batches  # (the rest led the next transaction)
        assert swept and set(swept) == {(0, 0)}  # every row went in the timed transactions (one per lineage)
        assert rep.sessions == 3 and rep.messages == len(gone_m) and rep.summaries == len(gone_s)
        assert sum(n for n, _u, _s in rep.batch_log.batches) == len(gone_m) + len(gone_s)
        assert store.get_messages(gone_m) == {} and store.get_summaries(gone_s) == {}
        assert {s: (store.session_message_ids(s), store.session_summary_ids(s)) for s in kept} == kept
        assert _grep_all(store, "CANARY-old-a-3") == [] and _grep_all(store, "CANARY-mid-3")
        doc = run_doctor(store)
        assert doc.ok, doc.render_text()
    finally:
        store.close()


def test_originals_removed_by_transactions_that_stop_partway_are_recorded_once(location, tmp_path, _fixed_rate):
    build_store(location, tmp_path, SPECS)
    store = open_store(location)
    try:
        plan = retention.plan_prune(store, older_than_days=90, keep_summaries=True)
        ids = set(store.originals_under_summaries(plan.sessions))
        expect: dict[int, list[int]] = {}  # summary -> its originals that go
        for s in plan.sessions:
            for sid in store.session_summary_ids(s):
                mine = sorted(ids & set(store.summary_children(sid)[1]))
                if mine:
                    expect[sid] = mine
        rep = retention.prune(store, plan, pause=0, clock=StallingClock())
        assert rep.batch_log.stopped >= 2, rep.batch_log.batches
        assert expect and rep.messages == len(ids) and store.get_messages(sorted(ids)) == {}
        assert store.originals_under_summaries(plan.sessions) == []
        spans = store.pruned_spans(sorted(expect))
        got = {k: (v["messages"], v["first_id"], v["last_id"]) for k, v in spans.items()}
        assert got == {k: (len(v), v[0], v[-1]) for k, v in expect.items()}  # each original counted once
        doc = run_doctor(store)
        assert doc.ok, doc.render_text()
    finally:
        store.close()


def _interrupted(store):
    return [r for r in store.retention_runs(20) if r["finished_at"] is None]


def test_the_configured_policy_runs_in_the_background_once_per_interval(tmp_path, monkeypatch):
    location = str(tmp_path / "lcm.db")
    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "hermes"))
    build_store(location, tmp_path, SPECS)
    store = open_store(location)
    try:
        policy = RetentionPolicy(max_age_days=90)
        assert retention.schedule(store, policy, lambda: set(), delay=0.01)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (retention.scheduled(store.location) or {}).get("last"):
            time.sleep(0.05)
        info = retention.scheduled(store.location)
        assert info and info["last"] and info["last"]["sessions"] == 3, info
        assert _sessions(store) == {"mid", "fresh"}
        retention.unschedule(store.location)
        # due again only after the interval, whichever process ran it last
        assert retention.schedule(store, policy, lambda: set(), delay=0.01)
        time.sleep(0.5)
        assert len(store.retention_runs(10)) == 1
        retention.unschedule(store.location)
        assert not retention.schedule(store, RetentionPolicy(), lambda: set())  # off: no thread
    finally:
        store.close()


def test_config_block_and_size_parsing():
    cfg = LCMConfig.load({"retention": {"max_age_days": 90, "keep_summaries": "yes", "nope": 1}}, read_file=False,
                         environ={"LCM_RETENTION_MAX_STORE_MB": "500"})
    assert cfg.retention == RetentionPolicy(max_age_days=90, max_store_mb=500, keep_summaries=True)
    assert any("nope" in w for w in cfg.warnings)
    bad = LCMConfig.load({"retention": {"max_age_days": -3}}, read_file=False, environ={})
    assert bad.retention.max_age_days == 0 and bad.warnings
    assert retention.parse_size("500MB") == 500 << 20 and retention.parse_size("2g") == 2 << 30
    assert retention.parse_size("1.5GiB") == int(1.5 * (1 << 30)) and retention.parse_size("300") == 300 << 20
    with pytest.raises(ValueError):
        retention.parse_size("lots")


def test_engine_in_a_copy_still_works_after_prune(location, tmp_path):
    """A deep-copied engine (the host's per-agent copy) on the same store keeps answering."""
    build_store(location, tmp_path, SPECS)
    e = _engine(location)
    c = copy.deepcopy(e)
    c.bind_session_state(None, "mid")
    retention.prune(e.store, retention.plan_prune(e.store, older_than_days=90), pause=0)
    ans = json.loads(c.handle_tool_call("lcm_grep", {"query": "CANARY-mid-5"}))
    assert [h for g in ans["groups"] for h in g["hits"]]


def test_the_engine_applies_the_configured_policy_off_the_turn_path(tmp_path, monkeypatch):
    """`retention:` in the config: the engine's store prunes in the background, never the
    session an engine of this process is bound to (here an old one, resumed)."""
    location = str(tmp_path / "lcm.db")
    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "hermes"))
    build_store(location, tmp_path, SPECS)
    monkeypatch.setattr(retention, "AUTO_DELAY_SECONDS", 0.01)
    e = _engine(location, retention={"max_age_days": 90})
    e.bind_session_state(None, "old-b")  # resumed: live in this process, though old
    st = e.get_status()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (retention.scheduled(e.store.location) or {}).get("last"):
        time.sleep(0.05)
    left = {s["id"] for s in e.store.list_sessions()}
    assert left == {"old-b", "mid", "fresh"}, left
    assert st["lcm_retention"]["policy"]["max_age_days"] == 90
    from lossless_context.hermes.plugin import run_command

    text = run_command(e, "status")
    assert "retention: prunes older than 90 days" in text and "oldest session: old-b" in text, text
    assert "last prune:" in text
    e.store.close()


def test_lcm_prune_command_line(tmp_path, monkeypatch):
    from tests.test_cli import ok, one_line_failure, run_lcm

    location = str(tmp_path / "lcm.db")
    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "hermes"))
    build_store(location, tmp_path, SPECS)
    home = tmp_path / "h"
    home.mkdir()
    assert "--older-than" in one_line_failure(run_lcm("--store", location, "prune", home=home), 1)
    assert "not a size" in one_line_failure(run_lcm("--store", location, "prune", "--max-size", "huge", home=home), 1)
    dry = ok(run_lcm("--store", location, "prune", "--older-than", "90", "--dry-run", home=home)).stdout
    assert "old-a (+1 in its lineage)" in dry and "old-b" in dry and "would remove 3 sessions" in dry, dry
    plan = json.loads(ok(run_lcm("--store", location, "prune", "--older-than", "90", "--dry-run", "--json",
                                 home=home)).stdout)
    assert plan["dry_run"] and len(plan["plan"]["lineages"]) == 2 and plan["plan"]["est_freed_bytes"] > 0
    store = open_store(location)
    assert len(store.list_sessions()) == 5  # a dry run changes nothing
    store.close()
    # no --yes: asked (here no answer comes), and nothing happens
    one_line_failure(run_lcm("--store", location, "prune", "--older-than", "90", home=home))
    store = open_store(location)
    assert len(store.list_sessions()) == 5
    store.close()
    out = ok(run_lcm("--store", location, "prune", "--older-than", "90", "--yes", home=home)).stdout
    assert "pruned 3 sessions" in out, out
    status = ok(run_lcm("--store", location, "status", home=home)).stdout
    assert "oldest session: mid" in status and "last prune:" in status and "encrypted at rest: no" in status
    assert "(16 messages in the last 7 days)" in status and "a day" in status, status  # growth: the fresh lineage
    doctor = ok(run_lcm("--store", location, "doctor", home=home)).stdout
    assert "size:" in doctor and "healthy" in doctor
    again = ok(run_lcm("--store", location, "prune", "--older-than", "0", "--keep-summaries", "--yes",
                       home=home)).stdout
    assert "pruned 0 sessions" in again and "left alone: 1 lineage" in again, again


def test_deleting_messages_reads_indexes_not_the_table(location):
    """The foreign-key checks of a deleted message (and `forget_records`' own statements) go
    through indexes: without them each deleted message scanned the whole messages table."""
    store = open_store(location)
    try:
        store.ensure_session("s")
        probes = {"messages": "supersedes", "message_vectors": "message_id", "context_items": "message_id"}
        for table, col in probes.items():
            if location.startswith("postgres"):  # (an index led by the column: the planner's choice)
                idx = store.read_sql(lambda c, t=table: c.execute(
                    "SELECT indexdef FROM pg_indexes WHERE tablename = %s", (t,)).fetchall())
                assert any(f"({col})" in d[0] or f"({col}," in d[0] for d in idx), (table, idx)
            else:
                plan = store.conn().execute(f"EXPLAIN QUERY PLAN SELECT 1 FROM {table} WHERE {col} = 42").fetchall()
                assert "USING" in str(plan) and "INDEX" in str(plan), (table, plan)
    finally:
        store.close()


def test_postgresql_doctor_advises_vacuum_after_a_large_prune(pg_fresh_dsn):
    """PostgreSQL keeps deleted rows' space until VACUUM: after a prune left many dead rows,
    `lcm doctor` says so and what to run (autovacuum is off for the table here, as on a
    server whose autovacuum has not come round yet)."""
    from lossless_context.records import NewMessage

    store = open_store(pg_fresh_dsn)
    try:
        store.ensure_session("old")
        store.write_sql(lambda c: c.execute("ALTER TABLE messages SET (autovacuum_enabled = false)"))
        old = time.time() - 200 * DAY
        rows = [NewMessage({"role": "user", "content": f"row {i}"}, "user", f"id{i}", None, f"row {i}", 3, old + i)
                for i in range(12_000)]
        store.append_messages("old", rows)
        store.write_sql(lambda c: c.execute("UPDATE sessions SET updated_at = %s", (old,)))
        assert "VACUUM (ANALYZE)" not in run_doctor(store).render_text()
        retention.prune(store, retention.plan_prune(store, older_than_days=90), pause=0)
        deadline = time.monotonic() + 30
        text = ""
        while time.monotonic() < deadline:  # (the server's statistics reach pg_stat within a second or so)
            text = run_doctor(store).render_text()
            if "messages: 12,000 dead rows" in text:  # (every transaction's count reported)
                break
            time.sleep(0.5)
        assert "messages: 12,000 dead rows" in text and "VACUUM (ANALYZE) " in text, text
    finally:
        store.close()


def test_reclaiming_space_grows_its_steps_gently_after_a_fast_one(tmp_path, monkeypatch):
    # Each incremental-vacuum step is sized from the last one's time; a step that looked
    # instant (pages in memory, nothing else running) made the next one 1,024 pages at once,
    # which on a loaded machine held the write lock for half a second. A step at most doubles.
    from lossless_context.store.sqlite import lifecycle as sqlite_lifecycle

    store = open_store(str(tmp_path / "lcm.db"))
    try:
        c = store.conn()
        c.execute("CREATE TABLE junk (b BLOB)")
        c.executemany("INSERT INTO junk VALUES (?)", [(os.urandom(12_000),) for _ in range(3000)])
        c.execute("DROP TABLE junk")
        assert store.space()["auto_vacuum"] == "incremental"
        now = [0.0]

        def instant() -> float:  # every step measured at 10 microseconds
            now[0] += 1e-5
            return now[0]

        monkeypatch.setattr(sqlite_lifecycle, "_clock", instant)
        steps: list[int] = []
        c.set_trace_callback(lambda sql: steps.append(int(sql.split("(")[1].split(")")[0]))
                             if sql.startswith("PRAGMA incremental_vacuum") else None)
        returned = store.reclaim_space(60.0, 0.0)
        c.set_trace_callback(None)
        assert returned > 0 and len(steps) >= 4, (returned, steps)
        assert steps[0] == sqlite_lifecycle.VACUUM_STEP_PAGES
        assert all(b <= 2 * a for a, b in zip(steps, steps[1:])), steps
    finally:
        store.close()


def test_no_index_merge_step_of_the_pruning_process_runs_during_a_prune(tmp_path, monkeypatch):
    # The pauses between a prune's transactions are for the host's writes; this process's
    # background merger took them (it merges every few seconds when no quiet moment comes).
    # During the prune a settle() finds nothing asked of the merger; one merge runs after.
    location = str(tmp_path / "lcm.db")
    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "hermes"))
    build_store(location, tmp_path, SPECS)
    store = open_store(location)
    try:
        merges: list[tuple[bool, int]] = []  # (a prune running?, the steps done) of each merge
        real_merge = store.merger.merge

        def merge(c):
            running = bool(retention._RUNNING)
            steps = real_merge(c)
            merges.append((running, steps))
            return steps

        monkeypatch.setattr(store.merger, "merge", merge)
        real_remove = store.remove_rows

        def remove(kind, groups, **kw):
            out = real_remove(kind, groups, **kw)
            assert store.merger.settle(timeout=10)  # (without the hold: a merge now, mid-prune)
            return out

        monkeypatch.setattr(store, "remove_rows", remove)
        rep = retention.prune(store, retention.plan_prune(store, older_than_days=90), pause=0)
        assert rep.messages > 0 and rep.transactions >= 1
        assert store.merger.settle(timeout=30)
        assert not [m for m in merges if m[0] and m[1]], merges  # no step while it ran
        assert merges and merges[-1] == (False, merges[-1][1]) and merges[-1][1] > 0, merges  # one after
    finally:
        store.close()
