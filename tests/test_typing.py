"""Type checking and linting stay honest (issue #37).

`.ci/run` runs mypy and ruff with the configuration in pyproject.toml (zero findings is the rule).
What they cannot check themselves is checked here: every `# type: ignore` in the package names
its error code and says why, so an ignore is a decision someone can read, not a silenced error.
No module of the package is exempted from an error code by a mypy override (the contract mixins'
`attr-defined` exemption went with the mixins, issue #42): a block that brings one back must
say why, and this file then counts its reason as covering those ignores.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "lossless_context"
IGNORE = re.compile(r"#\s*type:\s*ignore(?P<codes>\[[^\]]*\])?(?P<rest>.*)$")


def _overridden() -> dict[str, set[str]]:
    """Module path → error codes the pyproject mypy overrides disable for it."""
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    out: dict[str, set[str]] = {}
    for block in cfg["tool"]["mypy"].get("overrides", []):
        for mod in block.get("module", []):
            if mod.startswith("lossless_context."):
                path = mod.replace(".", "/") + ".py"
                out.setdefault(path, set()).update(block.get("disable_error_code", []))
    return out


def ignore_problems(text: str, rel: str, covered: dict[str, set[str]]) -> list[str]:
    """The `# type: ignore` comments in `text` (file `rel`) without a code or a reason."""
    problems = []
    for no, line in enumerate(text.splitlines(), 1):
        m = IGNORE.search(line)
        if m is None:
            continue
        codes = m.group("codes")
        if not codes:
            problems.append(f"{rel}:{no}: `type: ignore` without an error code")
            continue
        named = {c.strip() for c in codes[1:-1].split(",")}
        if named <= covered.get(rel, set()):
            continue  # the override's reason covers it
        rest = m.group("rest").strip()
        if not re.match(r"#\s*\S", rest):
            problems.append(f"{rel}:{no}: `type: ignore{codes}` without a reason (`  # why` after it)")
    return problems


def test_every_type_ignore_names_its_code_and_reason():
    covered = _overridden()
    problems: list[str] = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        problems += ignore_problems(path.read_text(encoding="utf-8"), rel, covered)
    assert problems == [], "\n".join(problems)


def test_the_check_can_fail():
    covered = {"a.py": {"attr-defined"}}
    assert ignore_problems("x = 1  # type: ignore\n", "b.py", covered) == [
        "b.py:1: `type: ignore` without an error code"]
    assert ignore_problems("x = 1  # type: ignore[misc]\n", "b.py", covered) == [
        "b.py:1: `type: ignore[misc]` without a reason (`  # why` after it)"]
    assert ignore_problems("x = 1  # type: ignore[misc]  # the host's class\n", "b.py", covered) == []
    assert ignore_problems("x = 1  # type: ignore[attr-defined]\n", "a.py", covered) == []
    assert ignore_problems("x = 1  # type: ignore[attr-defined,misc]\n", "a.py", covered) != []


def test_no_module_of_the_package_is_exempted_from_an_error_code():
    """The contract mixins' `attr-defined` exemption (issue #42) is gone with the mixins: every
    module of the package is checked with every error code."""
    assert _overridden() == {}
