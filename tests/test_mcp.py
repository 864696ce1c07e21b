"""`lcm mcp` as MCP clients meet it: spawned as a subprocess and spoken to with the SDK's own
stdio client (`mcp.client.stdio`) and with raw newline-delimited JSON-RPC, over SQLite and
PostgreSQL stores that real engines wrote (issue #44).

Checked: the handshake and its instructions (which scope), the tool list (read-only), a planted
canary found and expanded verbatim with the engine's own answers, hostile input and bad ids
answered as tool errors (``isError``), ids and sessions outside the scope answering exactly like
ids that do not exist, the server serving on after errors, a locked SQLite file and a frozen or
stopped PostgreSQL answered with a tool error within the call bound (and served again once the
store is back), and the process gone when its client closes stdin — even with a call stuck in
the store. No timings are asserted: the tests wait with generous guards, never measure.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pytest

from lossless_context import LCMEngine
from lossless_context.config import LCMConfig
from lossless_context.demo.host_driver import R19Host
from lossless_context.demo.sessions import coding_session, turn_ranges
from tests.support.pg import module_store_location, start_server

pytest.importorskip("mcp", reason="the [mcp] extra (the MCP SDK) is not installed")

REPO = Path(__file__).resolve().parents[1]
TOOLS = {"lcm_grep", "lcm_describe", "lcm_expand", "lcm_sessions"}
BETA_CANARY = "zebra-quartz-4471 beta only"
GUARD = 120.0  # seconds before a test gives up on an answer (a hang guard, not a timing assert)
HOSTILE = ["AND", "NEAR(", '"', "'; DROP TABLE messages; --", "(a+)+$", "a\x00b", "x" * 5000, "🔥"]


# --------------------------------------------------------------------------- the store


def _engine(location: str) -> LCMEngine:
    return LCMEngine(config=LCMConfig.load({"store": location, "summarizer": "extractive"}, read_file=False))


def plant(location: str) -> dict[str, Any]:
    """Two lineages written by real engines: `alpha` (conversation `conv-alpha`, compacted into
    a summary DAG, with the coding session's canaries), then `beta` (the latest session,
    its own canary)."""
    e = _engine(location)
    sess = coding_session(500, seed=7)
    host = R19Host(e, session_id="alpha", overhead_tokens=500, conversation_id="conv-alpha")
    host.start(context_length=16_000)
    for a, b in turn_ranges(sess.messages):
        host.add(*sess.messages[a:b])
        host.maybe_compress()
    host.end()
    assert host.compactions >= 2
    e.store.close()
    time.sleep(0.01)  # (beta is the newer session)
    e = _engine(location)  # another process: another conversation
    b = R19Host(e, session_id="beta", overhead_tokens=500)
    b.start(context_length=16_000)
    b.add({"role": "user", "content": "remember the beta code"},
          {"role": "assistant", "content": f"Noted: {BETA_CANARY}."})
    b.end()
    e.store.wait_indexed()
    beta_ids = e.store.session_message_ids("beta")
    assert e.store.lineage("alpha") == ["alpha"] and e.store.lineage("beta") == ["beta"]
    # the canary the tests use: a name said once, summarised away under a deeper summary
    canary = next(c for c in sess.canaries if c.kind == "name_said_once")
    e.store.close()
    return {"location": location, "sess": sess, "canary": canary, "beta_mid": max(beta_ids)}


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def planted(request, tmp_path_factory):
    return plant(module_store_location(request, tmp_path_factory, "mcp"))


@pytest.fixture(scope="module")
def planted_sqlite(tmp_path_factory):
    """The same store on SQLite alone (for what the backend does not change: the wire, the CLI)."""
    return plant(str(tmp_path_factory.mktemp("mcp-sqlite") / "lcm.db"))


def server_cmd(location: str, *flags: str, timeout: float = 5.0) -> list[str]:
    return [sys.executable, "-m", "lossless_context.cli", "--store", location, "mcp", *flags,
            "--timeout", str(timeout)]


def server_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LCM_", "HERMES_"))}
    env.update(HERMES_HOME=str(home), LCM_STORE_RETRY_SECONDS="1", PYTHONPATH=str(REPO))
    return env


def in_process(location: str, name: str, args: dict[str, Any], session: str = "alpha") -> Any:
    """The engine's own answer, from inside Hermes' process as the agent gets it."""
    e = _engine(location)
    try:
        e.bind_session_state(None, session)
        return json.loads(e.handle_tool_call(name, args))
    finally:
        e.store.close()


# --------------------------------------------------------------------------- the SDK's client


def is_error(res: Any) -> bool:
    return bool(res.model_dump(by_alias=True).get("isError"))


def text(res: Any) -> str:
    return res.content[0].text


async def _sdk_session(cmd: list[str], env: dict[str, str], errlog: Any, body: Any) -> Any:
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(command=cmd[0], args=cmd[1:], env=env, cwd=str(REPO))
    async with stdio_client(params, errlog=errlog) as (read, write):
        async with ClientSession(read, write) as s:
            init = await asyncio.wait_for(s.initialize(), GUARD)
            return await body(s, init)


def with_sdk(cmd: list[str], env: dict[str, str], tmp_path: Path, body: Any) -> tuple[Any, str]:
    """Run `body(session, init_result)` against a spawned server; (its result, server stderr)."""
    log = tmp_path / f"server-{time.monotonic_ns()}.err"
    with open(log, "w") as errlog:
        out = asyncio.run(_sdk_session(cmd, env, errlog, body))
    return out, log.read_text()


async def call(s: Any, name: str, args: dict[str, Any]) -> Any:
    return await asyncio.wait_for(s.call_tool(name, args), GUARD)


def clean_stderr(err: str) -> None:
    assert "Traceback" not in err and "internal error" not in err, err


def test_sdk_client_session_scope(planted, tmp_path):
    """The SDK's stdio client against `lcm mcp --session alpha`, on each backend."""
    loc, canary, sess = planted["location"], planted["canary"], planted["sess"]
    original = sess.messages[canary.message_index]
    beta_mid = planted["beta_mid"]

    async def body(s, init):
        got: dict[str, Any] = {"instructions": init.instructions}
        tools = (await s.list_tools()).tools
        got["tools"] = {t.name: t.model_dump(by_alias=True) for t in tools}
        got["grep"] = await call(s, "lcm_grep", {"query": canary.value})
        hit = json.loads(text(got["grep"]))["groups"][0]["hits"][0]
        got["expand"] = await call(s, "lcm_expand", {"id": hit["id"], "max_tokens": 12000})
        got["describe"] = await call(s, "lcm_describe", {"id": hit["id"]})
        top = json.loads(text(got["grep"]))["groups"][0]["summary_id"]
        got["summary"] = await call(s, "lcm_expand", {"id": top})
        got["bad"] = [await call(s, "lcm_expand", {"id": bad}) for bad in ("m999999999", "zzz", "s-1", None)]
        got["hostile"] = [await call(s, "lcm_grep", {"query": q}) for q in HOSTILE]
        got["hostile"] += [await call(s, "lcm_grep", {"query": "x", "limit": "many"}),
                           await call(s, "lcm_grep", {"query": "x", "cursor": "%%%"}),
                           await call(s, "lcm_grep", {"query": "x", "since": "yesterday"}),
                           await call(s, "lcm_grep", {}),
                           await call(s, "lcm_expand_query", {"prompt": "x"}),
                           await call(s, "no_such_tool", {})]
        # outside the scope: beta's message, beta's canary, every session
        got["beta_expand"] = await call(s, "lcm_expand", {"id": f"m{beta_mid}"})
        got["beta_describe"] = await call(s, "lcm_describe", {"id": f"m{beta_mid}"})
        got["nonexistent"] = await call(s, "lcm_expand", {"id": "m999999999"})
        got["beta_grep"] = await call(s, "lcm_grep", {"query": BETA_CANARY})
        got["all"] = await call(s, "lcm_grep", {"query": BETA_CANARY, "session_scope": "all"})
        got["sessions"] = await call(s, "lcm_sessions", {})
        got["again"] = await call(s, "lcm_grep", {"query": canary.value})  # alive after all of it
        return got

    got, err = with_sdk(server_cmd(loc, "--session", "alpha"), server_env(tmp_path), tmp_path, body)
    clean_stderr(err)
    assert "session alpha" in got["instructions"] and "--session" in got["instructions"]
    assert set(got["tools"]) == TOOLS
    for t in got["tools"].values():
        assert t["annotations"]["readOnlyHint"] is True and t["annotations"]["destructiveHint"] is False
        assert t["inputSchema"]["type"] == "object"
    # the canary: found, expanded verbatim; the same answers as the engine's own tools
    assert not is_error(got["grep"])
    grep = json.loads(text(got["grep"]))
    assert grep == in_process(loc, "lcm_grep", {"query": canary.value})
    hit = grep["groups"][0]["hits"][0]
    assert hit["summary_chain"], "the canary should have been summarised away"
    page = json.loads(text(got["expand"]))
    assert not is_error(got["expand"]) and page["message"] == original
    assert page == in_process(loc, "lcm_expand", {"id": hit["id"], "max_tokens": 12000})
    assert json.loads(text(got["describe"])) == in_process(loc, "lcm_describe", {"id": hit["id"]})
    assert not is_error(got["summary"]) and json.loads(text(got["summary"]))["children"]
    # bad input: tool errors with the engine's reasons, never an internal error
    for res in got["bad"] + got["hostile"]:
        body_ = json.loads(text(res))
        assert "internal error" not in text(res)
        if "error" in body_:
            assert is_error(res)
        else:
            assert not is_error(res) and "groups" in body_
    assert all(is_error(r) for r in got["bad"])
    assert json.loads(text(got["bad"][0])) == {"error": "unknown id m999999999"}
    assert json.loads(text(got["hostile"][-1]))["error"].startswith("unknown tool 'no_such_tool'")
    assert "lcm_expand_query" in json.loads(text(got["hostile"][-2]))["error"]
    # outside the scope: exactly like an id that does not exist
    assert is_error(got["beta_expand"]) and is_error(got["beta_describe"])
    assert json.loads(text(got["beta_expand"])) == {"error": f"unknown id m{beta_mid}"}
    assert json.loads(text(got["beta_describe"])) == {"error": f"unknown id m{beta_mid}"}
    assert json.loads(text(got["nonexistent"])) == {"error": "unknown id m999999999"}
    assert json.loads(text(got["beta_grep"]))["hits"] == 0
    assert is_error(got["all"]) and "--all-sessions" in json.loads(text(got["all"]))["error"]
    assert [r["id"] for r in json.loads(text(got["sessions"]))["sessions"]] == ["alpha"]
    assert json.loads(text(got["again"])) == grep


