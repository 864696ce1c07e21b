"""Issue #39 item 1: a PostgreSQL server that stops answering never hangs the session.

A real server of this module's own (so freezing it stalls no other test) is frozen with
SIGSTOP on the postmaster and every backend — a paused VM, a storage stall: the kernel still
accepts connections and acknowledges every packet, so neither ``statement_timeout`` (the
server's) nor TCP timeouts end a call. Every hook, tool and ``/lcm`` command must still
return while the server stays frozen, each store call past its client-side bound opens the
store's breaker, and the session takes the same fallback as a store that is down. Nothing
here asserts a time: each call runs on a thread joined with a bound far above the configured
store bound, and the test checks that it returned (and what it returned) while still frozen.
"""

from __future__ import annotations

import json
import threading
from typing import Any, Callable

import pytest

from lossless_context import LCMEngine
from lossless_context.config import LCMConfig
from lossless_context.contract.lifecycle import session_lock
from lossless_context.hermes.plugin import make_command_handler
from lossless_context.pipeline.validate import pairing_problems
from lossless_context.store.base import StoreError
from lossless_context.tokens import estimate_messages_tokens
from tests.support.pg import close_pools, start_server

JOIN = 90.0  # seconds a call may take before the test calls it hung (store bounds here: 1-2 s)
WINDOW = 64_000


@pytest.fixture(scope="module")
def server():
    srv = start_server()
    try:
        yield srv
    finally:
        close_pools()
        srv.stop()


@pytest.fixture
def dsn(server):
    name = server.create_database("freeze")
    yield server.dsn(name)
    close_pools(name)
    server.drop_database(name)


