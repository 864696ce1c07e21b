"""The deferred full-text index of large appends (store/sqlite_index.py, migration 009).

A pipelined append commits its rows and their id range in lcm_index_pending; the writer
thread indexes the range afterwards. These tests show: search never misses a committed row
(it indexes the backlog itself), a crash between the commit and the indexing loses
nothing (a real killed process), the backlog is indexed exactly once (FTS5's own
integrity check against the content table), and rows deleted before they were indexed do
not corrupt the index."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import pytest

from lossless_context.search.query import plan_query
from lossless_context.records import NewMessage
from lossless_context.store.sqlite import append as sqlite_append, index as sqlite_index
from lossless_context.store.sqlite.store import SQLiteStore

T0 = 1_700_000_000.0


def rows(n: int, start: int = 0) -> list[NewMessage]:
    out = []
    for i in range(start, start + n):
        text = f"message {i} token{i}x " + "lorem ipsum " * (i % 5)
        out.append(NewMessage(raw={"role": "user", "content": text}, role="user", ident=uuid.uuid4().hex,
                              uid=None, text=text, tokens=len(text) // 4 + 1, created_at=T0 + i))
    return out


def lazy(items):
    yield from items  # a generator: the store pipelines it (and defers its indexing)


def fts_ids(path: str, term: str) -> list[int]:
    """Rows the index itself holds for a term (read on a fresh connection: no waiting)."""
    c = sqlite3.connect(path)
    try:
        return [r[0] for r in c.execute("SELECT rowid FROM messages_fts WHERE messages_fts MATCH ? ORDER BY rowid",
                                        (term,))]
    finally:
        c.close()


def pending(path: str) -> list[tuple[int, int]]:
    c = sqlite3.connect(path)
    try:
        return c.execute("SELECT lo, hi FROM lcm_index_pending ORDER BY lo").fetchall()
    finally:
        c.close()


def check_index(path: str) -> None:
    """FTS5's integrity check with rank 1 compares the index with the content table row by
    row: a row indexed twice, missing, or deleted wrongly makes it raise."""
    c = sqlite3.connect(path)
    try:
        c.execute("INSERT INTO messages_fts(messages_fts, rank) VALUES ('integrity-check', 1)")
    finally:
        c.close()


def opened(tmp_path) -> tuple[str, SQLiteStore]:
    path = str(tmp_path / "lcm.db")
    s = SQLiteStore(path)
    s.ensure_session("a")
    return path, s


def child_script(path: str, body: str) -> str:
    """A Python program opening the store at `path` as session "a", then running `body`."""
    head = textwrap.dedent(f"""
        import itertools, os, sys, uuid
        sys.path.insert(0, {os.getcwd()!r})
        from lossless_context.records import NewMessage
        from lossless_context.store.sqlite.store import SQLiteStore
        s = SQLiteStore({path!r})
        s.ensure_session("a")
    """)
    return head + textwrap.dedent(body)


@pytest.fixture
def unindexed(monkeypatch):
    """Appends whose indexing job never runs: what a process killed right after its commit
    leaves behind (the subprocess test below does it for real)."""
    monkeypatch.setattr(sqlite_index.Indexer, "soon", lambda self: None)


@pytest.fixture
def one_idle_step(monkeypatch):
    """Decides what a pipelined append indexes while it waits for the caller's rows: exactly
    its first IDLE_STEP rows, never all of them. (Left to the threads, a caller slow to say
    "no more rows" lets the writer index the whole batch, and nothing is listed.)"""
    def decided(batch, c):
        top = batch.first - 1 + sqlite_append.IDLE_STEP
        if batch.indexed < top < batch.ids[-1]:
            c.execute(sqlite_index.INDEX_RANGE, (batch.first, top))
            batch.indexed = top
    monkeypatch.setattr(sqlite_append.Batch, "_index_while_idle", decided)


def test_a_large_append_is_indexed_after_its_commit_and_search_waits_for_it(tmp_path):
    path, s = opened(tmp_path)
    small = s.append_messages("a", rows(10))  # built rows: indexed in their own transaction
    assert pending(path) == [] and fts_ids(path, "token3x") == [small[3]]
    ids = s.append_messages("a", lazy(rows(1500, 10)))
    # Right away (the indexing job may still run), search finds the newest row.
    hits = s.search("messages", ["a"], plan_query("token1509x"), limit=5)
    assert [h["id"] for h in hits] == [ids[-1]]
    assert s.term_counts("messages", [plan_query("token700x")], cap=10) == [1]
    s.wait_indexed()
    assert pending(path) == []
    assert fts_ids(path, "token10x") == [ids[0]] and fts_ids(path, "token1509x") == [ids[-1]]
    check_index(path)
    s.close()


def test_a_backlog_left_by_a_dead_process_is_indexed_by_the_next_search(tmp_path, unindexed, one_idle_step):
    path, s = opened(tmp_path)
    ids = s.append_messages("a", lazy(rows(900)))
    s.close()
    # The writer thread indexed a first part while it waited for rows; the rest is listed.
    [(lo, hi)] = pending(path)
    assert lo == ids[0] + sqlite_append.IDLE_STEP and hi == ids[-1]
    assert fts_ids(path, f"token{lo - ids[0]}x") == [] and fts_ids(path, "token899x") == []
    t = SQLiteStore(path)  # a later process
    assert t.stats()["unindexed_messages"] == hi - lo + 1
    out = subprocess.run([sys.executable, "-m", "lossless_context.cli.commands", "--store", path, "status"],
                         capture_output=True, text=True, timeout=60)
    assert "not yet full-text indexed" in out.stdout and f"{hi - lo + 1}" in out.stdout, out.stdout + out.stderr
    hits = t.search("messages", ["a"], plan_query("token899x"), limit=5)
    assert [h["id"] for h in hits] == [ids[-1]]
    assert pending(path) == [] and len(fts_ids(path, "lorem")) == sum(1 for i in range(900) if i % 5)
    assert t.stats()["unindexed_messages"] == 0
    check_index(path)
    t.close()


def test_a_backlog_is_indexed_in_steps_each_committed(tmp_path, unindexed, one_idle_step, monkeypatch):
    path, s = opened(tmp_path)
    ids = s.append_messages("a", lazy(rows(1000)))
    monkeypatch.setattr(sqlite_index, "STEP", 300)
    steps = []
    begin = s._begin

    def counting_begin(c):
        steps.append(pending(path))  # what is still listed when each transaction starts
        begin(c)

    [(lo, hi)] = pending(path)
    assert hi == ids[-1]
    n = hi - lo + 1
    assert sqlite_index.index_pending(s.conn(), counting_begin) == n
    assert steps == [[(lo + k, hi)] for k in range(0, n, 300)] + [[]]
    check_index(path)
    s.close()


def test_rows_deleted_before_they_were_indexed_leave_the_index_consistent(tmp_path, unindexed):
    path, s = opened(tmp_path)
    ids = s.append_messages("a", lazy(rows(600)))
    c = sqlite3.connect(path, isolation_level=None)
    c.execute("PRAGMA foreign_keys=OFF")  # (a manual edit: the context still names them)
    c.execute("DELETE FROM messages WHERE id BETWEEN ? AND ?", (ids[10], ids[19]))
    c.close()
    s.wait_indexed()
    check_index(path)  # the delete trigger left the unindexed rows' (absent) entries alone
    assert fts_ids(path, "token15x") == [] and fts_ids(path, "token20x") == [ids[20]]
    c = sqlite3.connect(path, isolation_level=None)
    c.execute("PRAGMA foreign_keys=OFF")
    c.execute("DELETE FROM messages WHERE id BETWEEN ? AND ?", (ids[20], ids[29]))  # indexed now: taken out
    c.close()
    check_index(path)
    assert fts_ids(path, "token20x") == []
    s.close()


def test_another_process_indexes_a_backlog_it_finds(tmp_path, unindexed):
    path = str(tmp_path / "lcm.db")
    a, b = SQLiteStore(path), SQLiteStore(path)
    a.ensure_session("a")
    ids = a.append_messages("a", lazy(rows(700)))
    assert [h["id"] for h in b.search("messages", None, plan_query("token699x"), limit=3)] == [ids[-1]]
    assert a.search("messages", None, plan_query("token0x"), limit=3)[0]["id"] == ids[0]
    assert pending(path) == []
    check_index(path)
    a.close()
    b.close()


def test_a_process_killed_right_after_a_large_append_loses_nothing(tmp_path):
    path = str(tmp_path / "lcm.db")
    script = child_script(path, """
        def gen():
            for i in range(3000):
                t = f"message {i} token{i}x"
                yield NewMessage(raw={"role": "user", "content": t}, role="user", ident=uuid.uuid4().hex,
                                 uid=None, text=t, tokens=5, created_at=float(i))
        for k in range(3):
            s.append_messages("a", gen())
        os._exit(0)  # no close(), no waiting for the indexing job: wherever it was, it dies
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    c = sqlite3.connect(path)
    n = c.execute("SELECT count(*) FROM messages").fetchone()[0]
    c.close()
    assert n == 9000
    check_index_after = SQLiteStore(path)
    # Whatever the job had done, the rest is listed; one search finishes it, exactly once.
    hits = check_index_after.search("messages", ["a"], plan_query("token2999x"), limit=5)
    assert len(hits) == 3
    assert pending(path) == []
    check_index(path)
    assert len(fts_ids(path, "message")) == 9000
    check_index_after.close()


