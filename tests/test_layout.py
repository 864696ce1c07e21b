"""The layout rules import-linter cannot check, and import-linter's own contracts (issues #22, #42).

The import rules are declared once, in pyproject.toml's `[tool.importlinter]`, and checked by
`lint-imports` (`.ci/run` runs it; `test_the_import_contracts_hold` runs it here): the layers,
lazy imports included; the one module that imports the host; the core never importing the CLI, the
Hermes adapter, the demo or the MCP server; no import cycles. This file runs those contracts, checks
that their lists cover the package and match the README's layout table, and runs them once on a
copy of the package broken on purpose, so a contract that cannot fail would fail here.

What import-linter does not do is checked here on the source, read with `ast`:

* nothing uses another module's private names (`x._name` on anything but `self`/`cls`), but
  for the few listed below, each with the reason it is not such a use;
* no file over 800 lines, but for the listed ones, which are due to be split;
* code names say "summarize" (the host's and our config's spelling); prose may say "summarise".

Each of these rules also runs on a small synthetic package that breaks it.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "lossless_context"
HOST_MODULE = "lossless_context.hostapi"  # the one module that imports Hermes (the lowest layer)
# (module, name, attribute): private names used on something other than self/cls, and why that is fine
PRIVATE_OK = {
    ("lossless_context.engine", "engine", "_config"): "another LCMEngine, inside LCMEngine's own module",
    ("lossless_context.engine", "engine", "_store"): "another LCMEngine, inside LCMEngine's own module",
    ("lossless_context.engine", "engine", "_worker"): "another LCMEngine, inside LCMEngine's own module",
    **{("lossless_context.engine", "new", a): "the deep copy LCMEngine.__deepcopy__ builds of itself"
       for a in ("_config", "_family", "_init_runtime_state", "_model", "_overrides", "_provider", "_runtime")},
    ("lossless_context.config", "cfg", "_apply"): "an LCMConfig, inside LCMConfig's own module",
    ("lossless_context.config", "cfg", "_cross_check"): "an LCMConfig, inside LCMConfig's own module",
    ("lossless_context.cli.commands", "h", "_lcm_cli"): "a marker the CLI sets on its own log handler",
    ("lossless_context.mcp_server.server", "os", "_exit"): "the standard library's exit that waits for no thread",
}
PRIVATE_IMPORT_OK = {  # (module, relative module it imports private names from): why that is fine
    ("lossless_context.demo.sessions", "session_data"): "the demo's data tables, split out of their only user",
}
NAMEDTUPLE_API = {"_replace", "_asdict", "_fields", "_make"}
LONG_FILES: set[str] = set()  # files over 800 lines allowed (none: engine.py and cli.py are split)


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def load(root: Path) -> dict[str, tuple[Path, ast.Module]]:
    return {module_name(root, p): (p, ast.parse(p.read_text(encoding="utf-8"))) for p in sorted(root.rglob("*.py"))}


def private_violations(mods: dict) -> list[str]:
    bad = []
    for m, (_path, tree) in mods.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute):
                continue
            attr = node.attr
            if not attr.startswith("_") or attr.startswith("__") or attr in NAMEDTUPLE_API:
                continue
            v = node.value
            if isinstance(v, ast.Name) and v.id in ("self", "cls"):
                continue
            if isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "super":
                continue
            who = v.id if isinstance(v, ast.Name) else ast.unparse(v)
            if (m, who, attr) not in PRIVATE_OK:
                bad.append(f"{m}:{node.lineno} {who}.{attr}")
        for node in ast.walk(tree):  # `from .x import _name` reaches into x just the same
            if isinstance(node, ast.ImportFrom) and node.level and (m, node.module) not in PRIVATE_IMPORT_OK:
                bad.extend(f"{m}:{node.lineno} imports {node.module}.{a.name}" for a in node.names
                           if a.name.startswith("_") and not a.name.startswith("__"))
    return sorted(bad)


def british_names(mods: dict) -> list[str]:
    """Names defined or used in code (functions, classes, variables, arguments, attributes)
    spelled "summaris…"."""
    bad = set()
    for m, (_, tree) in mods.items():
        for n in ast.walk(tree):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names = [n.name]
            elif isinstance(n, ast.Name):
                names = [n.id]
            elif isinstance(n, ast.Attribute):
                names = [n.attr]
            elif isinstance(n, ast.arg) or (isinstance(n, ast.keyword) and n.arg):
                names = [n.arg]
            else:
                continue
            bad.update(f"{m}: {x}" for x in names if "summaris" in x.lower())
    return sorted(bad)


def long_files(root: Path, limit: int = 800) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*.py")
            if len(p.read_text(encoding="utf-8").splitlines()) > limit}


# -- import-linter's contracts (pyproject.toml [tool.importlinter]) -----------------------------

def contracts() -> dict[str, dict]:
    """The contracts declared in pyproject.toml, by id."""
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
    return {c["id"]: c for c in cfg["contracts"]}


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """Run `lint-imports` (the one .ci/run runs, from this interpreter's environment) on the
    pyproject.toml and the lossless_context package found in `root`."""
    exe = Path(sys.executable).with_name("lint-imports")
    assert exe.exists(), f"{exe} missing: import-linter comes with the [test] extra"
    env = {**os.environ, "PYTHONPATH": str(root)}  # the package in root, not the installed one
    return subprocess.run([str(exe), "--no-cache", "--no-logo"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)


def _within(m: str, package: str) -> bool:
    return m == package or m.startswith(package + ".")


def layer_groups(contract: dict, container: str) -> list[list[str]]:
    """The layers of a layers contract, highest first, as groups of absolute module names: an
    independent layer (`a | b`) is one group per module, a layer of siblings that may import each
    other (`a : b`) one group."""
    groups = []
    for layer in contract["layers"]:
        sep = ":" if ":" in layer else "|"
        names = [f"{container}.{n.strip()}" for n in layer.split(sep)]
        groups.extend([names] if sep == ":" else [[n] for n in names])
    return groups


def test_the_import_contracts_hold():
    run = lint_imports(ROOT)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    assert f"Contracts: {len(contracts())} kept, 0 broken." in out, out


def test_the_contracts_cover_the_package():
    mods = {module_name(PKG, p) for p in PKG.rglob("*.py")}
    top = {".".join(m.split(".")[:2]) for m in mods} - {"lossless_context"}
    c = contracts()
    # every module but hostapi.py is a source of the host rule (a new module must be listed there)
    host_sources = c["host-imports"]["source_modules"]
    assert sorted(m for m in mods - {"lossless_context", HOST_MODULE}
                  if not any(_within(m, s) for s in host_sources)) == []
    # the package root, which no contract can list without its children, keeps to relative
    # imports of its own modules
    tree = ast.parse((PKG / "__init__.py").read_text(encoding="utf-8"))
    assert [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Import)
            or (isinstance(n, ast.ImportFrom) and not n.level and n.module != "__future__")] == []
    assert not any(_within(HOST_MODULE, s) for s in host_sources)
    # the core (the sources) and the outer parts (the forbidden) together are the whole package
    outer = c["core-never-imports-outer"]
    assert set(outer["source_modules"]) | set(outer["forbidden_modules"]) == top
    assert not set(outer["source_modules"]) & set(outer["forbidden_modules"])
    # the host adapter is the lowest layer, alone
    assert layer_groups(c["layers"], "lossless_context")[-1] == [HOST_MODULE]


def readme_layout(readme: Path) -> list[tuple[list[str], str]]:
    """(paths, layer) of each row of the README's layout table."""
    text = readme.read_text(encoding="utf-8")
    block = text.split("<!-- layout:", 1)[1].split("\n\n", 1)[0]
    rows = []
    for line in block.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or cells[0] in ("path", "---") or not cells[0].startswith("`"):
            continue
        rows.append(([p.strip("`/ ") for p in cells[0].split(",")], cells[1]))
    return rows


def test_the_readme_layout_table_matches_the_package():
    """Each path of the table is in the package and the package is in the table; rows that name
    the same layer sit in the same group of the layers contract, and rows that name different
    layers in different groups."""
    rows = readme_layout(ROOT / "README.md")
    listed = {p: layer for paths, layer in rows for p in paths}
    top = {p.name for p in PKG.iterdir() if p.suffix == ".py" and p.stem != "__init__"} - {"hermes_plugin.py"}
    folders = {p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert set(listed) == top | folders, "README's layout table and the package differ"
    groups = layer_groups(contracts()["layers"], "lossless_context")

    def group(path: str) -> int:
        mod = "lossless_context." + path.removesuffix(".py")
        found = {i for i, g in enumerate(groups) for m in g if _within(m, mod) or _within(mod, m)}
        assert len(found) == 1, (path, found)
        return found.pop()

    by_layer: dict[str, set[int]] = {}
    for path, layer in listed.items():
        by_layer.setdefault(layer, set()).add(group(path))
    assert all(len(g) == 1 for g in by_layer.values()), by_layer
    assert len({min(g) for g in by_layer.values()}) == len(by_layer), by_layer


def test_the_contracts_catch_violations(tmp_path):
    """The contracts, run on a copy of the package with one breach of each rule, report each."""
    shutil.copytree(PKG, tmp_path / "lossless_context", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    pkg = tmp_path / "lossless_context"

    def append(rel: str, src: str) -> None:
        with (pkg / rel).open("a", encoding="utf-8") as f:
            f.write(textwrap.dedent(src))

    append("store/guard.py", "\n\ndef _up():\n    from ..engine import LCMEngine  # a store reaching up to the engine\n    return LCMEngine\n")
    append("sessions/forks.py", "\n\ndef _host():\n    import run_agent  # the host, outside hostapi.py\n    return run_agent\n")
    append("ops/retention.py", "\n\ndef _outer():\n    from .. import cli  # the core importing the CLI\n    return cli\n")
    append("hostapi.py", "\n\ndef _spec():\n    from .contract import spec  # the host adapter reaching up\n    return spec\n")
    (pkg / "pipeline" / "loop_a.py").write_text("from . import loop_b\n", encoding="utf-8")
    (pkg / "pipeline" / "loop_b.py").write_text("def f():\n    from . import loop_a  # lazy: still a cycle\n", encoding="utf-8")
    (pkg / "newpart.py").write_text('"""A module given no layer."""\n', encoding="utf-8")
    run = lint_imports(tmp_path)
    out = run.stdout + run.stderr
    assert run.returncode != 0, out
    for c in contracts().values():
        assert f"{c['name']} BROKEN" in out, (c["id"], out)
    for breach in ("lossless_context.store.guard -> lossless_context.engine",
                   "lossless_context.sessions.forks -> run_agent",
                   "lossless_context.ops.retention -> lossless_context.cli",
                   "lossless_context.hostapi -> lossless_context.contract.spec",
                   ".loop_b -> .loop_a", "newpart"):
        assert breach in out, (breach, out)


# -- the rules import-linter does not check ------------------------------------------------------

def test_no_module_uses_another_modules_private_names():
    assert private_violations(load(PKG)) == []


def test_code_names_spell_summarize_one_way():
    assert british_names(load(PKG)) == []


def test_files_stay_small():
    over = long_files(PKG)
    assert over <= LONG_FILES, f"over 800 lines: {sorted(over - LONG_FILES)}"
    assert LONG_FILES <= over, f"split already: drop {sorted(LONG_FILES - over)} from LONG_FILES"


def _fake(tmp_path: Path, files: dict[str, str]) -> dict:
    root = tmp_path / "lossless_context"
    for rel, src in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(src), encoding="utf-8")
    (root / "__init__.py").touch()
    return load(root)


def test_the_checks_catch_violations(tmp_path):
    mods = _fake(tmp_path, {
        "engine.py": """
            def f(store):
                return store._write(1)
        """,
        "c.py": "from .b import _hidden\ndef presummarise(): pass\n",
        "b.py": "_hidden = 1\n",
    })
    assert private_violations(mods) == ["lossless_context.c:1 imports b._hidden", "lossless_context.engine:3 store._write"]
    assert british_names(mods) == ["lossless_context.c: presummarise"]
    (tmp_path / "lossless_context" / "big.py").write_text("x = 1\n" * 801)
    assert long_files(tmp_path / "lossless_context") == {"big.py"}
