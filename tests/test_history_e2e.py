"""Issue #40's field scenarios through the real hermes-agent 0.19.0 agent loop, offline: what
the user undid stays gone even when the list after the undo reaches the engine through a pass.
"""

from __future__ import annotations

import pytest

from tests.support.fake_openai import ChatResponder, FakeOpenAI, Router, ScriptedResponder, SummariserResponder, ToolCall
from tests.support.hermes_host import hermes_available, run_hermes

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not hermes_available(), reason="hermes-agent not importable")]

SECRET = "OOPS-SECRET-8812"


def _store_hits(run, query: str, store=None) -> list[str]:
    """lcm_grep on the run's store (or a copy) after the host exited (no live list ingested on the way)."""
    import json

    from lossless_context import LCMEngine

    e = LCMEngine(store=str(store or run.hermes_home / "lcm" / "lcm.db"), summarizer="extractive")
    e.update_model("m", 64_000)
    e.on_session_start(run.result["session_id"])
    ans = json.loads(e.handle_tool_call("lcm_grep", {"query": query, "limit": 50}))
    assert "error" not in ans, ans
    return [h["id"] for g in ans["groups"] for h in g["hits"]]


def test_an_undo_whose_next_list_reaches_a_pass_is_not_searchable(tmp_path):
    """The secret is stored (a tool call hands the live list over), the user undoes it, and the
    next list reaches the engine only through compress(): the secret must not be found."""
    chat = ScriptedResponder({"look it up": ToolCall("lcm_grep", {"query": SECRET}, "call_undo_1")},
                             then=ChatResponder(reply_chars=30_000))
    with FakeOpenAI(responder=Router(chat=chat, summariser=SummariserResponder())) as srv:
        turns = [f"Question {i}: keep going with the billing refactor." for i in range(3)]
        turns += [f"my password is {SECRET}", "look it up", {"command": "/undo"}, {"command": "/undo"}]
        turns += [f"Question {i}: and the invoices?" for i in range(3, 8)]
        run = run_hermes(srv, turns, engine="lcm", workdir=tmp_path, end_session=False,
                         extra_config={"lcm": {"summarizer": "extractive"}})
        assert run.ok, run.describe()
        assert chat.tool_results, "the secret was handed to the engine before the undo"
        names = [c.get("method") for c in run.engine_calls if not c.get("depth")]
        assert "compress" in names[names.index("handle_tool_call"):], "a pass ran after the undo"
        assert not any(SECRET in str(m.get("content")) for m in run.messages)
        assert _store_hits(run, SECRET) == []
    # the store exported and imported elsewhere, and the shared page, keep it gone (items 2, 3)
    from tests.test_cli import ok, run_lcm

    db = run.hermes_home / "lcm" / "lcm.db"
    ok(run_lcm("--store", str(db), "export", "-o", str(tmp_path / "all.jsonl"), home=run.hermes_home))
    moved = tmp_path / "moved.db"
    ok(run_lcm("--store", str(moved), "import", "jsonl", str(tmp_path / "all.jsonl"), home=run.hermes_home))
    assert _store_hits(run, SECRET, store=moved) == []
    assert _store_hits(run, "billing refactor", store=moved)
    page = tmp_path / "view.html"
    ok(run_lcm("--store", str(db), "view", run.result["session_id"], "-o", str(page), home=run.hermes_home))
    assert SECRET not in page.read_text() and '"u":1' in page.read_text()


def _context_shape(db, sid: str) -> tuple[int, int, list[int], int]:
    """(context items, their tokens, the summaries in it, messages stored twice)."""
    import collections
    import sqlite3

    c = sqlite3.connect(db)
    try:
        idents = [r[0] for r in c.execute("SELECT ident FROM messages WHERE session_id=? ORDER BY seq", (sid,))]
        ctx = c.execute("SELECT message_id, summary_id FROM context_items WHERE session_id=? ORDER BY pos",
                        (sid,)).fetchall()
        tokens = sum(c.execute("SELECT tokens FROM messages WHERE id=?", (m,)).fetchone()[0] if m else
                     c.execute("SELECT tokens FROM summaries WHERE id=?", (s,)).fetchone()[0] for m, s in ctx)
    finally:
        c.close()
    twice = sum(v - 1 for v in collections.Counter(idents).values() if v > 1)
    return len(ctx), tokens, [s for _m, s in ctx if s], twice


