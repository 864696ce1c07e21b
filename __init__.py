"""Hermes plugin at the root of a lossless-context checkout (`hermes plugins install <git URL>`).

The host clones this repository into $HERMES_HOME/plugins/lcm/ and imports this file; its
`register(ctx)` hands the host a context engine through `ctx.register_context_engine`,
taken from the `lossless_context` package in this same checkout (an installed copy of the
package is used only when one is already imported). Importing this file does nothing else:
no sys.path change, no store, no config read. The engine needs nothing beyond the standard
library (config.yaml is read with ruamel.yaml, which every Hermes ships, or PyYAML); when it
cannot load, the reason goes to the host's log at WARNING and to `hermes plugins list`.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_PACKAGE = "lossless_context"
_MIN_PYTHON = (3, 11)


def _load_package():
    """The package from this checkout (or the one already imported), loaded on first use."""
    mod = sys.modules.get(_PACKAGE)
    if mod is not None:
        return mod
    init = _HERE / _PACKAGE / "__init__.py"
    if not init.is_file():
        raise ImportError(f"lcm plugin: {init} is missing; this checkout is incomplete (clone it again)")
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


def _check_python() -> None:
    if sys.version_info < _MIN_PYTHON:
        raise ImportError(
            f"lcm plugin: needs Python {'.'.join(map(str, _MIN_PYTHON))}+; the host runs {sys.version.split()[0]} "
            f"({sys.executable})")


def register(ctx) -> None:
    """Register the LCM context engine (and the /lcm command) with the host.

    A failure is logged at WARNING (hosts log a plugin's exception at DEBUG only, then fall back
    to the built-in compressor in silence) and raised, so the host records it for `hermes
    plugins list`."""
    try:
        _check_python()
        _load_package()
        from lossless_context.hermes.plugin import register as _register
    except Exception as exc:
        logging.getLogger("lossless_context").warning(
            "lcm plugin (%s) cannot load, so Hermes uses its built-in compressor: %s", _HERE, exc)
        raise
    _register(ctx)


__all__ = ["register"]
