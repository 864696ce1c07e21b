"""`lcm import hermes`: backfill from a real Hermes session database.

The database is written by the installed host's own `hermes_state.SessionDB` (sessions,
a parent/child pair, user/assistant/tool messages with tool calls, an in-place compaction
by the built-in compressor, a rewind). The import must store every conversation message
once, in order, with lineage; skip the compressor's summary and the copies it re-inserted;
never write to state.db; and add nothing when run again.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

import pytest

from tests.test_cli import ok, one_line_failure, run_lcm

hermes_state = pytest.importorskip("hermes_state")
SUMMARY_PREFIX = pytest.importorskip("agent.context_compressor").SUMMARY_PREFIX


def _tc(cid: str, name: str, args: dict) -> dict:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def build_state_db(home: Path) -> dict[str, list[dict]]:
    """Sessions written through the host's API; returns the expected conversation per session."""
    db = hermes_state.SessionDB(db_path=home / "state.db")
    expected: dict[str, list[dict]] = {}
    try:
        db.create_session("parent-1", source="cli", model="test-model")
        conv = [
            {"role": "user", "content": "Find why test_ledger fails; the canary is ZETA-4411."},
            {"role": "assistant", "content": "Let me look.",
             "tool_calls": [_tc("call_1", "search_files", {"pattern": "ledger"}),
                            _tc("call_2", "read_file", {"path": "src/ledger.py"})]},
            {"role": "tool", "tool_call_id": "call_1", "tool_name": "search_files", "content": "src/ledger.py:12"},
            {"role": "tool", "tool_call_id": "call_2", "tool_name": "read_file",
             "content": "def balance(x):\n    return x * 1.07  # port 18230"},
            {"role": "assistant", "content": "Decision: round in balance(); see src/ledger.py."},
        ]
        for i, m in enumerate(conv):
            db.append_message("parent-1", m["role"], content=m["content"], tool_name=m.get("tool_name"),
                              tool_calls=m.get("tool_calls"), tool_call_id=m.get("tool_call_id"),
                              timestamp=1_700_000_000 + i)
        expected["parent-1"] = conv

        db.create_session("child-1", source="cli", model="test-model", parent_session_id="parent-1")
        child = [
            {"role": "user", "content": "continue"},
            {"role": "assistant", "content": None, "tool_calls": [_tc("call_9", "terminal", {"command": "pytest -q"})]},
            {"role": "tool", "tool_call_id": "call_9", "tool_name": "terminal", "content": "3 passed"},
            {"role": "assistant", "content": "All green."},
            {"role": "user", "content": "continue"},  # said twice for real: stored twice
            {"role": "assistant", "content": "Nothing left to do."},
        ]
        for i, m in enumerate(child):
            db.append_message("child-1", m["role"], content=m["content"], tool_name=m.get("tool_name"),
                              tool_calls=m.get("tool_calls"), tool_call_id=m.get("tool_call_id"),
                              timestamp=1_700_000_100 + i)
        expected["child-1"] = child

        # A session the built-in compressor compacted in place, then continued; then a rewind.
        db.create_session("compacted-1", source="telegram", model="test-model")
        first = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}: detail #{i * 7}"}
                 for i in range(12)]
        for i, m in enumerate(first):
            db.append_message("compacted-1", m["role"], content=m["content"], timestamp=1_700_000_200 + i)
        summary = {"role": "user", "content": SUMMARY_PREFIX + "\nturns 2-8 discussed details."}
        db.archive_and_compact("compacted-1", first[:2] + [summary] + first[9:])
        later = [{"role": "user", "content": "and now the next question"},
                 {"role": "assistant", "content": "the next answer"}]
        for i, m in enumerate(later):
            db.append_message("compacted-1", m["role"], content=m["content"], timestamp=1_700_000_300 + i)
        rid = db.append_message("compacted-1", "user", content="oops, take this back", timestamp=1_700_000_400)
        db.append_message("compacted-1", "assistant", content="taken back", timestamp=1_700_000_401)
        db.rewind_to_message("compacted-1", rid)
        expected["compacted-1"] = first + later
    finally:
        db.close()
    return expected


def stored(store: Path) -> dict[str, list[dict]]:
    c = sqlite3.connect(store)
    try:
        out: dict[str, list[dict]] = {}
        for sid, raw in c.execute("SELECT session_id, raw FROM messages ORDER BY session_id, seq"):
            out.setdefault(sid, []).append(json.loads(raw))
        return out
    finally:
        c.close()


