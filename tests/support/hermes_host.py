"""Drive the REAL Hermes Agent loop offline, against a fake provider.

The host is whichever Python runs the driver: by default the host of the running ``hermes_host``
test (0.19.0, 0.20.0 or 0.22.2: tests/support/hosts.py), else this interpreter. Line numbers
quoted below are 0.19.0's.

Usage (from a test)::

    from tests.support.fake_openai import FakeOpenAI, ChatResponder
    from tests.support.hermes_host import run_hermes

    with FakeOpenAI(responder=ChatResponder(reply_chars=20000)) as srv:
        run = run_hermes(srv, ["first question", "second question"], engine="compressor")
        assert run.ok, run.stderr
        run.engine              # {"name": "compressor", "class": "...ContextCompressor", ...}
        run.turns               # per turn: final_response, api_calls, n_messages, compression_count ...
        run.messages            # the final message history (JSON-safe)
        run.engine_calls        # trace of engine method calls (trace_engine=True)
        srv.chat_requests       # what the provider saw

How it works: each ``run_hermes`` call creates fresh ``HOME`` and
``HERMES_HOME`` directories, writes ``config.yaml`` pointing Hermes at the fake
server, and starts ``python hermes_host.py --driver spec.json`` in a
subprocess (clean environment, no module caches shared between tests).  The
driver builds ``run_agent.AIAgent`` exactly like ``hermes -z`` does
(``hermes_cli/oneshot.py:_run_agent``: load_config -> resolve_runtime_provider
-> platform toolsets -> SessionDB -> AIAgent(quiet_mode=True, platform="cli"))
and then calls ``agent.run_conversation(msg, conversation_history=history,
task_id=session_id)`` once per turn, like the interactive CLI does
(``cli.py``: ``history = result["messages"]``).  At the end it runs the oneshot
clean-up (``shutdown_memory_provider(messages)`` -> ``on_session_end``, then
``agent.close()``), unless ``end_session=False``.

Plugin installation modes (``plugin_mode``):

* ``"entrypoint"`` -- the pip entry point ``lcm = lossless_context.hermes.plugin``
  of our editable install (the normal way); ``plugins.enabled: [lcm]``.
* ``"directory"`` -- a plugin folder ``$HERMES_HOME/plugins/<dir_name>/``
  (``plugin.yaml`` + ``__init__.py`` whose ``register(ctx)`` delegates to
  ``lossless_context.hermes.plugin.register``; or your own
  ``plugin_init_source``, e.g. :data:`DUMMY_ENGINE_INIT`).  The R19 loader
  keys a folder plugin by the ``name:`` in its plugin.yaml
  (hermes_cli/plugins.py:1581), scans entry points last and lets the later
  source win on a key clash (plugins.py:1369, 1384): with our package
  installed, a folder named ``lcm`` is silently replaced by the entry point.
  Two ways around it, both supported here:
    - ``hide_entry_point=True`` (the default for this mode): the driver patches
      ``importlib.metadata.entry_points`` so group ``hermes_agent.plugins``
      has no ``lcm`` (the loader calls it through the module attribute);
    - ``manifest_name="lcm-dir"`` (any other key): no clash; only that key is
      put in ``plugins.enabled``, so the entry point stays unloaded.  This is
      what a real user would have to do.
  ``hide_entry_point=False`` with the default name shows the real clash.
* ``"none"`` -- no plugin (``plugins.enabled: []``), e.g. with
  ``engine="compressor"``.

Network: the driver installs a socket guard that refuses any connection to a
non-loopback address and reports the attempts in ``run.blocked_connections``.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

HERE = Path(__file__).resolve()
REPO_ROOT = HERE.parents[2]

# The interpreter running the tests (its environment has the package under test and the
# host); LCM_HERMES_PYTHON overrides it deliberately.
DEFAULT_PYTHON = os.environ.get("LCM_HERMES_PYTHON") or sys.executable

# Env vars that would redirect the host (provider keys, proxies, Hermes knobs)
# are not inherited by the subprocess.
_ENV_KEEP = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "SYSTEMROOT", "PYTHONHASHSEED")


@functools.lru_cache(maxsize=None)
def hermes_available(python: str = DEFAULT_PYTHON) -> bool:
    """True when ``python`` can import the host (run_agent).  Cheap for the current interpreter."""
    try:
        if os.path.abspath(python) == os.path.abspath(sys.executable):
            import importlib.util

            return importlib.util.find_spec("run_agent") is not None and \
                importlib.util.find_spec("agent.context_engine") is not None
        r = subprocess.run([python, "-c", "import run_agent, agent.context_engine"],
                           capture_output=True, timeout=120)
        return r.returncode == 0
    except Exception:
        return False


def deep_merge(base: Dict[str, Any], extra: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    out = dict(base)
    for k, v in (extra or {}).items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def build_config(
    base_url: str,
    *,
    model: str = "fake-model",
    api_key: str = "sk-fake-test-key",
    context_length: int = 64000,
    engine: str = "lcm",
    plugins_enabled: Sequence[str] = ("lcm",),
    extra: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
    """The config.yaml the harness writes (before ``extra`` is deep-merged in)."""
    cfg: Dict[str, Any] = {
        "model": {
            "provider": "custom",
            "base_url": base_url,
            "default": model,
            "api_key": api_key,
            "context_length": int(context_length),
        },
        "plugins": {"enabled": list(plugins_enabled)},
        "context": {"engine": engine},
        "security": {"allow_lazy_installs": False, "tirith_enabled": False},
        "model_catalog": {"enabled": False},
        "agent": {"environment_probe": False},
        # keep the loop short and deterministic
        "memory": {"memory_enabled": False, "user_profile_enabled": False},
    }
    return deep_merge(cfg, extra)


DIRECTORY_PLUGIN_YAML = """\
name: {name}
version: 0.1.0
description: Lossless Context Management engine (directory install, test harness)
"""

DIRECTORY_PLUGIN_INIT = '''\
"""Directory-installed LCM plugin (written by tests/support/hermes_host.py)."""


def register(ctx):
    from lossless_context.hermes.plugin import register as _register

    return _register(ctx)
'''


# A self-contained engine plugin for exercising the harness and the host
# without our package: keeps the first message and the last ``keep`` messages
# (snapped back so the tail starts with a user message), puts an
# assistant-role marker between them, exposes one tool (``dummy_echo``) and one
# slash command (``/dummy``).  Use it as ``plugin_init_source=DUMMY_ENGINE_INIT``.
DUMMY_ENGINE_INIT = '''\
"""Dummy context engine (tests/support/hermes_host.py)."""
import json

from agent.context_engine import ContextEngine

_STATE = {"register_calls": 0}


class DummyEngine(ContextEngine):
    keep = 4

    @property
    def name(self):
        return "lcm"

    def update_from_response(self, usage):
        self.last_prompt_tokens = usage.get("prompt_tokens", 0)
        self.last_completion_tokens = usage.get("completion_tokens", 0)
        self.last_total_tokens = usage.get("total_tokens", 0)

    def should_compress(self, prompt_tokens=None):
        return bool(prompt_tokens and self.threshold_tokens and prompt_tokens >= self.threshold_tokens)

    def compress(self, messages, current_tokens=None, focus_topic=None, force=False, memory_context="", **kwargs):
        if len(messages) <= self.keep + 2:
            return list(messages)
        cut = len(messages) - self.keep
        while cut > 1 and messages[cut].get("role") != "user":
            cut -= 1
        if cut <= 1:
            return list(messages)
        head, tail = list(messages[:1]), list(messages[cut:])
        self.compression_count += 1
        marker = {"role": "assistant",
                  "content": "[dummy-engine summary: %d messages folded; focus=%s]" % (cut - 1, focus_topic)}
        return head + [marker] + tail

    def get_tool_schemas(self):
        return [{"name": "dummy_echo", "description": "Echo the arguments back.",
                 "parameters": {"type": "object", "properties": {"text": {"type": "string"}},
                                "required": ["text"]}}]

    def handle_tool_call(self, name, args, **kwargs):
        msgs = kwargs.get("messages")
        return json.dumps({"tool": name, "args": args, "kwargs": sorted(kwargs),
                           "n_messages": len(msgs) if msgs is not None else None})


def register(ctx):
    _STATE["register_calls"] += 1
    ctx.register_context_engine(DummyEngine())
    ctx.register_command("dummy", lambda raw: "dummy got %r (register_calls=%d)" % (raw, _STATE["register_calls"]),
                         description="dummy engine command", args_hint="[text]")
'''


def lcm_plugin_module_exists() -> bool:
    """True once ``lossless_context/hermes/plugin.py`` (the entry point target) exists."""
    return (REPO_ROOT / "lossless_context" / "hermes" / "plugin.py").exists()


@dataclass
class HostRun:
    returncode: int
    stdout: str
    stderr: str
    result: Dict[str, Any]
    hermes_home: Path
    home: Path
    config: Dict[str, Any]
    duration: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.result.get("driver_error")

    @property
    def engine(self) -> Dict[str, Any]:
        return self.result.get("engine") or {}

    @property
    def status_lines(self) -> List[List[str]]:
        """[kind, text] of every status or warning line the host emitted for the user."""
        return self.result.get("status_lines") or []

    @property
    def engine_name(self) -> Optional[str]:
        return self.engine.get("name")

    @property
    def turns(self) -> List[Dict[str, Any]]:
        return self.result.get("turns") or []

    @property
    def messages(self) -> List[Dict[str, Any]]:
        return self.result.get("messages") or []

    @property
    def engine_calls(self) -> List[Dict[str, Any]]:
        return self.result.get("engine_calls") or []

    @property
    def blocked_connections(self) -> List[str]:
        return self.result.get("blocked_connections") or []

    @property
    def host_version(self) -> str:
        return self.result.get("host_version") or ""

    @property
    def plugins(self) -> Dict[str, Any]:
        return self.result.get("plugins") or {}

    @property
    def log(self) -> str:
        """The host's own log files ($HERMES_HOME/logs/*.log), concatenated."""
        out = []
        logs = self.hermes_home / "logs"
        if logs.is_dir():
            for p in sorted(logs.glob("*.log")):
                try:
                    out.append(f"==> {p.name} <==\n" + p.read_text(errors="replace"))
                except OSError:
                    pass
        return "\n".join(out)

    def calls_named(self, name: str) -> List[Dict[str, Any]]:
        return [c for c in self.engine_calls if c.get("method") == name]

    def describe(self) -> str:
        return (f"rc={self.returncode} engine={self.engine}\n--- stderr ---\n{self.stderr[-6000:]}\n"
                f"--- driver_error ---\n{self.result.get('driver_error')}")


