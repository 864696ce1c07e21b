"""`lcm prune` and `lcm vacuum`: removing old history by age or size, and rewriting an SQLite
store so it gives the space back (ops/retention.py does the work)."""

from __future__ import annotations

import json
import time
from typing import Any, Callable

import click


def _ago(now: float, t: float) -> str:
    return f"{time.strftime('%Y-%m-%d', time.gmtime(t))} ({(now - t) / 86400:.0f} days ago)"


def render_plan(plan: Any) -> str:
    from ..ops.retention import human_bytes

    what = "whole sessions" if plan.mode == "sessions" else "the originals under summaries (summaries kept)"
    lines = [f"prune {what}"
             + (f", lineages last active more than {plan.older_than_days:g} days ago" if plan.older_than_days
                is not None else "")
             + (f"{',' if plan.older_than_days is not None else ''} oldest first until the store is under "
                f"{human_bytes(plan.max_bytes)}" if plan.max_bytes is not None else "")]
    for g in plan.lineages:
        extra = f" (+{len(g.sessions) - 1} in its lineage)" if len(g.sessions) > 1 else ""
        lines.append(f"  {g.sessions[0]}{extra}: last active {_ago(plan.now, g.last_activity)}, "
                     f"{g.removable:,} messages, ≈{human_bytes(g.est_bytes)}")
    n_sessions = len(plan.sessions)
    lines.append(f"would remove {n_sessions if plan.mode == 'sessions' else 0} sessions and "
                 f"{sum(g.removable for g in plan.lineages):,} messages: ≈{human_bytes(plan.est_freed)} of "
                 f"{human_bytes(plan.used_bytes)} in use ({human_bytes(plan.file_bytes)} on disk)"
                 if plan.lineages else "nothing to prune")
    if plan.protected:
        lines.append(f"left alone: {plan.protected} lineage(s) that qualify but are live or were active within a day")
    return "\n".join(lines)


def add_commands(group: click.Group, pass_app: Callable, UserError: type) -> None:  # noqa: N803
    """Define the commands on `group` (as session_cmds.add_commands)."""

    @click.command()
    @click.option("--older-than", "older_than", type=click.FloatRange(0, 36_500), metavar="DAYS", default=None,
                  help="Remove lineages last active more than DAYS days ago.")
    @click.option("--max-size", "max_size", metavar="SIZE", default=None,
                  help="Then remove the oldest lineages until the store is under SIZE (e.g. 500MB, 2GB).")
    @click.option("--keep-summaries", is_flag=True, default=None,
                  help="Keep the summaries and the DAG; remove only the original messages under them.")
    @click.option("--dry-run", is_flag=True, help="Show what would go and how much space comes back; change nothing.")
    @click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
    @click.option("--json", "as_json", is_flag=True, help="Print the plan (and the result) as JSON.")
    @pass_app
    def prune(app: Any, older_than: float | None, max_size: str | None, keep_summaries: bool | None, dry_run: bool,
              yes: bool, as_json: bool) -> None:
        """Remove old history: whole session lineages (as `lcm forget`), or only the originals under
        their summaries. A lineage active within the last day is never touched. Without options,
        the `retention:` block of the config is applied."""
        from ..ops.doctor import run_doctor
        from ..ops.retention import human_bytes, parse_size, plan_prune, prune as run_prune

        policy = app.config().retention
        max_bytes = None
        if max_size is not None:
            try:
                max_bytes = parse_size(max_size)
            except ValueError as exc:
                raise UserError(str(exc)) from exc
        if older_than is None and max_bytes is None:
            if not policy.enabled:
                raise UserError("give --older-than DAYS and/or --max-size SIZE (or set `retention:` in the lcm: config)")
            older_than = policy.max_age_days or None
            max_bytes = int(policy.max_store_mb * (1 << 20)) or None
            if keep_summaries is None:
                keep_summaries = policy.keep_summaries
        store = app.open_store()
        plan = plan_prune(store, older_than_days=older_than, max_bytes=max_bytes, keep_summaries=bool(keep_summaries))
        if as_json and (dry_run or not plan.lineages):
            click.echo(json.dumps({"dry_run": dry_run, "plan": plan.as_dict()}, indent=2))
            return
        if not as_json:
            click.echo(render_plan(plan))
        if dry_run or not plan.lineages:
            return
        if not yes and not click.confirm("Remove this for good?"):
            raise UserError("nothing pruned")
        rep = run_prune(store, plan, trigger="cli")
        if as_json:
            click.echo(json.dumps(rep.as_dict(), indent=2))
        else:
            click.echo(f"pruned {rep.sessions} sessions, {rep.messages:,} messages, {rep.summaries:,} summaries in "
                       f"{rep.transactions} transactions (longest {rep.longest_tx_ms:.0f} ms); store "
                       f"{human_bytes(plan.used_bytes)} → {human_bytes(rep.used_after)} in use, "
                       f"{human_bytes(plan.file_bytes)} → {human_bytes(rep.file_after)} on disk"
                       + (f"; left alone (active again): {', '.join(rep.skipped)}" if rep.skipped else ""))
            if rep.file_after >= plan.file_bytes and store.kind == "sqlite" and store.space()["free_bytes"]:
                click.echo("the file keeps its size (made without incremental auto-vacuum): `lcm vacuum` gives the "
                           "space back")
        doc = run_doctor(store, fanin=app.config().condense_fanin)
        if not doc.ok:
            raise UserError("the store is not healthy after pruning:\n" + doc.render_text())

    @click.command()
    @click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
    @pass_app
    def vacuum(app: Any, yes: bool) -> None:
        """Rewrite an SQLite store to give its free space back, and turn on incremental
        auto-vacuum so later prunes shrink it in place. Holds the store's write lock while it
        runs (stop Hermes first for a large store)."""
        from ..ops.retention import human_bytes

        store = app.open_store()
        if store.kind != "sqlite":
            raise UserError("the store is PostgreSQL: run `VACUUM (ANALYZE)` (or VACUUM FULL / pg_repack) on the "
                            "server instead")
        before = store.space()
        if not yes and not click.confirm(f"Rewrite {store.location} ({human_bytes(before['file_bytes'])}, "
                                         f"{human_bytes(before['free_bytes'])} free inside)? Writers wait meanwhile"):
            raise UserError("nothing done")
        store.vacuum()
        after = store.space()
        click.echo(f"vacuumed {store.location}: {human_bytes(before['file_bytes'])} → "
                   f"{human_bytes(after['file_bytes'])} (incremental auto-vacuum: {after['auto_vacuum']})")

    group.add_command(prune)
    group.add_command(vacuum)