def provider_view(m: dict) -> dict:
    return {k: m[k] for k in ("role", "content", "tool_calls", "tool_call_id") if m.get(k) is not None}


def digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.fixture
def hermes_home(tmp_path):
    home = tmp_path / "hermes"
    home.mkdir()
    expected = build_state_db(home)
    return home, expected


def test_import_all_then_again_adds_nothing(hermes_home, tmp_path):
    home, expected = hermes_home
    store = tmp_path / "lcm" / "lcm.db"
    db_file = home / "state.db"
    before = digest(db_file)
    r = ok(run_lcm("--store", str(store), "import", "hermes", "--all", "--hermes-home", str(home), home=home))
    total = sum(len(v) for v in expected.values())
    assert f"{total} messages added" in r.stdout
    got = stored(store)
    assert set(got) == set(expected)
    for sid, conv in expected.items():
        assert [provider_view(m) for m in got[sid]] == [provider_view(m) for m in conv], sid
    # host-only fields survive verbatim; timestamps become the stored times
    tool = got["parent-1"][3]
    assert tool["tool_name"] == "read_file" and tool["timestamp"] == 1_700_000_003
    c = sqlite3.connect(store)
    try:
        parents = dict(c.execute("SELECT id, parent_id FROM sessions"))
        platforms = dict(c.execute("SELECT id, platform FROM sessions"))
        assert c.execute("SELECT created_at FROM messages WHERE session_id='parent-1' ORDER BY seq").fetchone()[0] \
            == 1_700_000_000
    finally:
        c.close()
    assert parents == {"parent-1": None, "child-1": "parent-1", "compacted-1": None}
    assert platforms["compacted-1"] == "telegram"
    assert "1 compressor summaries" in r.stdout and "2 rewound" in r.stdout

    r2 = ok(run_lcm("--store", str(store), "import", "hermes", "--all", "--hermes-home", str(home), home=home))
    assert "0 messages added (nothing new)" in r2.stdout
    assert stored(store) == got
    assert digest(db_file) == before, "state.db must never be written"

    # the agent tools see the backfilled history, lineage included
    hits = json.loads(ok(run_lcm("--store", str(store), "grep", "ZETA-4411", "--session", "child-1", "--json",
                                 home=home)).stdout)
    assert [h["role"] for g in hits["groups"] for h in g["hits"]] == ["user"]
    ok(run_lcm("--store", str(store), "doctor", home=home))


def test_import_one_session_brings_its_ancestors(hermes_home, tmp_path):
    home, expected = hermes_home
    store = tmp_path / "one.db"
    ok(run_lcm("--store", str(store), "import", "hermes", "--session", "child-1", "--hermes-home", str(home),
               home=home))
    got = stored(store)
    assert set(got) == {"parent-1", "child-1"}
    assert len(got["child-1"]) == len(expected["child-1"])
    ok(run_lcm("--store", str(store), "import", "hermes", "--all", "--hermes-home", str(home), home=home))
    assert set(stored(store)) == set(expected)
    assert "unknown" not in ok(run_lcm("--store", str(store), "sessions", home=home)).stdout
    line = one_line_failure(run_lcm("--store", str(store), "import", "hermes", "--session", "nope",
                                    "--hermes-home", str(home), home=home), 1)
    assert "no session 'nope'" in line


def test_import_after_host_appends(hermes_home, tmp_path):
    home, expected = hermes_home
    store = tmp_path / "grow.db"
    ok(run_lcm("--store", str(store), "import", "hermes", "--all", "--hermes-home", str(home), home=home))
    db = hermes_state.SessionDB(db_path=home / "state.db")
    try:
        db.append_message("child-1", "user", content="one more thing", timestamp=1_700_000_500)
        db.append_message("child-1", "assistant", content="sure", timestamp=1_700_000_501)
    finally:
        db.close()
    r = ok(run_lcm("--store", str(store), "import", "hermes", "--all", "--hermes-home", str(home), home=home))
    assert "2 messages added" in r.stdout
    got = stored(store)["child-1"]
    assert [m["content"] for m in got[-3:]] == ["Nothing left to do.", "one more thing", "sure"]
    assert len(got) == len(expected["child-1"]) + 2


def test_unreadable_database(tmp_path):
    home = tmp_path / "h"
    home.mkdir()
    (home / "state.db").write_text("not a database")
    line = one_line_failure(run_lcm("--store", str(tmp_path / "s.db"), "import", "hermes", "--all",
                                    "--hermes-home", str(home), home=home), 1)
    assert "cannot read" in line
