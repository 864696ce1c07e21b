"""Smoke tests of the real-host harness (tests/support/hermes_host.py).

Each test starts the real hermes-agent 0.19.0 loop in a subprocess against the
fake provider; a run takes a few seconds.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.fake_openai import (  # noqa: E402
    ChatResponder,
    FakeOpenAI,
    Router,
    ScriptedResponder,
    SummariserResponder,
    ToolCall,
    looks_like_summary_request,
)
from tests.support.hermes_host import (  # noqa: E402
    DUMMY_ENGINE_INIT,
    lcm_plugin_module_exists,
    run_hermes,
)

# every test runs on each Hermes host (tests/support/hosts.py): 0.19, 0.22, and 0.20 when a mirror is given
pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("hermes_host")]


def host_calls(run, name=None):
    """Engine calls made by the host (not an engine method calling itself)."""
    return [c for c in run.engine_calls if c["depth"] == 0 and (name is None or c["method"] == name)]


def dir_plugin_module(host, key: str) -> str:
    """The module a directory plugin's code runs as: 0.19 and 0.20 load it through the general
    plugin system (`hermes_plugins.<key>`); 0.22 loads a context engine's folder itself, keyed by
    the folder's name, before the general plugin system."""
    if host.at_least("0.22"):
        return "_hermes_user_context_engine.lcm"
    return "hermes_plugins." + key.replace("-", "_")


def test_builtin_compressor_smoke(tmp_path):
    with FakeOpenAI(responder=ChatResponder(reply_chars=500)) as srv:
        run = run_hermes(srv, ["first question", "second question", "third question"],
                         engine="compressor", plugin_mode="none", workdir=tmp_path)
        assert run.ok, run.describe()
        assert run.engine_name == "compressor"
        assert run.engine["class"] == "agent.context_compressor.ContextCompressor"
        assert not run.blocked_connections
        chats = srv.agent_requests  # newer hosts also title the session with calls of their own
        assert len(chats) == 3
        for i, req in enumerate(chats):
            body = req.body
            assert body["model"] == "fake-model"
            assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
            assert req.messages[0]["role"] == "system"
            assert req.messages[-1] == {"role": "user", "content": ["first question", "second question",
                                                                   "third question"][i]}
            assert req.headers["Authorization"] == "Bearer sk-fake-test-key"
        # the history grows by user+assistant per turn and the final answer is the fake's
        assert [t["n_messages"] for t in run.turns] == [2, 4, 6]
        # the fake's reply to the third question (a newer host's title calls take numbers of their own)
        final = run.turns[-1]["final_response"]
        assert final.startswith("Answer #") and "[third question]" in final
        assert [m["role"] for m in run.messages] == ["user", "assistant"] * 3
        # usage flows into the engine
        assert run.turns[-1]["last_prompt_tokens"] > 0
        assert host_calls(run, "update_from_response")
        assert host_calls(run, "on_session_end")  # the oneshot-style shutdown at the end


def test_builtin_compressor_compacts_large_conversation(tmp_path):
    router = Router(chat=ChatResponder(reply_chars=30000), summariser=SummariserResponder(max_chars=2000))
    with FakeOpenAI(responder=router) as srv:
        run = run_hermes(srv, [f"question {i}" for i in range(9)], engine="compressor", plugin_mode="none",
                         workdir=tmp_path)
        assert run.ok, run.describe()
        assert run.turns[-1]["compression_count"] >= 1
        assert router.summary_calls >= 1
        compress = host_calls(run, "compress")
        assert compress and compress[0]["kwargs"]["force"] is False
        assert compress[0]["args"][0]["roles"][0] == "user"  # no system message in compress()
        # the compaction boundary: on_session_end (flush) then on_session_start(boundary_reason=...)
        # (newer hosts also re-read the engine's tool schemas: a query, not part of the boundary)
        names = [c["method"] for c in host_calls(run) if c["method"] != "get_tool_schemas"]
        i = names.index("compress")
        assert names[i + 1: i + 3] == ["on_session_end", "on_session_start"]
        assert host_calls(run, "on_session_start")[-1]["kwargs"]["boundary_reason"] == "compression"
        # the request after the compaction is smaller than the one before it
        sizes = [len(json.dumps(r.messages)) for r in srv.chat_requests
                 if r.body.get("stream") and not looks_like_summary_request(r.body)]  # main streams summaries too
        assert sizes[-1] < sizes[-2]


