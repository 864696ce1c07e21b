"""`lcm context` and `lcm forget`: what the model sees now, and removing a session, a message or
a turn for good."""

from __future__ import annotations

import json
import re
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
    @click.argument("target")
    @click.option("--turn", is_flag=True, help="With a message id: forget the whole turn holding it.")
    @click.option("--dry-run", is_flag=True, help="Show what would go; change nothing.")
    @click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
    @click.option("--json", "as_json", is_flag=True, help="Print what was (or would be) done as JSON.")
    @pass_app
    def forget(app: Any, target: str, turn: bool, dry_run: bool, yes: bool, as_json: bool) -> None:
        """Remove for good a session (TARGET: its id; also its messages, summaries, index rows
        and host background forks; branches that shared its history are repaired and keep
        their own), or one message (TARGET: m123) or, with --turn, the turn holding it: the
        summaries built over it are rebuilt without it (ids kept), its text leaves the store,
        its full-text indexes and its summaries."""
        from ..ops.doctor import run_doctor
        from ..edits import forget as fg

        store = app.open_store()
        is_message = re.fullmatch(r"m\d+", target) is not None and store.get_session(target) is None
        if turn and not is_message:
            raise UserError("--turn takes a message id (m123)")
        if is_message:
            try:
                plan = fg.plan_forget_messages(store, [int(target[1:])], turn=turn)
            except LookupError as exc:
                raise UserError(f"{exc} (see `lcm grep` or `lcm context`)") from exc
            if as_json and dry_run:
                click.echo(json.dumps(plan.as_dict(), indent=2, ensure_ascii=False))
                return
            if not as_json:
                click.echo(_render_plan(plan, dry_run))
            if dry_run:
                return
            if not yes and not click.confirm(f"Forget {len(plan.messages)} message(s) for good?"):
                raise UserError("nothing forgotten")
            done = fg.forget_messages(store, plan)
            click.echo(json.dumps({**plan.as_dict(), "done": done}, indent=2, ensure_ascii=False) if as_json else
                       f"forgot {done['messages']} message(s); rebuilt {done['summaries_rebuilt']} summaries,"
                       f" deleted {done['summaries']}; the store was scrubbed")
        else:
            if store.get_session(target) is None:
                raise UserError(f"unknown session {target!r} (see `lcm sessions`; a message is m123)")
            if dry_run:
                raise UserError("--dry-run is for messages and turns (m123)")
            if not yes and not click.confirm(f"Forget session {target} and everything summarised from it?"):
                raise UserError("nothing forgotten")
            rep = fg.forget_session(store, target)
            click.echo(f"forgot {', '.join(rep.sessions)}: {rep.messages} messages, {rep.summaries} summaries"
                       + (f"; repaired the context of {', '.join(rep.repaired)}" if rep.repaired else ""))
        doc = run_doctor(store)
        if not doc.ok:
            raise UserError("the store is not healthy after forgetting:\n" + doc.render_text())

    def _render_plan(plan: Any, dry_run: bool) -> str:
        head = "would forget" if dry_run else "forgetting"
        lines = [f"{head} {len(plan.messages)} message(s) of {', '.join(plan.sessions)}:"]
        lines += [f"  m{m}  {plan.previews.get(m, '')}" for m in plan.messages]
        if plan.rebuilt:
            lines.append("summaries rebuilt without them (ids kept): " + ", ".join(f"s{x}" for x in plan.rebuilt))
        if plan.dropped:
            lines.append("summaries deleted (nothing left under them): " + ", ".join(f"s{x}" for x in plan.dropped))
        if plan.contexts:
            lines.append("active contexts repaired: " + ", ".join(sorted(plan.contexts)))
        return "\n".join(lines)

    group.add_command(context)
    group.add_command(forget)