def test_search_on_other_threads_never_misses_a_committed_row(tmp_path):
    path, s = opened(tmp_path)
    done = threading.Event()
    errors: list[BaseException] = []
    committed: list[int] = []  # the last row of each append, once it returned

    def searcher() -> None:
        try:
            while not done.is_set():
                if committed:
                    k = committed[-1]
                    hits = s.search("messages", ["a"], plan_query(f"token{k}x"), limit=3)
                    assert len(hits) == 1, k
                    s.stats()
        except BaseException as exc:  # (reported by the main thread)
            errors.append(exc)

    threads = [threading.Thread(target=searcher) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for b in range(6):
            s.append_messages("a", lazy(rows(700, b * 700)))
            committed.append(b * 700 + 699)
    finally:
        done.set()
        for t in threads:
            t.join(60)
    assert not errors, errors[0]
    s.wait_indexed()
    assert pending(path) == [] and len(fts_ids(path, "message")) == 4200
    check_index(path)
    s.close()


def test_doctor_indexes_a_backlog_and_its_rebuild_clears_the_list(tmp_path, unindexed, one_idle_step, monkeypatch):
    from lossless_context.ops.doctor import run_doctor

    path, s = opened(tmp_path)
    s.append_messages("a", lazy(rows(800)))
    assert pending(path)
    fts_check = "full-text index messages_fts in sync"

    def fts_ok(rep) -> bool:
        [check] = [k for k in rep.checks if k.name == fts_check]
        return check.ok

    rep = run_doctor(s)  # the backlog is not an index out of sync: it is indexed first
    assert fts_ok(rep), rep.render_text()
    assert pending(path) == [] and len(fts_ids(path, "message")) == 800
    # A broken index AND a listed range (an append landing between doctor's wait and its
    # repair): the rebuild indexes every row, so the list must go with it, or the listed
    # rows would be indexed twice later.
    ids = s.append_messages("a", lazy(rows(300, 800)))
    c = sqlite3.connect(path, isolation_level=None)
    c.execute("INSERT INTO messages_fts(messages_fts) VALUES ('delete-all')")
    c.close()
    monkeypatch.setattr(s, "wait_indexed", lambda: None)
    rep = run_doctor(s, repair=True)
    [check] = [k for k in rep.checks if k.name == fts_check]
    assert not check.ok and check.repaired
    assert pending(path) == []
    monkeypatch.undo()
    s.wait_indexed()
    check_index(path)
    assert [h["id"] for h in s.search("messages", ["a"], plan_query("token1099x"), limit=3)] == [ids[-1]]
    assert len(fts_ids(path, "message")) == 1100
    s.close()


def test_the_writer_indexes_while_it_waits_for_rows_and_lists_only_the_rest(tmp_path, unindexed, monkeypatch):
    path, s = opened(tmp_path)
    batch = rows(1400)
    first_chunks = sqlite_append.FIRST + sqlite_append.CHUNK
    caught_up = threading.Event()  # the writer thread indexed the first two chunks while idle
    real = sqlite_append.Batch._index_while_idle

    def watched(self, c):
        real(self, c)
        if self.indexed - self.first + 1 >= first_chunks:
            caught_up.set()

    monkeypatch.setattr(sqlite_append.Batch, "_index_while_idle", watched)

    def pausing():  # a producer that pauses after two chunks: the writer thread has nothing to insert
        for k, r in enumerate(batch):
            if k == first_chunks:  # (until the writer has used the pause, not for a guessed time)
                assert caught_up.wait(60), "the writer did not index while it waited for rows"
            yield r

    ids = s.append_messages("a", pausing())
    # The rows inserted before the pause were indexed during it; what follows is listed
    # (normally the last rows at least: the commit does not wait for indexing).
    listed = pending(path)
    assert all(hi == ids[-1] and lo > ids[0] + first_chunks - 1 for lo, hi in listed) and len(listed) <= 1, listed
    assert fts_ids(path, "token0x") == [ids[0]] and fts_ids(path, f"token{first_chunks - 1}x") == [ids[first_chunks - 1]]
    s.wait_indexed()
    check_index(path)  # indexed in the transaction or after it, each row exactly once
    assert len(fts_ids(path, "message")) == 1400
    s.close()


def _writer_proc(path: str, proc: int, batches: int, done) -> None:
    s = SQLiteStore(path)
    sid = f"w{proc}"
    s.ensure_session(sid)
    for b in range(batches):
        n0 = b * 700
        items = [NewMessage(raw={"role": "user", "content": f"w{proc}r{i}x message"}, role="user",
                            ident=uuid.uuid4().hex, uid=None, text=f"w{proc}r{i}x message", tokens=4,
                            created_at=T0 + i) for i in range(n0, n0 + 700)]
        s.append_messages(sid, lazy(items))
        done.put(f"w{proc}r{n0 + 699}x")  # searchable from now on, in any process
    s.close()


def _reader_proc(path: str, todo, out) -> None:
    s = SQLiteStore(path)
    found = []
    while True:
        token = todo.get(timeout=120)
        if token is None:
            break
        found.append(len(s.search("messages", None, plan_query(token), limit=3)))
    s.close()
    out.put(found)


def test_processes_appending_and_searching_at_once(tmp_path):
    import multiprocessing

    path, s = opened(tmp_path)
    s.close()
    ctx = multiprocessing.get_context("spawn")
    todo, out = ctx.Queue(), ctx.Queue()
    writers = [ctx.Process(target=_writer_proc, args=(path, p, 4, todo)) for p in range(2)]
    reader = ctx.Process(target=_reader_proc, args=(path, todo, out))
    for p in (*writers, reader):
        p.start()
    for p in writers:
        p.join(180)
        assert p.exitcode == 0
    todo.put(None)
    found = out.get(timeout=120)
    reader.join(60)
    assert reader.exitcode == 0
    assert found == [1] * 8  # every append's last row found by the other process right after it
    t = SQLiteStore(path)
    t.wait_indexed()
    assert pending(path) == [] and len(fts_ids(path, "message")) == 2 * 4 * 700
    check_index(path)
    t.close()


def test_sigkill_while_appending_and_indexing_loses_nothing(tmp_path):
    import random
    import signal

    path = str(tmp_path / "lcm.db")
    script = child_script(path, """
        print("ready", flush=True)
        for k in itertools.count():
            s.append_messages("a", (NewMessage(raw={"role": "user", "content": f"message {k} {i}"}, role="user",
                                               ident=uuid.uuid4().hex, uid=None, text=f"message {k} {i}",
                                               tokens=4, created_at=float(i)) for i in range(1500)))
    """)
    rng = random.Random(11)
    for _kill in range(8):
        p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.05, 0.8))
        p.send_signal(signal.SIGKILL)
        p.wait(30)
        c = sqlite3.connect(path)
        assert c.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        n = c.execute("SELECT count(*) FROM messages").fetchone()[0]
        c.close()
        assert n % 1500 == 0  # whole appends or none
        t = SQLiteStore(path)
        t.wait_indexed()  # what the killed process had not indexed, listed, is indexed now
        t.close()
        assert pending(path) == [] and len(fts_ids(path, "message")) == n
        check_index(path)


