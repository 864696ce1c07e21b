"""`lcm mcp`: serve the history read-only to MCP clients on stdin/stdout (lossless_context/mcp_server)."""

from __future__ import annotations

import importlib.util
import threading
from typing import Any, Callable

import click

INSTALL_HINT = "pip install 'lossless-context[mcp]'"


def add_commands(group: click.Group, pass_app: Callable, UserError: type) -> None:  # noqa: N803
    """Define `lcm mcp` on `group` (the cli module passes its own decorator and error type)."""

    @click.command(name="mcp")
    @click.option("--session", default=None, metavar="ID", help="Serve this session's lineage.")
    @click.option("--conversation", default=None, metavar="ID",
                  help="Serve this conversation's sessions (a gateway's key, stable across rotations).")
    @click.option("--all-sessions", is_flag=True, help="Serve every session in the store.")
    @click.option("--store", "store_opt", metavar="PATH|DSN", default=None,
                  help="Store to read (default: as for every lcm command).")
    @click.option("--timeout", type=click.FloatRange(0.5, 3600), default=15.0, show_default=True,
                  help="Seconds a tool call may wait for the store before it is answered with an error.")
    @pass_app
    def mcp(app: Any, session: str | None, conversation: str | None, all_sessions: bool,
            store_opt: str | None, timeout: float) -> None:
        """Serve the history read-only over MCP (stdio) to Claude Code, Codex, Cursor or any MCP
        client: lcm_grep, lcm_describe, lcm_expand and lcm_sessions. Without --session,
        --conversation or --all-sessions it serves the lineage of the most recent Hermes session
        (chosen when it starts). Ends when the client closes stdin."""
        if sum(bool(x) for x in (session, conversation, all_sessions)) > 1:
            raise UserError("give at most one of --session, --conversation and --all-sessions")
        if importlib.util.find_spec("mcp") is None:
            raise UserError(f"`lcm mcp` needs the MCP SDK: {INSTALL_HINT}")
        try:
            import mcp.server.lowlevel  # noqa: F401  (a broken install fails here, in one line)
        except ImportError as exc:
            raise UserError(f"`lcm mcp`: the MCP SDK does not import ({exc}): {INSTALL_HINT}") from exc
        from ..mcp_server.scope import ScopeError, ServerScope
        from ..mcp_server.server import run

        if store_opt:
            app.store_opt = store_opt
        loc = app.location()
        _check_bounded(lambda: app.check_location(loc, must_exist=True), timeout)
        if session:
            scope = ServerScope("session", session)
        elif conversation:
            scope = ServerScope("conversation", conversation)
        else:
            scope = ServerScope("all" if all_sessions else "latest")
        try:
            run(app.config(store=loc), loc, scope, bound=timeout)
        except ScopeError as exc:
            raise UserError(str(exc)) from exc

    group.add_command(mcp)


def _check_bounded(check: Callable[[], None], timeout: float) -> None:
    """Run the CLI's check of the store file, for at most `timeout` seconds: a file whose lock
    another process holds would make it wait; the server then starts, and its calls say why
    they cannot read (a check that fails in time fails the start, in one line)."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            check()
        except BaseException as exc:  # handed back to the command
            failed.append(exc)

    t = threading.Thread(target=run, name="lcm-mcp-check", daemon=True)
    t.start()
    t.join(timeout)
    if failed:
        raise failed[0]
