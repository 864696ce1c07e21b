"""The README is checked against the code: its configuration table lists exactly the fields
of LCMConfig, with their real defaults (a key added to one and not the other fails here)."""

from __future__ import annotations

import dataclasses
import textwrap
import re
from pathlib import Path

from lossless_context.config import LCMConfig

README = Path(__file__).resolve().parent.parent / "README.md"


def config_rows() -> dict[str, str]:
    """{key: README default} from the table under '## Configuration' (a row may name several
    keys, `a` / `b`, with defaults `x` / `y`)."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Configuration"):]
    section = section[:section.index("\n## ", 1)]
    rows: dict[str, str] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        keys = re.findall(r"`([^`]+)`", cells[0])
        defaults = re.findall(r"`([^`]*)`", cells[1])
        assert len(keys) == len(defaults), f"README row {line!r}: keys and defaults do not pair up"
        for k, d in zip(keys, defaults):
            assert k not in rows, f"README lists {k!r} twice"
            rows[k] = d
    return rows


def fields() -> dict[str, object]:
    return {f.name: f.default for f in dataclasses.fields(LCMConfig) if f.default is not dataclasses.MISSING}


def test_the_readme_configuration_table_lists_every_config_key_and_nothing_else():
    documented, real = set(config_rows()), set(fields())
    assert real - documented == set(), f"config keys missing from the README table: {sorted(real - documented)}"
    assert documented - real == set(), f"README table keys that LCMConfig does not have: {sorted(documented - real)}"


def test_the_readme_defaults_are_the_real_defaults():
    rows = config_rows()
    for name, default in fields().items():
        shown = rows[name]
        if name == "store":  # "" means the path under HERMES_HOME, which the README names
            assert default == "" and "lcm.db" in shown
        elif isinstance(default, bool):
            assert shown == str(default).lower(), (name, shown, default)
        elif isinstance(default, (int, float)):
            assert float(shown) == float(default), (name, shown, default)
        else:
            assert shown.strip('"') == default, (name, shown, default)


# --------------------------------------------------------------------------- docs checked like code
# (issue #37) Every check below also runs on a small text that breaks it (`test_the_doc_checks_can_fail`).

import ast  # noqa: E402
import importlib.util  # noqa: E402

ROOT = README.parent
PKG = ROOT / "lossless_context"
DOCS = sorted((ROOT / "docs").glob("*.md"))
CONCURRENCY = ROOT / "docs" / "concurrency.md"
HOST_CONTRACT = ROOT / "docs" / "host-contract.md"
RESULTS = ROOT / "bench" / "RESULTS.md"
# Names in the README that look like placeholders but are real (environment variables, SQL).
PLACEHOLDER = re.compile(r"\b(?:TODO|TBD|FIXME|XXX)\b|\b[A-Z][A-Z0-9]+(?:_[A-Z0-9]+)+\b")
REAL_NAMES = re.compile(r"^(?:LCM_[A-Z0-9_]+|HERMES_[A-Z_]+|MY_SUMMARY_KEY|PG[A-Z]+|SKIP_LOCKED|FOR_UPDATE)$")
# Where a cited path may live: the repository, or inside the package (README and docs say `store/guard.py`).
OUR_PREFIXES = ("lossless_context/", "tests/", "bench/", "docs/", ".ci/", "cli/", "contract/", "demo/", "hermes/",
                "ops/", "pipeline/", "search/", "store/", "summarizers/")
GENERATED = ("bench/out/",)  # written by a run, not committed


def placeholders(text: str) -> list[str]:
    """ALL_CAPS_WORDS (outside code spans) and TODO-like words: a value someone meant to fill in."""
    prose = re.sub(r"`[^`]*`", "", re.sub(r"```.*?```", "", text, flags=re.S))
    return [w for w in PLACEHOLDER.findall(prose) if not REAL_NAMES.match(w)]


def test_the_readme_has_no_placeholders():
    assert placeholders(README.read_text(encoding="utf-8")) == []


def _cited(text: str) -> list[str]:
    """Paths of ours in code spans: `store/guard.py`, `store/guard._BREAKERS`, `bench/RESULTS.md`."""
    out = []
    for span in re.findall(r"`([^`\n]+)`", text):
        tok = span.strip().split("(")[0].split(" ")[0].split(":")[0].rstrip(",;")
        if tok.startswith(OUR_PREFIXES) and not tok.startswith(GENERATED) and "<" not in tok and "*" not in tok:
            out.append(tok)
    return out


def path_exists(tok: str) -> bool:
    """A cited path exists: as written from the repository root or from the package, a file, a
    folder, or a module followed by `.name` (`store/guard._BREAKERS`)."""
    for base in (ROOT, PKG):
        if (base / tok).exists():
            return True
        head, _, tail = tok.rpartition("/")
        stem = tail.split(".")[0]
        if stem and (base / head / f"{stem}.py").exists():
            return True
    return False


def _doc_texts() -> dict[str, str]:
    texts = {p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf-8") for p in [README, RESULTS, *DOCS]}
    for init in sorted(PKG.rglob("__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
        if doc:
            texts[init.relative_to(ROOT).as_posix()] = doc
    return texts


def test_every_cited_path_exists():
    missing = [f"{name}: `{tok}`" for name, text in _doc_texts().items() for tok in _cited(text)
               if not path_exists(tok)]
    assert missing == [], "cited paths that do not exist:\n" + "\n".join(missing)


def _all_module_names() -> set[str]:
    return {p.stem for p in PKG.rglob("*.py") if not p.stem.startswith("__")} | {
        p.name for p in PKG.rglob("*") if p.is_dir() and (p / "__init__.py").exists()}


def _modules_of(pkg: Path) -> set[str]:
    return {p.stem for p in pkg.glob("*.py") if not p.stem.startswith("__")} | {
        p.name for p in pkg.iterdir() if p.is_dir() and (p / "__init__.py").exists()}


def docstring_problems(pkg: Path, doc: str, elsewhere: set[str] | None = None) -> list[str]:
    """A package docstring names its real modules, and all of them: every module of the package
    is named; a name written as a file (`ingest.py`) is one of its modules or of the package's
    top level; and a bare name of a module that lives in another folder (`elsewhere`: every
    module name of the tree) is not claimed here — the module moved."""
    have = _modules_of(pkg)
    elsewhere = _all_module_names() if elsewhere is None else elsewhere
    problems, named = [], set()
    for span in re.findall(r"`([^`\n]+)`", doc):
        tok = span.strip().removesuffix("/")
        as_file = tok.endswith(".py")
        tok = tok.removesuffix(".py")
        if not re.fullmatch(r"[a-z_][a-z0-9_]*(?:[./][A-Za-z_][A-Za-z0-9_]*)*", tok):
            continue  # a command, a phrase, a class
        first = re.split(r"[./]", tok)[0]
        if first in have:
            named.add(first)
        elif "." in tok or "/" in tok:  # a path from the package's top: `store.base.Store`, `sessions/forks.py`
            if importlib.util.find_spec(f"lossless_context.{first}") is None and not (PKG / first).exists() \
                    and importlib.util.find_spec(first) is None:
                problems.append(f"`{span}` is not a module of {pkg.name}/ (or of the package)")
        elif as_file or first in elsewhere:
            if not ((PKG / f"{first}.py").exists() or (PKG / first).is_dir()):
                problems.append(f"`{span}` is not a module of {pkg.name}/ (or of the package)")
    problems += [f"module {m} is not named" for m in sorted(have - named)]
    return problems


def test_package_docstrings_name_their_real_modules():
    problems = []
    for init in sorted(PKG.rglob("__init__.py")):
        pkg = init.parent
        if pkg == PKG or pkg.name == "plugin_files":
            continue  # the top package's docstring is about the engine; plugin_files is data
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        problems += [f"{pkg.relative_to(ROOT)}: {p}" for p in docstring_problems(pkg, doc)]
    assert problems == [], "\n".join(problems)


def github_anchor(heading: str) -> str:
    return re.sub(r"\s", "-", re.sub(r"[^\w\- ]", "", heading.strip().lower()))


def contract_anchors() -> set[str]:
    return {github_anchor(h) for h in re.findall(r"^#{1,6} (.+)$", HOST_CONTRACT.read_text(encoding="utf-8"), re.M)}


def _repo_texts() -> dict[str, str]:
    out = {}
    for p in [*ROOT.glob("*.md"), *ROOT.glob("*.toml"), *(ROOT / "docs").glob("*.md"), *(ROOT / ".ci").glob("*"),
              *PKG.rglob("*.py"), *(ROOT / "tests").rglob("*.py"), *(ROOT / "tests").rglob("*.md"),
              *(ROOT / "bench").glob("*.py"), *(ROOT / "bench").glob("*.md")]:
        if p.is_file():
            out[p.relative_to(ROOT).as_posix()] = p.read_text(encoding="utf-8", errors="replace")
    return out


def test_the_host_contract_is_ours_and_every_link_into_it_resolves():
    anchors = contract_anchors()
    bad, outside = [], []
    old_name = "HOST_" + "CONTRACT.md"  # (spelled apart so this file does not cite it)
    for name, text in _repo_texts().items():
        bad += [f"{name}: #{a}" for a in re.findall(r"host-contract\.md#([\w-]+)", text) if a not in anchors]
        if old_name in text:
            outside.append(name)
    assert bad == [], "links to sections docs/host-contract.md does not have:\n" + "\n".join(bad)
    assert outside == [], f"cite docs/host-contract.md, not a file outside the repository: {outside}"
    headings = HOST_CONTRACT.read_text(encoding="utf-8")
    for version in ("## 0.19.0", "## Upstream main, 0.20.0", "## The 0.22 line"):
        assert version in headings, f"docs/host-contract.md has no section {version!r}"


def tier0_claim(readme: str) -> tuple[int, ...]:
    m = re.search(r"tier 0\s+cuts what is sent to the summariser from ([\d,]+) to ([\d,]+) tokens \(built-in "
                  r"compressor:\s+([\d,]+)\) and summariser calls from (\d+) to (\d+) \(built-in: (\d+)\)", readme)
    assert m, "the README's tier-0 sentence changed: update tier0_claim()"
    return tuple(int(g.replace(",", "")) for g in m.groups())


def test_the_readme_tier0_figures_are_the_benchmark_s():
    rows = {}
    for line in RESULTS.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 7 and cells[0].startswith(("lossless-context", "built-in")):
            rows.setdefault(cells[0], (int(cells[2]), int(cells[4].replace(",", ""))))  # (calls, tokens sent)
    on, off = rows["lossless-context (ours, tier 0 on)"], rows["lossless-context (ours, tier 0 off)"]
    builtin = rows["built-in ContextCompressor"]
    assert tier0_claim(README.read_text(encoding="utf-8")) == (off[1], on[1], builtin[1], off[0], on[0], builtin[0])


# -- docs/concurrency.md: every thread, lock and process-wide registry of the package is listed

_LOCKS = {"Lock", "RLock", "Condition", "Semaphore", "BoundedSemaphore"}
_CONTAINERS = {"dict", "set", "list", "OrderedDict", "WeakSet", "WeakValueDictionary", "WeakKeyDictionary",
               "defaultdict", "local", "deque", "Counter"}
_MUTATORS = {"append", "add", "pop", "popitem", "setdefault", "update", "clear", "move_to_end", "discard", "remove",
             "extend", "insert", "appendleft"}
GENERIC_LOCKS = {"_lock", "lock", "_cv"}  # named with their class (`Breaker._lock`) to be told apart


def _call_name(node: ast.AST) -> str:
    if isinstance(node, ast.Call):
        f = node.func
        return f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
    return ""


def concurrency_facts(tree: ast.AST, module: str) -> dict[str, set[str]]:
    """What docs/concurrency.md must name for one module: its named threads, its locks (module-level
    `module._NAME`; an instance's `attr`, or `Class.attr` for a generic name) and its registries
    (module-level containers that functions change)."""
    threads: set[str] = set()
    locks: set[str] = set()
    tops: dict[str, int] = {}
    for node in getattr(tree, "body", []):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [t.id for t in targets if isinstance(t, ast.Name)]
            if _call_name(node.value) in _LOCKS:
                locks.update(f"{module}.{n}" for n in names)
            elif isinstance(node.value, (ast.Dict, ast.Set, ast.List)) or _call_name(node.value) in _CONTAINERS:
                tops.update((n, 1) for n in names if n != "__all__")
    for cls in [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]:
        for node in ast.walk(cls):
            if isinstance(node, ast.Assign) and _call_name(node.value) in _LOCKS:
                for t in node.targets:
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                        locks.add(f"{cls.name}.{t.attr}" if t.attr in GENERIC_LOCKS else t.attr)
    registries: set[str] = set()
    for fn in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
        for n in ast.walk(fn):
            if isinstance(n, (ast.Assign, ast.AugAssign, ast.Delete)):
                for t in (n.targets if isinstance(n, (ast.Assign, ast.Delete)) else [n.target]):
                    if isinstance(t, (ast.Subscript, ast.Attribute)) and isinstance(t.value, ast.Name) \
                            and t.value.id in tops:
                        registries.add(f"{module}.{t.value.id}")
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in _MUTATORS \
                    and isinstance(n.func.value, ast.Name) and n.func.value.id in tops:
                registries.add(f"{module}.{n.func.value.id}")
            if _call_name(n) in ("Thread", "ThreadPoolExecutor", "Timer"):
                kw = {k.arg: k.value for k in n.keywords}  # type: ignore[union-attr]
                val = kw.get("name") or kw.get("thread_name_prefix")
                if isinstance(val, ast.Constant):
                    threads.add(str(val.value))
                elif isinstance(val, ast.JoinedStr):  # f"lcm-bg-{i}": its constant head
                    threads.add("".join(str(v.value) for v in val.values if isinstance(v, ast.Constant)) + "N")
                else:
                    threads.add(f"<unnamed thread in {module}>")
    return {"threads": threads, "locks": locks, "registries": registries}


def concurrency_problems(facts: dict[str, set[str]], doc: str) -> list[str]:
    spans = set(re.findall(r"`([^`\n]+)`", doc))
    words = " ".join(spans)
    out = [f"thread {t} is not in the Threads table" for t in sorted(facts["threads"]) if f"`{t}`" not in doc]
    for lk in sorted(facts["locks"]):
        module, _, name = lk.rpartition(".") if lk.count("/") or lk.count(".") > 1 else ("", "", lk)
        if lk not in spans and not any(re.search(rf"(?<!\w){re.escape(x)}\b", words) for x in (lk, name)
                                       if "." in x or x not in GENERIC_LOCKS):
            out.append(f"lock {lk} is not listed")
    out += [f"registry {r} is not in the registries table" for r in sorted(facts["registries"]) if f"`{r}" not in doc]
    return out


def test_concurrency_doc_lists_every_thread_lock_and_registry():
    facts: dict[str, set[str]] = {"threads": set(), "locks": set(), "registries": set()}
    for path in sorted(PKG.rglob("*.py")):
        module = path.relative_to(PKG).with_suffix("").as_posix()
        for k, v in concurrency_facts(ast.parse(path.read_text(encoding="utf-8")), module).items():
            facts[k] |= v
    assert len(facts["threads"]) >= 7 and len(facts["registries"]) >= 10  # the scan itself works
    problems = concurrency_problems(facts, CONCURRENCY.read_text(encoding="utf-8"))
    assert problems == [], "docs/concurrency.md is out of step with the code:\n" + "\n".join(problems)


def test_the_doc_checks_can_fail(tmp_path):
    assert placeholders("cuts from 10 to TIER0_TOKENS tokens; set `LCM_X` or LCM_STORE") == ["TIER0_TOKENS"]
    assert not path_exists("store/nowhere.py") and path_exists("store/guard._BREAKERS")
    assert _cited("see `pipeline/owners.py` and `$HERMES_HOME/x` and `agent/x.py`") == ["pipeline/owners.py"]
    pkg = tmp_path / "p"
    pkg.mkdir()
    for name in ("__init__", "alpha", "beta"):
        (pkg / f"{name}.py").write_text("")
    assert docstring_problems(pkg, "`alpha` and `gamma.py`, `lcm rekey`, `rekey`", {"owners"}) == [
        "`gamma.py` is not a module of p/ (or of the package)", "module beta is not named"]
    assert docstring_problems(pkg, "`alpha`, `beta`, `owners` (moved away)", {"owners"}) == [
        "`owners` is not a module of p/ (or of the package)"]
    assert github_anchor("R19: order of calls") == "r19-order-of-calls"
    src = textwrap.dedent('''
        import threading
        _REG = {}
        _GUARD = threading.Lock()
        def f(k):
            _REG[k] = 1
            threading.Thread(target=f, name="lcm-x").start()
        class C:
            def __init__(self):
                self._lock = threading.Lock()
                self._odd_lock = threading.Lock()
    ''')
    facts = concurrency_facts(ast.parse(src), "m/mod")
    assert facts == {"threads": {"lcm-x"}, "locks": {"m/mod._GUARD", "C._lock", "_odd_lock"},
                     "registries": {"m/mod._REG"}}
    assert concurrency_problems(facts, "`lcm-x`, `m/mod._GUARD`, `C._lock`, `_odd_lock`, `m/mod._REG` →") == []
    assert len(concurrency_problems(facts, "`lcm-y`, `_GUARD`, `_lock`")) == 4
