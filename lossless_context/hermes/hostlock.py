"""The host's own compression lock, read (never written) for `lcm doctor` and `/lcm status`.

Hermes serialises the compactions of a session with a row in its session database
(`state.db`, table `compression_locks`: session, holder `pid=<n>:tid=…`, expiry). A process
killed during a pass (kill -9, a crash, a machine stop) leaves its row behind: until it
expires (300 s after the holder's last refresh) the host skips every compaction of that
session — the context grows past the threshold while the engine is never asked. Hermes 0.20
and later reclaim a row whose holder process is gone; 0.19.0 waits for the expiry. We report
such a row with what to do; the host's database is the host's, so nothing here changes it.
"""

from __future__ import annotations

import os
import re
import shlex
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

_PID = re.compile(r"(?:^|:)pid=(\d+)(?::|$)")


@dataclass(frozen=True)
class HostLock:
    session_id: str
    holder: str
    pid: int | None
    expires_at: float
    rowid: int = 0  # the row in the host's table (the command below names it, not the session id)

    def line(self, db: Path) -> str:
        left = max(0, int(self.expires_at - time.time()))
        when = time.strftime("%H:%M:%S", time.localtime(self.expires_at))
        return (f"host compression lock on session {self.session_id} is stale: its holder (pid {self.pid}) is not "
                f"running, and the host skips every compaction of this session until it expires at {when} "
                f"(in {left} s). Hermes 0.20+ reclaims such a lock by itself; on 0.19.0 wait, or stop Hermes and run: "
                f"{self.clear_command(db)}")

    def clear_command(self, db: Path) -> str:
        """The shell command that deletes this row (for the user to run with Hermes stopped).
        The row is named by its rowid, a number, so no text of the host's (a session id) is
        pasted into SQL or a shell line; the path is quoted for the shell."""
        sql = f"DELETE FROM compression_locks WHERE rowid = {int(self.rowid)}"
        return " ".join(shlex.quote(part) for part in ("sqlite3", str(db), sql))


def _alive(pid: int) -> bool:
    if pid <= 0:
        return True  # not a pid we can judge: treat as held
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


def stale_locks(hermes_home: Path | str, now: float | None = None) -> list[HostLock]:
    """Unexpired host compression locks whose holder process on this machine is gone."""
    db = Path(hermes_home) / "state.db"
    if not db.is_file():
        return []
    now = time.time() if now is None else now
    try:
        conn = sqlite3.connect(f"file:{quote(str(db))}?mode=ro", uri=True, timeout=0.5)
    except sqlite3.Error:
        return []
    try:
        rows = conn.execute("SELECT session_id, holder, expires_at, rowid FROM compression_locks"
                            " WHERE expires_at >= ?", (now,)).fetchall()
    except sqlite3.Error:  # an older host without the table, or a locked file: nothing to say
        return []
    finally:
        conn.close()
    out = []
    for sid, holder, expires, rowid in rows:
        m = _PID.search(str(holder or ""))
        pid = int(m.group(1)) if m else None
        if pid is not None and pid != os.getpid() and not _alive(pid):
            out.append(HostLock(str(sid), str(holder), pid, float(expires), int(rowid)))
    return out


def stale_lock_lines(hermes_home: Path | str) -> list[str]:
    """One line per stale host lock (empty when there is none or nothing can be read)."""
    db = Path(hermes_home) / "state.db"
    try:
        return [lock.line(db) for lock in stale_locks(hermes_home)]
    except Exception:  # a report must never fail the command that shows it
        return []
