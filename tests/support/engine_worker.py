"""Child processes for the crash and multi-process tests (run as a script).

    python tests/support/engine_worker.py crash  <workdir>
    python tests/support/engine_worker.py writer <workdir> <name> <seed> <n_messages> <force_every>

``crash``: a host that replays a long generated session (``workdir/session.pkl``) into an
engine on ``workdir/lcm/lcm.db``, session ``crash-1``, compacting the way the host does, and
persisting its own message list like the host's session database (``host.json``, written
atomically: after every turn, and after adopting a compaction *before* sending the commit
signal). The parent SIGKILLs it at random moments; the next child starts where the host's
records say and re-feeds everything it may not have handed over. Markers go to
``progress.log`` (``A n``: about to hand over messages up to n) and ``status.log``
(``C``/``c`` around compress(), ``R``/``r`` around the start-up resync).

``writer``: one of several processes (a "gateway", a "CLI") driving its own session and a
shared one on the same store file; it records its compaction intervals and every warning
the engine logged, in ``<name>.result.json``.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import pickle
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from lossless_context import LCMEngine  # noqa: E402
from lossless_context.config import LCMConfig  # noqa: E402
from lossless_context.tokens import estimate_messages_tokens  # noqa: E402

CRASH_SID = "crash-1"
SYSTEM = {"role": "system", "content": "You are Hermes, a helpful coding agent."}


def crash_config(workdir: Path) -> LCMConfig:
    return LCMConfig.load({"store": str(workdir / "lcm" / "lcm.db"), "summarizer": "extractive",
                           "fresh_tail_tokens": 1500, "leaf_chunk_tokens": 2500, "threshold": 0.2,
                           "soft_threshold": 0.15, "lock_timeout": 10}, read_file=False)


def turn_ends(msgs: list[dict]) -> list[int]:
    ends = [i for i in range(1, len(msgs)) if msgs[i].get("role") == "user"]
    return ends + [len(msgs)]


def _append(fd: int, text: str) -> None:
    os.write(fd, text.encode())


def _save_atomic(path: Path, data: object) -> None:
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def last_attempted(workdir: Path) -> int:
    p = workdir / "progress.log"
    if not p.exists():
        return 0
    nums = [int(line.split()[1]) for line in p.read_text().splitlines() if line.startswith("A ")]
    return max(nums) if nums else 0


def host_state(workdir: Path) -> dict:
    p = workdir / "host.json"
    return json.loads(p.read_text()) if p.exists() else {"list": [], "fed": 0}


def resync(workdir: Path, sess: list[dict], status: int | None = None) -> tuple[LCMEngine, list[dict], int]:
    """Start-up of a new host process: a fresh engine, then the host's records re-fed."""
    state = host_state(workdir)
    attempted = max(last_attempted(workdir), state["fed"])
    engine = LCMEngine(config=crash_config(workdir))
    if status is not None:
        print("READY", flush=True)
    engine.update_model(model="crash-model", context_length=64_000, base_url="http://127.0.0.1:9/v1",
                        api_key="k", provider="custom", api_mode="chat_completions")
    engine.bind_session_state(None, CRASH_SID)
    if status is not None:
        _append(status, "R")
    engine.on_session_start(CRASH_SID, platform="cli", model="crash-model", context_length=64_000)
    # The host's records: its saved list plus whatever it may have handed over after saving.
    host = list(state["list"]) + sess[state["fed"]:attempted]
    engine.on_session_end(CRASH_SID, [SYSTEM] + copy.deepcopy(host))  # re-ingest: must not duplicate
    if status is not None:
        _append(status, "r")
    return engine, host, attempted