def test_a_resumed_session_is_searchable_by_the_agent_the_moment_compress_returns(tmp_path):
    import json

    from lossless_context import LCMEngine
    from lossless_context.config import LCMConfig
    from lossless_context.demo.sessions import coding_session

    e = LCMEngine(config=LCMConfig.load({"store": str(tmp_path / "lcm.db"), "summarizer": "extractive"},
                                        read_file=False))
    e.update_model("m", 64_000)
    e.on_session_start("resumed")
    sess = coding_session(4000, seed=7)
    out = e.compress(list(sess.messages[:2500]))  # the whole history at once: one pipelined append
    assert out and e.store.stats()["messages"] >= 2500
    e.ingest(list(sess.messages))  # 1,500 more, stored without a compaction after them
    assert sess.canaries and any(c.message_index >= 2500 for c in sess.canaries)
    for c in sess.canaries:  # the agent's first lcm_grep, right away
        res = json.loads(e.handle_tool_call("lcm_grep", {"query": c.value}))
        assert any(h for g in res["groups"] for h in g["hits"]), c
    assert e.get_status()["lcm_unindexed_messages"] == 0
    e.store.close()


@pytest.mark.parametrize("idle", ["none", "some"])
def test_a_search_does_not_stall_behind_another_writer_holding_the_lock(tmp_path, unindexed, monkeypatch, idle):
    """Decided, not raced: the append indexes none of its rows while idle, or exactly its
    first IDLE_STEP rows (not however many the writer thread happened to reach); every attempt of a search to index another process's backlog is
    recorded with the busy timeout it ran under, and the busy pause is ended explicitly
    (as BUSY_PAUSE seconds later) only once the other writer has released the lock."""
    path, s = opened(tmp_path)

    def decided(batch, c):  # (in place of "while the caller has not sent its next chunk")
        top = batch.first - 1 + sqlite_append.IDLE_STEP
        if idle == "some" and batch.indexed < top < batch.ids[-1]:
            c.execute(sqlite_index.INDEX_RANGE, (batch.first, top))
            batch.indexed = top
    monkeypatch.setattr(sqlite_append.Batch, "_index_while_idle", decided)
    ids = s.append_messages("a", lazy(rows(700)))
    [(lo, hi)] = pending(path)
    assert lo - ids[0] == (0 if idle == "none" else sqlite_append.IDLE_STEP)
    monkeypatch.setattr(sqlite_index, "SEARCH_LOCK_WAIT", 0.3)
    attempts: list[int] = []  # the busy timeout (ms) each attempt to index waited under
    real = sqlite_index.index_pending

    def recording(c, begin):
        attempts.append(c.execute("PRAGMA busy_timeout").fetchone()[0])
        return real(c, begin)

    monkeypatch.setattr(sqlite_index, "index_pending", recording)
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process in a long write transaction
    hits = s.search("messages", ["a"], plan_query("token699x"), limit=3)
    # It waited for the lock under the search's bound (0.3 s), not the store's 30 s, and
    # then searched what is indexed: nothing lost, the backlog still listed.
    assert attempts == [300]
    assert hits == [] and pending(path) == [(lo, hi)]
    for _ in range(5):  # the next searches (one lcm_grep runs several) do not wait again
        assert s.search("messages", ["a"], plan_query("token698x"), limit=3) == []
    assert attempts == [300]
    if lo > ids[0]:  # rows the append indexed itself (while idle) are found meanwhile
        assert [h["id"] for h in s.search("messages", ["a"], plan_query("token0x"), limit=3)] == [ids[0]]
    assert attempts == [300] and pending(path) == [(lo, hi)]
    other.execute("ROLLBACK")
    other.close()
    monkeypatch.setattr(s._indexer, "_busy_until", 0.0)  # (as BUSY_PAUSE seconds later)
    # Once the other writer is gone, the next search indexes the backlog and finds every row.
    assert [h["id"] for h in s.search("messages", ["a"], plan_query("token699x"), limit=3)] == [ids[-1]]
    assert [h["id"] for h in s.search("messages", ["a"], plan_query(f"token{lo - ids[0]}x"), limit=3)] == [lo]
    assert attempts == [300, 300]
    assert pending(path) == []
    assert s.conn().execute("PRAGMA busy_timeout").fetchone()[0] == 30_000  # restored
    check_index(path)
    s.close()
