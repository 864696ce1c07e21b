"""A store the user can read but not write (another user's, a read-only mount) can be inspected.

The CLI runs as the unprivileged user `nobody` (setpriv) against a store root made and left
0644 in a directory nobody cannot write, so neither the file nor its WAL/-shm can be written:
every reading command answers, a writing one fails with one clear line, the file is unchanged.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from lossless_context import LCMEngine
from lossless_context.config import LCMConfig
from lossless_context.store import open_store
from lossless_context.store.sqlite.readonly import ReadOnlySQLiteStore
from tests.support.nobody import why_not_as_nobody

ROOT = Path(__file__).resolve().parents[1]
CANARY = "READONLY-CANARY-5150"
SETPRIV = shutil.which("setpriv")

pytestmark = [pytest.mark.skipif(os.geteuid() != 0 or SETPRIV is None,
                                 reason="needs root to make a store another user can only read (setpriv)"),
              pytest.mark.skipif(os.geteuid() == 0 and SETPRIV is not None and why_not_as_nobody() is not None,
                                 reason=str(why_not_as_nobody() if os.geteuid() == 0 and SETPRIV else ""))]


@pytest.fixture()
def shared_store():
    d = Path(tempfile.mkdtemp(prefix="lcm-ro-", dir="/tmp"))
    try:
        d.chmod(0o755)
        path = d / "lcm.db"
        e = LCMEngine(config=LCMConfig.load({"store": str(path)}, read_file=False))
        msgs = [{"role": "system", "content": "You are helpful."}]
        for i in range(30):
            msgs.append({"role": "user", "content": f"step {i}" + (f": remember {CANARY}" if i == 3 else "")})
            msgs.append({"role": "assistant", "content": f"done with step {i}"})
        e.on_session_start("ro-session")
        e.ingest(msgs, session_id="ro-session")
        e.store.wait_indexed()
        e.store.close()
        path.chmod(0o644)
        for extra in ("lcm.db-wal", "lcm.db-shm"):
            assert not (d / extra).exists()  # the last connection checkpointed and removed them
        yield path
    finally:
        shutil.rmtree(d, ignore_errors=True)


def as_nobody(store: Path, *args: str) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ.get("PATH", ""), "HOME": "/tmp", "PYTHONPATH": str(ROOT), "COLUMNS": "200",
           "HERMES_HOME": "/tmp/lcm-ro-no-home"}
    return subprocess.run([SETPRIV, "--reuid=nobody", "--regid=nogroup", "--clear-groups", sys.executable,
                           "-m", "lossless_context.cli.commands", "--store", str(store), *args],
                          capture_output=True, text=True, env=env, cwd="/tmp", timeout=120)


def _digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_nobody_really_cannot_write_it(shared_store):
    r = subprocess.run([SETPRIV, "--reuid=nobody", "--regid=nogroup", "--clear-groups", sys.executable, "-c",
                        f"import os; print(os.access({str(shared_store)!r}, os.R_OK), "
                        f"os.access({str(shared_store)!r}, os.W_OK), os.access({str(shared_store.parent)!r}, os.W_OK))"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "False", "False"]


def test_every_reading_command_answers(shared_store):
    before = _digest(shared_store)
    grep = as_nobody(shared_store, "grep", CANARY)
    assert grep.returncode == 0, grep.stderr
    assert CANARY in grep.stdout
    status = as_nobody(shared_store, "status")
    assert status.returncode == 0, status.stderr
    assert "ro-session" in as_nobody(shared_store, "sessions").stdout
    ctx = as_nobody(shared_store, "context", "--json")
    assert ctx.returncode == 0, ctx.stderr
    assert json.loads(ctx.stdout)["session"] == "ro-session"
    doctor = as_nobody(shared_store, "doctor")
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert _digest(shared_store) == before
    assert sorted(p.name for p in shared_store.parent.iterdir()) == ["lcm.db"]


def test_a_writing_command_fails_with_one_clear_line(shared_store):
    before = _digest(shared_store)
    r = as_nobody(shared_store, "forget", "ro-session", "--yes")
    assert r.returncode != 0
    assert "Traceback" not in r.stderr + r.stdout
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("lcm: ") and "read-only" in lines[0], r.stderr
    assert _digest(shared_store) == before
    assert CANARY in as_nobody(shared_store, "grep", CANARY).stdout  # nothing was forgotten


def test_the_owner_still_gets_the_writable_store(shared_store):
    s = open_store(str(shared_store))  # root may write: the ordinary store
    assert not isinstance(s, ReadOnlySQLiteStore)
    s.close()
