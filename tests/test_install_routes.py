"""Install routes on every Hermes host (0.19, 0.22, and 0.20 with a mirror), and the `lcm` name clash.

* `hermes plugins install <git URL> --enable` (non-interactive) and a copy of the checkout in
  $HERMES_HOME/plugins/lcm/: the repository root is itself a plugin; the host's own loader then
  registers our engine from that folder. On 0.22 in a venv with the host alone (no PyYAML).
* `pip install <clone>` into a 0.22 host's Python: no PyYAML comes with it; the entry point loads us.
* The host's repository scan (`hermes plugins install`) and `hermes plugins validate` are clean.
* The root `__init__.py` has no import-time effects, registers without PyYAML, and says at WARNING
  why it cannot load when it cannot.
* Another plugin claiming `lcm` (as LCM-X does): `lossless_context.hermes.nameclash` predicts which
  engine the real host loader registers, and `lcm install` says so and how to choose ours.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from lossless_context.cli.commands import lcm as lcm_main
from lossless_context.config import load_yaml
from lossless_context.hermes.nameclash import resolve
from tests.support.fake_openai import ChatResponder, FakeOpenAI, Router
from tests.support.hermes_host import run_hermes
from tests.support.hosts import HostUnavailable, clean_host_python

ROOT = Path(__file__).resolve().parents[1]

RIVAL_INIT = textwrap.dedent('''
    """A rival engine that also answers to the name lcm (like LCM-X's alias)."""
    from agent.context_engine import ContextEngine


    class Rival(ContextEngine):
        @property
        def name(self):
            return "lcm"

        def update_from_response(self, usage):
            pass

        def should_compress(self, prompt_tokens=None):
            return False

        def compress(self, messages, current_tokens=None, focus_topic=None, force=False, **kw):
            return messages


    def register(ctx):
        ctx.register_context_engine(Rival())
''')


def _env(home: Path) -> dict[str, str]:
    env = dict(os.environ, HERMES_HOME=str(home), HOME=str(home.parent))
    env.pop("PYTHONPATH", None)
    return env


def _git_repo(tmp_path: Path) -> Path:
    """A git repository holding this checkout's committed-or-not files (like a user's clone)."""
    repo = tmp_path / "src"
    repo.mkdir()
    tracked = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout.split()
    for rel in tracked:
        src = ROOT / rel
        if src.is_file():
            dst = repo / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run(git + ["init", "-q"], cwd=repo, check=True)
    subprocess.run(git + ["add", "-A"], cwd=repo, check=True)
    subprocess.run(git + ["commit", "-qm", "snapshot"], cwd=repo, check=True)
    return repo


# `hermes plugins install` on 0.22 publishes through the host's package manager, which first
# downloads a managed Python (3.14) for its dependency environment -- for every plugin, even one
# without dependencies and with `python_runtime: external`. Offline that download fails, so this
# runs the host's own CLI with that one step replaced by the host's own publication of a plugin
# whose dependency environment does not change (pm.install._publish_inactive). Everything else --
# clone, security scan, manifest checks, consent, the enable transaction -- is the host's code.
PM_STANDIN = textwrap.dedent('''
    import sys
    import pm.client
    from pm.install import _publication, _publish_inactive

    def sync_venv(extras=None, *, explicit=False, plugins=None, repair=False, evict_incompatible_plugins=False):
        change = _publication(plugins)
        if change is not None:
            _publish_inactive(change)

    pm.client.sync_venv = sync_venv
    from hermes_cli.main import main
    sys.argv = ["hermes", "plugins", "install", *sys.argv[1:]]
    main()
''')


def _plugins_install(python: str, url: str, home: Path, cwd: Path) -> subprocess.CompletedProcess:
    """`hermes plugins install <url> --enable`, non-interactive (stdin closed), in that Python."""
    args = [url, "--enable"]
    if _host_version(python).startswith("0.22"):
        cmd = [python, "-c", PM_STANDIN, *args]
    else:
        cmd = [str(Path(python).with_name("hermes")), "plugins", "install", *args]
    return subprocess.run(cmd, env=_env(home), capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL, cwd=str(cwd))


def _host_version(python: str) -> str:
    r = subprocess.run([python, "-c", "import hermes_cli; print(hermes_cli.__version__)"], capture_output=True,
                       text=True, timeout=120)
    return r.stdout.strip()


def _route_python(host) -> str:
    """The host's Python as a user of that host has it before installing us: on 0.22 a venv with
    the host alone (no PyYAML, no lossless_context); 0.19/0.20 are the suite's host venvs."""
    if host.label != "0.22":
        return host.python
    try:
        return clean_host_python("0.22")
    except HostUnavailable as exc:
        pytest.skip(f"clean Hermes 0.22 venv: {exc}")


def _run_cli_hint(hint: str, home: Path, cwd: Path) -> subprocess.CompletedProcess:
    """Run `lcm status` the way /lcm cli says to."""
    if "alias lcm=" in hint:
        value = shlex.split(hint.split("alias lcm=", 1)[1].splitlines()[0])[0]
        cmd = ["bash", "-c", value + " status"]
    else:
        cmd = [hint.split(" is ", 1)[1].splitlines()[0].strip(), "status"]
    return subprocess.run(cmd, env=_env(home), capture_output=True, text=True, timeout=300, cwd=str(cwd))


@pytest.mark.parametrize("route", ["git-url", "directory"])
def test_plugin_folder_routes_load_the_engine(tmp_path, hermes_host, route):
    """`hermes plugins install <git URL> --enable` (non-interactive), or a copy of the checkout in
    $HERMES_HOME/plugins/lcm/: the host's own loader registers our engine from that folder, /lcm
    answers, and /lcm cli gives a working command line. On 0.22 in a venv without PyYAML."""
    python = _route_python(hermes_host)
    repo = _git_repo(tmp_path)
    home = tmp_path / "home" / ".hermes"
    home.mkdir(parents=True)
    folder = home / "plugins" / "lcm"
    if route == "git-url":
        r = _plugins_install(python, f"file://{repo}", home, tmp_path)
        out = r.stdout + r.stderr
        assert r.returncode == 0, out
        assert "flagged" not in out and "Blocked" not in out and "caution" not in out, out
        cfg = load_yaml((home / "config.yaml").read_text())
        assert "lcm" in cfg["plugins"]["enabled"]
    else:
        shutil.copytree(repo, folder, ignore=shutil.ignore_patterns(".git"))
    assert (folder / "plugin.yaml").is_file() and (folder / "lossless_context" / "engine.py").is_file()
    if hermes_host.label == "0.22":
        assert subprocess.run([python, "-c", "import yaml"], capture_output=True).returncode != 0
        assert subprocess.run([python, "-c", "import lossless_context"], capture_output=True,
                              cwd=str(tmp_path)).returncode != 0
    with FakeOpenAI(responder=Router(chat=ChatResponder(reply_chars=300))) as srv:
        run = run_hermes(srv, ["hello", {"command": "/lcm status"}, {"command": "/lcm cli"}], engine="lcm",
                         plugin_mode="none", hermes_home=home, home=home.parent, python=python,
                         hide_entry_point=True, extra_config={"plugins": {"enabled": ["lcm"]}})
    assert run.ok, run.describe()
    assert run.engine["class"] == "lossless_context.engine.LCMEngine", run.describe()
    assert run.engine["file"].startswith(str(folder)), run.engine  # the folder's code, not an installed copy
    status = run.turns[1]["command_output"]
    assert "LCM engine" in status and "config:" not in status, status
    hint = run.turns[2]["command_output"]
    if hermes_host.label == "0.22":
        assert "alias lcm=" in hint and str(folder) in hint, hint
    r = _run_cli_hint(hint, home, tmp_path)
    assert r.returncode == 0 and "store" in r.stdout.lower(), r.stdout + r.stderr
    listed = subprocess.run([str(Path(python).with_name("hermes")), "plugins", "list"], env=_env(home),
                            capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert "lcm" in listed.stdout


@pytest.mark.hosts("0.22")
def test_pip_route_into_a_clean_host_pulls_no_pyyaml(tmp_path, hermes_host):
    """`pip install <clone>` into a 0.22 host's Python (a venv with the host alone): no PyYAML
    comes with it, the entry point loads our engine, and the `lcm` command works."""
    repo = _git_repo(tmp_path)
    venv = tmp_path / "venv"
    clean = Path(_route_python(hermes_host))
    # a copy of the clean host venv (site-packages and all), so the shared one stays clean
    subprocess.run(["cp", "-a", str(clean.parent.parent), str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "venv", "--upgrade", str(venv)], check=True, capture_output=True)
    r = subprocess.run([str(python), "-m", "pip", "install", "-q", str(repo)], capture_output=True, text=True,
                       timeout=900, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout + r.stderr
    assert subprocess.run([str(python), "-c", "import yaml"], capture_output=True).returncode != 0
    home = tmp_path / "home" / ".hermes"
    home.mkdir(parents=True)
    with FakeOpenAI(responder=Router(chat=ChatResponder(reply_chars=300))) as srv:
        run = run_hermes(srv, ["hello", {"command": "/lcm cli"}], engine="lcm", hermes_home=home,
                         home=home.parent, python=str(python))
    assert run.ok, run.describe()
    assert run.engine["class"] == "lossless_context.engine.LCMEngine"
    assert "site-packages" in run.engine["file"], run.engine
    hint = run.turns[1]["command_output"]
    assert str(venv / "bin" / "lcm") in hint, hint
    r = _run_cli_hint(hint, home, tmp_path)
    assert r.returncode == 0 and "store" in r.stdout.lower(), r.stdout + r.stderr


@pytest.mark.hosts("0.22")
def test_the_hosts_repository_scan_and_validation_are_clean(tmp_path, hermes_host):
    """What `hermes plugins install` scans (the whole clone) comes out `safe` -- no finding at
    caution level or above -- and `hermes plugins validate` (the catalog's admission gate) passes."""
    repo = _git_repo(tmp_path)
    probe = textwrap.dedent('''
        import json, sys
        from pathlib import Path
        from tools.plugin_guard import scan_plugin, should_allow_plugin_install
        r = scan_plugin(Path(sys.argv[1]))
        allowed, why = should_allow_plugin_install(r)
        print(json.dumps({"verdict": r.verdict, "allowed": allowed, "why": why,
                          "high": [(f.severity, f.pattern_id, f.file, f.line) for f in r.findings
                                   if f.severity in ("high", "critical")]}))
    ''')
    r = subprocess.run([hermes_host.python, "-c", probe, str(repo)], capture_output=True, text=True, timeout=600,
                       cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["verdict"] == "safe" and out["allowed"] is True and out["high"] == [], out
    home = tmp_path / "vh"
    home.mkdir()
    v = subprocess.run([str(hermes_host.hermes), "plugins", "validate", str(repo)], env=_env(home),
                       capture_output=True, text=True, timeout=600, cwd=str(tmp_path))
    text = v.stdout + v.stderr
    assert v.returncode == 0 and "Validation passed" in text, text
    for line in ("requires_hermes — spec '>=0.19.0' parses", "external runtime", "security scan — safe",
                 "declared tools — matches registrations"):
        assert line in text, text


ROOT_PROBE = textwrap.dedent('''
    import builtins, importlib.util, json, logging, sys
    records = []
    class Keep(logging.Handler):
        def emit(self, record): records.append((record.levelname, record.getMessage()))
    logging.getLogger("lossless_context").addHandler(Keep())
    before = set(sys.modules); path = list(sys.path)
    spec = importlib.util.spec_from_file_location("hermes_plugins.lcm_probe", sys.argv[1])
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
    new = sorted(m for m in set(sys.modules) - before if "lossless" in m)
    real_import = builtins.__import__
    def no_yaml(name, *a, **k):  # a host without PyYAML (the 0.22 line)
        if name == "yaml" or name.startswith("yaml."):
            raise ImportError("No module named 'yaml'")
        return real_import(name, *a, **k)
    builtins.__import__ = no_yaml
    class Ctx:
        engine = None
        def register_context_engine(self, e): self.engine = e
        def register_command(self, *a, **k): pass
    ctx = Ctx()
    try:
        mod.register(ctx)
        err = ""
    except ImportError as exc:
        err = str(exc)
    cfg = ctx.engine.config if ctx.engine is not None else None
    print(json.dumps({"new": new, "path_same": path == sys.path, "err": err,
                      "engine": getattr(ctx.engine, "name", None),
                      "threshold": getattr(cfg, "threshold", None), "warnings": list(getattr(cfg, "warnings", [])),
                      "records": records}))
''')


def _root_probe(python: str, init: Path, home: Path, cwd: Path) -> dict:
    env = _env(home)
    r = subprocess.run([python, "-c", ROOT_PROBE, str(init)], capture_output=True, text=True, timeout=120,
                       cwd=str(cwd), env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_root_plugin_registers_without_pyyaml_and_has_no_import_side_effects(tmp_path, hermes_host):
    """The root __init__.py imports nothing at import time; register() works in a host without
    PyYAML and still reads config.yaml (with ruamel.yaml, which every Hermes ships)."""
    home = tmp_path / "home" / ".hermes"
    home.mkdir(parents=True)
    (home / "config.yaml").write_text("lcm:\n  threshold: 0.7   # from the user's config\n")
    out = _root_probe(hermes_host.python, ROOT / "__init__.py", home, tmp_path)
    assert out["new"] == [] and out["path_same"]
    assert out["err"] == "" and out["engine"] == "lcm"
    assert out["threshold"] == 0.7 and out["warnings"] == []
    assert not [r for r in out["records"] if r[0] in ("WARNING", "ERROR")], out["records"]
    text = (ROOT / "__init__.py").read_text()
    assert "register_context_engine" in text and "MemoryProvider" not in text


def test_root_plugin_from_an_incomplete_checkout_says_why_at_warning(tmp_path, hermes_host):
    """What the user needs to know reaches the host's log at WARNING (hosts log a plugin's own
    exception at DEBUG only), and the error the host records for the plugin names the cause."""
    folder = tmp_path / "plugins" / "lcm"
    folder.mkdir(parents=True)
    shutil.copy2(ROOT / "__init__.py", folder / "__init__.py")
    shutil.copy2(ROOT / "plugin.yaml", folder / "plugin.yaml")  # no lossless_context/ beside them
    home = tmp_path / "home" / ".hermes"
    home.mkdir(parents=True)
    out = _root_probe(hermes_host.python, folder / "__init__.py", home, tmp_path)
    assert "this checkout is incomplete" in out["err"] and out["engine"] is None
    warned = [m for lvl, m in out["records"] if lvl == "WARNING"]
    assert warned and "built-in compressor" in warned[0] and "incomplete" in warned[0], out["records"]


# -- the name clash -----------------------------------------------------------------------------------

REAL_WINNER = textwrap.dedent('''
    import json
    from hermes_cli.plugins import discover_plugins, get_plugin_context_engine
    discover_plugins()
    eng = get_plugin_context_engine()
    print(json.dumps({"name": getattr(eng, "name", None), "module": type(eng).__module__ if eng else None}))
''')


def _home_with_rival(tmp_path: Path, enabled: list[str]) -> Path:
    home = tmp_path / "h" / ".hermes"
    rival = home / "plugins" / "hermes-lcm"
    rival.mkdir(parents=True)
    (rival / "plugin.yaml").write_text("name: hermes-lcm\ndescription: rival\nversion: 1.0\n")
    (rival / "__init__.py").write_text(RIVAL_INIT)
    (home / "config.yaml").write_text("context:\n  engine: lcm\nplugins:\n  enabled: [" + ", ".join(enabled) + "]\n")
    return home


def _real_winner(home: Path, tmp_path: Path) -> str:
    r = subprocess.run([sys.executable, "-c", REAL_WINNER], env=_env(home), capture_output=True, text=True,
                       timeout=300, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])["module"]


def test_rival_claiming_lcm_is_reported_and_matches_the_real_loader(tmp_path):
    home = _home_with_rival(tmp_path, ["hermes-lcm", "lcm"])
    res = resolve(home)
    assert res.winner is not None and res.winner.key == "hermes-lcm" and not res.ours
    lines = "\n".join(res.lines())
    assert "NOT lossless-context" in lines and "hermes plugins disable hermes-lcm" in lines
    assert "lcm install --mode bundled" in lines
    # the prediction is what the real host loader does
    assert not _real_winner(home, tmp_path).startswith("lossless_context")
    # lcm install says it too
    r = CliRunner().invoke(lcm_main, ["install", "--hermes-home", str(home)])
    assert r.exit_code == 0 and "NOT lossless-context" in r.stderr


def test_disabled_rival_leaves_ours(tmp_path):
    home = _home_with_rival(tmp_path, ["lcm"])
    res = resolve(home)
    assert res.ours and res.winner.source == "entrypoint"
    lines = "\n".join(res.lines())
    assert "the host will load" in lines and "[not enabled]" in lines and "NOT" not in lines
    assert _real_winner(home, tmp_path).startswith("lossless_context")


def test_no_rival_no_report(tmp_path):
    home = tmp_path / "x" / ".hermes"
    home.mkdir(parents=True)
    (home / "config.yaml").write_text("plugins:\n  enabled: [lcm]\n")
    assert resolve(home).lines() == []
    r = CliRunner().invoke(lcm_main, ["install", "--hermes-home", str(home)])
    assert r.exit_code == 0 and "claims" not in r.stderr + r.output


@pytest.mark.hosts("0.22")
def test_the_catalog_entry_draft_matches_the_plugin_and_the_hosts_catalog_parser(tmp_path, hermes_host):
    """docs/catalog-entry.yaml parses as a catalog entry with the host's own parser (the pin
    filled in), and says what plugin.yaml and pyproject.toml say (version, requires_hermes,
    capabilities)."""
    import tomllib

    entry = load_yaml((ROOT / "docs" / "catalog-entry.yaml").read_text())
    manifest = load_yaml((ROOT / "plugin.yaml").read_text())
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert entry["version"] == manifest["version"] == version
    assert entry["requires_hermes"] == manifest["requires_hermes"]
    for key in ("provides_tools", "provides_hooks", "requires_env"):
        assert entry["capabilities"][key] == manifest.get(key, []), key
    assert manifest["python_runtime"] == "external"
    probe = textwrap.dedent('''
        import json, sys
        from hermes_cli.plugin_catalog import entry_from_mapping
        data = json.loads(sys.argv[1])
        data["sha"] = "a" * 40  # the owner pins a release commit
        e = entry_from_mapping(data, "lossless-context.yaml")
        print(json.dumps(e.to_dict() if e is not None else None))
    ''')
    r = subprocess.run([hermes_host.python, "-c", probe, json.dumps(entry)], capture_output=True, text=True,
                       timeout=300, cwd=str(tmp_path), env=_env(tmp_path / "h"))
    assert r.returncode == 0, r.stderr
    parsed = json.loads(r.stdout.strip().splitlines()[-1])
    assert parsed is not None, r.stderr  # the host logs why it rejects an entry
    assert parsed["name"] == "lossless-context" and parsed["category"] == "memory"
    assert parsed["version"] == version and parsed["requires_hermes"] == manifest["requires_hermes"]
