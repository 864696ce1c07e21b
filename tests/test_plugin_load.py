"""Loading the plugin stays light: register() imports the engine, not the parts that are only
needed once there is work (exploration of large outputs, secret patterns, the extractive
summariser). The cost itself is measured by `python -m bench.plugin_load`, not here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = r"""
import json, sys
class Ctx:
    def register_context_engine(self, e): self.engine = e
    def register_command(self, *a, **k): pass
from lossless_context import hermes_plugin
ctx = Ctx(); hermes_plugin.register(ctx)
print(json.dumps(sorted(m for m in sys.modules if m.startswith("lossless_context"))))
"""

DEFERRED = ("lossless_context.text.explore", "lossless_context.text.redact", "lossless_context.summarizers.extractive",
            "lossless_context.cli.commands", "lossless_context.ops.viewer", "lossless_context.demo")


def test_register_leaves_the_heavy_modules_unimported(tmp_path):
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=str(ROOT), timeout=120,
                       env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "HERMES_HOME": str(tmp_path / "h"),
                            "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    loaded = set(json.loads(r.stdout.splitlines()[-1]))
    assert "lossless_context.engine" in loaded  # the probe did load the engine
    assert not loaded & set(DEFERRED), sorted(loaded & set(DEFERRED))