def run_hermes(
    server: Any,
    turns: Sequence[Union[str, Dict[str, Any]]],
    *,
    engine: str = "lcm",
    plugin_mode: str = "entrypoint",
    extra_config: Optional[Dict[str, Any]] = None,
    context_length: int = 64000,
    model: Optional[str] = None,
    hermes_home: Optional[Union[str, Path]] = None,
    home: Optional[Union[str, Path]] = None,
    session_id: Optional[str] = None,
    resume: bool = False,
    toolsets: Optional[Sequence[str]] = None,
    max_iterations: int = 12,
    trace_engine: bool = True,
    hide_entry_point: Optional[bool] = None,
    dir_name: str = "lcm",
    manifest_name: Optional[str] = None,
    plugin_init_source: Optional[str] = None,
    end_session: bool = True,
    env: Optional[Dict[str, str]] = None,
    timeout: float = 180.0,
    python: Optional[str] = None,
    workdir: Optional[Union[str, Path]] = None,
    log_level: str = "INFO",
    join_background: float = 0.0,
    defer_reviews: bool = False,
) -> HostRun:
    """Run ``turns`` user messages through one real AIAgent in a subprocess.

    ``server`` is a started :class:`FakeOpenAI` (or anything with ``base_url``
    and ``model``).  A turn is a string (the user message) or a dict
    ``{"message": str}`` or ``{"command": "/compress [focus | here N]"}``
    (the CLI's manual compression path, cli.py:_manual_compress), ``/new``
    (the engine-visible part of cli.py:new_session) or
    ``{"command": "/<plugin-command> args"}`` (a plugin slash command, called
    like cli.py does: ``handler(raw_args)``), or ``/branch [name]`` (the host's own
    CLICommandsMixin._handle_branch_command on a stand-in CLI object).
    ``join_background``: seconds to wait for the host's background review ("bg-review" threads,
    and 0.22's idle queue) after every turn, before the next one (a user's pause: 0.22 cancels a
    review the next turn overtakes), and before the session ends. ``defer_reviews`` (0.22): the
    host takes the review model for its managed local server, so it queues every automatic
    review for an idle moment (``auxiliary.background_review.defer: auto``).

    ``hermes_home`` / ``home``: reuse directories (e.g. a second process on the
    same store -- pass ``run.hermes_home`` / ``run.home`` of an earlier run);
    by default fresh dirs under ``workdir`` (e.g. pytest's ``tmp_path``; the
    system temp dir if None).  ``resume=True`` with ``session_id`` loads that
    session's active history from the host's SessionDB first, like
    ``hermes --resume`` (process-per-turn scenarios: one run_hermes call per
    turn, same dirs, ``session_id=previous.result["session_id"]``).

    ``toolsets``: enabled toolsets; default ``["context_engine"]`` (only the
    engine's own tools -- no file/terminal/web tools, so the fake model cannot
    touch the machine, and the tool-schema overhead stays small); pass
    ``["__config__"]`` to use the "cli" platform toolsets from config like
    ``hermes -z`` does.  ``env``: extra environment for the subprocess.
    ``trace_engine``: record every engine method call (``run.engine_calls``).
    ``python``: the host's interpreter; by default the host of the running ``hermes_host`` test
    (tests/support/hosts.py), else this interpreter (or ``LCM_HERMES_PYTHON``).
    """
    if python is None:
        from tests.support.hosts import current

        host = current()
        python = host.python if host is not None else DEFAULT_PYTHON
    if hermes_home is None:
        root = Path(tempfile.mkdtemp(prefix="hermes-harness-", dir=str(workdir) if workdir else None))
        hermes_home = root / "hermes_home"
        home = Path(home) if home is not None else root / "home"
    else:
        hermes_home = Path(hermes_home)
        home = Path(home) if home is not None else hermes_home.parent / "home"
    hermes_home.mkdir(parents=True, exist_ok=True)
    home.mkdir(parents=True, exist_ok=True)

    model = model or getattr(server, "model", None) or "fake-model"
    if plugin_mode == "none":
        enabled: List[str] = []
    elif plugin_mode == "directory":
        enabled = [manifest_name or dir_name]
    else:
        enabled = ["lcm"]
    cfg = build_config(server.base_url, model=model, context_length=context_length, engine=engine,
                       plugins_enabled=enabled, extra=extra_config)
    _write_yaml(hermes_home / "config.yaml", cfg)

    if plugin_mode == "directory":
        pdir = hermes_home / "plugins" / dir_name
        pdir.mkdir(parents=True, exist_ok=True)
        (pdir / "plugin.yaml").write_text(DIRECTORY_PLUGIN_YAML.format(name=manifest_name or dir_name))
        (pdir / "__init__.py").write_text(plugin_init_source or DIRECTORY_PLUGIN_INIT)
        if hide_entry_point is None:
            hide_entry_point = True
    if hide_entry_point is None:
        hide_entry_point = False

    norm_turns = []
    for t in turns:
        norm_turns.append({"message": t} if isinstance(t, str) else dict(t))

    run_dir = Path(tempfile.mkdtemp(prefix="run-", dir=hermes_home.parent))
    spec = {
        "turns": norm_turns,
        "session_id": session_id,
        "resume": resume,
        "toolsets": list(toolsets) if toolsets is not None else ["context_engine"],
        "max_iterations": max_iterations,
        "trace_engine": trace_engine,
        "hide_entry_point": hide_entry_point,
        "end_session": end_session,
        "result_path": str(run_dir / "result.json"),
        "log_level": log_level,
        "join_background": join_background,
        "defer_reviews": defer_reviews,
    }
    spec_path = run_dir / "spec.json"
    spec_path.write_text(json.dumps(spec))

    child_env = {k: os.environ[k] for k in _ENV_KEEP if k in os.environ}
    child_env.update({
        "HOME": str(home),
        "HERMES_HOME": str(hermes_home),
        "NO_PROXY": "*",
        "no_proxy": "*",
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "HERMES_YOLO_MODE": "1",
        "HERMES_ACCEPT_HOOKS": "1",
    })
    child_env.update(env or {})

    t0 = time.time()
    try:
        proc = subprocess.run(
            [python, str(HERE), "--driver", str(spec_path)],
            cwd=str(home), env=child_env, capture_output=True, text=True, timeout=timeout,
        )
        rc, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc = -9
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err = (exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or ""))
        err += f"\n[harness] driver timed out after {timeout}s"
    dt = time.time() - t0
    result: Dict[str, Any] = {}
    rp = Path(spec["result_path"])
    if rp.exists():
        try:
            result = json.loads(rp.read_text())
        except Exception as exc:  # pragma: no cover
            result = {"driver_error": f"unreadable result.json: {exc}"}
    else:
        result = {"driver_error": "driver wrote no result.json"}
    return HostRun(rc, out, err, result, hermes_home, home, cfg, dt)


