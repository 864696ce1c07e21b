"""`python -m bench.plugin_load` — what loading the plugin costs the host (import + register()).

Each sample is a fresh interpreter that first imports what the host has already imported when
it loads plugins (`agent.context_engine`), then times, in-process: importing the repository-root
plugin file (the `hermes plugins install` route) or the entry-point module, and calling
`register(ctx)` once. The host's plugin load budget is 10 s; the target is well under 1 s.
Noise from other processes on the machine shows up as spread between samples.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = r'''
import importlib, importlib.util, json, sys, time
tb = time.perf_counter()
import agent.context_engine  # already loaded in the host before plugins are (the baseline)
base = time.perf_counter() - tb
route = sys.argv[1]
class Ctx:
    engines = []
    def register_context_engine(self, e): self.engines.append(e)
    def register_command(self, *a, **k): pass
t0 = time.perf_counter(); c0 = time.process_time()
if route == "root":
    spec = importlib.util.spec_from_file_location("hermes_plugins.lcm", sys.argv[2])
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
else:
    mod = importlib.import_module("lossless_context.hermes.plugin")
t1 = time.perf_counter()
ctx = Ctx(); mod.register(ctx)
t2 = time.perf_counter(); c2 = time.process_time()
assert ctx.engines and ctx.engines[0].name == "lcm"
print(json.dumps({"import": t1 - t0, "register": t2 - t1, "base": base, "cpu": c2 - c0}))
'''


def sample(route: str, pycache: str | None) -> dict[str, float]:
    env = dict(os.environ)
    if pycache:  # bytecode cached (as in a normal install), kept outside the checkout
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = pycache
    else:  # every module compiled from source on each start (PYTHONDONTWRITEBYTECODE=1)
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env["PYTHONPYCACHEPREFIX"] = tempfile.mkdtemp(prefix="lcm-nopyc-")
    out = subprocess.run([sys.executable, "-c", PROBE, route, str(ROOT / "__init__.py")], capture_output=True,
                         text=True, check=True, cwd=str(ROOT.parent), env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(n: int = 7) -> int:
    cache = tempfile.mkdtemp(prefix="lcm-pyc-")
    sample("root", cache)  # warm the bytecode cache
    for route, pyc in (("root", cache), ("entrypoint", cache), ("root", None)):
        runs = [sample(route, pyc) for _ in range(n)]
        imp = [r["import"] * 1000 for r in runs]
        reg = [r["register"] * 1000 for r in runs]
        tot = [a + b for a, b in zip(imp, reg)]
        base = statistics.median(r["base"] * 1000 for r in runs)
        cpu = statistics.median(r["cpu"] * 1000 for r in runs)
        route = route + ("" if pyc else " (no .pyc)")
        print(f"{route:20} import {statistics.median(imp):7.1f} ms  register {statistics.median(reg):7.1f} ms  "
              f"total median {statistics.median(tot):7.1f} ms, CPU {cpu:6.1f} ms (min {min(tot):.1f}, max {max(tot):.1f}; n={n}); "
              f"baseline: the host's own agent.context_engine import {base:.1f} ms "
              f"(ratio {statistics.median(tot) / max(base, 1e-6):.1f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 7))
