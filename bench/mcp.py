"""lcm_grep through `lcm mcp` against the same call in-process (issue #44).

One store per backend (a coding session compacted by the engine), three ways to ask it the same
questions, in one run:

* **engine**: `LCMEngine.handle_tool_call("lcm_grep", …)` inside the process, as Hermes calls it;
* **scoped**: the server's own code path without the transport (`tools.dispatch_scoped` on the
  read-only store, the scope of `--session`), in this process;
* **mcp**: a spawned `lcm mcp --session …` asked by the SDK's stdio client (`mcp.client.stdio`):
  JSON-RPC over pipes, the server's thread hand-off and bound, and the client's parsing.

The three are measured in a fresh process (like the server's), interleaved call by call; each
question is asked once to warm up, then `reps` times per path. Reported: each question's
p50 per path, a pass over the question set (the sum of those p50s) per path and the ratio mcp /
engine (the cost of the protocol), the median time MCP adds to a call, and the server's start-up
(spawn to the end of `initialize`). The answers must be the same JSON on every path.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from . import common

SESSION = "mcp-bench"


def _build(store: str, n: int) -> list[str]:
    """A compacted coding session of `n` messages; the questions asked of it."""
    from lossless_context.demo.host_driver import R19Host
    from lossless_context.demo.sessions import coding_session, turn_ranges

    e = common.make_engine(store, context_length=32_000)
    sess = coding_session(n, seed=11)
    host = R19Host(e, session_id=SESSION, overhead_tokens=1500)
    host.start(context_length=32_000)
    for a, b in turn_ranges(sess.messages):
        host.add(*sess.messages[a:b])
        host.maybe_compress()
    host.end()
    common.settle_indexes(e.store)
    e.store.close()
    return ([c.value for c in sess.canaries[:3]]
            + ["pytest failure in the routes", "what did we decide about the export cutoff?", "\"retry budget\""])


def _timed(fn: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return common.ms_since(t0), out


async def _compare(store: str, queries: list[str], reps: int) -> dict[str, Any]:
    """The three paths, interleaved call by call (load that comes and goes touches all three
    alike): per question, the ms of each call on each path; the warm-up answers; the start-up."""
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    from lossless_context.config import LCMConfig
    from lossless_context.mcp_server.scope import ServerScope
    from lossless_context.mcp_server.server import Reader
    from lossless_context.tools import ToolSource, dispatch_scoped

    e = common.make_engine(store, context_length=32_000)
    e.bind_session_state(None, SESSION)
    reader = Reader(LCMConfig.load({"store": store}), store)
    scope = ServerScope("session", SESSION)
    params = StdioServerParameters(command=sys.executable, env=dict(os.environ), cwd=str(common.ROOT),
                                   args=["-m", "lossless_context.cli", "--store", store, "mcp", "--session", SESSION])
    ms: dict[str, list[list[float]]] = {k: [[] for _ in queries] for k in ("engine", "scoped", "mcp")}
    answers: dict[str, list[Any]] = {k: [] for k in ms}
    try:
        t0 = time.perf_counter()
        with open(os.devnull, "w") as quiet:
            async with stdio_client(params, errlog=quiet) as (read, write):
                async with ClientSession(read, write) as s:
                    await s.initialize()
                    started = time.perf_counter() - t0
                    for rnd in range(reps + 1):  # round 0 warms up; its answers are compared
                        for i, q in enumerate(queries):
                            took = {
                                "engine": _timed(lambda q=q: json.loads(e.handle_tool_call("lcm_grep", {"query": q}))),
                                "scoped": _timed(lambda q=q: json.loads(dispatch_scoped(
                                    ToolSource(reader.store, reader.config, reader.semantic_arm()), "lcm_grep", {"query": q}, lambda a: scope.for_call(reader.store, a)))),
                            }
                            t1 = time.perf_counter()
                            res = await s.call_tool("lcm_grep", {"query": q})
                            took["mcp"] = (common.ms_since(t1), json.loads(res.content[0].text))
                            for k, (t, answer) in took.items():
                                if rnd == 0:
                                    answers[k].append(answer)
                                else:
                                    ms[k][i].append(t)
    finally:
        e.store.close()
        reader.close()
    return {"ms": ms, "answers": answers, "started": started}


def _measure(store: str, n: int, reps: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    queries = _build(store, n)
    built = time.perf_counter() - t0
    # measured in a process of its own: a fresh heap, as the server's (the build's leftovers in this
    # process would slow the in-process paths alone)
    proc = subprocess.run([sys.executable, "-m", "bench.mcp", store, str(reps), json.dumps(queries)],
                          cwd=str(common.ROOT), capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"bench.mcp worker failed: {proc.stderr[-2000:]}")
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    paths, a = got["ms"], got["answers"]
    # per question: its p50 on each path; a "pass" is the question set once (the sum of its p50s)
    p50 = {k: [common.percentile(v, 50) or 0.0 for v in per_q] for k, per_q in paths.items()}
    per_query = [{"query": q[:40], "hits": ans.get("hits"), **{f"{k}_p50_ms": round(p50[k][i], 3) for k in paths}}
                 for i, (q, ans) in enumerate(zip(queries, a["engine"]))]
    passes = {k: sum(v) for k, v in p50.items()}
    added = sorted(m - e for m, e in zip(p50["mcp"], p50["engine"]))
    return {
        "messages": n, "queries": len(queries), "reps": reps, "build_seconds": round(built, 1),
        "per_query": per_query,
        **{f"{k}_pass_ms": round(v, 3) for k, v in passes.items()},
        "ratio_mcp_engine": round(passes["mcp"] / passes["engine"], 2) if passes["engine"] else None,
        "ratio_scoped_engine": round(passes["scoped"] / passes["engine"], 2) if passes["engine"] else None,
        "added_ms_per_call_median": round(added[len(added) // 2], 3),
        "server_start_seconds": round(got["started"], 2),
        "same_answers": a["engine"] == a["scoped"] == a["mcp"],
        "hits": [x.get("hits") for x in a["engine"]],
    }


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    try:
        import mcp  # noqa: F401
    except ImportError as exc:
        return {"skipped": f"the MCP SDK is not installed (pip install 'lossless-context[mcp]'): {exc}"}
    quick = cfg["quick"]
    n, reps = (1_000, 5) if quick else (20_000, 20)
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="lcm-bench-mcp-") as tmp:
        out["sqlite"] = _measure(str(Path(tmp) / "lcm.db"), n, reps)
    if quick:
        out["postgresql"] = {"skipped": "quick mode: SQLite only"}
        return out
    srv, why = _pg_server()
    if srv is None:
        out["postgresql"] = {"skipped": why}
        return out
    try:
        out["postgresql"] = _measure(srv.dsn(srv.create_database("mcpbench")), n, reps)
    finally:
        srv.stop()
    return out


def _pg_server() -> tuple[Any, str | None]:
    """(a started test server, or None and why not)."""
    try:
        from tests.support.pg import PgServer, find_bindir
    except Exception as exc:
        return None, f"tests/support/pg.py not importable: {exc}"
    bindir = find_bindir()
    if bindir is None:
        return None, "PostgreSQL server binaries not found"
    srv = PgServer(bindir, shared_buffers="256MB")
    try:
        srv.start()
    except Exception as exc:
        srv.stop()
        return None, f"could not start PostgreSQL: {exc}"
    return srv, None


if __name__ == "__main__":  # the measuring worker: STORE REPS QUERIES_JSON → one JSON line
    common.quiet_logs()
    _store, _reps, _queries = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
    print(json.dumps(asyncio.run(_compare(_store, _queries, _reps)), default=str))
