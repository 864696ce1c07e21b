"""Issue #23 items 4 and 5: a store that cannot be used, or hangs, does not take the session down.

Real parts: a store path under a regular file, a read-only store file, a TCP listener on
127.0.0.1 that accepts and never answers (a hung PostgreSQL), the real engine.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from lossless_context import LCMEngine
from lossless_context.pipeline.validate import pairing_problems
from lossless_context.config import LCMConfig
from lossless_context.hermes.plugin import make_command_handler
from lossless_context.store import open_store
from lossless_context.pipeline.assemble import trim_without_store
from lossless_context.store.guard import Breaker, GuardedStore, StoreUnavailable
from lossless_context.tokens import estimate_messages_tokens
from tests.support.nobody import why_not_as_nobody


def _engine(store: str, **kw) -> LCMEngine:
    cfg = LCMConfig.load({"store": store, "summarizer": "extractive", **kw}, read_file=False)
    e = LCMEngine(config=cfg)
    e.update_model("m", 64_000)
    return e


def _conversation(turns: int, chars: int = 12_000) -> list[dict]:
    out: list[dict] = []
    for i in range(turns):
        out.append({"role": "user", "content": f"question {i}: " + "q" * 200})
        out.append({"role": "assistant", "content": None,
                    "tool_calls": [{"id": f"c{i}", "type": "function",
                                    "function": {"name": "terminal", "arguments": "{}"}}]})
        out.append({"role": "tool", "tool_call_id": f"c{i}", "content": f"output {i} " + "o" * chars})
        out.append({"role": "assistant", "content": f"answer {i} " + "a" * 400})
    return out


def test_store_under_a_regular_file_keeps_the_session_within_the_window(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    e = _engine(str(blocker / "lcm.db"), store_retry_seconds=600)
    msgs = _conversation(20)
    assert estimate_messages_tokens(msgs) > 64_000
    out = e.compress(msgs, current_tokens=estimate_messages_tokens(msgs))
    assert out != msgs and pairing_problems(out) == []
    assert estimate_messages_tokens(out) <= e._budget(0).target
    assert out[-4:] == msgs[-4:] and out[0] == msgs[0]  # newest turns and the head kept verbatim
    # the model's tool names the store and the reason, not a bare exception name
    ans = json.loads(e.handle_tool_call("lcm_grep", {"query": "question"}))
    assert str(blocker / "lcm.db") in ans["error"] and "NotADirectoryError" in ans["error"]
    assert "internal error" not in ans["error"]
    # /lcm status says so too
    status = make_command_handler(e)("status")
    assert "unavailable" in status and str(blocker) in status


def test_the_user_is_told_once_per_outage(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    e = _engine(str(blocker / "lcm.db"), store_retry_seconds=600)
    msgs = _conversation(20)
    with caplog.at_level("WARNING", logger="lossless_context"):
        for _ in range(5):
            e.compress(msgs, current_tokens=estimate_messages_tokens(msgs))
            e.on_session_end("s", msgs)
    told = [r for r in caplog.records if "the session goes on without it" in r.getMessage()]
    assert len(told) == 1 and str(blocker) in told[0].getMessage()


class _Opener:
    """Counts how often the real store is opened (each open touches the file system)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, location: str):
        self.calls += 1
        return open_store(location)


def test_breaker_fails_fast_during_the_cool_down_and_probes_after_it(tmp_path):
    now = [1000.0]
    blocker = tmp_path / "f"
    blocker.write_text("x")
    loc = str(blocker / "lcm.db")
    opener = _Opener()
    g = GuardedStore(loc, opener, cooldown=30)
    g.breaker = Breaker(loc, 30, clock=lambda: now[0])
    inner = g.inner  # the open is lazy: it succeeds
    calls = []
    orig = inner.lineage

    def counting(*a, **k):
        calls.append(a)
        return orig(*a, **k)

    inner.lineage = counting  # type: ignore[method-assign]
    # the first real call fails and opens the breaker
    with pytest.raises(StoreUnavailable) as first:
        g.lineage("s")
    assert "NotADirectoryError" in str(first.value) or "FileExistsError" in str(first.value)
    assert len(calls) == 1
    calls.clear()
    for _ in range(10):
        with pytest.raises(StoreUnavailable):
            g.lineage("s")
    assert calls == [] and g.breaker.fast_failures == 10  # nothing reached the store
    # after the cool-down one call probes; the store is fixed meanwhile: it closes the breaker
    blocker.unlink()
    now[0] += 31
    assert g.lineage("s") == ["s"] and len(calls) == 1
    assert not g.breaker.is_open


def test_a_busy_lock_is_not_an_outage(tmp_path):
    import sqlite3

    from lossless_context.store.guard import is_outage

    assert not is_outage(sqlite3.OperationalError("database is locked"))
    assert is_outage(sqlite3.OperationalError("attempt to write a readonly database"))
    assert not is_outage(ValueError("bad input"))


