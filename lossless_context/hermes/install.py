"""`lcm install` / `lcm uninstall`: wire the engine into a Hermes home.

Holds the config.yaml editing (ruamel.yaml round-trip, so the user's comments, key order
and other settings survive) and the directory-plugin copy. Both operations are
idempotent: running them twice changes nothing the second time.

* install: `context.engine: lcm`, `lcm` added to `plugins.enabled` (and removed from
  `plugins.disabled`, which would otherwise veto it); in `directory` mode the plugin files
  (`plugin.yaml`, `__init__.py`) are copied to `$HERMES_HOME/plugins/lcm/`. In
  `entrypoint` mode the pip entry point of the installed package is what Hermes loads;
  an identical folder left by an earlier directory install is removed.
  In `bundled` mode the same files go to the installed host's own
  `plugins/context_engine/lcm/` (the location of engines shipped with Hermes, loaded
  by `context.engine` alone).
* uninstall: `context.engine` back to `compressor` (only when it is `lcm`), `lcm` removed
  from `plugins.enabled`, the plugin folders removed (only when they hold our files).
"""

from __future__ import annotations

import io
import shutil
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, cast

from ..files import write_text_atomic

PLUGIN_NAME = "lcm"
PLUGIN_FILES = ("plugin.yaml", "__init__.py")
MODES = ("entrypoint", "directory", "bundled")


class InstallError(RuntimeError):
    """A user-facing installation problem (unreadable config, bad mode)."""


@dataclass
class InstallResult:
    config_path: Path
    changes: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.changes)


def _yaml() -> Any:
    from ruamel.yaml import YAML

    y = YAML(typ="rt")
    y.preserve_quotes = True
    y.indent(mapping=2, sequence=4, offset=2)
    y.width = 4096
    return y


