"""`lcm context` and `lcm forget`: what the model sees now, and removing a session for good."""

from __future__ import annotations

import json
from typing import Any, Callable

import click


def add_commands(group: click.Group, pass_app: Callable, UserError: type) -> None:  # noqa: N803
    """Define the commands on `group` (the cli module passes its own decorator and error type:
    no import back into it, which also runs as ``python -m lossless_context.cli.commands``)."""

    @click.command()
    @click.argument("session", required=False)
    @click.option("--json", "as_json", is_flag=True, help="Print the items as JSON.")
    @pass_app
    def context(app: Any, session: str | None, as_json: bool) -> None:
        """What the model sees now: a session's active context with ids and token counts."""
        from ..pipeline.context_view import context_rows, render_rows

        store = app.open_store()
        sid = app.resolve_session(store, session)
        rows = context_rows(store, sid)
        click.echo(json.dumps({"session": sid, "items": rows}, indent=2, ensure_ascii=False) if as_json
                   else render_rows(sid, rows))


    @click.command()
    @click.argument("session")
    @click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
    @pass_app
    def forget(app: Any, session: str, yes: bool) -> None:
        """Remove a session for good: its messages, summaries and index rows (and its host
        background forks); branches that shared its history are repaired and keep their own."""
        from ..ops.doctor import run_doctor
        from ..pipeline.forget import forget_session

        store = app.open_store()
        if store.get_session(session) is None:
            raise UserError(f"unknown session {session!r} (see `lcm sessions`)")
        if not yes and not click.confirm(f"Forget session {session} and everything summarised from it?"):
            raise UserError("nothing forgotten")
        rep = forget_session(store, session)
        click.echo(f"forgot {', '.join(rep.sessions)}: {rep.messages} messages, {rep.summaries} summaries"
                   + (f"; repaired the context of {', '.join(rep.repaired)}" if rep.repaired else ""))
        doc = run_doctor(store)
        if not doc.ok:
            raise UserError("the store is not healthy after forgetting:\n" + doc.render_text())

    group.add_command(context)
    group.add_command(forget)
