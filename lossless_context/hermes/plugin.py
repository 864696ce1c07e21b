"""The Hermes adapter: `register(ctx)` for the plugin loaders and the `/lcm` slash command.

Named by the pip entry point `hermes_agent.plugins: lcm = lossless_context.hermes.plugin`
and imported by the directory plugin's `__init__.py`. Importing it has no side effects.
"""

from __future__ import annotations

import json
import logging
import shlex
import threading
import time
from typing import Any, Callable

log = logging.getLogger("lossless_context")

COMMAND_HELP = "status | context | doctor | grep <query> | describe <id> | expand <id> | cli"
# /lcm runs on the host's own thread (the REPL's): it answers within about a second, or says
# the store is busy, rather than wait behind a pass or on a store that does not answer.
ANSWER_SECONDS = 1.0  # a store call (or the session lock) waited on longer than this: "busy"
SYNC_LOCK_WAIT = 0.5  # storing the host's latest turns first waits this long behind a pass


def register(ctx: Any) -> None:
    """Register a **new** engine (one per call) and, where supported, the /lcm command."""
    from ..engine import LCMEngine

    engine = LCMEngine()
    ctx.register_context_engine(engine)
    _install_pricer()
    reg_cmd = getattr(ctx, "register_command", None)
    if callable(reg_cmd):
        try:
            reg_cmd("lcm", make_command_handler(engine), description="Lossless context: status, doctor, search",
                    args_hint=COMMAND_HELP)
        except TypeError:
            reg_cmd("lcm", make_command_handler(engine))
        except Exception as exc:  # an older loader must never stop the engine from loading
            log.debug("lcm: register_command failed: %s", exc)


def make_command_handler(engine: Any) -> Callable[[str], str]:
    def handler(raw_args: str = "") -> str:
        try:
            # The host deep-copies the registered engine per agent and drives only the copies:
            # act on the copy the user's agent drives (the live session), never a review fork.
            live = engine.live_engine() if hasattr(engine, "live_engine") else engine
            return _answer(live, raw_args or "")
        except Exception as exc:
            return f"lcm: {type(exc).__name__}: {exc}"

    return handler


def _answer(live: Any, raw_args: str) -> str:
    """Run the command on a thread of its own and wait while it makes progress: when one of
    its store calls has waited over ANSWER_SECONDS (a frozen server, a lock held by another
    process), answer that the store is busy instead. The command then ends by itself within
    its store calls' bounds; its answer is dropped."""
    box: dict[str, str] = {}

    def work() -> None:
        note = ""
        if hasattr(live, "sync_from_host"):
            try:  # below the threshold the host never handed over its latest turns
                live.sync_from_host(lock_wait=SYNC_LOCK_WAIT)
            except Exception as exc:
                if type(exc).__name__ == "SessionBusy":
                    note = "\n(a compaction pass is running: the latest turns are stored when it ends)"
                log.debug("lcm: reading the host's session before /lcm failed: %s", exc)
        try:
            box["out"] = run_command(live, raw_args) + note
        except Exception as exc:
            box["out"] = f"lcm: {type(exc).__name__}: {exc}"

    worker = threading.Thread(target=work, name="lcm-command", daemon=True)
    began = time.monotonic()
    worker.start()
    while True:
        worker.join(0.05)
        if not worker.is_alive():
            return box.get("out", "lcm: the command ended without an answer")
        waited = _store_wait(live, worker.ident)
        if time.monotonic() - began >= ANSWER_SECONDS and waited >= ANSWER_SECONDS:
            return _busy_answer(live, waited)


def _store_wait(engine: Any, thread_id: int | None) -> float:
    fn = getattr(engine, "store_busy_for", None)
    try:
        return float(fn(thread_id)) if callable(fn) else 0.0
    except Exception:
        return 0.0


def _busy_answer(engine: Any, waited: float) -> str:
    try:
        where = engine.store.location
    except Exception:
        where = "?"
    bound = getattr(getattr(engine, "config", None), "store_timeout", None)
    limit = f" (every store call gives up after {bound:g} s; the store then counts as down)" if bound else ""
    return (f"LCM engine — the store at {where} is busy: a store call has waited {waited:.1f} s for an answer"
            f"{limit}. The session goes on; /lcm status again in a moment.")


def run_command(engine: Any, raw_args: str) -> str:
    try:
        parts = shlex.split(raw_args)
    except ValueError:
        parts = raw_args.split()
    sub = parts[0].lower() if parts else "status"
    rest = raw_args.strip()[len(parts[0]):].strip() if parts else ""
    if sub == "status":
        st = engine.get_status()
        depth = st.get("lcm_summaries_by_depth") or {}
        nodes = ", ".join(f"d{d}: {n}" for d, n in sorted(depth.items())) or "none"
        if st.get("lcm_store_error"):
            return (f"LCM engine — {st['lcm_store_error']}\n"
                    f"session {st.get('lcm_session_id') or '-'}: the context is kept within the window by dropping "
                    f"the oldest turns (the host's own history keeps them); nothing new is stored until the store "
                    f"is back\n" + _config_lines(st) + _host_lock_lines())
        return (
            f"LCM engine — store {st.get('lcm_store')} ({st.get('lcm_backend')})\n"
            f"session {st.get('lcm_session_id') or '-'}; messages stored {st.get('lcm_messages', 0)}; "
            f"summary nodes {nodes}\n"
            f"compactions {st.get('lcm_compactions', 0)} (this process), {st.get('lcm_store_compactions', 0)} (store); "
            f"summary levels in the context {st.get('compression_count', 0)}; "
            f"summariser calls {st.get('lcm_summarizer_calls', 0)} ({st.get('lcm_background_calls', 0)} in the "
            f"background), failures {st.get('lcm_summarizer_failures', 0)}\n"
            f"context {st.get('last_prompt_tokens', 0)}/{st.get('context_length', 0)} tokens, "
            f"threshold {st.get('threshold_tokens', 0)}{_ratio_note(st)}\n"
            + cost_lines(st)
        ) + _status_extra(st) + _lifecycle_lines(engine) + ("\n" + _config_lines(st) if st.get("lcm_config_warnings")
                                                          else "")
    if sub == "context":
        from ..pipeline.context_view import render_context

        return render_context(engine)
    if sub == "doctor":
        from ..ops.doctor import run_doctor

        report = run_doctor(engine.store, repair=False, retention=engine.config.retention)
        return report.render_text() + _host_lock_lines()
    if sub == "cli":
        return cli_hint()
    if sub in ("grep", "search"):
        if not rest:
            return "usage: /lcm grep <query>"
        data = json.loads(engine.handle_tool_call("lcm_grep", {"query": rest, "limit": 8}))
        return format_grep(data)
    if sub in ("describe", "expand"):
        if not rest:
            return f"usage: /lcm {sub} <id>"
        data = json.loads(engine.handle_tool_call(f"lcm_{sub}", {"id": rest.split()[0]}))
        return json.dumps(data, ensure_ascii=False, indent=2)[:8000]
    return f"usage: /lcm {COMMAND_HELP}"