def test_default_scope_is_the_latest_session_and_flags(planted, tmp_path):
    """No flag: the latest session's lineage (beta), said in the instructions; --all-sessions
    sees both lineages; --conversation the conversation's."""
    loc, canary = planted["location"], planted["canary"]

    async def body(s, init):
        return (init.instructions, [json.loads(text(await call(s, "lcm_grep", {"query": q})))["hits"]
                                    for q in (canary.value, BETA_CANARY)],
                json.loads(text(await call(s, "lcm_sessions", {"limit": 1}))))

    env = server_env(tmp_path)
    (instr, hits, sessions), err = with_sdk(server_cmd(loc), env, tmp_path, body)
    clean_stderr(err)
    assert "session beta" in instr and "most recent" in instr
    assert hits[0] == 0 and hits[1] >= 1
    assert [r["id"] for r in sessions["sessions"]] == ["beta"] and sessions["next_cursor"] is None

    (instr, hits, sessions), _ = with_sdk(server_cmd(loc, "--all-sessions"), env, tmp_path, body)
    assert "every session" in instr and hits[0] >= 1 and hits[1] >= 1
    assert sessions["total"] == 2 and sessions["next_cursor"]  # paged: one per page

    (instr, hits, sessions), _ = with_sdk(server_cmd(loc, "--conversation", "conv-alpha"), env, tmp_path, body)
    assert "conversation conv-alpha" in instr and hits[0] >= 1 and hits[1] == 0
    assert [r["id"] for r in sessions["sessions"]] == ["alpha"]


