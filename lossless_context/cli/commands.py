"""The `lcm` command line: demo, install, status, sessions, the agent tools for humans,
the HTML view, export/import, Hermes backfill, doctor and backup.

Only this module knows about click and rich; the engine never imports it. Every failure ends with one line `lcm: <reason>` on stderr and a non-zero exit code,
never a traceback (set LCM_DEBUG=1 to see one for internal errors).
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import sys
from pathlib import Path
from typing import Any

import click

from .. import __version__
from ..files import atomic_text
from .render import describe_text, expand_text, grep_text, sessions_table, status_table


class UserError(Exception):
    """A problem the user can fix: reported as one line, exit code 1."""


def _is_dsn(loc: str) -> bool:
    return loc.startswith(("postgresql://", "postgres://"))


# --------------------------------------------------------------------------- app state


class App:
    def __init__(self, store: str | None, verbose: bool) -> None:
        self.store_opt = store
        self.verbose = verbose
        self._config = None

    def config(self, **over: Any):
        from ..config import LCMConfig

        base = {"summarizer": "extractive"}
        if self.store_opt:
            base["store"] = self.store_opt
        base.update(over)
        return LCMConfig.load(base)

    def location(self) -> str:
        if self.store_opt:
            return self.store_opt if _is_dsn(self.store_opt) else str(Path(self.store_opt).expanduser())
        return self.config().store_location()

    def check_location(self, loc: str, must_exist: bool = True) -> None:
        if _is_dsn(loc):
            return
        self.config()  # (its encryption_key_file opens an encrypted store: store/sqlite/cipher.py)
        from ..store.sqlite.file import StoreFileError, check_store_file

        p = Path(loc)
        try:
            exists = check_store_file(p)
        except StoreFileError as exc:
            raise UserError(str(exc)) from exc
        if not exists and must_exist:
            raise UserError(f"no store at {p} yet: it is created when Hermes first runs with the lcm engine "
                            f"(`lcm demo` shows the engine at work in a store of its own)")

    def open_store(self, must_exist: bool = True):
        from ..store import open_store

        loc = self.location()
        self.check_location(loc, must_exist)
        return open_store(loc)

    def engine(self, session: str | None = None, all_sessions: bool = False):
        from ..engine import LCMEngine

        loc = self.location()
        self.check_location(loc, True)
        over: dict[str, Any] = {"store": loc}
        if all_sessions:
            over["cross_session_search"] = True
        engine = LCMEngine(config=self.config(**over))
        sid = self.resolve_session(engine.store, session)
        engine.bind_session_state(None, sid)
        return engine, sid

    @staticmethod
    def resolve_session(store: Any, session: str | None) -> str:
        from ..ops.viewer import latest_session  # (the user's latest real session: forks.py)

        if session:
            if store.get_session(session) is None:
                raise UserError(f"unknown session {session!r} (see `lcm sessions`)")
            return session
        sid = latest_session(store)
        if sid is None:
            raise UserError("the store has no sessions yet")
        return sid


def _console(stderr: bool = False):
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    return Console(file=stream, width=None if stream.isatty() else 120, highlight=False)


def _progress(console: Any):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console, transient=True, disable=not console.is_terminal)


def _tool(engine: Any, name: str, args: dict[str, Any]) -> dict[str, Any]:
    data = json.loads(engine.handle_tool_call(name, args))
    if isinstance(data, dict) and "error" in data:
        raise UserError(str(data["error"]))
    return data


pass_app = click.make_pass_decorator(App)


# --------------------------------------------------------------------------- the group


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--store", metavar="PATH|DSN", default=None,
              help="Store: an SQLite file or a postgresql:// DSN (default: lcm.store of config.yaml, "
                   "$LCM_STORE, or $HERMES_HOME/lcm/lcm.db).")
@click.option("-v", "--verbose", is_flag=True, help="Show the engine's log messages.")
@click.version_option(__version__, prog_name="lcm")
@click.pass_context
def lcm(ctx: click.Context, store: str | None, verbose: bool) -> None:
    """Lossless Context Management for Hermes Agent: every message kept verbatim, old context
    replaced by a searchable DAG of summaries."""
    _setup_logging(verbose)
    ctx.obj = App(store, verbose)


class _OneLine(logging.Formatter):
    def __init__(self, verbose: bool) -> None:
        super().__init__("lcm: %(levelname)s: %(message)s")
        self.verbose = verbose

    def format(self, record: logging.LogRecord) -> str:
        if not self.verbose:
            record.exc_info, record.exc_text, record.stack_info = None, None, None
            return super().format(record).splitlines()[0]
        return super().format(record)


def _setup_logging(verbose: bool) -> None:
    log = logging.getLogger("lossless_context")
    for h in list(log.handlers):
        if getattr(h, "_lcm_cli", False):
            log.removeHandler(h)
    h = logging.StreamHandler(sys.stderr)
    h._lcm_cli = True  # type: ignore[attr-defined]  # marks our own handler, to replace it on a later call
    h.setFormatter(_OneLine(verbose))
    log.addHandler(h)
    log.setLevel(logging.INFO if verbose else logging.ERROR)
    log.propagate = False


# --------------------------------------------------------------------------- demo


@lcm.command()
@click.option("--messages", "n_messages", type=click.IntRange(20, 2_000_000), default=3000, show_default=True,
              help="Messages in the generated coding session.")
@click.option("--store", "demo_store", metavar="PATH", default=None,
              help="Store file for the demo (default: a new temporary directory).")
@click.option("--summarizer", type=click.Choice(["extractive", "openai"]), default="extractive", show_default=True,
              help="extractive: built-in, no network; openai: an OpenAI-compatible endpoint (--base-url).")
@click.option("--base-url", default="", help="OpenAI-compatible base URL (with --summarizer openai).")
@click.option("--model", default="", help="Model name for --summarizer openai.")
@click.option("--api-key-env", default="", metavar="VAR", help="Environment variable holding the API key.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the generated session.")
@click.option("--context-length", type=click.IntRange(16_000, 10_000_000), default=64_000, show_default=True,
              help="The simulated model's context window.")
@click.option("--rotate", is_flag=True, help="Give each compaction a new session id with a parent link "
              "(the host's rotation mode) instead of compacting in place.")
@click.option("--html", "html_path", metavar="FILE", default=None,
              help="Where to write the HTML DAG view (default: lcm-demo.html next to the store).")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@pass_app
def demo(app: App, n_messages: int, demo_store: str | None, summarizer: str, base_url: str, model: str,
         api_key_env: str, seed: int, context_length: int, rotate: bool, html_path: str | None,
         as_json: bool) -> None:
    """Replay a long deterministic coding session through a real engine and show what LCM kept."""
    from ..demo import run_demo

    if summarizer == "openai":
        if not base_url.startswith(("http://", "https://")):
            raise UserError("--summarizer openai needs --base-url http(s)://…/v1")
    store = demo_store or app.store_opt
    if store and _is_dsn(store):
        raise UserError("lcm demo writes an SQLite store; give --store PATH")
    if store:
        app.check_location(str(Path(store).expanduser()), must_exist=False)
    err = _console(stderr=True)
    with _progress(err) as prog:
        tasks: dict[str, Any] = {}

        def progress(stage: str, done: int, total: int) -> None:
            label = {"replay": "replaying turns", "canaries": "checking canaries", "html": "writing view"}[stage]
            if stage not in tasks:
                tasks[stage] = prog.add_task(label, total=total)
            prog.update(tasks[stage], completed=done)

        res = run_demo(n_messages, store, seed=seed, summarizer=summarizer, base_url=base_url, model=model,
                       api_key_env=api_key_env, context_length=context_length, rotate=rotate,
                       html=html_path, progress=progress)
    if as_json:
        click.echo(json.dumps(res.as_dict(), indent=2))
    else:

        from ..demo import print_tables

        print_tables(_console(), res)
    if res.canaries_recovered != len(res.canaries):
        click.echo(f"lcm: only {res.canaries_recovered} of {len(res.canaries)} canaries were recovered", err=True)
        raise click.exceptions.Exit(1)


# --------------------------------------------------------------------------- install


@lcm.command()
@click.option("--hermes-home", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Hermes home (default: $HERMES_HOME or ~/.hermes).")
@click.option("--mode", type=click.Choice(["entrypoint", "directory", "bundled"]), default="entrypoint", show_default=True,
              help="entrypoint: Hermes loads the installed package; directory: also copy the plugin folder "
                   "to $HERMES_HOME/plugins/lcm/; bundled: copy it into the installed host's "
                   "plugins/context_engine/lcm/.")
def install(hermes_home: Path | None, mode: str) -> None:
    """Enable the lcm engine in Hermes' config.yaml (comments and other settings are kept)."""
    from ..config import hermes_home as default_home
    from ..hermes.install import install as do_install

    home = hermes_home or default_home()
    res = do_install(home, mode)
    for c in res.changes:
        click.echo(f"  {c}")
    click.echo(f"lcm {'installed' if res.changed else 'already installed'} in {home} ({mode} mode)"
               + ("" if res.changed else ": nothing to do"))
    _echo_name_clash(home)


