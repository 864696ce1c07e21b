"""Whether this test run's interpreter can run as the unprivileged user `nobody` (setpriv).

The tests that drop root to prove a store is really read-only need the interpreter to start as
another user. An interpreter built into a private home (pyenv or uv under /root, mode 0700: the
CI's Python 3.13 run) cannot even load its own shared library there; those tests then skip with
the reason, and run in the main run, whose interpreter is the system's.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys


@functools.lru_cache(maxsize=None)
def why_not_as_nobody() -> str | None:
    """None when `setpriv … sys.executable -c pass` works as nobody; else why not."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return "setpriv (util-linux) is not installed"
    r = subprocess.run([setpriv, "--reuid=nobody", "--regid=nogroup", "--clear-groups", sys.executable, "-c", "pass"],
                       capture_output=True, text=True, timeout=60)
    if r.returncode == 0:
        return None
    return f"{sys.executable} cannot run as nobody: {r.stderr.strip()[-300:]}"