# Run in a process of its own: as root (CI) it drops to the unprivileged user `nobody` first
# (setpriv, as tests/test_readonly_store.py does), since root writes read-only files.
READ_ONLY_SCENARIO = """
import json, logging, os, stat, sys
from tests.test_store_guard import _conversation, _engine
from lossless_context.pipeline.validate import pairing_problems
from lossless_context.tokens import estimate_messages_tokens
logging.basicConfig(level=logging.ERROR)  # an internal error shows on stderr (checked by the parent)
path = sys.argv[1]
e0 = _engine(path)
e0.ingest(_conversation(2), session_id="s")
e0.store.close()
os.chmod(path, stat.S_IRUSR)
e = _engine(path)
msgs = _conversation(20)
out = e.compress(msgs, current_tokens=estimate_messages_tokens(msgs), session_id="s")
print(json.dumps({"uid": os.geteuid(), "writable": os.access(path, os.W_OK), "pairing": pairing_problems(out),
                  "before": estimate_messages_tokens(msgs), "after": estimate_messages_tokens(out),
                  "reason": e.get_status().get("lcm_last_reason")}))
"""


def test_read_only_store_file(tmp_path):
    """A store file its user may not write (0400): the session goes on, trimmed to the window."""
    workdir = Path(tempfile.mkdtemp(prefix="lcm-ro-guard-", dir="/tmp"))
    try:
        env = {"PATH": os.environ.get("PATH", ""), "HOME": str(workdir), "HERMES_HOME": str(workdir / "hermes"),
               "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        cmd = [sys.executable, "-c", READ_ONLY_SCENARIO, str(workdir / "lcm.db")]
        if os.geteuid() == 0:
            setpriv = shutil.which("setpriv")
            assert setpriv, "setpriv (util-linux) is needed to drop root for this test"
            if why_not_as_nobody() is not None:  # (an interpreter in a private home: runs in the main run)
                pytest.skip(str(why_not_as_nobody()))
            os.chown(workdir, pwd.getpwnam("nobody").pw_uid, grp.getgrnam("nogroup").gr_gid)
            cmd = [setpriv, "--reuid=nobody", "--regid=nogroup", "--clear-groups", *cmd]
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(workdir), timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        res = json.loads(r.stdout.strip().splitlines()[-1])
        assert res["uid"] != 0 and res["writable"] is False, res
        assert res["pairing"] == [] and res["after"] < res["before"], res
        assert "Traceback" not in r.stderr and "ERROR" not in r.stderr, r.stderr[-3000:]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


class _HungServer:
    """Accepts TCP connections on 127.0.0.1 and never answers (a hung PostgreSQL)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.conns: list[socket.socket] = []
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            self.conns.append(c)

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()


def test_hung_postgres_costs_one_timeout_then_fails_fast(tmp_path):
    pytest.importorskip("psycopg")
    srv = _HungServer()
    try:
        dsn = f"postgresql://lcm@127.0.0.1:{srv.port}/lcm?connect_timeout=1"
        e = _engine(dsn, store_retry_seconds=600)
        msgs = _conversation(20)
        # one turn's worth of hooks: start, compress, a tool, end
        e.on_session_start("s1")
        out = e.compress(msgs, current_tokens=estimate_messages_tokens(msgs))
        json.loads(e.handle_tool_call("lcm_grep", {"query": "x"}))
        e.on_session_end("s1", msgs)
        after_first = srv.accepted
        assert after_first >= 1
        assert pairing_problems(out) == [] and estimate_messages_tokens(out) < estimate_messages_tokens(msgs)
        for _ in range(5):  # further hooks never reach the server during the cool-down
            e.on_session_start("s1")
            e.compress(msgs, current_tokens=estimate_messages_tokens(msgs))
            e.on_session_end("s1", msgs)
        assert srv.accepted == after_first
        st = e.get_status()
        assert "127.0.0.1" in st["lcm_store_error"] and "unavailable" in st["lcm_store_error"]
    finally:
        srv.close()


def test_postgres_connections_carry_hot_path_timeouts():
    pytest.importorskip("psycopg")
    from lossless_context.store.postgres.conn import PostgresConnections

    kw = PostgresConnections("postgresql://u@127.0.0.1:1/db")._conn_kwargs()
    assert kw["connect_timeout"] <= 5 and "statement_timeout" in kw["options"]
    own = PostgresConnections("postgresql://u@127.0.0.1:1/db?connect_timeout=2&options=-c%20x%3D1")._conn_kwargs()
    assert "connect_timeout" not in own and "options" not in own  # the DSN's own settings win


def test_missing_psycopg_gives_the_install_hint(monkeypatch):
    from lossless_context.store.postgres import conn as postgres_conn

    monkeypatch.setattr(postgres_conn, "psycopg", None)
    monkeypatch.setattr(postgres_conn, "pg_errors", None)
    c = postgres_conn.PostgresConnections("postgresql://u@127.0.0.1:1/db")
    with pytest.raises(Exception) as exc:
        c._write(lambda conn: None)
    assert "pip install" in str(exc.value) and "NoneType" not in str(exc.value)


def test_trim_without_store_never_splits_a_tool_group():
    msgs = _conversation(30, chars=3000)
    for target in (2000, 8000, 20_000, 60_000):
        out = trim_without_store(msgs, target, 3)
        assert pairing_problems(out) == [] and out[-1] == msgs[-1]
        assert any(m["role"] == "user" for m in out)
    assert trim_without_store(msgs[:4], 10, 3) == msgs[:4]  # one turn: nothing to cut
