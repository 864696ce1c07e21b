"""Hermes directory plugin for lossless-context: delegates to the installed package.

The context engine itself lives in the `lossless-context` distribution; this folder only
lets Hermes find it under $HERMES_HOME/plugins/lcm/ (a ContextEngine plugin).
"""

from lossless_context.hermes.plugin import register  # noqa: F401

__all__ = ["register"]
