"""The plugin's former module path, kept for directory installs made before the package was
laid out in folders (their `__init__.py` imports `lossless_context.hermes_plugin`)."""

from .hermes.plugin import register  # noqa: F401