def _write_yaml(path: Path, data: Dict[str, Any]) -> None:
    try:
        import yaml  # type: ignore

        path.write_text(yaml.safe_dump(data, sort_keys=False))
    except ImportError:  # JSON is valid YAML
        path.write_text(json.dumps(data, indent=2))


# ===========================================================================
# Driver (runs inside the subprocess; imports the host)
# ===========================================================================


def _jsonable(x: Any, depth: int = 0) -> Any:
    if depth > 12:
        return repr(x)[:200]
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, dict):
        return {str(k): _jsonable(v, depth + 1) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v, depth + 1) for v in x]
    return repr(x)[:500]


def _summ(x: Any) -> Any:
    """A short description of an argument for the call trace."""
    if isinstance(x, list):
        if x and all(isinstance(m, dict) and "role" in m for m in x):
            return {"messages": len(x), "roles": [m.get("role") for m in x][:400],
                    "chars": sum(len(str(m.get("content") or "")) for m in x)}
        return {"list": len(x)}
    if isinstance(x, dict):
        return {k: _summ(v) for k, v in list(x.items())[:20]}
    if callable(x):
        return f"<callable {getattr(x, '__name__', type(x).__name__)}>"
    if isinstance(x, str) and len(x) > 300:
        return x[:300] + f"...(+{len(x) - 300})"
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    return repr(x)[:200]


