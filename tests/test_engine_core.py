"""The engine core against the real hermes-agent 0.19.0 ABC: contract, budgets, compaction."""

from __future__ import annotations

import copy
import json
import os

import pytest
from agent.context_engine import ContextEngine as HostContextEngine

from lossless_context import LCMEngine
from lossless_context.pipeline.validate import pairing_problems
from lossless_context.config import LCMConfig
from lossless_context.demo.sessions import coding_session, turn_ranges
from lossless_context.tokens import estimate_messages_tokens
from lossless_context.demo.host_driver import R19Host


@pytest.fixture
def home(tmp_path, monkeypatch):
    h = tmp_path / "hermes"
    monkeypatch.setenv("HERMES_HOME", str(h))
    for k in list(os.environ):
        if k.startswith("LCM_"):
            monkeypatch.delenv(k)
    return h


def make_engine(tmp_path, **kw) -> LCMEngine:
    cfg = LCMConfig.load({"store": str(tmp_path / "lcm" / "lcm.db"), "summarizer": "extractive", **kw},
                         read_file=False)
    return LCMEngine(config=cfg)


# -- the seed's examples and the host ABC ---------------------------------------------------

def test_seed_examples_and_isinstance(home):
    engine = LCMEngine()
    assert isinstance(engine, HostContextEngine)
    assert engine.name == "lcm"
    out = engine.compress([{"role": "user", "content": "hello"}])
    assert isinstance(out, list) and all(isinstance(m, dict) and "role" in m for m in out)
    assert out == [{"role": "user", "content": "hello"}]


def test_construction_touches_no_disk(home):
    LCMEngine()
    e = LCMEngine(context_length=200_000)
    assert e.context_length == 200_000
    assert e.threshold_tokens == int(200_000 * 0.75)
    assert not home.exists(), "constructing an engine must not create files"


def test_status_clamps_sentinel_and_reset(home):
    e = LCMEngine(context_length=100_000)
    e.last_prompt_tokens = -1
    st = e.get_status()
    assert st["last_prompt_tokens"] == 0 and st["usage_percent"] == 0
    for key in ("lcm_messages", "lcm_summaries_by_depth", "lcm_compactions", "lcm_summarizer_calls",
                "lcm_summarizer_failures", "lcm_store", "lcm_unindexed_messages"):
        assert key in st
    e.last_prompt_tokens, e.last_completion_tokens, e.last_total_tokens, e.compression_count = 5, 6, 11, 2
    e.on_session_reset()
    assert (e.last_prompt_tokens, e.last_completion_tokens, e.last_total_tokens, e.compression_count) == (0, 0, 0, 0)


def test_defaults_and_unknown_tool(home):
    e = LCMEngine()
    names = {s["name"] for s in e.get_tool_schemas()}
    assert names == {"lcm_grep", "lcm_describe", "lcm_expand", "lcm_expand_query"}
    for s in e.get_tool_schemas():
        assert set(s) == {"name", "description", "parameters"}
    assert "error" in json.loads(e.handle_tool_call("nope", {}))


def test_deepcopy_and_clone_share_no_budget_state(tmp_path, home):
    e = make_engine(tmp_path)
    e.update_model("m", 128_000)
    e.on_session_start("s1")
    for c in (copy.deepcopy(e), e.clone_for_agent()):
        assert isinstance(c, LCMEngine) and c is not e
        assert c.threshold_tokens == e.threshold_tokens
        c.threshold_tokens = 1
        c.last_prompt_tokens = 999
        c.compression_count = 7
        assert e.threshold_tokens != 1 and e.last_prompt_tokens != 999 and e.compression_count == 0
        # one store (one connection pool) per location for every copy: a gateway makes a copy
        # per agent (tests/test_pg_gateway.py ran out of PostgreSQL connections otherwise)
        assert c.store is e.store and c.store.location == e.store.location
        # the store-wide figures /lcm status shows are shared by every copy (issue #23 item 1)
        assert c.get_status()["lcm_summarizer_calls"] == e.get_status()["lcm_summarizer_calls"]


def test_usage_updates_and_sentinels(home):
    e = LCMEngine(context_length=100_000)
    e.update_from_response({"prompt_tokens": 80_000, "completion_tokens": 100, "total_tokens": 80_100})
    assert e.last_prompt_tokens == 80_000 and e.should_compress()
    e.last_prompt_tokens = -1  # host: waiting for real usage
    assert e.should_compress() is False
    e.update_from_response({})
    assert e.last_prompt_tokens == -1
    e.update_from_response({"input_tokens": 10, "output_tokens": 2, "cache_read_tokens": 3, "prompt_tokens": 10,
                            "completion_tokens": 2, "total_tokens": 12})
    assert e.last_prompt_tokens == 10
    e.threshold_tokens = 5  # the host lowers it to fit the auxiliary model
    assert e.should_compress(6) and not e.should_compress(4)