@pytest.mark.parametrize("flags, says", [
    (["--session", "nope"], "unknown session 'nope'"),
    (["--conversation", "nope"], "no session belongs to conversation 'nope'"),
    (["--session", "alpha", "--all-sessions"], "at most one of"),
])
def test_a_scope_the_store_does_not_have_is_refused_at_start(planted_sqlite, tmp_path, flags, says):
    res = subprocess.run(server_cmd(planted_sqlite["location"], *flags), env=server_env(tmp_path), stdin=subprocess.DEVNULL,
                         capture_output=True, text=True, timeout=GUARD)
    assert res.returncode == 1 and res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lcm: ") and says in lines[0], res.stderr


# --------------------------------------------------------------------------- raw JSON-RPC


class RawClient:
    """Newline-delimited JSON-RPC on a subprocess's stdin/stdout, as clients other than the
    SDK speak it."""

    def __init__(self, cmd: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(cmd, env=env, cwd=str(REPO), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, encoding="utf-8")
        self.lines: "queue.Queue[str | None]" = queue.Queue()
        self.err: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=lambda: self.err.extend(self.proc.stderr), daemon=True).start()
        self._id = 0

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def send(self, obj: Any) -> None:
        self.proc.stdin.write((obj if isinstance(obj, str) else json.dumps(obj)) + "\n")
        self.proc.stdin.flush()

    def request(self, method: str, params: Any = None) -> dict[str, Any]:
        self._id += 1
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": self._id, "method": method}
        if params is not None:
            msg["params"] = params
        self.send(msg)
        return self.reply(self._id)

    def reply(self, want: Any) -> dict[str, Any]:
        while True:
            line = self.lines.get(timeout=GUARD)
            assert line is not None, "the server closed stdout: " + "".join(self.err)
            msg = json.loads(line)  # every line the server writes is one JSON-RPC message
            if msg.get("id") == want:
                return msg

    def tool(self, name: str, args: dict[str, Any]) -> tuple[Any, bool]:
        res = self.request("tools/call", {"name": name, "arguments": args})["result"]
        return json.loads(res["content"][0]["text"]), bool(res.get("isError"))

    def close_stdin_and_wait(self) -> int:
        self.proc.stdin.close()
        return self.proc.wait(timeout=GUARD)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@contextmanager