_TRACED = (
    "update_model", "bind_session_state", "on_session_start", "on_session_end", "on_session_reset",
    "should_compress", "should_compress_preflight", "compress", "update_from_response",
    "handle_tool_call", "get_tool_schemas", "has_content_to_compress", "select_context",
    "on_turn_complete", "__deepcopy__", "clone_for_agent",
)


def _install_tracer(cls: type, calls: List[Dict[str, Any]]) -> None:
    """Wrap the engine class's lifecycle methods to record every call.

    Wrapping the class (not the instance) also covers the deep copies the host
    makes per agent.  ``depth`` is 0 for calls made by the host and > 0 for calls
    an engine method makes on itself (e.g. the built-in compressor's
    on_session_start() calling bind_session_state()).  ``functools.wraps`` keeps
    ``inspect.signature`` intact, so the host's kwarg filtering for compress()
    sees the real signature.
    """
    import functools
    import threading

    if cls.__dict__.get("_harness_traced", False):
        return
    local = threading.local()
    for name in _TRACED:
        fn = getattr(cls, name, None)
        if fn is None or not callable(fn):
            continue

        def make(fn=fn, name=name):
            @functools.wraps(fn)
            def wrapper(self, *args, **kwargs):
                depth = getattr(local, "depth", 0)
                rec = {"method": name, "depth": depth, "t": round(time.time(), 4),
                       "args": [_summ(a) for a in args],
                       "kwargs": {k: _summ(v) for k, v in kwargs.items()}, "obj": id(self),
                       "thread": threading.current_thread().name}
                calls.append(rec)
                local.depth = depth + 1
                try:
                    res = fn(self, *args, **kwargs)
                except BaseException as exc:
                    rec["raised"] = f"{type(exc).__name__}: {exc}"
                    raise
                finally:
                    local.depth = depth
                rec["returned"] = _summ(res) if name != "__deepcopy__" else f"<{type(res).__name__}>"
                return res

            return wrapper

        setattr(cls, name, make())
    cls._harness_traced = True


