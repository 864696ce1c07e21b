"""The `lcm mcp` server: the engine's read-only tools over MCP's stdio transport.

* Tools: `lcm_grep`, `lcm_describe`, `lcm_expand`, `lcm_sessions`, answered by the engine's
  own code (`tools.dispatch_scoped`): the same arguments, JSON answers, paging and errors.
  An answer holding ``"error"`` is sent as a tool error (``isError``), so the client's model
  sees the reason and the server keeps serving.
* The store is opened read-only (SQLite ``mode=ro`` beside a writing Hermes, WAL readers;
  PostgreSQL sessions with ``default_transaction_read_only``), behind the store's circuit
  breaker (`store/guard.py`): after a failure calls fail at once for ``store_retry_seconds``.
* Every call runs on a small pool of daemon threads and is answered within ``bound`` seconds:
  a store that hangs gets a tool error naming it, and while a call is still stuck no other
  call is sent after it (they are answered at once); the event loop never waits on the store.
* The server ends when its client closes stdin; a call stuck in the store does not keep the
  process alive (its thread is a daemon, and the process exits without waiting for it).

Works with the `mcp` SDK's 1.x (decorator handlers) and 2.x (constructor handlers) low-level
servers, so it installs beside any Hermes release's own `mcp` pin.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import json
import logging
import os
import queue
import sys
import threading
import time
from typing import Any, Callable

from .. import __version__
from ..config import LCMConfig
from ..retrieval.semantic import SemanticArm, SemanticUnavailable, load_embedder
from ..store import open_store
from ..store.guard import GuardedStore, StoreUnavailable, mask_location
from ..tools import READ_ONLY_SCHEMAS, ToolSource, dispatch_scoped
from .scope import ScopeError, ServerScope

log = logging.getLogger("lossless_context.mcp")

DEFAULT_BOUND = 15.0  # seconds a tool call may take before it is answered with an error
WORKERS = 4
SERVER_NAME = "lcm"

_TITLES = {"lcm_grep": "Search the lossless history", "lcm_describe": "Describe a summary or message",
           "lcm_expand": "Open a summary or message verbatim", "lcm_sessions": "List the sessions in scope"}


class Reader:
    """What the tools read (the part of the engine they use): the store, read-only and behind
    its breaker, the configuration, and the semantic arm when configured (it only reads the
    vectors the engine keeps; it never embeds)."""

    def __init__(self, config: LCMConfig, location: str, call_timeout: float | None = None) -> None:
        self.config = config
        self.location = location
        # PostgreSQL's client-side bound on one store call (store/postgres/deadline.py): the
        # configured one, never more than the bound on a whole tool call
        bound = config.store_timeout if call_timeout is None else min(config.store_timeout, call_timeout)
        self.store = GuardedStore(location, lambda loc: open_store(loc, read_only=True, call_timeout=bound),
                                  config.store_retry_seconds)
        self._arm: SemanticArm | None = None
        self._arm_tried = False
        self._arm_lock = threading.Lock()

    def semantic_arm(self) -> SemanticArm | None:
        if not self.config.semantic:
            return None
        with self._arm_lock:
            if not self._arm_tried:
                self._arm_tried = True
                try:
                    self._arm = SemanticArm(self.store, load_embedder(self.config.semantic_model))
                except (SemanticUnavailable, ImportError) as exc:
                    log.warning("lcm mcp: semantic search is off: %s", exc)
            return self._arm

    def close(self) -> None:
        self.store.close()


class BoundedCalls:
    """Runs store work on daemon threads, each call answered within `bound` seconds.

    A call past its bound is *overdue*: while one is, further calls are refused at once (the
    store is not answering; more threads would only wait behind it), until it comes back."""

    def __init__(self, bound: float, where: str, workers: int = WORKERS) -> None:
        self.bound = float(bound)
        self.where = where
        self._jobs: "queue.SimpleQueue[tuple[Callable[[], Any], concurrent.futures.Future]]" = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._overdue: dict[concurrent.futures.Future, float] = {}
        self._running = 0
        for i in range(max(1, workers)):
            threading.Thread(target=self._work, name=f"lcm-mcp-{i}", daemon=True).start()

    def _work(self) -> None:
        while True:
            fn, fut = self._jobs.get()
            if not fut.set_running_or_notify_cancel():
                continue
            with self._lock:
                self._running += 1
            try:
                fut.set_result(fn())
            except BaseException as exc:  # handed to the waiting coroutine
                fut.set_exception(exc)
            finally:
                with self._lock:
                    self._running -= 1
                    self._overdue.pop(fut, None)

    def busy(self) -> bool:
        """Whether a call is still running (perhaps stuck in the store)."""
        with self._lock:
            return self._running > 0

    def stuck_for(self) -> float | None:
        """Seconds since the oldest overdue call started, while one is still out."""
        with self._lock:
            return time.monotonic() - min(self._overdue.values()) if self._overdue else None

    async def run(self, fn: Callable[[], Any]) -> Any:
        """`fn()` on a worker thread; TimeoutError past the bound, StoreUnavailable at once
        while an earlier call is still overdue."""
        stuck = self.stuck_for()
        if stuck is not None:
            raise StoreUnavailable(self.where, f"an earlier call has not come back for {stuck:.0f} s "
                                   "(the store is not answering)")
        fut: concurrent.futures.Future = concurrent.futures.Future()
        started = time.monotonic()
        self._jobs.put((fn, fut))
        try:
            return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(fut)), self.bound)
        except asyncio.TimeoutError:
            with self._lock:
                if not fut.done():
                    self._overdue[fut] = started
            raise TimeoutError(f"the lcm store at {self.where} did not answer within {self.bound:g} s") from None


class LCMServer:
    """The tools, their scope and the bound on each call, independent of the SDK."""

    def __init__(self, reader: Reader, scope: ServerScope, bound: float = DEFAULT_BOUND) -> None:
        self.reader = reader
        self.scope = scope
        self.calls = BoundedCalls(bound, mask_location(reader.location))

    def instructions(self) -> str:
        return (
            "Read-only access to the lossless history that the lcm engine keeps for Hermes Agent: "
            "every message verbatim, older turns also summarised into a DAG of summaries. "
            f"Scope: {self.scope.describe()}. Nothing outside this scope is searched, and its ids "
            "answer as unknown. Search with lcm_grep first (words, a question, an identifier or a "
            "\"quoted phrase\"; mode=regex for a regex), then lcm_expand an id (s… summary, m… "
            "message) to read the originals verbatim; lcm_describe shows where an id sits; "
            "lcm_sessions lists the sessions in scope. Answers are JSON and paged: pass next_cursor "
            "back as cursor. Nothing can be written through this server."
        )

    @staticmethod
    def tool_definitions() -> list[dict[str, Any]]:
        """The tools as MCP lists them (JSON, camelCase keys)."""
        return [{
            "name": s["name"], "title": _TITLES[s["name"]], "description": s["description"],
            "inputSchema": s["parameters"],
            "annotations": {"title": _TITLES[s["name"]], "readOnlyHint": True, "destructiveHint": False,
                            "idempotentHint": True, "openWorldHint": False},
        } for s in READ_ONLY_SCHEMAS]

    async def start(self) -> None:
        """Choose the scope's session now when the store answers within the bound; a store
        that does not is chosen from at the first call instead. Raises ScopeError for a
        session or conversation the store does not have."""
        try:
            await self.calls.run(lambda: self.scope.resolve(self.reader.store))
        except ScopeError:
            raise
        except Exception as exc:  # down, hung, busy, empty: the calls say so until it answers
            log.warning("lcm mcp: the store could not be read at start (%s); the scope is checked "
                        "at the first call", exc)

    async def call(self, name: str, arguments: Any) -> tuple[str, bool]:
        """One tool call: its JSON answer and whether it is an error."""
        store = self.reader.store

        def work() -> str:
            source = ToolSource(store, self.reader.config, self.reader.semantic_arm())
            return dispatch_scoped(source, name, arguments, lambda a: self.scope.for_call(store, a))

        try:
            answer = await self.calls.run(work)
        except (StoreUnavailable, TimeoutError) as exc:
            answer = json.dumps({"error": f"{exc}; the history cannot be searched until it is back"})
        try:
            data = json.loads(answer)
        except ValueError:  # (dispatch_scoped always answers JSON)
            return answer, True
        return answer, isinstance(data, dict) and "error" in data


# --------------------------------------------------------------------------- the SDK


def build_server(app: LCMServer) -> Any:
    """The SDK's low-level server around `app` (mcp 2.x constructor handlers, or 1.x decorators)."""
    from mcp import types
    from mcp.server.lowlevel import Server

    def tools() -> list[Any]:
        return [types.Tool.model_validate(t) for t in app.tool_definitions()]

    async def call(name: str, arguments: Any) -> Any:
        text, is_error = await app.call(name, arguments)
        return types.CallToolResult.model_validate({"content": [{"type": "text", "text": text}],
                                                    "isError": is_error})

    if "on_call_tool" in inspect.signature(Server.__init__).parameters:  # mcp 2.x
        async def on_list_tools(ctx: Any, params: Any) -> Any:
            return types.ListToolsResult(tools=tools())

        async def on_call_tool(ctx: Any, params: Any) -> Any:
            return await call(params.name, params.arguments)

        return Server(SERVER_NAME, version=__version__, instructions=app.instructions(),
                      on_list_tools=on_list_tools, on_call_tool=on_call_tool)

    # mcp 1.x: handlers registered by decorators (typed as Any: the 2.x stubs have no such methods)
    server: Any = Server(SERVER_NAME, version=__version__, instructions=app.instructions())

    @server.list_tools()
    async def list_tools() -> list[Any]:
        return tools()

    # the tools check their own arguments (the engine's answers to hostile input), not the schema
    @server.call_tool(validate_input=False)
    async def call_tool(name: str, arguments: Any) -> Any:
        return await call(name, arguments)

    return server


