"""Who staged a compaction pass, and whether that engine can still commit it.

A pass is staged by one engine and published only when its host commits. Two hosts may
write one session at once (a gateway and a CLI on the same session id), so an engine must
not discard — or publish — a stage another live engine is still waiting to commit. The
owner travels in the pass id (``<uuid>@<host>:<pid>:<engine token>``), which every backend
already stores; a stage is *held* while its owner is alive: an engine object of this
process, another process of this machine, or — for another machine, where liveness cannot
be checked — a stage younger than ``REMOTE_STAGE_TTL``. Stages from before owners were
recorded (a bare uuid) belong to nobody.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
import weakref
from typing import Any

REMOTE_STAGE_TTL = 600.0  # seconds a stage of another machine's engine is presumed live

_HOST = socket.gethostname().replace("@", "_")
_LIVE: "weakref.WeakValueDictionary[str, Any]" = weakref.WeakValueDictionary()


def register(engine: Any) -> str:
    """A new owner name for ``engine``; it stays live as long as the engine object does."""
    token = uuid.uuid4().hex[:12]
    _LIVE[token] = engine
    return f"{_HOST}:{os.getpid()}:{token}"


def live_objects() -> list[Any]:
    """Every engine object of this process that is still alive."""
    return list(_LIVE.values())


def live_sessions() -> set[str]:
    """The sessions live engines of this process are bound to (retention never touches them)."""
    return {e.current_session() for e in live_objects() if callable(getattr(e, "current_session", None))}


def new_pass_id(owner: str | None) -> str:
    return f"{uuid.uuid4().hex}@{owner}" if owner else uuid.uuid4().hex


def pass_owner(pass_id: str) -> str | None:
    _, sep, owner = pass_id.partition("@")
    return owner if sep and owner else None


def held_by_other(pass_id: str, created_at: float, me: str | None) -> bool:
    """True while another engine that is still alive may commit this stage."""
    owner = pass_owner(pass_id)
    if owner is None or owner == me:
        return False
    parts = owner.rsplit(":", 2)  # a host name may itself hold ":"
    if len(parts) != 3:
        return False
    host, pid_s, token = parts
    if host != _HOST:
        return time.time() - created_at < REMOTE_STAGE_TTL
    try:
        pid = int(pid_s)
    except ValueError:
        return False
    if pid == os.getpid():
        return token in _LIVE
    return _pid_alive(pid)


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    except OSError:
        return False
    return True
