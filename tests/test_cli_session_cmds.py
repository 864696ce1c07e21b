"""`lcm context SESSION`, `lcm forget SESSION` and the CLI's default session (issue #23)."""

from __future__ import annotations

import copy
import json

from lossless_context import LCMEngine
from lossless_context.config import LCMConfig
from lossless_context.tokens import estimate_messages_tokens
from tests.support.hostdb import session_db
from tests.test_cli import ok, run_lcm


def _store(tmp_path) -> tuple[LCMEngine, str]:
    loc = str(tmp_path / "lcm.db")
    reg = LCMEngine(config=LCMConfig.load({"store": loc, "summarizer": "extractive"}, read_file=False))
    e = copy.deepcopy(reg)
    e.update_model("m", 64_000)
    host_db = session_db(tmp_path / "state.db", {"real": None})  # the host's own session database
    e.bind_session_state(host_db, "real")
    hist = [{"role": "user", "content": "SECRETWORD-881 first"}, {"role": "assistant", "content": "ok"}]
    for i in range(14):
        hist += [{"role": "user", "content": f"q{i} " + "u" * 14_000}, {"role": "assistant", "content": "a" * 14_000}]
    out = e.compress(hist, current_tokens=estimate_messages_tokens(hist))
    e.on_session_start("real", boundary_reason="compression", old_session_id="real")
    e.on_session_end("real", out)
    fork = copy.deepcopy(reg)  # the host's review fork: bound without the session database, started later
    fork.bind_session_state(None, "review")
    fork.on_session_start("review")
    return e, loc


def test_context_shows_the_active_list_of_the_latest_real_session(tmp_path):
    e, loc = _store(tmp_path)
    home = tmp_path / "h"
    home.mkdir()
    out = ok(run_lcm("--store", loc, "context", home=home)).stdout
    assert "active context of real" in out and " tok" in out
    _v, ctx = e.store.get_context("real")
    assert all((f"m{x.ref}" if x.kind == "m" else f"s{x.ref}") in out for x in ctx)
    data = json.loads(ok(run_lcm("--store", loc, "context", "real", "--json", home=home)).stdout)
    assert [r["id"] for r in data["items"]] == [f"{x.kind}{x.ref}" for x in ctx]
    # lcm grep's default session is the user's real one, not the review fork started later
    assert "SECRETWORD-881" in ok(run_lcm("--store", loc, "grep", "SECRETWORD-881", home=home)).stdout


def test_forget_removes_the_session_and_its_text(tmp_path):
    e, loc = _store(tmp_path)
    home = tmp_path / "h"
    home.mkdir()
    out = ok(run_lcm("--store", loc, "forget", "real", "--yes", home=home)).stdout
    assert "forgot real" in out and "review" in out  # its background fork goes with it
    ok(run_lcm("--store", loc, "doctor", home=home))
    sessions = json.loads(ok(run_lcm("--store", loc, "sessions", "--json", home=home)).stdout)
    assert sessions == []
    import sqlite3

    c = sqlite3.connect(loc)
    assert c.execute("SELECT COUNT(*) FROM messages_fts WHERE messages_fts MATCH 'SECRETWORD'").fetchone()[0] == 0
    assert c.execute("SELECT COUNT(*) FROM summaries WHERE text LIKE '%SECRETWORD%'").fetchone()[0] == 0
    r = run_lcm("--store", loc, "forget", "nope", "--yes", home=home)
    assert r.returncode != 0 and "unknown session" in r.stderr


def test_config_errors_are_shown_by_status_and_doctor(tmp_path):
    _e, loc = _store(tmp_path)
    home = tmp_path / "h2"
    home.mkdir()
    (home / "config.yaml").write_text("lcm:\n  fresh_tail_tokens: lots\n")
    st = ok(run_lcm("--store", loc, "status", home=home)).stdout
    assert "config:" in st and "fresh_tail_tokens" in st and "lots" in st
    doc = ok(run_lcm("--store", loc, "doctor", home=home)).stdout
    assert "config:" in doc and "fresh_tail_tokens" in doc