def load_config(path: Path) -> Any:
    """The config as a round-trip mapping (an empty one when the file is missing or empty)."""
    from ruamel.yaml.comments import CommentedMap

    if not path.exists():
        return CommentedMap()
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InstallError(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        data = _yaml().load(text)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InstallError(f"{path} is not valid YAML: {first}") from exc
    if data is None:
        return CommentedMap()
    if not hasattr(data, "keys"):
        raise InstallError(f"{path} must hold a mapping at the top level")
    return data


def save_config(path: Path, data: Any) -> None:
    buf = io.StringIO()
    _yaml().dump(data, buf)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Write atomically next to the file; keep its permissions when it existed.
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o600
    write_text_atomic(path, buf.getvalue(), mode=mode, prefix=".config.", suffix=".yaml.tmp")


def _section(data: Any, key: str) -> Any:
    from ruamel.yaml.comments import CommentedMap

    cur = data.get(key)
    if cur is None:
        cur = CommentedMap()
        data[key] = cur
    elif not hasattr(cur, "keys"):
        raise InstallError(f"`{key}:` in config.yaml must be a mapping, found {type(cur).__name__}")
    return cur


def _list(section: Any, key: str, where: str) -> Any:
    from ruamel.yaml.comments import CommentedSeq

    cur = section.get(key)
    if cur is None:
        cur = CommentedSeq()
        section[key] = cur
    elif not isinstance(cur, list):
        raise InstallError(f"`{where}` in config.yaml must be a list, found {type(cur).__name__}")
    return cur


def _remove_value(parent: Any, key: str, value: str) -> bool:
    """Remove every `value` from the list `parent[key]`, keeping the blank lines and comments
    that ruamel attached to a removed last item (they separate the next block)."""
    seq = parent.get(key) if hasattr(parent, "get") else None
    if not isinstance(seq, list) or value not in seq:
        return False
    while value in seq:
        i = seq.index(value)
        ca = getattr(seq, "ca", None)
        tok = ca.items.get(i) if ca is not None else None
        was_last = i == len(seq) - 1
        del seq[i]  # ruamel shifts the comments of the following items
        token = tok[0] if tok else None
        if token is None or ca is None or not was_last or "\n" not in token.value:
            continue
        tail = token.value[token.value.index("\n") + 1:]
        if not tail:
            continue
        if len(seq):
            prev = ca.items.get(len(seq) - 1)
            if prev and prev[0] is not None:
                prev[0].value = prev[0].value + tail
            else:
                token.value = "\n" + tail
                ca.items[len(seq) - 1] = [token, None, None, None]
        else:
            cast(Any, seq).fa.set_flow_style()  # a ruamel CommentedSeq: its flow attributes
            token.value = "\n" + tail
            pca = getattr(parent, "ca", None)
            if pca is not None:
                pca.items[key] = [None, None, token, None]
    return True


def _packaged_file(name: str) -> bytes:
    return resources.files("lossless_context.hermes").joinpath("plugin_files", name).read_bytes()


def _is_our_folder(folder: Path) -> bool:
    """The folder holds exactly our plugin files (possibly plus __pycache__)."""
    if not folder.is_dir():
        return False
    for name in PLUGIN_FILES:
        f = folder / name
        if not f.is_file() or f.read_bytes() != _packaged_file(name):
            return False
    extra = {p.name for p in folder.iterdir()} - set(PLUGIN_FILES) - {"__pycache__"}
    return not extra


def install(hermes_home: Path, mode: str = "entrypoint") -> InstallResult:
    if mode not in MODES:
        raise InstallError(f"unknown mode {mode!r}; use one of {', '.join(MODES)}")
    hermes_home = Path(hermes_home).expanduser()
    cfg_path = hermes_home / "config.yaml"
    res = InstallResult(cfg_path)
    data = load_config(cfg_path)
    ctx = _section(data, "context")
    if ctx.get("engine") != PLUGIN_NAME:
        res.changes.append(f"context.engine: {ctx.get('engine')!r} → 'lcm'")
        ctx["engine"] = PLUGIN_NAME
    plugins = _section(data, "plugins")
    enabled = _list(plugins, "enabled", "plugins.enabled")
    if PLUGIN_NAME not in enabled:
        enabled.append(PLUGIN_NAME)
        res.changes.append("plugins.enabled: added lcm")
    if _remove_value(plugins, "disabled", PLUGIN_NAME):
        res.changes.append("plugins.disabled: removed lcm")
    if res.changes or not cfg_path.exists():
        save_config(cfg_path, data)

    folder = hermes_home / "plugins" / PLUGIN_NAME
    if mode == "bundled":
        _write_plugin(bundled_folder(), res)
    if mode == "directory":
        _write_plugin(folder, res)
    elif _is_our_folder(folder):
        shutil.rmtree(folder)
        res.changes.append(f"removed {folder} (the pip entry point loads the engine)")
    return res


def uninstall(hermes_home: Path) -> InstallResult:
    hermes_home = Path(hermes_home).expanduser()
    cfg_path = hermes_home / "config.yaml"
    res = InstallResult(cfg_path)
    if cfg_path.exists():
        data = load_config(cfg_path)
        ctx = data.get("context")
        if hasattr(ctx, "keys") and ctx.get("engine") == PLUGIN_NAME:
            ctx["engine"] = "compressor"
            res.changes.append("context.engine: 'lcm' → 'compressor'")
        plugins = data.get("plugins")
        if hasattr(plugins, "keys") and _remove_value(plugins, "enabled", PLUGIN_NAME):
            res.changes.append("plugins.enabled: removed lcm")
        if res.changes:
            save_config(cfg_path, data)
    folders = [hermes_home / "plugins" / PLUGIN_NAME]
    try:
        folders.append(bundled_folder())
    except InstallError:
        pass  # no host installed here: nothing bundled to remove
    for folder in folders:
        if folder.is_dir():
            if _is_our_folder(folder) or _looks_like_ours(folder):
                shutil.rmtree(folder)
                res.changes.append(f"removed {folder}")
            else:
                raise InstallError(f"{folder} holds files that are not lossless-context's; remove it by hand")
    return res


def bundled_folder() -> Path:
    """`plugins/context_engine/lcm/` inside the installed hermes-agent package."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("plugins.context_engine")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise InstallError("hermes-agent is not installed in this environment (no plugins.context_engine)")
    return Path(list(spec.submodule_search_locations)[0]) / PLUGIN_NAME


def _write_plugin(folder: Path, res: InstallResult) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in PLUGIN_FILES:
        want = _packaged_file(name)
        dest = folder / name
        if not dest.is_file() or dest.read_bytes() != want:
            dest.write_bytes(want)
            res.changes.append(f"wrote {dest}")


def _looks_like_ours(folder: Path) -> bool:
    """An older copy of our plugin (different version text): plugin.yaml names lcm and
    __init__.py imports our package."""
    try:
        init = (folder / "__init__.py").read_text(encoding="utf-8")
        manifest = (folder / "plugin.yaml").read_text(encoding="utf-8")
    except OSError:
        return False
    return "lossless_context" in init and any(
        line.split(":", 1)[1].strip() == PLUGIN_NAME
        for line in manifest.splitlines() if line.startswith("name:")
    )