def test_directory_plugin_mode_with_dummy_engine(tmp_path, hermes_host):
    script = ScriptedResponder({2: ToolCall("dummy_echo", {"text": "hi"})}, then=ChatResponder(reply_chars=300))
    with FakeOpenAI(responder=script) as srv:
        run = run_hermes(
            srv,
            ["one", "two", {"command": "/dummy hello"}, "three", "four", {"command": "/compress my focus"}, "five"],
            engine="lcm", plugin_mode="directory", plugin_init_source=DUMMY_ENGINE_INIT, workdir=tmp_path,
        )
        assert run.ok, run.describe()
        assert run.engine_name == "lcm"
        assert run.engine["class"] == dir_plugin_module(hermes_host, "lcm") + ".DummyEngine"
        assert run.engine["is_registered_object"] is False  # deep-copied per agent
        assert run.plugins["lcm"]["source"] == "user" and run.plugins["lcm"]["enabled"]
        assert run.result["context_engine_tools"] == ["dummy_echo"]
        assert all("dummy_echo" in r.tool_names for r in srv.agent_requests)
        # construction order
        names = [c["method"] for c in host_calls(run)]
        assert names[:3] == ["update_model", "get_tool_schemas", "on_session_start"]
        um = host_calls(run, "update_model")[0]["kwargs"]
        assert um["context_length"] == 64000 and um["provider"] == "custom"
        assert um["base_url"] == srv.base_url
        # the engine tool was dispatched with the live message list
        [tc] = host_calls(run, "handle_tool_call")
        assert tc["args"][:2] == ["dummy_echo", {"text": "hi"}]
        assert list(tc["kwargs"]) == ["messages"]
        assert json.loads(script.tool_results[0]["content"])["n_messages"] == tc["kwargs"]["messages"]["messages"]
        # plugin slash command and manual /compress
        assert "register_calls=1" in run.turns[2]["command_output"]
        [comp] = host_calls(run, "compress")
        assert comp["kwargs"] == {"current_tokens": comp["kwargs"]["current_tokens"], "focus_topic": "my focus",
                                  "force": True}
        out = run.turns[5]["command_output"]
        assert (out["before"], out["after"]) == (10, 6)  # first message + marker + last 4
        last = srv.agent_requests[-1].messages
        assert any("dummy-engine summary" in str(m.get("content")) for m in last)


def test_second_process_resumes_the_session(tmp_path):
    """Process-per-turn (like ``hermes chat -q`` with --resume): same dirs, same session id."""
    with FakeOpenAI(responder=ChatResponder(reply_chars=200)) as srv:
        first = run_hermes(srv, ["first"], engine="compressor", plugin_mode="none", workdir=tmp_path)
        assert first.ok, first.describe()
        sid = first.result["session_id"]
        second = run_hermes(srv, ["second"], engine="compressor", plugin_mode="none",
                            hermes_home=first.hermes_home, home=first.home, session_id=sid, resume=True)
        assert second.ok, second.describe()
        assert second.result["session_id"] == sid and second.result["resumed_messages"] == 2
        assert [m["role"] for m in srv.agent_requests[-1].messages] == ["system", "user", "assistant", "user"]


def test_entry_point_and_directory_plugin_with_same_key(tmp_path, hermes_host):
    """0.19 and 0.20 let a pip entry point replace a user plugin folder with the same key; 0.22
    loads a context engine's folder first, so the folder's engine is the one in use."""
    with FakeOpenAI(responder=ChatResponder(reply_chars=100)) as srv:
        run = run_hermes(srv, ["hi"], engine="lcm", plugin_mode="directory", plugin_init_source=DUMMY_ENGINE_INIT,
                         hide_entry_point=False, workdir=tmp_path)
        assert run.ok, run.describe()
        if hermes_host.at_least("0.22"):
            assert run.engine["class"] == dir_plugin_module(hermes_host, "lcm") + ".DummyEngine"
        else:
            assert run.plugins["lcm"]["source"] == "entrypoint"
            assert run.engine["class"] == "lossless_context.engine.LCMEngine"


def test_directory_plugin_with_other_key_needs_no_hiding(tmp_path, hermes_host):
    with FakeOpenAI(responder=ChatResponder(reply_chars=100)) as srv:
        run = run_hermes(srv, ["hi"], engine="lcm", plugin_mode="directory", plugin_init_source=DUMMY_ENGINE_INIT,
                         manifest_name="lcm-dir", hide_entry_point=False, workdir=tmp_path)
        assert run.ok, run.describe()
        assert run.engine["class"] == dir_plugin_module(hermes_host, "lcm-dir") + ".DummyEngine"
        assert run.plugins["lcm-dir"]["enabled"] and not run.plugins["lcm"]["enabled"]


@pytest.mark.skipif(not lcm_plugin_module_exists(), reason="lossless_context/hermes/plugin.py not written yet")
@pytest.mark.parametrize("mode", ["entrypoint", "directory"])
def test_lcm_plugin_loads(tmp_path, mode):
    with FakeOpenAI(responder=Router(chat=ChatResponder(reply_chars=300))) as srv:
        run = run_hermes(srv, ["hello", "again"], engine="lcm", plugin_mode=mode, workdir=tmp_path)
        assert run.ok, run.describe()
        assert run.engine_name == "lcm", run.describe()
        assert run.engine["class"].startswith("lossless_context."), run.engine
        assert "falling back to built-in compressor" not in run.stderr
        assert len(srv.chat_requests) >= 2
