"""Install routes against the real host CLI (0.19.0), and the `lcm` name clash (issue #18).

* `hermes plugins install <local git URL>`: the repository root is itself a plugin folder;
  the host's own plugin loader then registers our engine from the cloned checkout.
* The root `__init__.py` has no import-time effects and reports a missing dependency.
* Another plugin claiming `lcm` (as LCM-X does): `lossless_context.hermes.nameclash` predicts which
  engine the real host loader registers, and `lcm install` says so and how to choose ours.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from lossless_context.cli.commands import lcm as lcm_main
from lossless_context.hermes.nameclash import resolve

ROOT = Path(__file__).resolve().parents[1]
HERMES = Path(sys.executable).with_name("hermes")

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


LOAD_FOLDER = textwrap.dedent('''
    import json, sys, time
    from pathlib import Path
    from hermes_cli.plugins import PluginManager
    folder = Path(sys.argv[1])
    t0 = time.perf_counter()
    pm = PluginManager()
    # the host's own directory-plugin parsing and loading, for exactly this folder
    manifests = [m for m in pm._scan_directory(folder.parent, source="user") if m.path and Path(m.path) == folder]
    assert manifests, "the host did not recognise the folder as a plugin"
    pm._load_plugin(manifests[0])
    took = time.perf_counter() - t0
    eng = pm._context_engine
    import lossless_context
    print(json.dumps({"engine": getattr(eng, "name", None), "cls": type(eng).__module__,
                      "pkg": lossless_context.__file__, "seconds": took,
                      "errors": [p.error for p in pm._plugins.values() if p.error]}))
''')


@pytest.mark.skipif(not HERMES.exists(), reason="the hermes CLI of the installed host is needed")
def test_hermes_plugins_install_from_a_local_git_url(tmp_path):
    repo = _git_repo(tmp_path)
    home = tmp_path / "home" / ".hermes"
    home.mkdir(parents=True)
    r = subprocess.run([str(HERMES), "plugins", "install", f"file://{repo}", "--enable"], env=_env(home),
                       capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout + r.stderr
    folder = home / "plugins" / "lcm"
    assert (folder / "plugin.yaml").is_file() and (folder / "__init__.py").is_file()
    assert (folder / "lossless_context" / "engine.py").is_file()
    import yaml

    cfg = yaml.safe_load((home / "config.yaml").read_text())
    assert "lcm" in cfg["plugins"]["enabled"]
    r = subprocess.run([sys.executable, "-c", LOAD_FOLDER, str(folder)], env=_env(home), capture_output=True,
                       text=True, timeout=300, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["engine"] == "lcm" and out["errors"] == []
    # the engine came from the cloned checkout, not from this test's installed copy
    assert out["pkg"].startswith(str(folder)), out
    listed = subprocess.run([str(HERMES), "plugins", "list"], env=_env(home), capture_output=True, text=True,
                            timeout=300)
    assert "lcm" in listed.stdout


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
