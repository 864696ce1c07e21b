"""Hermes directory plugin for lossless-context: delegates to the installed package.

The context engine itself lives in the `lossless-context` distribution; this folder only
lets Hermes find it under $HERMES_HOME/plugins/lcm/ (a ContextEngine plugin). When the
package is not importable in the host's Python, `register` says so at WARNING (the host
itself logs a plugin's failure at DEBUG only) with the command that fixes it.
"""

import logging
import sys


def register(ctx):
    try:
        from lossless_context.hermes.plugin import register as _register
    except ImportError as exc:
        logging.getLogger("lossless_context").warning(
            "lcm plugin: the lossless-context package is not importable in the host's Python (%s): %s; "
            "install it there (%s -m pip install <clone or git URL of lossless-context>), or use "
            "`hermes plugins install <git URL>`; Hermes uses its built-in compressor meanwhile",
            sys.executable, exc, sys.executable)
        raise
    _register(ctx)


__all__ = ["register"]
