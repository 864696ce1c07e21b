"""Hermes plugin at the root of a lossless-context checkout (`hermes plugins install <git URL>`).

The host clones this repository into $HERMES_HOME/plugins/lcm/ and imports this file; its
`register(ctx)` hands the host a context engine through `ctx.register_context_engine`,
taken from the `lossless_context` package in this same checkout (an installed copy of the
package is used only when one is already imported). Importing this file does nothing else:
no sys.path change, no store, no config read. A missing dependency is reported with the
command that installs it into the host's own Python.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_PACKAGE = "lossless_context"
_REQUIRES = ("yaml",)  # what the engine needs at run time beyond the standard library


def _load_package():
    """The package from this checkout (or the one already imported), loaded on first use."""
    mod = sys.modules.get(_PACKAGE)
    if mod is not None:
        return mod
    init = _HERE / _PACKAGE / "__init__.py"
    if not init.is_file():
        raise ImportError(f"lcm plugin: {init} is missing; this checkout is incomplete")
    spec = importlib.util.spec_from_file_location(_PACKAGE, init, submodule_search_locations=[str(init.parent)])
    if spec is None or spec.loader is None:
        raise ImportError(f"lcm plugin: cannot load {init}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[_PACKAGE] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        sys.modules.pop(_PACKAGE, None)
        raise
    return mod


def _check_requirements() -> None:
    missing = [name for name in _REQUIRES if importlib.util.find_spec(name) is None]
    if missing:
        pip = {"yaml": "pyyaml"}
        raise ImportError(
            "lcm plugin: missing Python package(s) " + ", ".join(pip.get(m, m) for m in missing)
            + f" in the host's Python ({sys.executable}); install with: {sys.executable} -m pip install "
            + " ".join(pip.get(m, m) for m in missing))


def register(ctx) -> None:
    """Register the LCM context engine (and the /lcm command) with the host."""
    _check_requirements()
    _load_package()
    from lossless_context.hermes.plugin import register as _register

    _register(ctx)


__all__ = ["register"]
