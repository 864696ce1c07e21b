"""The SQLite store's full-text index segments merged in the background (store/sqlite/merge.py).

FTS5 reads every segment of an index for every term of a query; a store written in many
small transactions kept a dozen or more. The store's merge thread merges every level that
holds two segments after each write (migration 016 sets usermerge 2): what it leaves is at
most one segment per level, and every search answers exactly what it answered before.
"""

from __future__ import annotations

import sqlite3
import uuid

import pytest

from lossless_context.records import NewMessage, NewSummary
from lossless_context.search.query import plan_query
from lossless_context.store import open_store
from lossless_context.store.sqlite import merge as sqlite_merge

WORDS = ["deploy", "ledger", "invoice", "cache", "queue", "shard", "replica", "quota", "retry", "webhook"]
QUERIES = ["retry", "deploy ledger", "ERR_QUOTA_7", "queue OR shard", "青龙七号"]


def _nm(text: str, t: float) -> NewMessage:
    return NewMessage(raw={"role": "user", "content": text}, role="user", ident=uuid.uuid4().hex, uid=None,
                      text=text, tokens=len(text) // 4 + 1, created_at=t)


def _write(st, rounds: int, start: int = 0) -> None:
    """Many small transactions: one message per append, a pass of one summary every third."""
    for k in range(start, start + rounds):
        sid = f"u{k % 3}"
        st.ensure_session(sid, conversation_id="c" + sid)
        text = " ".join(WORDS[(k * 7 + j) % len(WORDS)] for j in range(5)) + (" ERR_QUOTA_7" if k % 11 == 0 else "")
        text += " 青龙七号暗号" if k % 13 == 0 else ""
        [mid] = st.append_messages(sid, [_nm(text, 1e9 + k)])
        if k % 3 == 0:
            v, e = st.get_context(sid)
            s = NewSummary(key="L", kind="leaf", depth=0, level="normal", summarizer="t", text="summary " + text,
                           tokens=5, source_tokens=50, t_start=1e9 + k, t_end=1e9 + k, n_messages=1,
                           message_ids=[mid])
            st.stage_pass(sid, f"p{k}", [s], [("s", "L")], v, len(e))
            assert st.publish_pass(f"p{k}")


def _answers(st) -> list:
    out = []
    for q in QUERIES:
        plan = plan_query(q)
        for target in ("messages", "summaries"):
            for scope in (None, ["u1"], ["u0", "u2"]):
                for order in ("rank", "recent"):
                    mode = "substring" if plan.needs_substring and not plan.fts_match else "fts"
                    rows = st.search(target, scope, plan, mode=mode, order=order, limit=500)
                    out.append((q, target, scope, order, [r["id"] for r in rows]))
        out.append((q, st.term_counts("messages", [plan], 1000), st.term_counts("summaries", [plan], 1000)))
    return out


def _one_per_level(c: sqlite3.Connection) -> dict[str, list[tuple[int, int]]]:
    got = {}
    for t in sqlite_merge.TABLES:
        row = c.execute(f"SELECT block FROM {t}_data WHERE id = 10").fetchone()
        got[t] = sqlite_merge.levels(row[0]) if row else []
    return {t: lv for t, lv in got.items() if any(m or n > 1 for m, n in lv)}


def test_merging_leaves_one_segment_per_level_and_the_same_answers(tmp_path, monkeypatch):
    st = open_store(str(tmp_path / "m.db"))
    try:
        with monkeypatch.context() as m:  # writes with the merge thread out of the way
            m.setattr(sqlite_merge.Merger, "poke", lambda self: None)
            _write(st, 240)
            st.wait_indexed()
        c = st.conn()
        before = sqlite_merge.segments(c)
        assert before["messages_fts"] >= 4 and before["summaries_scoped_fts"] >= 2, before
        assert _one_per_level(c)  # FTS5's own merging leaves levels of several
        want = _answers(st)
        assert any(ids for *_, ids in want[:-1] if isinstance(ids, list))

        assert st.merger.merge(c) > 0
        assert _one_per_level(c) == {}
        after = sqlite_merge.segments(c)
        assert all(after[t] < before[t] for t in ("messages_fts", "summaries_fts", "summaries_scoped_fts")), after
        for t in sqlite_merge.TABLES:  # (the CJK indexes hold some rows of their content tables:
            # only their own structure can be checked, not against every row)
            c.execute(f"INSERT INTO {t}({t}, rank) VALUES ('integrity-check', ?)", (int(not t.endswith("_cjk")),))
        assert _answers(st) == want
        assert st.merger.merge(c) == 0  # nothing left: no transaction at all

        # the thread, after ordinary writes (settle: once it has acted on them)
        _write(st, 120, start=240)
        st.wait_indexed()
        st.merger.settle()
        assert _one_per_level(c) == {}
        assert st.merger.steps > 0
        want = _answers(st)
        fresh = open_store(str(tmp_path / "m.db"))  # another connection reads the same
        try:
            assert _answers(fresh) == want
        finally:
            fresh.close()
    finally:
        st.close()


def _varint(v: int) -> bytes:
    """SQLite's varint (values below 2**56 here)."""
    groups = [v & 0x7F]
    v >>= 7
    while v:
        groups.append(0x80 | (v & 0x7F))
        v >>= 7
    return bytes(reversed(groups))


@pytest.mark.parametrize("v2", [False, True])
def test_structure_records_are_read_in_both_formats(v2):
    """A record as SQLite 3.40 writes it and as 3.44+ does (tombstone fields per segment):
    levels of (segments being merged, segments); work when a level holds two or a merge is
    under way; an unreadable record counts as work (the merge itself then decides)."""
    def record(levels: list[tuple[int, list[int]]]) -> bytes:
        body = _varint(len(levels)) + _varint(sum(len(s) for _, s in levels)) + _varint(300)
        for merging, segs in levels:
            body += _varint(merging) + _varint(len(segs))
            for sid in segs:
                body += _varint(sid) + _varint(1) + _varint(200 + sid)
                if v2:
                    body += _varint(1 << 40) + _varint(5) + _varint(0) + _varint(0) + _varint(1 << 20)
        return b"\x00\x00\x00\x07" + (b"\xff\x00\x00\x01" if v2 else b"") + body

    assert sqlite_merge.levels(record([(0, [1]), (0, []), (0, [2])])) == [(0, 1), (0, 0), (0, 1)]
    assert not sqlite_merge.has_work(record([(0, [1]), (0, [300])]))
    assert sqlite_merge.has_work(record([(0, [1, 2]), (0, [3])]))
    assert sqlite_merge.has_work(record([(0, [1]), (1, [3])]))
    assert sqlite_merge.has_work(record([(0, [1, 2])])[:-3])  # cut short
    assert not sqlite_merge.has_work(None)


def test_the_merge_thread_gives_up_while_another_process_holds_the_write_lock(tmp_path, monkeypatch):
    """A background step waits at most LOCK_WAIT_MS for the write lock, then leaves the work
    to the next write: it never queues behind another process's transaction (nor keeps
    close() waiting for one)."""
    path = str(tmp_path / "l.db")
    st = open_store(path)
    try:
        with monkeypatch.context() as m:
            m.setattr(sqlite_merge.Merger, "poke", lambda self: None)
            _write(st, 120)
            st.wait_indexed()
        c = st.conn()
        assert _one_per_level(c)
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another process's long write transaction
        st.merger.poke()
        # the thread acts on it: its step finds the lock taken and gives up (it does not wait
        # for the other transaction, which here would never end)
        assert st.merger.settle(timeout=20)
        assert _one_per_level(c) and st.merger.steps == 0
        other.execute("ROLLBACK")
        other.close()
        st.merger.poke()  # (the next write's)
        assert st.merger.settle()
        assert _one_per_level(c) == {} and st.merger.steps > 0
    finally:
        st.close()


def test_a_fork_waits_while_the_merge_thread_opens_its_connection(tmp_path):
    """Opening a connection holds SQLite's process-wide mutexes; a fork in the middle would
    leave the child waiting forever on its first open (test_fork_after_use hung so now and
    then). The thread opens its connection under the step lock, which a fork takes first."""
    import threading

    entered, release = threading.Event(), threading.Event()
    path = str(tmp_path / "m.db")

    def connect() -> sqlite3.Connection:
        entered.set()
        assert release.wait(30)
        return sqlite3.connect(path, check_same_thread=False)

    m = sqlite_merge.Merger(connect)
    try:
        m.poke()
        assert entered.wait(30)
        held = m.step_lock.locked()  # (the fork hook acquires this lock before the fork)
        release.set()
        assert held, "the merge thread opened its connection outside the lock a fork waits for"
    finally:
        release.set()
        m.stop()
