"""Our engine inside the real hermes-agent 0.19.0 agent loop, offline (issue: runs inside real Hermes).

Each run drives `run_agent.AIAgent` in a subprocess against an OpenAI-compatible server on
127.0.0.1 that records every request. Conversations are made large (30 KB replies) so the
host's own threshold logic fires compaction several times.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.support.fake_openai import (ChatResponder, FakeOpenAI, Router, ScriptedResponder, SummariserResponder,
                                       ToolCall, looks_like_summary_request)
from tests.support.hermes_host import run_hermes

# every test runs on each Hermes host (tests/support/hosts.py): 0.19, 0.22, and 0.20 when a mirror is given
pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("hermes_host")]

CANARY = "QX-7781-PELICAN"


def _host_calls(run, name=None):
    return [c for c in run.engine_calls if c["depth"] == 0 and (name is None or c["method"] == name)]


def _turns():
    turns = [f"Question {i}: please keep working on the billing refactor." for i in range(12)]
    turns[1] = f"Remember the ticket id {CANARY}; we will need it at the very end."
    turns[10] = "search the history for the ticket id"
    return turns


@pytest.mark.parametrize("mode", ["entrypoint", "directory"])
def test_lcm_compacts_inside_the_real_agent_loop(tmp_path, mode):
    chat = ScriptedResponder({"search the history": ToolCall("lcm_grep", {"query": CANARY})},
                             then=ChatResponder(reply_chars=30_000))
    router = Router(chat=chat, summariser=SummariserResponder(max_chars=2000))
    with FakeOpenAI(responder=router) as srv:
        run = run_hermes(srv, _turns(), engine="lcm", plugin_mode=mode, workdir=tmp_path,
                         extra_config={"lcm": {"summarizer": "auto", "background_compaction": "off"}})
        assert run.ok, run.describe()
        # our engine was the active one, not the built-in fallback
        assert run.engine_name == "lcm" and run.engine["class"] == "lossless_context.engine.LCMEngine"
        assert "falling back to built-in compressor" not in run.log
        # compaction fired several times, committed through the host's boundary
        compress = _host_calls(run, "compress")
        starts = [c for c in _host_calls(run, "on_session_start") if c["kwargs"].get("boundary_reason") == "compression"]
        assert len(compress) >= 2 and len(starts) >= 2
        # the provider received our compacted list: the summary marker and fewer bytes
        with_summary = [r for r in srv.chat_requests if r.body.get("stream") and
                        any("<lcm-summary" in str(m.get("content")) for m in r.messages)]
        assert with_summary, "no request carried our summary message"
        # the host's compression model summarised through the same server (summarizer: auto → host)
        assert router.summary_calls >= 1
        # our tool schemas were in the requests, and the fake model's tool call was answered by us
        # (agent turns only: a newer host streams its compression model's calls too)
        assert all("lcm_grep" in r.tool_names for r in srv.chat_requests
                   if r.body.get("stream") and not looks_like_summary_request(r.body))
        [res] = [json.loads(m["content"]) for m in chat.tool_results if "groups" in m["content"]]
        hits = [h for g in res["groups"] for h in g["hits"]]
        assert any(CANARY in (h.get("snippet") or "") for h in hits)
        # the store survives the process: a second agent on the same HERMES_HOME sees the history
        sid = run.result["session_id"]
        # (a fresh id: the host drops a tool call whose id repeats one already in the history)
        chat2 = ScriptedResponder({"find it": ToolCall("lcm_grep", {"query": CANARY}, "call_second_process_1")},
                                  then=ChatResponder(reply_chars=200))
        srv.responder = Router(chat=chat2, summariser=SummariserResponder())
        second = run_hermes(srv, ["find it"], engine="lcm", plugin_mode=mode, hermes_home=run.hermes_home,
                            home=run.home, session_id=sid, resume=True)
        assert second.ok, second.describe()
        [res2] = [json.loads(m["content"]) for m in chat2.tool_results]
        assert any(CANARY in (h.get("snippet") or "") for g in res2["groups"] for h in g["hits"])
    db = run.hermes_home / "lcm" / "lcm.db"
    assert db.exists() and (db.stat().st_mode & 0o777) == 0o600
    assert (db.parent.stat().st_mode & 0o777) == 0o700


def test_lcm_slash_command_and_manual_compress(tmp_path):
    with FakeOpenAI(responder=Router(chat=ChatResponder(reply_chars=3_000))) as srv:
        turns = [f"step {i} of the migration plan" for i in range(6)]
        turns += [{"command": "/compress migration"}, {"command": "/lcm status"}, {"command": "/lcm grep migration plan"},
                  {"command": "/lcm doctor"}, "and now?"]
        run = run_hermes(srv, turns, engine="lcm", plugin_mode="entrypoint", workdir=tmp_path,
                         extra_config={"lcm": {"summarizer": "extractive"}})
        assert run.ok, run.describe()
        [comp] = _host_calls(run, "compress")
        assert comp["kwargs"]["force"] is True and comp["kwargs"]["focus_topic"] == "migration"
        status, grep, doctor = (run.turns[i].get("command_output") for i in (7, 8, 9))
        assert "LCM engine" in status and "messages stored" in status, run.turns[7]
        assert "step" in grep and "m1" in grep, grep
        assert "healthy" in doctor, doctor
        last = srv.agent_requests[-1].messages
        assert any("<lcm-summary" in str(m.get("content")) for m in last)


def _lcm_cli(host, *args: str) -> subprocess.CompletedProcess:
    """The `lcm` command line in the host's own Python (what the host will import)."""
    return subprocess.run([host.python, "-m", "lossless_context.cli", *args], capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL)


def test_bundled_location_install(tmp_path, hermes_host):
    """`lcm install --mode bundled` puts the plugin in the host's own plugins/context_engine/lcm/;
    the host then loads it by `context.engine: lcm` alone (no plugins.enabled entry)."""
    folder = Path(subprocess.run(
        [hermes_host.python, "-c", "from lossless_context.hermes.install import bundled_folder; print(bundled_folder())"],
        capture_output=True, text=True, check=True, timeout=120).stdout.strip())
    home = tmp_path / "home-for-install"
    # a copy left by an interrupted run (uninstall refuses to touch a folder that is not ours)
    assert _lcm_cli(hermes_host, "uninstall", "--hermes-home", str(home)).returncode == 0
    assert not folder.exists()
    try:
        r = _lcm_cli(hermes_host, "install", "--mode", "bundled", "--hermes-home", str(home))
        assert r.returncode == 0, r.stdout + r.stderr
        assert (folder / "__init__.py").is_file() and (folder / "plugin.yaml").is_file()
        with FakeOpenAI(responder=Router(chat=ChatResponder(reply_chars=300))) as srv:
            run = run_hermes(srv, ["hello", "again"], engine="lcm", plugin_mode="none", workdir=tmp_path)
            assert run.ok, run.describe()
            assert run.engine_name == "lcm" and run.engine["class"] == "lossless_context.engine.LCMEngine"
            assert all("lcm_grep" in r.tool_names for r in srv.agent_requests)
    finally:
        _lcm_cli(hermes_host, "uninstall", "--hermes-home", str(home))
    assert not folder.exists()
