"""Issue #39 item 4: the smaller edges of staying within the window.

* a manual /compress that cannot shrink the context changes nothing;
* the user is told in the chat once when storing stops and once when it resumes, and the
  log is not flooded while it is down;
* a stale compression lock of the host (holder process dead) is reported by /lcm status and
  lcm doctor, with what to do.
Real parts: the engine, SQLite stores, the host's own SessionDB and its lock rows.
"""

from __future__ import annotations

import logging
import os
import shlex
import sqlite3
import subprocess
import sys
import time

from click.testing import CliRunner

from lossless_context import LCMEngine
from lossless_context.config import LCMConfig
from lossless_context.hermes.plugin import make_command_handler
from lossless_context.pipeline.validate import pairing_problems
from lossless_context.tokens import estimate_messages_tokens


def _engine(store: str, **kw) -> LCMEngine:
    e = LCMEngine(config=LCMConfig.load({"store": store, "summarizer": "extractive", **kw}, read_file=False))
    e.update_model("m", 64_000)
    e.on_session_start("s")
    return e


def _turns(n: int, words: int) -> list[dict]:
    out: list[dict] = []
    for i in range(n):
        out += [{"role": "user", "content": f"q{i} " + "word " * words},
                {"role": "assistant", "content": f"a{i} " + "text " * words}]
    return out


def test_a_manual_compress_that_cannot_shrink_changes_nothing(tmp_path):
    e = _engine(str(tmp_path / "lcm.db"))
    small = _turns(3, 20)  # one short message between the protected head and tail
    out = e.compress(small, force=True)
    assert out == small and estimate_messages_tokens(out) == estimate_messages_tokens(small)
    assert e.store.staged_passes("s") == [] and e.compression_count == 0
    assert "could not shrink" in e.get_status()["lcm_last_pass"]["outcome"]
    big = _turns(12, 800)  # with something to fold, a forced pass still shrinks it
    out = e.compress(big, force=True)
    assert estimate_messages_tokens(out) < estimate_messages_tokens(big) and pairing_problems(out) == []


def _conversation(turns: int) -> list[dict]:
    out: list[dict] = []
    for i in range(turns):
        out.append({"role": "user", "content": f"question {i}: " + "q" * 200})
        out.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": "terminal", "arguments": "{}"}}]})
        out.append({"role": "tool", "tool_call_id": f"c{i}", "content": f"output {i} " + "o" * 12_000})
        out.append({"role": "assistant", "content": f"answer {i} " + "a" * 400})
    return out


def test_one_line_when_storing_stops_and_one_when_it_resumes(tmp_path, caplog):
    blocker = tmp_path / "store-dir"
    blocker.write_text("a regular file where the store's directory should be")
    e = _engine(str(blocker / "lcm.db"), store_retry_seconds=0)
    msgs = _conversation(20)
    tokens = estimate_messages_tokens(msgs)
    told = []
    with caplog.at_level(logging.DEBUG, logger="lossless_context"):
        for _turn in range(6):  # a few turns of every hook while the store cannot be used
            e.on_session_start("s")
            e.select_context(msgs)
            e.on_turn_complete(msgs, usage={"prompt_tokens": tokens})
            e.prune_tool_results_only(msgs, current_tokens=tokens)
            out = e.compress(msgs, current_tokens=tokens)
            assert out != msgs and pairing_problems(out) == []
            told.append(e._last_summary_error)  # what every host prints after such a pass
            e.on_session_end("s", msgs)
    assert told[0] and "LCM stopped storing" in told[0] and str(blocker) in told[0]
    assert told[1:] == [None] * 5  # once per outage
    # the status line of a later pass (0.20+) does not repeat it
    line = e.get_automatic_compaction_status_message(phase="compress", default_message="x")
    assert "Compacting context" in line and "stopped" not in line and "again" not in line
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("lossless_context")]
    assert len(warnings) == 1 and "goes on without it" in warnings[0].getMessage(), [
        r.getMessage()[:120] for r in warnings]
    # the store comes back: the next pass's status line says so, once
    blocker.unlink()
    blocker.mkdir()
    with caplog.at_level(logging.WARNING, logger="lossless_context"):
        e.on_session_end("s", msgs)  # the probe after the cool-down reaches the store
    assert e.store.stats()["messages"] > 0
    back = e.get_automatic_compaction_status_message(phase="preflight", default_message="x")
    assert "LCM is storing again" in back and "Compacting context" in back
    again = e.get_automatic_compaction_status_message(phase="preflight", default_message="x")
    assert "storing again" not in again