def test_model_thresholds_longest_match(home):
    e = LCMEngine()
    e.model_thresholds = {"claude": 0.5, "claude-sonnet": 0.6, "openrouter:sonnet": 0.9, "bad": "x"}
    e.update_model("anthropic/claude-sonnet-4", 200_000, provider="anthropic")
    assert e.threshold_tokens == 120_000
    e.update_model("anthropic/claude-sonnet-4", 200_000, provider="openrouter")
    assert e.threshold_tokens == 180_000
    e.update_model("gpt-5", 100_000, provider="openai")
    assert e.threshold_tokens == int(100_000 * e.config.threshold)


def test_has_content_to_compress(tmp_path, home):
    e = make_engine(tmp_path)
    e.update_model("m", 64_000)
    short = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert e.has_content_to_compress(short) is False
    long = short + [{"role": "user" if i % 2 else "assistant", "content": f"msg {i} " * 50} for i in range(40)]
    assert e.has_content_to_compress(long) is True


# -- compaction through a simulated host ----------------------------------------------------

def _drive(engine, session, context_length=64_000, step=1):
    host = R19Host(engine, overhead_tokens=2_000)
    host.start(context_length=context_length)
    msgs = session.messages
    for a, b in turn_ranges(msgs):
        host.add(*msgs[a:b])
        host.maybe_compress()
    host.end()
    return host


def test_long_session_compaction_is_lossless(tmp_path, home):
    sess = coding_session(1500, seed=3)
    e = make_engine(tmp_path)
    host = _drive(e, sess)
    assert host.compactions >= 3
    assert host.invalid == []
    assert pairing_problems(host.messages) == []
    # within budget after every pass
    assert estimate_messages_tokens(host.messages) < e.threshold_tokens
    # every input message stored byte-for-byte
    stored = {json.dumps(m.raw, sort_keys=True) for m in e.store.iter_all_messages()}
    for m in sess.messages:
        assert json.dumps(m, sort_keys=True) in stored
    assert e.store.stats()["messages"] == len(sess.messages)
    assert e.store.stats()["summaries_by_depth"], "summary nodes were published"


def test_focus_and_force(tmp_path, home):
    sess = coding_session(300, seed=5)
    e = make_engine(tmp_path)
    host = R19Host(e)
    host.start(context_length=1_000_000)
    host.add(*sess.messages)
    assert host.maybe_compress() is False  # far below threshold
    assert host.maybe_compress(force=True, focus="billing") is True
    assert pairing_problems(host.messages) == []
    assert estimate_messages_tokens(host.messages) < estimate_messages_tokens(sess.messages)


def test_reconciles_turns_a_dead_process_never_handed_over(tmp_path, home):
    """R19 hands the conversation over only in compress()/on_session_end(); the host's own
    session database has the rest, and a new engine ingests it at session start."""
    from hermes_state import SessionDB

    db = SessionDB(db_path=tmp_path / "state.db")
    db.create_session(session_id="s-dead", source="cli", model="m")
    turns = [("user", "first question about QX-9911"), ("assistant", "an answer"), ("user", "second"),
             ("assistant", "another answer")]
    for role, text in turns:
        db.append_message("s-dead", role=role, content=text)
    e = make_engine(tmp_path)
    e.update_model("m", 64_000)
    e.bind_session_state(session_db=db, session_id="s-dead")
    e.on_session_start("s-dead", platform="cli")
    e.on_session_start("s-dead", platform="cli")  # idempotent
    assert e.store.stats()["messages"] == 4
    res = json.loads(e.handle_tool_call("lcm_grep", {"query": "QX-9911"}))
    assert res["hits"] == 1


def test_repeated_message_in_a_new_session_of_the_conversation_is_stored(tmp_path, home):
    """A session sharing a gateway conversation_id sees the other's history, but a message that
    repeats one from there ("continue") is a new message of this session, not the old row."""
    e = make_engine(tmp_path)
    e.on_session_start("a", conversation_id="conv")
    e.ingest([{"role": "user", "content": "continue"}, {"role": "assistant", "content": "Done."}], session_id="a")
    e.on_session_start("b", conversation_id="conv")
    e.ingest([{"role": "user", "content": "continue"}, {"role": "assistant", "content": "Done."}], session_id="b")
    assert e.store.stats()["messages"] == 4
    assert set(e.store.lineage("b")) == {"a", "b"}


def test_branch_rebind_keeps_lineage_from_the_host_db(tmp_path, home):
    """/branch rebinds positionally without on_session_start; the host's session row names the
    parent, so the branch still sees the history it came from."""
    from hermes_state import SessionDB

    db = SessionDB(db_path=tmp_path / "state.db")
    db.create_session(session_id="root", source="cli", model="m")
    db.create_session(session_id="branch-1", source="cli", model="m", parent_session_id="root")
    e = make_engine(tmp_path)
    e.bind_session_state(db, "root")
    e.on_session_start("root")
    e.ingest([{"role": "user", "content": "the secret word is PELICAN-42"}])
    e.on_session_reset()
    e.bind_session_state(db, "branch-1")
    assert e.store.lineage("branch-1") == ["branch-1", "root"]
    res = json.loads(e.handle_tool_call("lcm_grep", {"query": "PELICAN-42"}))
    assert res["hits"] == 1