class _NetGuard:
    def __init__(self) -> None:
        self.blocked: List[str] = []

    def install(self) -> None:
        import ipaddress
        import socket

        orig_connect = socket.socket.connect
        orig_connect_ex = socket.socket.connect_ex
        orig_gai = socket.getaddrinfo
        guard = self

        def local(host: Any) -> bool:
            if isinstance(host, bytes):
                host = host.decode()
            if host in ("localhost", "localhost.localdomain", "", None):
                return True
            try:
                return ipaddress.ip_address(str(host).split("%")[0]).is_loopback
            except ValueError:
                return False

        def check(sock, address):
            if sock.family in (socket.AF_INET, socket.AF_INET6) and isinstance(address, tuple):
                if not local(address[0]):
                    guard.blocked.append(f"{address[0]}:{address[1]}")
                    raise ConnectionRefusedError(f"[hermes harness] network blocked: {address[0]}")

        def connect(sock, address):
            check(sock, address)
            return orig_connect(sock, address)

        def connect_ex(sock, address):
            check(sock, address)
            return orig_connect_ex(sock, address)

        def gai(host, *a, **k):
            if not local(host):
                guard.blocked.append(f"dns:{host}")
                raise socket.gaierror(socket.EAI_NONAME, f"[hermes harness] DNS blocked: {host}")
            return orig_gai(host, *a, **k)

        socket.socket.connect = connect
        socket.socket.connect_ex = connect_ex
        socket.getaddrinfo = gai


def _hide_entry_point(group: str = "hermes_agent.plugins", names: Sequence[str] = ("lcm",)) -> None:
    """Make ``importlib.metadata.entry_points()`` stop reporting our plugin entry point.

    hermes_cli/plugins.py calls ``importlib.metadata.entry_points()`` through the
    module attribute (plugins.py:1662 scan, 1872 load), so patching the attribute
    in the driver process is enough.  Handles both return shapes:
    ``SelectableGroups`` (dict of group -> EntryPoints, Python 3.10/3.11) and
    ``EntryPoints`` (3.12+, or any call with ``group=``).
    """
    import importlib.metadata as md

    orig = md.entry_points

    def hidden(ep: Any) -> bool:
        return getattr(ep, "group", None) == group and getattr(ep, "name", None) in names

    def entry_points(**params: Any) -> Any:
        eps = orig(**params)
        if isinstance(eps, dict):  # SelectableGroups
            return type(eps)({g: md.EntryPoints([ep for ep in v if not hidden(ep)]) for g, v in eps.items()})
        return md.EntryPoints([ep for ep in eps if not hidden(ep)])

    md.entry_points = entry_points