def test_an_outage_known_when_a_pass_starts_is_told_in_its_status_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    e = _engine(str(blocker / "lcm.db"), store_retry_seconds=600)
    e.on_session_end("s", _conversation(2))  # a hook meets the outage before any pass
    line = e.get_automatic_compaction_status_message(phase="compress", default_message="x")
    assert "LCM stopped storing" in line and "Compacting context" in line
    msgs = _conversation(20)
    e.compress(msgs, current_tokens=estimate_messages_tokens(msgs))
    assert e._last_summary_error is None  # (told already: not twice)


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_stale_host_compression_lock_is_reported_with_what_to_do(tmp_path, monkeypatch):
    from hermes_state import SessionDB

    home = tmp_path / "hermes"
    home.mkdir()
    monkeypatch.setenv("HERMES_HOME", str(home))
    db = SessionDB(db_path=home / "state.db")
    db.create_session(session_id="s-crashed", source="cli", model="m")
    db.create_session(session_id="s-live", source="cli", model="m")
    pid = _dead_pid()
    assert db.try_acquire_compression_lock("s-crashed", f"pid={pid}:tid=1:agent=a:nonce=n", ttl_seconds=300)
    assert db.try_acquire_compression_lock("s-live", f"pid={os.getpid()}:tid=1:agent=b:nonce=m", ttl_seconds=300)
    e = _engine(str(tmp_path / "lcm.db"))
    status = make_command_handler(e)("status")
    assert "s-crashed is stale" in status and f"pid {pid}" in status and "DELETE FROM compression_locks" in status
    assert "s-live" not in status  # a live holder's lock is no business of ours
    doctor = make_command_handler(e)("doctor")
    assert "s-crashed is stale" in doctor
    from lossless_context.cli.commands import lcm

    res = CliRunner().invoke(lcm, ["--store", str(tmp_path / "lcm.db"), "doctor"])
    assert "s-crashed is stale" in res.output, res.output
    # the command it gives removes exactly that row (run here as the shell would split it)
    cmd = shlex.split(status.split("stop Hermes and run: ", 1)[1].splitlines()[0])
    assert cmd[:2] == ["sqlite3", str(home / "state.db")]
    with sqlite3.connect(home / "state.db") as raw:
        raw.execute(cmd[2])
        assert [r[0] for r in raw.execute("SELECT session_id FROM compression_locks")] == ["s-live"]
    assert "is stale" not in make_command_handler(e)("status")
    assert db.try_acquire_compression_lock("s-crashed", f"pid={pid}:tid=1:agent=a:nonce=n", ttl_seconds=300)
    # once it has expired the host takes the lock again by itself: nothing to report
    db._conn.execute("UPDATE compression_locks SET expires_at = ?", (time.time() - 1,))
    db._conn.commit()
    assert "is stale" not in make_command_handler(e)("status")


def test_the_real_host_shows_one_line_when_storing_stops(tmp_path):
    """Through the real 0.19.0 agent loop: the store cannot be used, compactions fall back,
    and what the host shows the user (its status and warning lines) says so exactly once."""
    from tests.support.fake_openai import ChatResponder, FakeOpenAI, Router, prompt_tokens_for
    from tests.support.hermes_host import hermes_available, run_hermes

    if not hermes_available():
        import pytest

        pytest.skip("hermes-agent is not installed")
    blocker = tmp_path / "blocker"
    blocker.write_text("a regular file where the store's directory should be")
    with FakeOpenAI(responder=Router(chat=ChatResponder(reply_chars=24_000))) as srv:
        run = run_hermes(srv, [f"step {i} of the plan" for i in range(20)], engine="lcm", workdir=tmp_path,
                         extra_config={"lcm": {"summarizer": "extractive", "store": str(blocker / "lcm.db")}})
        assert run.ok, run.describe()
        assert len(run.calls_named("compress")) >= 2
        told = [text for kind, text in run.status_lines if "LCM stopped storing" in text]
        assert len(told) == 1 and str(blocker) in told[0] and "retrying in" not in told[0], run.status_lines
        assert max(prompt_tokens_for(r.json) for r in srv.chat_requests) <= 64_000