def _returns(fn: Callable[[], Any], bound: float = JOIN) -> Any:
    """fn() on a thread; fails the test if it has not returned within `bound` seconds."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the test
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(bound)
    assert not t.is_alive(), f"{getattr(fn, '__name__', fn)} did not return while the server was frozen"
    if "error" in box:
        raise box["error"]
    return box["value"]


def _conversation(turns: int, tag: str, chars: int = 12_000) -> list[dict]:
    out: list[dict] = []
    for i in range(turns):
        out.append({"role": "user", "content": f"question {tag}{i}: " + "q" * 200})
        out.append({"role": "assistant", "content": None,
                    "tool_calls": [{"id": f"c{tag}{i}", "type": "function",
                                    "function": {"name": "terminal", "arguments": "{}"}}]})
        out.append({"role": "tool", "tool_call_id": f"c{tag}{i}", "content": f"output {tag}{i} " + "o" * chars})
        out.append({"role": "assistant", "content": f"answer {tag}{i} " + "a" * 400})
    return out


def _engine(dsn: str, **kw: Any) -> LCMEngine:
    cfg = LCMConfig.load({"store": dsn, "summarizer": "extractive", "store_timeout": 1.5,
                          "store_retry_seconds": 600, "lock_timeout": 5, **kw}, read_file=False)
    e = LCMEngine(config=cfg)
    e.update_model("m", WINDOW)
    return e


def test_every_hook_and_tool_returns_while_the_server_is_frozen(server, dsn):
    e = _engine(dsn, store_retry_seconds=2)
    e.on_session_start("s1")
    first = _conversation(6, "a")
    e.compress(first, current_tokens=estimate_messages_tokens(first))
    assert e.store.stats()["messages"] == len(first)
    msgs = first + _conversation(14, "b")
    tokens = estimate_messages_tokens(msgs)
    assert tokens > WINDOW
    with server.frozen():
        out = _returns(lambda: e.compress(msgs, current_tokens=tokens))
        # the same fallback as a store that is down: within the window, valid, newest turns kept
        assert pairing_problems(out) == [] and estimate_messages_tokens(out) <= WINDOW
        assert out[-4:] == msgs[-4:] and out[0] == msgs[0]
        reason = e.get_status()["lcm_store_error"]
        assert "unavailable" in reason and ("timeout" in reason or "no connection" in reason)
        # every other hook and tool answers too (the breaker is open: without waiting again)
        _returns(lambda: e.on_session_end("s1", msgs))
        _returns(lambda: e.on_turn_complete(msgs, usage={"prompt_tokens": tokens}))
        assert _returns(lambda: e.select_context(msgs)) is None  # the request left alone
        assert _returns(lambda: e.prune_tool_results_only(msgs, current_tokens=tokens)) == (msgs, 0)
        _returns(lambda: e.on_session_start("s1"))
        grep = json.loads(_returns(lambda: e.handle_tool_call("lcm_grep", {"query": "question"}, messages=msgs)))
        assert "unavailable" in grep["error"] and "internal error" not in grep["error"]
        status = _returns(lambda: make_command_handler(e)("status"))
        assert "unavailable" in status or "busy" in status
    # thawed: after the cool-down the store is used again, and nothing stored was lost
    assert _returns(lambda: _when_back(e))["messages"] >= len(first)


def _when_back(e: LCMEngine) -> dict:
    while True:
        try:
            return e.store.stats()
        except StoreError:
            threading.Event().wait(0.2)


def test_lcm_status_answers_while_a_pass_is_stuck_in_the_store(server, dsn):
    """The issue's freeze: a pass waits in the store (here its bound is long), and /lcm status
    must not wait behind it — neither on the session lock nor on a store call."""
    from hermes_state import SessionDB
    import tempfile
    from pathlib import Path

    e = _engine(dsn, store_timeout=60, lock_timeout=60)
    with tempfile.TemporaryDirectory() as tmp:
        db = SessionDB(db_path=Path(tmp) / "state.db")
        db.create_session(session_id="s1", source="cli", model="m")
        e.bind_session_state(session_db=db, session_id="s1")
        e.on_session_start("s1")
        first = _conversation(4, "a")
        e.compress(first, current_tokens=estimate_messages_tokens(first))
        for m in first + [{"role": "user", "content": "a turn only the host's database has"}]:
            db.append_message("s1", role=m["role"], content=m.get("content"), tool_calls=m.get("tool_calls"),
                              tool_call_id=m.get("tool_call_id"))
        msgs = first + _conversation(14, "b")
        with server.frozen():
            stuck = threading.Thread(target=lambda: e.compress(msgs, current_tokens=estimate_messages_tokens(msgs)),
                                     daemon=True)
            stuck.start()
            status = _returns(lambda: make_command_handler(e)("status"))
            assert "busy" in status and "has waited" in status
        stuck.join(JOIN)
        assert not stuck.is_alive()


def test_lcm_status_does_not_wait_behind_a_running_pass(tmp_path):
    """SQLite, no freeze: a pass holding the session (a long summariser call) must not make
    /lcm status wait — it answers from the store and says the latest turns come later."""
    from hermes_state import SessionDB

    cfg = LCMConfig.load({"store": str(tmp_path / "lcm.db"), "summarizer": "extractive"}, read_file=False)
    e = LCMEngine(config=cfg)
    e.update_model("m", WINDOW)
    db = SessionDB(db_path=tmp_path / "state.db")
    db.create_session(session_id="s1", source="cli", model="m")
    db.append_message("s1", role="user", content="hello there")
    e.bind_session_state(session_db=db, session_id="s1")
    e.on_session_start("s1")
    db.append_message("s1", role="assistant", content="a reply the engine was not handed yet")
    taken, release = threading.Event(), threading.Event()

    def pass_holding_the_session() -> None:
        with session_lock(e.store.location, "s1"):
            taken.set()
            release.wait(JOIN * 2)

    holder = threading.Thread(target=pass_holding_the_session, daemon=True)
    holder.start()
    try:
        assert taken.wait(JOIN)
        status = _returns(lambda: make_command_handler(e)("status"))
        assert "messages stored 1" in status and "a compaction pass is running" in status
        # a hook that ingests does not wait unbounded either (lock_timeout: 30 s by default)
        e.config.lock_timeout = 0.5
        _returns(lambda: e.on_session_end("s1", [{"role": "user", "content": "hello there"}]))
    finally:
        release.set()
        holder.join(JOIN)
    status = _returns(lambda: make_command_handler(e)("status"))
    assert "messages stored 2" in status and "a compaction pass is running" not in status


def test_store_calls_are_cut_at_their_client_side_bound(server, dsn):
    from lossless_context.store.postgres.store import PostgresStore

    store = PostgresStore(dsn, call_timeout=1.0, background_index=False)
    try:
        store.ensure_session("s")
        with server.frozen():
            with pytest.raises(StoreError, match="timeout: the server did not answer within 1 s"):
                _returns(lambda: store.get_context("s"))

            def lock() -> None:
                with store.compaction_lock("s", 0.5):
                    pass

            with pytest.raises(StoreError):
                _returns(lock)
        # thawed: the cut connections were dropped, never handed out again
        assert _returns(lambda: store.get_context("s")) == (0, [])
        with store.compaction_lock("s", 1.0) as got:
            assert got
    finally:
        store.close()


def test_the_pools_idle_check_is_bounded(server, dsn, monkeypatch):
    """The issue's stack: _check_if_idle → check_connection → execute → wait, with no bound.
    Here the call bound is long, so only the check's own bound can end the wait."""
    from lossless_context.store.postgres import conn as pg_conn
    from lossless_context.store.postgres.store import PostgresStore

    store = PostgresStore(dsn, call_timeout=600.0, background_index=False)
    try:
        store.ensure_session("s")
        monkeypatch.setattr(pg_conn, "IDLE_CHECK_SECONDS", 0.0)  # every checkout is checked
        with server.frozen():
            with pytest.raises(StoreError, match="no connection available"):
                _returns(lambda: store.get_context("s"))
    finally:
        store.close()