def _driver(spec_path: str) -> int:
    import logging
    import traceback

    spec = json.loads(Path(spec_path).read_text())
    result: Dict[str, Any] = {"turns": [], "engine_calls": []}
    guard = _NetGuard()
    guard.install()
    if spec.get("hide_entry_point"):
        _hide_entry_point()

    def dump() -> None:
        result["blocked_connections"] = guard.blocked
        Path(spec["result_path"]).write_text(json.dumps(_jsonable(result), indent=1))

    agent = None
    session_db = None
    try:
        # stderr logging for the harness (the host also writes $HERMES_HOME/logs/)
        logging.basicConfig(level=getattr(logging, spec.get("log_level", "INFO")), stream=sys.stderr,
                            format="%(levelname)s %(name)s: %(message)s")

        from hermes_cli.config import load_config
        from hermes_cli.runtime_provider import resolve_runtime_provider
        from hermes_cli.tools_config import _get_platform_tools

        import hermes_cli

        result["host_version"] = getattr(hermes_cli, "__version__", "")
        cfg = load_config()
        model_cfg = cfg.get("model") or {}
        model = model_cfg.get("default") or model_cfg.get("model") or ""

        # Discover plugins first so the tracer can wrap the engine class before
        # the agent constructs (and deep-copies) it.
        calls: List[Dict[str, Any]] = result["engine_calls"]
        try:
            from hermes_cli.plugins import discover_plugins, get_plugin_manager

            discover_plugins()
            pm = get_plugin_manager()
            result["plugins"] = {
                k: {"enabled": p.enabled, "source": p.manifest.source, "path": p.manifest.path,
                    "kind": p.manifest.kind, "error": p.error, "name": p.manifest.name,
                    "commands": list(p.commands_registered)}
                for k, p in pm._plugins.items()
                if p.manifest.source != "bundled"
            }
            ce = pm._context_engine
            result["registered_engine"] = (
                {"name": getattr(ce, "name", None), "class": f"{type(ce).__module__}.{type(ce).__qualname__}"}
                if ce is not None else None
            )
            result["plugin_commands"] = sorted(pm._plugin_commands)
            if spec.get("trace_engine") and ce is not None:
                _install_tracer(type(ce), calls)
            if spec.get("trace_engine"):
                # 0.22 loads a context engine's folder itself (plugins/context_engine, module
                # `_hermes_user_context_engine.<dir>`, cached in sys.modules): that class is the
                # one the agent gets, not the plugin manager's copy
                engine_name = (cfg.get("context") or {}).get("engine") or "compressor"
                if engine_name != "compressor":
                    try:
                        from plugins.context_engine import find_engine_dir, load_context_engine

                        folder = find_engine_dir(engine_name)
                        if folder is not None and folder.parent.name != "context_engine":
                            own = load_context_engine(engine_name)
                            if own is not None:
                                _install_tracer(type(own), calls)
                    except ImportError:  # 0.19/0.20: no loader of user engine folders
                        pass
                    except Exception as exc:
                        result["context_engine_loader_error"] = f"{type(exc).__name__}: {exc}"
        except Exception as exc:
            result["plugin_discovery_error"] = f"{type(exc).__name__}: {exc}"
        if spec.get("trace_engine"):
            from agent.context_compressor import ContextCompressor

            _install_tracer(ContextCompressor, calls)

        if spec.get("defer_reviews"):
            # the one fact the host checks before queueing a review: does it decode on the
            # llama-server the host manages (a supervisor state file naming its endpoint)?
            import agent.review_idle_queue as review_queue

            review_queue.review_targets_managed_local = lambda *_a, **_k: True
        runtime = resolve_runtime_provider(requested=None, target_model=model or None)
        toolsets = spec.get("toolsets")
        if toolsets == ["__config__"]:
            toolsets = sorted(_get_platform_tools(cfg, "cli"))
        try:
            from hermes_state import SessionDB

            session_db = SessionDB()
        except Exception as exc:
            result["session_db_error"] = str(exc)

        history: List[Dict[str, Any]] = []
        sid = spec.get("session_id")
        if spec.get("resume") and sid and session_db is not None:
            try:
                # as hermes_cli/cli_agent_setup_mixin.py:297 does on --resume
                history = session_db.get_messages_as_conversation(sid, repair_alternation=True)
                history = [m for m in history if m.get("role") != "session_meta"]
                result["resumed_messages"] = len(history)
            except Exception as exc:
                result["resume_error"] = f"{type(exc).__name__}: {exc}"

        from run_agent import AIAgent

        agent = AIAgent(
            api_key=runtime.get("api_key"),
            base_url=runtime.get("base_url"),
            provider=runtime.get("provider"),
            api_mode=runtime.get("api_mode"),
            model=model,
            enabled_toolsets=toolsets,
            quiet_mode=True,
            platform="cli",
            session_db=session_db,
            session_id=sid,
            max_iterations=int(spec.get("max_iterations", 12)),
            credential_pool=runtime.get("credential_pool"),
        )
        agent.suppress_status_output = True
        agent.stream_delta_callback = None
        agent.tool_gen_callback = None
        # What the host shows the user in the chat besides the replies (its status and warning
        # lines, as a gateway's status_callback receives them): run.status_lines.
        status_lines: List[Any] = result.setdefault("status_lines", [])
        agent.status_callback = lambda kind, message, *a, **k: status_lines.append([str(kind), str(message)])
        cc = agent.context_compressor
        result["engine"] = {
            "name": getattr(cc, "name", None),
            "class": f"{type(cc).__module__}.{type(cc).__qualname__}",
            "context_length": getattr(cc, "context_length", None),
            "threshold_tokens": getattr(cc, "threshold_tokens", None),
            "threshold_percent": getattr(cc, "threshold_percent", None),
            "id": id(cc),
            "file": _source_file(type(cc)),
            "is_registered_object": (cc is get_plugin_manager()._context_engine) if result.get("registered_engine") else None,
        }
        result["session_id"] = agent.session_id
        result["tools"] = sorted(agent.valid_tool_names) if getattr(agent, "valid_tool_names", None) else []
        result["context_engine_tools"] = sorted(getattr(agent, "_context_engine_tool_names", set()) or [])
        dump()

        for i, turn in enumerate(spec["turns"]):
            rec: Dict[str, Any] = {"index": i}
            t0 = time.time()
            try:
                if "command" in turn:
                    rec.update(_run_command(agent, turn["command"], history))
                    history = rec.pop("_history", history)
                else:
                    res = agent.run_conversation(turn["message"], conversation_history=history,
                                                 task_id=agent.session_id)
                    history = res.get("messages", history)
                    rec.update({
                        "final_response": res.get("final_response"),
                        "api_calls": res.get("api_calls"),
                        "completed": res.get("completed"),
                        "failed": res.get("failed"),
                        "error": res.get("error"),
                        "interrupted": res.get("interrupted"),
                        "result_keys": sorted(res.keys()),
                    })
            except Exception as exc:
                rec["exception"] = f"{type(exc).__name__}: {exc}"
                rec["traceback"] = traceback.format_exc()
            rec["seconds"] = round(time.time() - t0, 3)
            rec["n_messages"] = len(history)
            rec["session_id"] = agent.session_id
            cc = agent.context_compressor
            rec["compression_count"] = getattr(cc, "compression_count", None)
            rec["last_prompt_tokens"] = getattr(cc, "last_prompt_tokens", None)
            rec["threshold_tokens"] = getattr(cc, "threshold_tokens", None)
            if spec.get("join_background"):
                # the user reads the reply before typing again: the host's review runs meanwhile
                rec["background_reviews"] = _let_background_reviews_finish(float(spec["join_background"]))
            result["turns"].append(rec)
            result["messages"] = history
            dump()

        # Newer hosts title a session on a daemon thread ("auto-title") that writes the session
        # database; closing the database under it (and exiting) races with that write.
        import threading

        for t in [t for t in threading.enumerate() if t.name == "auto-title"]:
            t.join(timeout=30)
        if spec.get("join_background"):
            # so what the reviews did is in the store before this process exits
            _let_background_reviews_finish(float(spec["join_background"]))
            result["background_alive"] = [t.name for t in threading.enumerate() if t.name == "bg-review"]
        if spec.get("end_session", True):
            try:
                agent.shutdown_memory_provider(history)
            except Exception as exc:
                result["shutdown_error"] = f"{type(exc).__name__}: {exc}"
    except BaseException as exc:  # noqa: BLE001
        result["driver_error"] = f"{type(exc).__name__}: {exc}"
        result["driver_traceback"] = traceback.format_exc()
    finally:
        try:
            if agent is not None:
                agent.close()
        except Exception:
            pass
        try:
            if session_db is not None:
                session_db.close()
        except Exception:
            pass
        dump()
    return 0 if not result.get("driver_error") else 1