def raw_server(cmd: list[str], env: dict[str, str]) -> Iterator[RawClient]:
    c = RawClient(cmd, env)
    try:
        yield c
    finally:
        c.kill()


def handshake(c: RawClient) -> dict[str, Any]:
    init = c.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                    "clientInfo": {"name": "raw-jsonrpc", "version": "0"}})["result"]
    c.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    return init


def test_raw_jsonrpc_client(planted_sqlite, tmp_path):
    planted = planted_sqlite
    loc, canary, sess = planted["location"], planted["canary"], planted["sess"]
    with raw_server(server_cmd(loc, "--session", "alpha"), server_env(tmp_path)) as c:
        init = handshake(c)
        assert init["serverInfo"]["name"] == "lcm" and "tools" in init["capabilities"]
        assert "session alpha" in init["instructions"]
        listed = c.request("tools/list")["result"]["tools"]
        assert {t["name"] for t in listed} == TOOLS
        assert all(t["annotations"]["readOnlyHint"] for t in listed)
        found, err = c.tool("lcm_grep", {"query": canary.value})
        assert not err
        hit = found["groups"][0]["hits"][0]
        page, err = c.tool("lcm_expand", {"id": hit["id"], "max_tokens": 12000})
        assert not err and page["message"] == sess.messages[canary.message_index]
        assert c.tool("lcm_expand", {"id": "m0"}) == ({"error": "unknown id m0"}, True)
        assert c.tool("lcm_describe", {"id": f"m{planted['beta_mid']}"}) == (
            {"error": f"unknown id m{planted['beta_mid']}"}, True)
        assert c.tool("lcm_grep", {"query": BETA_CANARY})[0]["hits"] == 0
        c.send("this is not JSON")  # a broken line: the server answers or ignores it, and goes on
        assert c.request("ping")["result"] == {}
        assert c.request("no/such/method").get("error")  # a protocol error, not a crash
        assert c.tool("lcm_grep", {"query": canary.value})[0] == found
        assert c.close_stdin_and_wait() == 0  # gone when its client closes stdin
    assert "Traceback" not in "".join(c.err)