def test_connections_carry_keepalives_and_a_tcp_user_timeout():
    pytest.importorskip("psycopg")
    from lossless_context.store.postgres.conn import PostgresConnections

    kw = PostgresConnections("postgresql://u@127.0.0.1:1/db", call_timeout=7)._conn_kwargs()
    assert kw["keepalives"] == 1 and kw["keepalives_idle"] > 0 and kw["tcp_user_timeout"] == 7000
    own = PostgresConnections("postgresql://u@127.0.0.1:1/db?keepalives=0&tcp_user_timeout=100")._conn_kwargs()
    assert "keepalives" not in own and "tcp_user_timeout" not in own  # the DSN's own settings win


def test_a_short_deadline_is_kept_behind_a_long_one():
    """The watchdog sleeps until the earliest deadline: a call with a short bound registered
    while a long one is watched (the pool's idle check inside a long maintenance call's
    process) must still be cut at its own bound. Real sockets, no server."""
    import socket
    from types import SimpleNamespace

    from lossless_context.store.postgres.deadline import fired, watch

    long_a, long_b = socket.socketpair()
    short_a, short_b = socket.socketpair()
    try:
        def conn(s: socket.socket) -> Any:
            return SimpleNamespace(pgconn=SimpleNamespace(socket=s.fileno()))

        with watch(conn(long_b), 3600):
            pass  # the watchdog thread runs, and has nothing to watch again
        with watch(conn(long_a), 3600):
            threading.Event().wait(0.5)  # (lets the thread go to sleep until the long deadline)
            with watch(conn(short_a), 0.2) as w:
                assert _returns(lambda: short_a.recv(1)) == b""  # cut: EOF, not a hang
            assert fired(w)
        long_b.send(b"x")
        assert long_a.recv(1) == b"x"  # the long one was left alone
    finally:
        for s in (long_a, long_b, short_a, short_b):
            s.close()


class _FreezeAt:
    """A provider that freezes the store's server when the `at`-th chat request arrives (the
    user's session goes on against a frozen store from then on)."""

    def __init__(self, inner: Any, at: int, server: Any) -> None:
        self.inner, self.at, self.server, self.n, self.frozen = inner, at, server, 0, None

    def __call__(self, req: dict) -> Any:
        self.n += 1
        if self.n == self.at and self.frozen is None:
            self.frozen = self.server.frozen()
            self.frozen.__enter__()
        return self.inner(req)

    def thaw(self) -> None:
        if self.frozen is not None:
            self.frozen.__exit__(None, None, None)


def test_the_real_agent_loop_goes_on_while_the_server_is_frozen(server, dsn, tmp_path):
    """The issue's field test through the real 0.19.0 agent loop: the server freezes after the
    first compaction; every later turn finishes, the next compaction falls back within the
    window, and the user is told once."""
    from tests.support.fake_openai import ChatResponder, FakeOpenAI, Router, prompt_tokens_for
    from tests.support.hermes_host import hermes_available, run_hermes

    if not hermes_available():
        pytest.skip("hermes-agent is not installed")
    # Frozen after the first compaction: the store then holds pooled connections (the data
    # pool's and the compaction lock's), and the next pass meets them stuck, not a refused connect.
    chat = _FreezeAt(ChatResponder(reply_chars=24_000), at=10, server=server)
    try:
        with FakeOpenAI(responder=Router(chat=chat)) as srv:
            run = run_hermes(srv, [f"step {i} of the plan" for i in range(20)], engine="lcm", workdir=tmp_path,
                             extra_config={"lcm": {"summarizer": "extractive", "store": dsn, "store_timeout": 2,
                                                   "store_retry_seconds": 600}},
                             timeout=600)
            assert chat.frozen is not None and run.ok, run.describe()
            assert len(run.calls_named("compress")) >= 2  # one before the freeze, one during it
            assert max(prompt_tokens_for(r.json) for r in srv.chat_requests) <= WINDOW
            told = [text for kind, text in run.status_lines if "LCM stopped storing" in text]
            assert len(told) == 1, run.status_lines
    finally:
        chat.thaw()