def _let_background_reviews_finish(limit: float) -> Dict[str, Any]:
    """Give the host's background memory/skill review the pause a user gives it between turns.

    The review runs on a daemon thread named "bg-review" after a turn. 0.22 cancels a running
    review when the next live turn starts ("background review superseded"), and queues a review
    bound for its managed local model server until the machine has been idle for a settle window
    (`agent.review_idle_queue.QUEUE`, thread "bg-review-idle-queue"). A driver that sends the next
    turn at once never lets a review run: this waits up to ``limit`` seconds for both, telling the
    queue (through its own clock and idleness seams) that the machine stayed idle, so its own
    dispatcher hands the review over exactly as it would after a real pause."""
    import threading

    deadline = time.monotonic() + limit
    out: Dict[str, Any] = {"queued": 0, "joined": 0}
    try:
        from agent.review_idle_queue import QUEUE  # 0.22: the idle queue
    except ImportError:
        QUEUE = None
    if QUEUE is not None and QUEUE.pending_count():
        out["queued"] = QUEUE.pending_count()
        now, idle = QUEUE._now, QUEUE._server_idle
        # an idle machine: the settle window and the items' age limit have passed
        QUEUE._now = lambda: time.monotonic() + 24 * 3600
        QUEUE._server_idle = lambda: True
        try:
            QUEUE._wake.set()
            while QUEUE.pending_count() and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            QUEUE._now, QUEUE._server_idle = now, idle
    while time.monotonic() < deadline:
        alive = [t for t in threading.enumerate() if t.name == "bg-review"]
        if not alive:
            break
        for t in alive:
            try:
                t.join(timeout=max(0.0, deadline - time.monotonic()))
            except RuntimeError:  # listed by enumerate() while still starting: not joinable yet
                time.sleep(0.01)
                continue
            out["joined"] += 1
    return out


def _source_file(cls: type) -> Optional[str]:
    """Where the engine's code was loaded from (an installed package or a plugin folder)."""
    import inspect

    try:
        return inspect.getfile(cls)
    except (TypeError, OSError):
        return None