def test_import_after_a_crash_takes_the_active_transcript_and_doctor_repairs_old_copies(tmp_path):
    """0.19.0 keeps each compaction's archived rows (active=0, compacted=1) and re-persists the
    head and tail: `lcm import hermes --all` after a crash must add only the turns never handed
    over, and `lcm doctor --repair` removes the copies an earlier importer stored."""
    import shutil

    from lossless_context import LCMEngine
    from lossless_context.hermes.importer import _session_rows, open_readonly, reconstruct, state_db_path
    from lossless_context.ops.doctor import run_doctor
    from tests.test_cli import ok, run_lcm

    with FakeOpenAI(responder=Router(chat=ChatResponder(reply_chars=30_000), summariser=SummariserResponder())) as srv:
        turns = [f"Turn {i}: keep going with the billing refactor." for i in range(14)]
        run = run_hermes(srv, turns, engine="lcm", workdir=tmp_path, end_session=False,  # killed: no flush at exit
                         extra_config={"lcm": {"summarizer": "extractive"}})
        assert run.ok, run.describe()
    sid = run.result["session_id"]
    db = run.hermes_home / "lcm" / "lcm.db"
    old = tmp_path / "earlier.db"
    for suffix in ("", "-wal"):
        if (db.parent / (db.name + suffix)).exists():
            shutil.copyfile(db.parent / (db.name + suffix), old.parent / (old.name + suffix))
    items, _tokens, sums, twice = _context_shape(db, sid)
    assert sums and twice == 0
    said = 2 * len(turns)  # a user message and a reply per turn
    ok(run_lcm("--store", str(db), "import", "hermes", "--all", home=run.hermes_home))
    items, tokens, sums, twice = _context_shape(db, sid)
    assert twice == 0 and len(sums) == len(set(sums)), (items, sums, twice)
    assert tokens < 64_000, tokens
    import sqlite3

    assert sqlite3.connect(db).execute("SELECT count(*) FROM messages WHERE session_id=?", (sid,)).fetchone()[0] == said
    assert run_doctor(_open(db)).ok
    ok(run_lcm("--store", str(db), "import", "hermes", "--all", home=run.hermes_home))  # again: nothing new
    assert _context_shape(db, sid) == (items, tokens, sums, twice)

    # what an earlier importer did: every row, archived copies and re-persisted head included
    conn = open_readonly(state_db_path(run.hermes_home))
    msgs, _info = reconstruct(_session_rows(conn, sid), [])
    conn.close()
    e = LCMEngine(store=str(old), summarizer="extractive")
    e.update_model("m", 64_000)
    e.ingest(msgs, session_id=sid)
    e.store.close()
    _items, bad_tokens, _sums, bad_twice = _context_shape(old, sid)
    assert bad_twice > 0 and bad_tokens > 64_000  # the damage the issue measured
    rep = run_doctor(_open(old))
    assert not rep.ok and any(c.name == "no message stored twice by an import" and not c.ok for c in rep.checks)
    ok(run_lcm("--store", str(old), "doctor", "--repair", home=run.hermes_home))
    _items, fixed_tokens, fixed_sums, fixed_twice = _context_shape(old, sid)
    assert fixed_twice == 0 and len(fixed_sums) == len(set(fixed_sums)) and fixed_tokens < 64_000
    assert run_doctor(_open(old)).ok


def _open(path):
    from lossless_context.store import open_store

    return open_store(str(path))