def _echo_name_clash(home: Path) -> None:
    """Another plugin answering to `lcm` decides which engine the host loads: say so."""
    from ..hermes.nameclash import resolve

    try:
        lines = resolve(home).lines()
    except Exception as exc:  # reporting must never break install or doctor
        lines = [f"engine 'lcm': cannot tell which plugin the host will load ({exc})"]
    for line in lines:
        click.echo(line, err=True)


@lcm.command()
@click.option("--hermes-home", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Hermes home (default: $HERMES_HOME or ~/.hermes).")
def uninstall(hermes_home: Path | None) -> None:
    """Switch Hermes back to the built-in compressor and remove the plugin folder (the store is kept)."""
    from ..config import hermes_home as default_home
    from ..hermes.install import uninstall as do_uninstall

    home = hermes_home or default_home()
    res = do_uninstall(home)
    for c in res.changes:
        click.echo(f"  {c}")
    click.echo(f"lcm {'uninstalled from' if res.changed else 'is not installed in'} {home}"
               + ("" if res.changed else ": nothing to do"))


# --------------------------------------------------------------------------- status / sessions


@lcm.command()
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@pass_app
def status(app: App, as_json: bool) -> None:
    """Store location, size, sessions, messages, summary nodes by depth, last compaction."""

    store = app.open_store()
    st = store.stats()
    sessions = store.list_sessions()
    last = max((s for s in sessions if s.get("last_compaction_at")), key=lambda s: s["last_compaction_at"],
               default=None)
    st["last_compaction_session"] = last["id"] if last else None
    st["summaries_by_depth"] = {str(k): v for k, v in sorted(st["summaries_by_depth"].items())}
    st["summariser_spend"] = store.summary_cost_totals()
    st["semantic"] = {"enabled": app.config().semantic, "model": app.config().semantic_model,
                      "vectors": store.vector_counts()}
    st["config_warnings"] = list(app.config().warnings)
    from ..ops.lifecycle_info import render_facts, store_facts

    st["lifecycle"] = store_facts(store, app.config().retention)
    if as_json:
        click.echo(json.dumps(st, indent=2, default=str))
    else:
        status_table(_console(), st)
        for line in render_facts(st["lifecycle"]):
            click.echo(line)
        for w in st["config_warnings"]:
            click.echo(f"config: {w}")


@lcm.command()
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@pass_app
def sessions(app: App, as_json: bool) -> None:
    """Sessions with their lineage (parent), conversation id, messages and summary nodes."""

    store = app.open_store()
    rows = store.list_sessions()
    if as_json:
        click.echo(json.dumps(rows, indent=2, default=str))
    else:
        sessions_table(_console(), rows)


# --------------------------------------------------------------------------- the agent tools


@lcm.command()
@click.argument("query")
@click.option("--session", default=None, help="Session whose lineage is searched (default: the latest).")
@click.option("--all-sessions", is_flag=True, help="Search every session in the store.")
@click.option("--mode", type=click.Choice(["text", "regex"]), default="text", show_default=True)
@click.option("--scope", type=click.Choice(["both", "messages", "summaries"]), default="both", show_default=True)
@click.option("--role", default=None, help="Only messages with this role.")
@click.option("--since", default=None, metavar="ISO", help="Only from this time on (e.g. 2026-01-05T09:00Z).")
@click.option("--until", default=None, metavar="ISO", help="Only up to this time.")
@click.option("--limit", type=click.IntRange(1, 100), default=10, show_default=True)
@click.option("--cursor", default=None, help="next_cursor of a previous page.")
@click.option("--json", "as_json", is_flag=True, help="Print the tool's raw JSON.")
@pass_app
def grep(app: App, query: str, session: str | None, all_sessions: bool, mode: str, scope: str, role: str | None,
         since: str | None, until: str | None, limit: int, cursor: str | None, as_json: bool) -> None:
    """Search the whole history (originals and summaries), like the agent's lcm_grep."""

    engine, _sid = app.engine(session, all_sessions)
    args: dict[str, Any] = {"query": query, "mode": mode, "scope": scope, "limit": limit}
    for k, v in (("role", role), ("since", since), ("until", until)):
        if v:
            args[k] = v
    if cursor:
        args["cursor"] = cursor
    if all_sessions:
        args["session_scope"] = "all"
    data = _tool(engine, "lcm_grep", args)
    click.echo(json.dumps(data, indent=2, ensure_ascii=False) if as_json else grep_text(data))


@lcm.command()
@click.argument("node_id", metavar="ID")
@click.option("--session", default=None, help="Session whose lineage the id belongs to (default: the latest).")
@click.option("--json", "as_json", is_flag=True, help="Print the tool's raw JSON.")
@pass_app
def describe(app: App, node_id: str, session: str | None, as_json: bool) -> None:
    """Metadata of a summary (s12) or message (m345): span, depth, parents, children, text."""

    engine, _ = app.engine(session)
    data = _tool(engine, "lcm_describe", {"id": node_id})
    click.echo(json.dumps(data, indent=2, ensure_ascii=False) if as_json else describe_text(data))


@lcm.command()
@click.argument("node_id", metavar="ID")
@click.option("--session", default=None, help="Session whose lineage the id belongs to (default: the latest).")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@pass_app
def resummarize(app: App, node_id: str, session: str | None, as_json: bool) -> None:
    """Re-summarise one summary node (s12) with the current summariser; the id stays valid
    and the previous text is kept in the node's history."""
    from ..edits.resummarize import resummarize as run

    engine, _ = app.engine(session)
    ref = node_id.strip().lower().lstrip("s")
    if not ref.isdigit():
        raise UserError(f"{node_id!r} is not a summary id (like s12)")
    out = run(engine.store, engine.summary_escalator(),
              int(ref), engine.config.leaf_summary_tokens)
    click.echo(json.dumps(out, indent=2) if as_json else
               f"{out['id']}: {out['previous_level']} ({out['previous_tokens']} tokens) → {out['level']} "
               f"({out['tokens']} tokens) by {out['summarizer']}; {out['history']} earlier text(s) kept")


@lcm.command()
@click.argument("node_id", metavar="ID")
@click.option("--session", default=None, help="Session whose lineage the id belongs to (default: the latest).")
@click.option("--max-tokens", type=click.IntRange(200, 12000), default=4000, show_default=True,
              help="Page budget.")
@click.option("--cursor", default=None, help="next_cursor of a previous page.")
@click.option("--json", "as_json", is_flag=True, help="Print the tool's raw JSON.")
@click.option("--raw", is_flag=True, help="Inline images and files as stored (base64), not as a label.")
@pass_app
def expand(app: App, node_id: str, session: str | None, max_tokens: int, cursor: str | None,
           as_json: bool, raw: bool) -> None:
    """Open a summary into its children, or a message into its verbatim original."""

    engine, _ = app.engine(session)
    args: dict[str, Any] = {"id": node_id, "max_tokens": max_tokens, "raw": raw}
    if cursor:
        args["cursor"] = cursor
    data = _tool(engine, "lcm_expand", args)
    click.echo(json.dumps(data, indent=2, ensure_ascii=False) if as_json else expand_text(data))


# --------------------------------------------------------------------------- view / export / import


@lcm.command()
@click.argument("session", required=False)
@click.option("-o", "--output", metavar="FILE.html", default="lcm-view.html", show_default=True)
@pass_app
def view(app: App, session: str | None, output: str) -> None:
    """Write a self-contained HTML page of a session's summary DAG (no network needed to open it)."""
    from ..ops.viewer import write_view

    store = app.open_store()
    sid = app.resolve_session(store, session)
    path = write_view(store, sid, output)
    click.echo(f"wrote {path} (session {sid})")


@lcm.command()
@click.argument("session", required=False)
@click.option("-o", "--output", metavar="FILE.jsonl", default="-", show_default=True, help="'-' for stdout.")
@pass_app
def export(app: App, session: str | None, output: str) -> None:
    """Export the whole store, or one session's lineage, as versioned JSONL (messages and DAG)."""
    from ..ops.export import export_jsonl

    store = app.open_store()
    if session:
        app.resolve_session(store, session)
    if getattr(store, "encrypted", False):
        click.echo("lcm: warning: the store is encrypted, this export is not (plaintext JSONL): keep it private"
                   + ("" if output == "-" else " (the file is made 0600)"), err=True)
    if output == "-":
        n = export_jsonl(store, sys.stdout, session)
        return
    dest = Path(output).expanduser()
    with atomic_text(dest, prefix=".lcm-export.", newline="\n") as fh:  # (0600: the conversation)
        n = export_jsonl(store, fh, session)
    click.echo(f"exported {n} records to {dest}" + (f" (lineage of {session})" if session else ""), err=True)


@lcm.group(name="import")
def import_() -> None:
    """Import history: an lcm JSONL export, or sessions from Hermes' own database."""


@import_.command(name="jsonl")
@click.argument("file", metavar="FILE")
@pass_app
def import_jsonl_cmd(app: App, file: str) -> None:
    """Import an `lcm export` file (idempotent: importing twice adds nothing)."""
    from ..ops.export import import_jsonl

    try:
        fh = sys.stdin if file == "-" else open(Path(file).expanduser(), encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot read {file}: {exc.strerror or exc}") from exc
    with fh:
        try:
            lines = list(fh)
        except UnicodeDecodeError as exc:
            raise UserError(f"cannot read {file}: not UTF-8 text") from exc
    store = app.open_store(must_exist=False)
    rep = import_jsonl(store, lines)
    for w in rep.warnings[:20]:
        click.echo(f"lcm: warning: {w}", err=True)
    click.echo(f"imported {rep.sessions_added} sessions, {rep.messages_added} messages, "
               f"{rep.summaries_added} summaries, {rep.contexts_set} contexts"
               + (" (nothing new)" if not rep.added else "")
               + (f"; {rep.ids_remapped} ids remapped" if rep.ids_remapped else ""))


@import_.command(name="hermes")
@click.option("--session", "session_ids", multiple=True, metavar="ID",
              help="A Hermes session to import (with its ancestors); repeatable.")
@click.option("--all", "all_", is_flag=True, help="Import every session.")
@click.option("--hermes-home", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Hermes home holding state.db (default: $HERMES_HOME or ~/.hermes).")
@pass_app
def import_hermes_cmd(app: App, session_ids: tuple[str, ...], all_: bool, hermes_home: Path | None) -> None:
    """Backfill sessions from Hermes' session database (read-only; idempotent)."""
    from ..config import hermes_home as default_home
    from ..engine import LCMEngine
    from ..hermes.importer import import_hermes

    if bool(session_ids) == bool(all_):
        raise UserError("give --session ID (repeatable) or --all")
    home = hermes_home or default_home()
    loc = app.location()
    app.check_location(loc, must_exist=False)
    engine = LCMEngine(config=app.config(store=loc))
    err = _console(stderr=True)
    with _progress(err) as prog:
        task = prog.add_task("importing sessions", total=None)

        def progress(sid: str, done: int, total: int) -> None:
            prog.update(task, completed=done, total=total)

        rep = import_hermes(engine, home, list(session_ids) if session_ids else None, progress=progress)

    from ..hermes.importer import print_report

    print_report(_console(), rep)


# --------------------------------------------------------------------------- doctor / backup


@lcm.command()
@click.option("--repair", is_flag=True, help="Apply the safe repairs (never deletes user data).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@pass_app
def doctor(app: App, repair: bool, as_json: bool) -> None:
    """Check the store's integrity; exits non-zero when it is unhealthy."""
    from ..ops.doctor import run_doctor

    store = app.open_store()
    rep = run_doctor(store, repair=repair, fanin=app.config().condense_fanin, retention=app.config().retention)
    click.echo(json.dumps(rep.as_dict(), indent=2) if as_json else rep.render_text())
    for w in app.config().warnings:  # (shown, not failed: the engine runs on the default)
        click.echo(f"config: {w}", err=as_json)
    from ..config import hermes_home as default_home

    _echo_name_clash(default_home())
    from ..hermes.hostlock import stale_lock_lines

    for line in stale_lock_lines(default_home()):  # (the host's state, not the store's: shown, not failed)
        click.echo(f"warning: {line}", err=as_json)
    if not rep.ok:
        failed = [c.name for c in rep.checks if not (c.ok or c.repaired)]
        click.echo(f"lcm: the store is unhealthy ({'; '.join(failed)})", err=True)
        raise click.exceptions.Exit(1)


@lcm.command()
@click.option("-o", "--output", metavar="FILE", required=True, help="Backup file to write.")
@click.option("--force", is_flag=True, help="Overwrite FILE if it exists.")
@pass_app
def backup(app: App, output: str, force: bool) -> None:
    """Copy the SQLite store with SQLite's online backup API (safe while Hermes runs)."""
    loc = app.location()
    if _is_dsn(loc):
        raise UserError("the store is PostgreSQL: back it up with pg_dump (e.g. `pg_dump -Fc DBNAME > lcm.dump`)")
    app.check_location(loc, must_exist=True)
    dest = Path(output).expanduser()
    if dest.exists() and not force:
        raise UserError(f"{dest} exists (use --force to overwrite)")
    if dest.resolve() == Path(loc).resolve():
        raise UserError("the backup file must differ from the store")
    from ..store.sqlite.file import StoreFileError, backup_store_file

    err = _console(stderr=True)
    try:
        with _progress(err) as prog:
            task = prog.add_task("backing up", total=None)
            encrypted = backup_store_file(Path(loc), dest,
                                          lambda done, total: prog.update(task, completed=done, total=total))
    except StoreFileError as exc:
        raise UserError(str(exc)) from exc
    click.echo(f"backed up {loc} → {dest} ({dest.stat().st_size:,} bytes, "
               + ("encrypted with the store's key)" if encrypted else "not encrypted: the store is plaintext)"))


def _user_error_types() -> tuple[type[BaseException], ...]:
    from ..ops.export import ExportError
    from ..hermes.importer import HermesImportError
    from ..hermes.install import InstallError
    from ..store.base import StoreError

    return (UserError, StoreError, InstallError, ExportError, HermesImportError, LookupError, OSError,
            sqlite3.Error, UnicodeError)


def _fail(msg: str, code: int) -> None:
    line = " ".join(str(msg).split()) or "failed"
    click.echo(f"lcm: {line}", err=True)
    sys.exit(code)


def main(argv: list[str] | None = None) -> None:
    try:
        rv = lcm.main(args=argv, prog_name="lcm", standalone_mode=False)
    except click.exceptions.Exit as e:  # pragma: no cover - click returns it in non-standalone mode
        sys.exit(e.exit_code)
    except click.UsageError as e:
        where = f" (see `{e.ctx.command_path} --help`)" if e.ctx is not None else ""
        _fail(e.format_message() + where, e.exit_code)
    except click.ClickException as e:
        _fail(e.format_message(), e.exit_code)
    except (click.Abort, KeyboardInterrupt):
        _fail("interrupted", 130)
    except BrokenPipeError:
        sys.exit(0)
    except Exception as e:
        if os.environ.get("LCM_DEBUG"):
            raise
        if isinstance(e, _user_error_types()):
            if isinstance(e, OSError) and e.strerror:
                _fail(f"{e.strerror}: {e.filename}" if e.filename else e.strerror, 1)
            _fail(str(e) or type(e).__name__, 1)
        _fail(f"internal error: {type(e).__name__}: {e} (set LCM_DEBUG=1 for a traceback)", 2)
    sys.exit(rv if isinstance(rv, int) else 0)


# `lcm context` and `lcm forget` live in session_cmds.py, `lcm mcp` in mcp_cmd.py (kept apart for size).
from .mcp_cmd import add_commands as add_mcp_command  # noqa: E402
from .session_cmds import add_commands  # noqa: E402

add_commands(lcm, pass_app, UserError)
add_mcp_command(lcm, pass_app, UserError)
# `lcm prune` and `lcm vacuum` live in lifecycle_cmds.py.
from .lifecycle_cmds import add_commands as add_lifecycle_commands  # noqa: E402

add_lifecycle_commands(lcm, pass_app, UserError)
# `lcm encrypt`, `lcm rekey` and `lcm decrypt` live in cipher_cmds.py.
from .cipher_cmds import add_commands as add_cipher_commands  # noqa: E402

add_cipher_commands(lcm, pass_app, UserError)


if __name__ == "__main__":
    main()