def cli_hint() -> str:
    """How to run the `lcm` command line against this Hermes: the installed `lcm` script next to
    the host's Python (pip route), else the package this plugin runs from, with the host's Python
    (`hermes plugins install` copies no script anywhere)."""
    import shlex
    import sys
    from pathlib import Path

    import lossless_context

    python = Path(sys.executable)
    script = python.parent / "lcm"
    if script.is_file() and _installed_distribution():
        return (f"The lcm command line of this Hermes is {script}\n"
                f"  e.g. {shlex.quote(str(script))} status   (or put {python.parent} on PATH)")
    root = Path(lossless_context.__file__).resolve().parent.parent
    command = f"PYTHONPATH={shlex.quote(str(root))} {shlex.quote(str(python))} -m lossless_context.cli"
    return ("The lcm command line runs from this plugin's folder with the host's Python:\n"
            f"  alias lcm={shlex.quote(command)}\n"
            "then e.g. `lcm status`, `lcm grep WORD`, `lcm doctor` (add the alias to your shell's rc file).\n"
            f"To install it as a command instead: {shlex.quote(str(python))} -m pip install {shlex.quote(str(root))}")


def _installed_distribution() -> bool:
    from importlib import metadata

    try:
        metadata.distribution("lossless-context")
    except metadata.PackageNotFoundError:
        return False
    return True


def _ratio_note(st: dict[str, Any]) -> str:
    r = st.get("lcm_provider_ratio") or 1.0
    return (f"; the provider counts {r:.2f} tokens per token of LCM's estimate (passes plan in its units)"
            if r > 1.0 else "")


def cost_lines(st: dict[str, Any]) -> str:
    """The summariser spend lines of a status (get_status() keys lcm_cost_*)."""
    from ..summarizers.costs import describe

    return (f"summariser spend: last pass {describe(st.get('lcm_cost_last_pass'))}; "
            f"this session {describe(st.get('lcm_cost_session'))}; "
            f"tier-0 stub-only passes {st.get('lcm_tier0_passes', 0)}")


def _install_pricer() -> None:
    """Prices from Hermes' own pricing metadata (agent/usage_pricing.py), when it has them.
    No endpoint is asked: only the host's built-in price tables are used."""
    from ..summarizers.costs import set_pricer
    from ..hostapi import usage_pricer

    price = usage_pricer()
    if price is not None:
        set_pricer(price)


def _status_extra(st: dict[str, Any]) -> str:
    """The last pass's result, and which engine the host loads for `lcm` when another claims it."""
    out = ""
    p = st.get("lcm_last_pass")
    if isinstance(p, dict):
        out += (f"\nlast pass: {p.get('tokens_before')} → {p.get('tokens_after')} tokens, "
                f"{p.get('calls')} summariser calls, {p.get('seconds')} s ({p.get('outcome')})")
    try:
        from ..config import hermes_home
        from .nameclash import resolve

        lines = resolve(hermes_home()).lines()
    except Exception:
        lines = []
    return out + "".join("\n" + line for line in lines) + _host_lock_lines()


def _host_lock_lines() -> str:
    """A stale compression lock in the host's own database (hostlock.py), with what to do."""
    try:
        from ..config import hermes_home
        from .hostlock import stale_lock_lines

        return "".join(f"\nwarning: {line}" for line in stale_lock_lines(hermes_home()))
    except Exception:
        return ""


def _lifecycle_lines(engine: Any) -> str:
    """The store's size, growth, oldest session, retention and encryption (lifecycle_info.py)."""
    from ..ops.lifecycle_info import render_facts, store_facts

    try:
        return "".join("\n" + line for line in render_facts(store_facts(engine.store, engine.config.retention)))
    except Exception as exc:  # a status line, not a reason to fail /lcm status
        return f"\nstore lifecycle: not measured ({type(exc).__name__}: {exc})"


def _config_lines(st: dict[str, Any]) -> str:
    return "\n".join(f"config: {w}" for w in st.get("lcm_config_warnings") or [])


def format_grep(data: dict[str, Any]) -> str:
    if "error" in data:
        return f"lcm grep: {data['error']}"
    lines = []
    for g in data.get("groups", []):
        lines.append(f"[{g.get('summary_id') or 'active context'}]")
        for h in g.get("hits", []):
            lines.append(f"  {h['id']:>8} {h.get('role') or '':9} {h.get('time') or '':25} {h.get('snippet', '')}")
    return "\n".join(lines) if lines else "no matches"
