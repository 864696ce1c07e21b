"""Who else answers to `context.engine: lcm`, and which engine the host will actually load.

Other engines claim the name too (LCM-X, the renamed hermes-lcm line, keeps `lcm` as an
alias) and the host keeps one context engine. It resolves `lcm` in this order (checked in
0.19.0 and main):

1. a folder `plugins/context_engine/lcm/` inside the installed host ("bundled") wins outright;
2. otherwise the general plugin loader registers the *first* context engine among the enabled
   plugins — `$HERMES_HOME/plugins/*/` in directory order, then pip entry points (a pip entry
   point replaces a folder with the same key) — and the host uses it only if its name is `lcm`.

This module only reads files and package metadata: nothing is imported or executed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable

from ..config import load_yaml

ENGINE = "lcm"
ENTRY_GROUP = "hermes_agent.plugins"
_NAME_RE = re.compile(r"""["']lcm["']""")


@dataclass(frozen=True)
class Claimant:
    key: str  # the host's plugin key (folder name or entry point name)
    source: str  # bundled | user | entrypoint
    where: str  # a path or a distribution name
    ours: bool
    enabled: bool


def _reads(path: Path, limit: int = 200_000) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")[:limit]
    except OSError:
        return ""


def _manifest_name(folder: Path) -> str:
    for name in ("plugin.yaml", "plugin.yml"):
        text = _reads(folder / name, 20_000)
        m = re.search(r"^name:\s*['\"]?([^'\"\n#]+)", text, re.MULTILINE)
        if m:
            return m.group(1).strip()
    return folder.name


def _claims_lcm(folder: Path) -> tuple[bool, bool]:
    """(claims the name, is ours) for a plugin folder, from its files alone."""
    init = _reads(folder / "__init__.py")
    ours = "lossless_context" in init
    if _manifest_name(folder) == ENGINE or folder.name == ENGINE:
        return True, ours
    if ours:
        return True, True
    if "register_context_engine" not in init and "ContextEngine" not in init:
        return False, False
    # An engine whose code names itself (or an alias) "lcm" anywhere in its top-level modules.
    for py in [folder / "__init__.py", *sorted(folder.glob("*.py"))[:40]]:
        if _NAME_RE.search(_reads(py)):
            return True, False
    return False, False


def _enabled_names(hermes_home: Path) -> tuple[set[str], set[str]]:
    try:
        data = load_yaml(_reads(hermes_home / "config.yaml")) or {}
    except Exception:
        data = {}
    plugins = data.get("plugins") if isinstance(data, dict) else None
    plugins = plugins if isinstance(plugins, dict) else {}

    def names(key: str) -> set[str]:
        v = plugins.get(key)
        return {str(x) for x in v} if isinstance(v, list) else set()

    return names("enabled"), names("disabled")


def bundled_dir() -> Path | None:
    try:
        import importlib.util

        spec = importlib.util.find_spec("plugins.context_engine")
    except Exception:
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _entry_points() -> Iterable[Any]:
    try:
        return metadata.entry_points(group=ENTRY_GROUP)
    except Exception:
        return []


def claimants(hermes_home: Path) -> list[Claimant]:
    """Every plugin that may answer to `lcm`, in the order the host considers them."""
    hermes_home = Path(hermes_home).expanduser()
    enabled, disabled = _enabled_names(hermes_home)
    out: list[Claimant] = []
    bdir = bundled_dir()
    if bdir is not None and (bdir / ENGINE).is_dir():
        ours = "lossless_context" in _reads(bdir / ENGINE / "__init__.py")
        out.append(Claimant(ENGINE, "bundled", str(bdir / ENGINE), ours, True))
    user = hermes_home / "plugins"
    folders = sorted(p for p in user.iterdir() if p.is_dir()) if user.is_dir() else []
    eps = list(_entry_points())
    ep_keys = {ep.name for ep in eps}
    for folder in folders:
        claims, ours = _claims_lcm(folder)
        if not claims or folder.name in ep_keys:  # a pip entry point with the same key hides it
            continue
        on = (folder.name in enabled or _manifest_name(folder) in enabled) and folder.name not in disabled
        out.append(Claimant(folder.name, "user", str(folder), ours, on))
    for ep in eps:
        dist = getattr(getattr(ep, "dist", None), "name", "") or ""
        ours = str(ep.value).split(":")[0].startswith("lossless_context")
        if ep.name != ENGINE and "lcm" not in dist.lower() and not ours:
            continue
        on = ep.name in enabled and ep.name not in disabled
        out.append(Claimant(ep.name, "entrypoint", dist or str(ep.value), ours, on))
    return out


@dataclass(frozen=True)
class Resolution:
    winner: Claimant | None
    others: list[Claimant]

    @property
    def ours(self) -> bool:
        return self.winner is not None and self.winner.ours

    def lines(self) -> list[str]:
        """What to tell the user (empty when only our engine claims the name)."""
        claim = [c for c in ([self.winner] if self.winner else []) + self.others]
        if all(c.ours for c in claim):
            return []
        w = self.winner
        where = f"{w.source} plugin '{w.key}' ({w.where})" if w else "no plugin"
        head = (f"engine 'lcm': the host will load {where} — "
                + ("lossless-context" if self.ours else "NOT lossless-context"))
        out = [head]
        for c in self.others:
            out.append(f"  also claims 'lcm': {c.source} plugin '{c.key}' ({c.where})"
                       + (" [lossless-context]" if c.ours else "") + ("" if c.enabled else " [not enabled]"))
        if not self.ours:
            rivals = [c for c in claim if not c.ours]
            how = []
            for c in rivals:
                if c.source == "bundled":
                    how.append(f"remove {c.where}")
                else:
                    how.append(f"`hermes plugins disable {c.key}` (or drop '{c.key}' from plugins.enabled)")
            out.append("  to use lossless-context: " + "; ".join(how)
                       + "; or `lcm install --mode bundled`, which the host prefers over any other plugin")
        return out


def resolve(hermes_home: Path) -> Resolution:
    cl = claimants(hermes_home)
    bundled = [c for c in cl if c.source == "bundled"]
    if bundled:
        winner: Claimant | None = bundled[0]
    else:
        winner = next((c for c in cl if c.enabled), None)
    return Resolution(winner, [c for c in cl if c is not winner])