async def serve(app: LCMServer) -> None:
    """Serve MCP on stdin/stdout until the client closes stdin."""
    from mcp.server.stdio import stdio_server

    await app.start()
    server = build_server(app)  # (after start: the instructions name the session chosen)
    print(f"lcm mcp: serving {app.scope.describe()} from {app.calls.where} (read-only)", file=sys.stderr,
          flush=True)
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


def run(config: LCMConfig, location: str, scope: ServerScope, bound: float = DEFAULT_BOUND) -> None:
    """Run `lcm mcp` in this process until stdin closes (ScopeError for a scope the store
    does not have). The process ends here when a call is still stuck in the store."""
    import anyio

    app = LCMServer(Reader(config, location, call_timeout=bound), scope, bound)
    anyio.run(serve, app)
    # Closing waits for nothing stuck: a worker still inside the store keeps its connection.
    done = threading.Event()

    def close() -> None:
        try:
            app.reader.close()
        finally:
            done.set()

    if not app.calls.busy():
        threading.Thread(target=close, name="lcm-mcp-close", daemon=True).start()
        done.wait(5.0)
    if app.calls.busy() or not done.is_set():
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # (mcp 1.x closes stdout when its transport ends)
                pass
        os._exit(0)  # a daemon worker blocked in the store's socket must not hold the exit