def crash_main(workdir: Path) -> None:
    with open(workdir / "session.pkl", "rb") as f:
        sess = pickle.load(f)
    progress = os.open(workdir / "progress.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    status = os.open(workdir / "status.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    engine, host, attempted = resync(workdir, sess, status)
    fed = attempted
    for end in turn_ends(sess):
        if end <= fed:
            continue
        _append(progress, f"A {end}\n")
        host.extend(copy.deepcopy(sess[fed:end]))
        fed = end
        for _ in range(3):  # up to 3 passes per turn, like the host
            est = estimate_messages_tokens(host) + 20
            if not engine.should_compress(est):
                break
            before = copy.deepcopy(host)
            _append(status, "C")
            out = engine.compress([SYSTEM] + host, current_tokens=est)
            _append(status, "c")
            body = out[1:]
            if body == before or not body:
                break
            engine.on_session_end(CRASH_SID, [SYSTEM] + before)
            host = body
            _save_atomic(workdir / "host.json", {"list": host, "fed": fed})  # the host persists first
            engine.on_session_start(CRASH_SID, boundary_reason="compression", old_session_id=CRASH_SID,
                                    platform="cli")
        engine.on_turn_complete([SYSTEM] + copy.deepcopy(host), usage={"prompt_tokens": 1})
        _save_atomic(workdir / "host.json", {"list": host, "fed": fed})
    print("DONE", flush=True)


# --------------------------------------------------------------------------- writer


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(f"{record.levelname} {record.name}: {record.getMessage()}")


def writer_main(workdir: Path, name: str, seed: int, n_messages: int, force_every: int) -> None:
    from lossless_context.pipeline import compaction
    from lossless_context.demo.sessions import coding_session

    cap = _Capture()
    logging.getLogger("lossless_context").addHandler(cap)
    intervals: list[tuple[str, float, float]] = []
    orig_run = compaction.Compactor.run

    def timed_run(self, session_id, *a, **kw):  # record when this process compacted a session
        t0 = time.monotonic()
        try:
            return orig_run(self, session_id, *a, **kw)
        finally:
            intervals.append((session_id, t0, time.monotonic()))

    compaction.Compactor.run = timed_run
    cfg = LCMConfig.load({"store": str(workdir / "lcm" / "lcm.db"), "summarizer": "extractive",
                          "fresh_tail_tokens": 1000, "leaf_chunk_tokens": 2000, "threshold": 0.2,
                          "soft_threshold": 0.15, "lock_timeout": 60}, read_file=False)
    base = LCMEngine(config=cfg)
    base.update_model(model="w", context_length=64_000)
    sessions = {f"own-{name}": coding_session(n_messages, seed=seed).messages,
                "shared": [_tag(m, name) for m in coding_session(n_messages, seed=seed + 1000).messages]}
    engines = {}
    for sid in sessions:
        e = base.clone_for_agent()
        e.bind_session_state(None, sid)
        e.on_session_start(sid, platform=name)
        engines[sid] = e
    hosts = {sid: [] for sid in sessions}
    pos = {sid: 0 for sid in sessions}
    ends = {sid: turn_ends(m) for sid, m in sessions.items()}
    errors: list[str] = []
    reasons: list[str] = []
    go = workdir / "go"
    while not go.exists():  # start together with the other writers
        time.sleep(0.005)
    step = 0
    while any(pos[s] < len(sessions[s]) for s in sessions):
        for sid, msgs in sessions.items():
            if pos[sid] >= len(msgs):
                continue
            e = engines[sid]
            end = next(x for x in ends[sid] if x > pos[sid])
            hosts[sid].extend(copy.deepcopy(msgs[pos[sid]:end]))
            pos[sid] = end
            step += 1
            est = estimate_messages_tokens(hosts[sid])
            try:
                if e.should_compress(est) or step % force_every == 0:
                    before = copy.deepcopy(hosts[sid])
                    out = e.compress(hosts[sid], current_tokens=est, force=step % force_every == 0)
                    reason = e.get_status().get("lcm_last_reason") or ""
                    reasons.append(reason)
                    if out != before and out:
                        e.on_session_end(sid, before)
                        hosts[sid] = out
                        e.on_session_start(sid, boundary_reason="compression", old_session_id=sid, platform=name)
                else:
                    e.on_turn_complete(copy.deepcopy(hosts[sid]))
                if step % 7 == 0:
                    res = json.loads(e.handle_tool_call("lcm_grep", {"query": "error"}, messages=hosts[sid]))
                    if "error" in res:
                        errors.append(f"tool: {res['error']}")
            except Exception as exc:  # must never happen: the hooks do not raise
                errors.append(f"{type(exc).__name__}: {exc}")
    for sid, e in engines.items():
        e.on_session_end(sid, copy.deepcopy(hosts[sid]))
    result = {"intervals": intervals, "errors": errors, "log": cap.records,
              "reasons": [r for r in reasons if r.startswith("error")], "n": {s: len(m) for s, m in sessions.items()}}
    (workdir / f"{name}.result.json").write_text(json.dumps(result))


def _tag(m: dict, name: str) -> dict:
    """Make a writer's messages in the shared session distinct from the other writer's."""
    m = copy.deepcopy(m)
    if isinstance(m.get("content"), str):
        m["content"] = f"[{name}] " + m["content"]
    if m.get("tool_call_id"):
        m["tool_call_id"] = f"{name}_{m['tool_call_id']}"
    for tc in m.get("tool_calls") or []:
        tc["id"] = f"{name}_{tc['id']}"
    return m


if __name__ == "__main__":
    mode, wd = sys.argv[1], Path(sys.argv[2])
    if mode == "crash":
        crash_main(wd)
    elif mode == "writer":
        writer_main(wd, sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]))
    else:
        raise SystemExit(f"unknown mode {mode}")