# --------------------------------------------------------------------------- beside a writing Hermes


@pytest.fixture(params=["sqlite", "postgres"])
def fresh_location(request, tmp_path):
    if request.param == "postgres":
        return request.getfixturevalue("pg_fresh_dsn")
    return str(tmp_path / "lcm.db")


def test_serves_beside_a_writer_and_sees_what_it_commits(fresh_location, tmp_path):
    """Hermes goes on writing while the server runs: a new session of alpha's conversation,
    stored by another engine after the server started, is found by the next call (the
    lineage is read per call; SQLite's reader sees the WAL's commits), and nothing the
    server does gets in the writer's way."""
    loc = fresh_location
    planted = plant(loc)
    with raw_server(server_cmd(loc, "--session", "alpha"), server_env(tmp_path)) as c:
        handshake(c)
        assert c.tool("lcm_grep", {"query": "gamma-canary-9931"})[0]["hits"] == 0
        e = _engine(loc)  # another process's engine, writing while the server holds its connections
        try:
            g = R19Host(e, session_id="gamma", overhead_tokens=500, conversation_id="conv-alpha")
            g.start(context_length=16_000)
            g.add({"role": "user", "content": "note the gamma code"},
                  {"role": "assistant", "content": "gamma-canary-9931 noted."})
            g.end()
            e.store.wait_indexed()
        finally:
            e.store.close()
        found, err = c.tool("lcm_grep", {"query": "gamma-canary-9931"})
        assert not err and found["hits"] == 1, found
        hit = found["groups"][0]["hits"][0]
        assert c.tool("lcm_expand", {"id": hit["id"]})[0]["message"] == {
            "role": "assistant", "content": "gamma-canary-9931 noted."}
        sessions = [r["id"] for r in c.tool("lcm_sessions", {})[0]["sessions"]]
        assert sessions == ["gamma", "alpha"]
        assert c.tool("lcm_grep", {"query": BETA_CANARY})[0]["hits"] == 0  # still not beta
        assert c.tool("lcm_expand", {"id": f"m{planted['beta_mid']}"})[1]
        assert c.close_stdin_and_wait() == 0
    assert "Traceback" not in "".join(c.err)


# --------------------------------------------------------------------------- a store that hangs


def poll_until_ok(c: RawClient, query: str, limit: float = GUARD) -> Any:
    """Call lcm_grep until it answers without error (the store is back); the last answer."""
    deadline = time.monotonic() + limit
    while True:
        out, err = c.tool("lcm_grep", {"query": query})
        if not err or time.monotonic() > deadline:
            return out, err
        time.sleep(0.3)


def test_locked_sqlite_answers_a_tool_error_and_the_server_goes_on(tmp_path):
    """Another process holds the SQLite file's lock (exclusive locking mode: it lets no reader
    in): calls are answered with a tool error within the bound, the server's loop stays free;
    once the lock is gone the server answers again; and a server whose call is stuck in the
    lock still ends when its client closes stdin."""
    loc = str(tmp_path / "lcm.db")
    canary = plant(loc)["canary"].value
    env = server_env(tmp_path)
    locker: sqlite3.Connection | None = sqlite3.connect(loc, isolation_level=None)
    try:
        locker.execute("PRAGMA locking_mode=EXCLUSIVE")
        locker.execute("BEGIN EXCLUSIVE")  # held until this connection closes
        with raw_server(server_cmd(loc, "--session", "alpha", timeout=1.0), env) as c:
            assert "session alpha" in handshake(c)["instructions"]  # the handshake never waits on the store
            for name, args in (("lcm_grep", {"query": canary}), ("lcm_describe", {"id": "m1"})):
                out, err = c.tool(name, args)
                assert err and ("did not answer within 1 s" in out["error"]
                                or "has not come back" in out["error"]), out
            assert c.request("ping")["result"] == {}  # the loop itself never waits on the store
            with raw_server(server_cmd(loc, "--session", "alpha", timeout=1.0), env) as stuck:
                handshake(stuck)
                assert stuck.tool("lcm_grep", {"query": canary})[1]
                assert stuck.close_stdin_and_wait() == 0  # a call stuck in the lock does not hold it
            locker.close()
            locker = None
            after, err = poll_until_ok(c, canary)
            assert not err and after["hits"] >= 1, after
            assert after == in_process(loc, "lcm_grep", {"query": canary})
            assert c.close_stdin_and_wait() == 0
        assert "Traceback" not in "".join(c.err + stuck.err)
    finally:
        if locker is not None:
            locker.close()