def _run_command(agent: Any, command: str, history: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Run a slash command the way the CLI does (subset: /compress [focus], plugin commands)."""
    parts = command.strip().split(None, 1)
    name = parts[0].lstrip("/").lower()
    arg = parts[1] if len(parts) > 1 else ""
    if name == "compress":
        return _manual_compress(agent, history, arg)
    if name in ("new", "reset"):
        return _new_session(agent, history)
    if name == "undo":
        return _undo(history)
    if name == "branch":
        return _branch(agent, history, command)
    from hermes_cli.plugins import get_plugin_command_handler, resolve_plugin_command_result

    handler = get_plugin_command_handler(name)
    if handler is None:
        return {"command_error": f"unknown command /{name}"}
    out = resolve_plugin_command_result(handler(arg))
    return {"command_output": out}


def _branch(agent: Any, history: List[Dict[str, Any]], command: str) -> Dict[str, Any]:
    """``/branch [name]`` through the host's own handler (CLICommandsMixin._handle_branch_command),
    on a stand-in for the CLI object that carries what the handler reads and writes."""
    import cli as hermes_cli_module
    from hermes_cli.cli_commands_mixin import CLICommandsMixin

    class _CLI(CLICommandsMixin):
        pass

    # 0.19/0.20 call a method of HermesCLI; 0.22 calls tools.approval_yolo.transfer_session_yolo itself
    transfer = getattr(hermes_cli_module.HermesCLI, "_transfer_session_yolo", None)
    if transfer is not None:
        _CLI._transfer_session_yolo = transfer  # type: ignore[attr-defined]
    shell = _CLI()
    shell._agent_running = False
    shell.session_start = getattr(agent, "session_start", None)
    shell.conversation_history = list(history)
    shell._session_db = getattr(agent, "_session_db", None)
    shell.session_id = agent.session_id
    shell.agent = agent
    shell.model = agent.model
    shell.max_turns = getattr(agent, "max_iterations", 12)
    shell.reasoning_config = getattr(agent, "reasoning_config", None)
    shell._pending_title = None
    shell._resumed = False
    parent = agent.session_id
    shell._handle_branch_command(command)
    return {"command_output": {"parent_session_id": parent, "branch_session_id": agent.session_id},
            "_history": list(shell.conversation_history)}


def _undo(history: List[Dict[str, Any]]) -> Dict[str, Any]:
    """``/undo``: the engine-visible part of cli.py:undo_last (7417): the history is cut before
    the last user message; no engine hook is called."""
    users = [i for i, m in enumerate(history) if m.get("role") == "user"]
    if not users:
        return {"command_output": "no user message to undo", "_history": history}
    cut = users[-1]
    return {"command_output": {"removed": len(history) - cut}, "_history": history[:cut]}


def _new_session(agent: Any, history: List[Dict[str, Any]]) -> Dict[str, Any]:
    """``/new``: the engine-visible part of cli.py:new_session (7108-7230)."""
    import uuid
    from datetime import datetime

    old = agent.session_id
    engine = getattr(agent, "context_compressor", None)
    if history and engine is not None and hasattr(engine, "on_session_end"):
        try:  # cli.py:7095 (_launch_session_boundary_memory_flush)
            engine.on_session_end(old or "", list(history))
        except Exception:
            pass
    db = getattr(agent, "_session_db", None)
    if db is not None and old:
        try:
            agent._flush_messages_to_session_db(history)
        except Exception:
            pass
        try:
            db.end_session(old, "new_session")
        except Exception:
            pass
    new_sid = f"{datetime.now().strftime('%Y%m%d_%H%M%S')}_{uuid.uuid4().hex[:6]}"
    agent.session_id = new_sid
    agent.reset_session_state()  # cli.py:7225
    if hasattr(agent, "_last_flushed_db_idx"):
        agent._last_flushed_db_idx = 0
    if hasattr(agent, "_invalidate_system_prompt"):
        agent._invalidate_system_prompt()
    return {"command_output": {"old_session_id": old, "new_session_id": new_sid}, "_history": []}


def _manual_compress(agent: Any, history: List[Dict[str, Any]], raw_args: str) -> Dict[str, Any]:
    """``/compress [focus | here [N]]`` exactly as cli.py:_manual_compress (9744-9941) does it."""
    if not history or len(history) < 4:
        return {"command_output": "not enough conversation to compress (need at least 4 messages)",
                "_history": history}
    if not agent.compression_enabled:
        return {"command_output": "compression disabled", "_history": history}
    from agent.model_metadata import estimate_request_tokens_rough
    from hermes_cli.partial_compress import (
        extract_compress_flags,
        parse_partial_compress_args,
        rejoin_compressed_head_and_tail,
        split_history_for_partial_compress,
    )

    raw_args, _preview, _aggressive = extract_compress_flags(raw_args or "")
    partial, keep_last, focus_topic = parse_partial_compress_args(raw_args)
    original = list(history)
    head, tail = original, []
    if partial:
        head, tail = split_history_for_partial_compress(original, keep_last)
        if not tail:
            partial, head = False, original
    sys_prompt = getattr(agent, "_cached_system_prompt", "") or ""
    approx = estimate_request_tokens_rough(original, system_prompt=sys_prompt, tools=getattr(agent, "tools", None) or None)
    old_sid = agent.session_id
    compressed, _ = agent._compress_context(head, None, approx_tokens=approx,
                                            focus_topic=focus_topic or None, force=True)
    if partial and tail:
        compressed = rejoin_compressed_head_and_tail(compressed, tail)
    if agent.session_id and agent.session_id != old_sid:
        agent._flush_messages_to_session_db(compressed, None)
    return {
        "command_output": {"partial": partial, "keep_last": keep_last, "focus_topic": focus_topic,
                           "head_len": len(head), "tail_len": len(tail), "before": len(original),
                           "after": len(compressed), "approx_tokens": approx},
        "_history": compressed,
    }


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "--driver":
        sys.exit(_driver(sys.argv[2]))
    print("usage: hermes_host.py --driver SPEC.json", file=sys.stderr)
    sys.exit(2)