def test_the_original_outranks_the_agents_own_searches(tmp_path):
    """svc-kappa-5 said in turn 1, searched for three times: the next search's first hits are
    the originals, not the earlier calls, answers and replies (they follow, marked)."""
    import json

    term = "svc-kappa-5"
    script = {f"search {k}": ToolCall("lcm_grep", {"query": term}, f"call_kappa_{k}") for k in range(4)}
    chat = ScriptedResponder(script, then=ChatResponder(reply_chars=300))
    with FakeOpenAI(responder=Router(chat=chat, summariser=SummariserResponder())) as srv:
        turns = [f"Our staging cluster is called {term}; deploys go there first.", "ok, next topic: invoices"]
        turns += [f"search {k}: what was {term} again?" for k in range(4)]
        run = run_hermes(srv, turns, engine="lcm", workdir=tmp_path, extra_config={"lcm": {"summarizer": "extractive"}})
        assert run.ok, run.describe()
    last = json.loads(chat.tool_results[-1]["content"])
    hits = [h for g in last["groups"] for h in g["hits"]]
    top = [h.get("message", {}).get("content", "") for h in hits[:2]]
    assert any(t.startswith("Our staging cluster is called") for t in top), hits[:3]  # what the user said
    assert not any(h.get("tool_traffic") for h in hits[:2])
    traffic = [h for h in hits if h.get("tool_traffic")]
    assert len(traffic) >= 6 and hits.index(traffic[0]) >= 2


def test_stored_times_are_the_hosts(tmp_path):
    """0.19.0 hands the engine lists without times; the stored rows carry the times the host's
    session database has for them, not the moment of the compaction that stored them."""
    import sqlite3

    with FakeOpenAI(responder=Router(chat=ChatResponder(reply_chars=30_000), summariser=SummariserResponder())) as srv:
        turns = [f"Turn {i}: keep going with the billing refactor." for i in range(9)]
        run = run_hermes(srv, turns, engine="lcm", workdir=tmp_path, extra_config={"lcm": {"summarizer": "extractive"}})
        assert run.ok, run.describe()
    sid = run.result["session_id"]
    host = sqlite3.connect(run.hermes_home / "state.db")
    said = {}
    for content, ts in host.execute("SELECT content, timestamp FROM messages WHERE session_id=? AND role='user'"
                                    " ORDER BY id", (sid,)):
        said.setdefault(content, ts)
    ours = sqlite3.connect(run.hermes_home / "lcm" / "lcm.db").execute(
        "SELECT text, created_at FROM messages WHERE session_id=? AND role='user' ORDER BY seq", (sid,)).fetchall()
    assert len(ours) == len(turns)
    off = [(t, round(at - said[t], 3)) for t, at in ours if abs(at - said[t]) > 0.01]
    # only the turn in flight when its list arrived keeps the moment it was stored
    assert len(off) <= 2 and all(abs(d) < 5 for _t, d in off), off
    assert len({at for _t, at in ours}) > 3  # not all one moment (the host's times differ by milliseconds)


def test_a_turn_forgotten_on_a_live_session_is_not_stored_again(tmp_path, hermes_host):
    """`lcm forget --turn` while the session lives on: the host's own transcript still holds the
    turn, and resuming the session hands it over again (with every later list). It stays
    forgotten — not stored, not found — while the new turn is stored (through each host)."""
    import sqlite3

    from tests.test_cli import ok, run_lcm

    with FakeOpenAI(responder=Router(chat=ChatResponder(reply_chars=400), summariser=SummariserResponder())) as srv:
        turns = ["Question 1: the billing refactor.", f"my password is {SECRET}", "Question 3: the invoices."]
        first = run_hermes(srv, turns, engine="lcm", workdir=tmp_path)
        assert first.ok, first.describe()
        sid = first.result["session_id"]
        hits = _store_hits(first, SECRET)
        assert hits, "the secret was never stored"
        ok(run_lcm("forget", hits[0], "--turn", "--yes", home=first.hermes_home))
        assert _store_hits(first, SECRET) == []
        again = run_hermes(srv, ["Question 4: and the taxes?"], engine="lcm", hermes_home=first.hermes_home,
                           home=first.home, session_id=sid, resume=True)
        assert again.ok, again.describe()
        assert again.result.get("resumed_messages", 0) >= 6  # the host's transcript holds the turn
    assert _store_hits(again, SECRET) == [], "the host's copy of the forgotten turn was stored again"
    with sqlite3.connect(again.hermes_home / "lcm" / "lcm.db") as c:
        assert c.execute("SELECT COUNT(*) FROM messages WHERE text LIKE ?", (f"%{SECRET}%",)).fetchone()[0] == 0
        assert c.execute("SELECT COUNT(*) FROM messages WHERE text LIKE '%Question 4%'").fetchone()[0] >= 1
    ok(run_lcm("doctor", home=again.hermes_home))