def _cluster_pids(server: Any) -> list[int]:
    """The postmaster and every process it started (backends, background workers)."""
    master = int((server.data / "postmaster.pid").read_text().split()[0])
    kids = subprocess.run(["pgrep", "-P", str(master)], capture_output=True, text=True).stdout.split()
    return [master, *map(int, kids)]


def test_frozen_and_stopped_postgresql_answer_tool_errors(tmp_path):
    """A PostgreSQL server frozen mid-session (SIGSTOP: a VM pause, a partition) and one that is
    stopped: each call is answered with a tool error within the bound, and the server serves
    again once PostgreSQL is back."""
    server = start_server()  # a server of its own: freezing the shared one would stall others
    try:
        loc = server.dsn(server.create_database("mcpfreeze"))
        canary = plant(loc)["canary"].value
        with raw_server(server_cmd(loc, "--session", "alpha", timeout=2.0), server_env(tmp_path)) as c:
            handshake(c)
            before, err = c.tool("lcm_grep", {"query": canary})
            assert not err and before["hits"] >= 1
            pids = _cluster_pids(server)
            try:
                for pid in pids:
                    os.kill(pid, signal.SIGSTOP)
                frozen, err = c.tool("lcm_grep", {"query": canary})
                assert err and "did not answer within 2 s" in frozen["error"], frozen
                assert c.request("ping")["result"] == {}
                again, err = c.tool("lcm_expand", {"id": "m1"})
                assert err and ("has not come back" in again["error"] or "did not answer" in again["error"]
                                or "unavailable" in again["error"]), again
            finally:
                for pid in pids:
                    os.kill(pid, signal.SIGCONT)
            after, err = poll_until_ok(c, canary)
            assert not err and after == before, after
            server.pause()  # down: connections refused
            try:
                down, err = c.tool("lcm_grep", {"query": canary})
                assert err and "unavailable" in down["error"], down
            finally:
                server.resume()
            after, err = poll_until_ok(c, canary)
            assert not err and after == before, after
            assert c.close_stdin_and_wait() == 0
        assert "Traceback" not in "".join(c.err)
    finally:
        server.stop()


# --------------------------------------------------------------------------- without the SDK


def test_engine_and_cli_work_without_the_sdk_and_lcm_mcp_names_the_install(tmp_path):
    """`mcp` hidden: the engine, its plugin and the CLI import and run; `lcm mcp` fails with
    one line naming the install command."""
    loc = str(tmp_path / "lcm.db")
    plant(loc)
    hide = "import sys; sys.modules['mcp'] = None; "
    env = server_env(tmp_path)
    ok = subprocess.run([sys.executable, "-c", hide + "import lossless_context.engine, lossless_context.hermes.plugin, "
                         "lossless_context.mcp_server.server; from lossless_context.cli import main; "
                         f"main(['--store', {loc!r}, 'grep', 'pytest', '--limit', '1'])"],
                        env=env, capture_output=True, text=True, timeout=GUARD, cwd=str(REPO))
    assert ok.returncode == 0 and "pytest" in ok.stdout, ok.stderr
    res = subprocess.run([sys.executable, "-c", hide + "from lossless_context.cli import main; "
                          f"main(['--store', {loc!r}, 'mcp'])"],
                         env=env, capture_output=True, text=True, timeout=GUARD, cwd=str(REPO),
                         stdin=subprocess.DEVNULL)
    assert res.returncode == 1 and res.stdout == ""
    assert res.stderr.strip().splitlines() == ["lcm: `lcm mcp` needs the MCP SDK: pip install 'lossless-context[mcp]'"]
