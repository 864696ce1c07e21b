"""Store behaviour, the same for both backends (SQLite file and a throw-away PostgreSQL)."""

from __future__ import annotations

import json
import multiprocessing
import os
import stat
import threading
import time
import uuid
from pathlib import Path

import pytest

from lossless_context.messages import clean_text, safe_json
from lossless_context.search.query import compile_regex, plan_query
from lossless_context.records import ContextEntry, NewMessage, NewSummary
from lossless_context.store import StoreError, open_store
from lossless_context.store.sqlite.store import SQLiteStore

BACKENDS = ["sqlite", "postgres"]
T0 = 1_700_000_000.0


@pytest.fixture(params=BACKENDS)
def location(request, tmp_path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "lcm" / "lcm.db")
    return request.getfixturevalue("pg_fresh_dsn")


@pytest.fixture
def store(location):
    s = open_store(location)
    yield s
    s.close()


# -- helpers --------------------------------------------------------------------------------

def nm(text: str, role: str = "user", *, raw=None, uid=None, t: float = T0, tokens: int | None = None,
       absorbed=(), large=False, exploration=None) -> NewMessage:
    raw = {"role": role, "content": text} if raw is None else raw
    return NewMessage(raw=raw, role=role, ident=uuid.uuid4().hex, uid=uid, text=text,
                      tokens=len(text) // 4 + 1 if tokens is None else tokens, created_at=t,
                      absorbed=list(absorbed), large=large, exploration=exploration)


def leaf(key: str, mids: list[int], text: str, *, t_end: float = T0) -> NewSummary:
    return NewSummary(key=key, kind="leaf", depth=0, text=text, tokens=10, source_tokens=100, level="normal",
                      summarizer="test", t_start=T0, t_end=t_end, n_messages=len(mids), message_ids=list(mids))


def condensed(key: str, children: list, text: str, *, depth: int = 1) -> NewSummary:
    return NewSummary(key=key, kind="condensed", depth=depth, text=text, tokens=10, source_tokens=100,
                      level="normal", summarizer="test", t_start=T0, t_end=T0 + 50, n_messages=3,
                      child_keys=list(children))


def ctx(store, sid) -> list[tuple[str, int]]:
    return [(e.kind, e.ref) for e in store.get_context(sid)[1]]


def set_ctx(store, sid, items, expected=None) -> int:
    return store.set_context(sid, [ContextEntry(k, r) for k, r in items], expected_version=expected)


def ids_of(rows) -> list[int]:
    return [r["id"] for r in rows]


def search(store, q, target="messages", sessions=None, **kw):
    return store.search(target, sessions, plan_query(q), **kw)


# -- opening, migrations, files ---------------------------------------------------------------

def test_open_is_lazy(location):
    s = open_store(location)
    try:
        if s.kind == "sqlite":
            assert not os.path.exists(location)
        else:
            assert s._pool is None and s._lock_pool is None
        s.ensure_session("a")
        assert s.get_session("a")["id"] == "a"
    finally:
        s.close()


def test_migrations_recorded_and_idempotent(location):
    a = open_store(location)
    a.ensure_session("x")
    first = a.applied_migrations()
    assert "001_initial" in first
    a.close()
    b = open_store(location)
    try:
        assert b.applied_migrations() == first
        assert b.get_session("x") is not None
        # Closing and reopening the same object works too.
        b.close()
        assert b.get_session("x") is not None
    finally:
        b.close()


def test_backends_have_the_same_methods():
    """Every public method of the SQLite store (the reference) exists on the PostgreSQL store
    with the same signature, and neither leaves an abstract method unimplemented."""
    import inspect

    from lossless_context.store.base import Store
    from lossless_context.store.postgres.store import PostgresStore

    assert not PostgresStore.__abstractmethods__ and not SQLiteStore.__abstractmethods__
    skip = {"conn", "tx"}  # SQLite connection plumbing
    for name, fn in inspect.getmembers(SQLiteStore, inspect.isfunction):
        if name.startswith("_") or name in skip:
            continue
        other = getattr(PostgresStore, name, None)
        assert other is not None, f"PostgresStore lacks {name}"
        assert inspect.signature(other) == inspect.signature(fn), name
    for name in Store.__abstractmethods__:
        assert getattr(PostgresStore, name) is not getattr(Store, name), name


def test_sqlite_file_modes(tmp_path):
    loc = tmp_path / "deep" / "dir" / "lcm.db"
    old = os.umask(0o022)
    try:
        s = SQLiteStore(str(loc))
        s.ensure_session("a")
        with s.compaction_lock("a", 1) as ok:
            assert ok
    finally:
        os.umask(old)
    assert stat.S_IMODE(loc.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(loc.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "deep" / "dir" / "lcm.db.locks").stat().st_mode) == 0o700
    s.close()


# -- sessions -----------------------------------------------------------------------------------

def test_sessions_and_lineage(store):
    store.ensure_session("root", platform="cli", model="m1")
    store.ensure_session("child", parent_id="root")
    store.ensure_session("grandchild", parent_id="child", conversation_id="conv")
    store.ensure_session("sibling", conversation_id="conv")
    store.ensure_session("unrelated", conversation_id="other")
    store.ensure_session("self", parent_id="self")  # a session is never its own parent

    g = store.get_session("grandchild")
    assert g["parent_id"] == "child" and g["conversation_id"] == "conv"
    assert g["context_version"] == 0 and g["compactions"] == 0
    assert store.get_session("self")["parent_id"] is None
    assert store.get_session("nope") is None

    lin = store.lineage("grandchild")
    assert lin[0] == "grandchild"
    assert set(lin) == {"grandchild", "child", "root", "sibling"}
    assert len(lin) == len(set(lin))
    assert set(store.lineage("sibling")) == {"sibling", "grandchild", "child", "root"}
    assert store.lineage("root") == ["root"]
    assert store.lineage("unrelated") == ["unrelated"]
    assert store.lineage("missing") == ["missing"]

    # Later calls fill in what is missing and never overwrite the parent or conversation.
    store.ensure_session("root", platform=None, model="m2", boundary_reason="compress")
    store.ensure_session("child", parent_id="unrelated", conversation_id="late")
    r, c = store.get_session("root"), store.get_session("child")
    assert (r["platform"], r["model"], r["boundary_reason"]) == ("cli", "m2", "compress")
    assert (c["parent_id"], c["conversation_id"]) == ("root", "late")

    # A parent named before it exists is created on the fly.
    store.ensure_session("orphan", parent_id="ghost")
    assert store.get_session("ghost") is not None

    listed = {s["id"]: s for s in store.list_sessions()}
    assert {"root", "child", "grandchild", "sibling", "unrelated", "self", "orphan", "ghost"} <= set(listed)
    assert set(listed["root"]) == {"id", "parent_id", "conversation_id", "created_at", "updated_at",
                                   "compactions", "last_compaction_at", "messages", "summaries",
                                   "boundary_reason"}  # (background forks are told apart by it: forks.py)


def test_lineage_cycle_terminates(store):
    store.ensure_session("a")
    store.ensure_session("b", parent_id="a")
    store.ensure_session("a", parent_id="b")  # a cycle a -> b -> a
    assert set(store.lineage("a")) == {"a", "b"}


# -- messages --------------------------------------------------------------------------------------

RAW_CASES = [
    {"role": "user", "content": "plain"},
    {"content": "keys out of order", "role": "assistant", "zeta": 1, "alpha": [1, 2, {"b": 1, "a": 2}]},
    {"role": "user", "content": "unicode: crème brûlée — 重试次数上限 — 🚀 — \u202e"},
    {"role": "user", "content": "lone \ud800 high and \udfff low surrogates, pair \ud83d\ude80"},
    {"role": "tool", "content": "nul \x00 byte and \x00\x00 more", "tool_call_id": "c\x001"},
    {"role": "user", "content": [
        {"type": "text", "text": "look at this"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
    ]},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": [1, [2, [3]]]}"}}]},
    {"role": "user", "content": "numbers", "f": 1.5e-300, "big": 2 ** 70, "neg": -0.0, "t": True, "n": None},
    "a bare string message",
    ["a", "list", {"as": "message"}],
]


def test_append_roundtrip_raw_verbatim(store):
    store.ensure_session("s")
    rows = [nm(f"text {i}", raw=raw) for i, raw in enumerate(RAW_CASES)]
    ids = store.append_messages("s", rows)
    assert len(ids) == len(RAW_CASES) and ids == sorted(ids) and len(set(ids)) == len(ids)
    got = store.get_messages(ids)
    for mid, raw in zip(ids, RAW_CASES):
        rec = got[mid]
        assert safe_json(rec.raw) == safe_json(raw)  # byte-identical JSON, key order kept
        assert rec.raw == json.loads(safe_json(raw))  # (a surrogate pair decodes joined)
    # Reading again through another path gives the same.
    again = store.session_messages("s")
    assert [m.id for m in again] == ids
    assert [safe_json(m.raw) for m in again] == [safe_json(r) for r in RAW_CASES]


def test_a_read_record_decodes_its_raw_once_and_stands_for_the_eager_record(store):
    """A pass reads hundreds of rows and decodes the raw JSON of few (store/rows.py): the record
    read must still be the record - equal to one built eagerly, the same object on every read
    of .raw (a caller may keep or change it), writable, and copied or pickled whole."""
    import copy
    import dataclasses
    import pickle

    from lossless_context.records import MessageRecord
    from lossless_context.store.rows import message_record

    store.ensure_session("s")
    raws = [{"role": "user", "content": "one"}, {"role": "tool", "tool_call_id": "c1", "content": "x" * 50}]
    ids = store.append_messages("s", [nm(f"t{i}", raw=r) for i, r in enumerate(raws)])
    got = store.get_messages(ids)
    for mid, raw in zip(ids, raws):
        rec = got[mid]
        first = rec.raw
        assert first == raw and rec.raw is first
        eager = MessageRecord(**{f.name: getattr(rec, f.name) for f in dataclasses.fields(MessageRecord)})
        assert rec == eager and eager == rec and not (rec != eager)
        assert dataclasses.asdict(rec)["raw"] == raw
        for twin in (copy.copy(rec), copy.deepcopy(rec), pickle.loads(pickle.dumps(rec))):
            assert twin == rec and twin.raw == raw
    # A copy taken before the first read carries the decoded message too.
    fresh = store.get_messages(ids[:1])[ids[0]]
    assert pickle.loads(pickle.dumps(fresh)).raw == raws[0]
    assert fresh != store.get_messages(ids[1:])[ids[1]]
    fresh.raw = {"role": "user", "content": "changed"}
    assert fresh.raw == {"role": "user", "content": "changed"}
    # A raw column that is not JSON (a row from before safe_json) reads as its text.
    row = (1, "s", 0, None, "i", "user", "not {json", "t", 1, T0, 0, None)
    assert message_record(row).raw == "not {json" and message_record(row).large is False


def test_append_seq_fields_and_reads(store):
    store.ensure_session("s")
    store.ensure_session("other")
    assert store.append_messages("s", []) == []
    a = store.append_messages("s", [nm("one", uid="u1", t=T0 + 1), nm("two", "assistant", t=T0 + 2)])
    b = store.append_messages("s", [nm("three", uid="u1", t=T0 + 3, absorbed=["u0", "u0"], large=True,
                                       exploration="explored")])
    c = store.append_messages("other", [nm("elsewhere", uid="u1")])
    msgs = store.session_messages("s")
    assert [m.seq for m in msgs] == [0, 1, 2]
    assert [m.text for m in msgs] == ["one", "two", "three"]
    assert [m.role for m in msgs] == ["user", "assistant", "user"]
    m3 = msgs[2]
    assert m3.large is True and m3.exploration == "explored" and m3.uid == "u1"
    assert m3.created_at == T0 + 3 and isinstance(m3.tokens, int)
    assert msgs[0].large is False and msgs[0].exploration is None
    assert store.session_messages("other")[0].seq == 0
    assert [m.text for m in store.session_messages("s", after_seq=0, limit=1)] == ["two"]
    assert store.get_messages([]) == {}
    got = store.get_messages([b[0], a[0], a[0], 10 ** 9])
    assert set(got) == {a[0], b[0]} and got[a[0]].session_id == "s"

    # log_after: (id, ident, uid) in id order for the given sessions only.
    log = store.log_after(["s"], a[0], 10)
    assert [r[0] for r in log] == [a[1], b[0]]
    assert log[1][2] == "u1" and log[1][1] == msgs[2].ident
    assert [r[0] for r in store.log_after(["s", "other"], 0, 100)] == [*a, *b, *c]
    assert len(store.log_after(["s", "other"], 0, 2)) == 2
    assert store.log_after([], 0, 10) == []

    # find_uid: the newest version within the scope.
    assert store.find_uid(["s"], "u1") == (b[0], msgs[2].ident)
    assert store.find_uid(["s", "other"], "u1")[0] == c[0]
    assert store.find_uid(["s"], "nope") is None

    assert [m.id for m in store.iter_all_messages(batch=2)] == [*a, *b, *c]
    assert store.get_session("s")["updated_at"] >= store.get_session("s")["created_at"]


def test_aliases(store):
    store.ensure_session("s")
    ids = store.append_messages("s", [nm("a"), nm("b"), nm("c")])
    assert store.aliases_for(ids) == {}
    store.add_aliases([])
    store.add_aliases([("alias-a", ids[0]), ("alias-a2", ids[0]), ("alias-b", ids[1])])
    store.add_aliases([("alias-a", ids[0])])  # recording twice is harmless
    assert store.aliases_for([ids[0], ids[0], ids[2]]) == {"alias-a": ids[0], "alias-a2": ids[0]}
    assert store.aliases_for(ids) == {"alias-a": ids[0], "alias-a2": ids[0], "alias-b": ids[1]}
    assert store.aliases_for([]) == {}
    with pytest.raises(Exception):  # noqa: B017  (either backend's integrity error)
        store.add_aliases([("dangling", 10 ** 9)])  # foreign key: the message must exist
    assert store.aliases_for([10 ** 9]) == {}


def test_representations_are_set_once_and_the_first_text_wins(store):
    store.ensure_session("s")
    a, b, c = store.append_messages("s", [nm("a"), nm("b"), nm("c")])
    assert store.set_representations([(a, "stub a"), (b, "stub b"), (a, "later a")]) == {a, b}
    assert store.set_representations([(b, "again b"), (c, "stub c")]) == {c}  # b keeps its own
    got = store.get_messages([a, b, c])
    assert [(got[i].large, got[i].exploration) for i in (a, b, c)] == [
        (True, "stub a"), (True, "stub b"), (True, "stub c")]
    assert store.set_representations([]) == set()


def test_presummaries(store):
    store.ensure_session("s")
    store.ensure_session("t")
    assert store.get_presummary("s", "k1") is None
    assert store.count_presummaries() == 0 and store.count_presummaries("s") == 0
    store.put_presummary("s", "k1", "first \x00draft", 5, 50, "normal", "llm")
    store.put_presummary("s", "k2", "other span", 6, 60, "normal", "llm")
    store.put_presummary("t", "k1", "same key, other session", 7, 70, "deterministic", "extractive")
    assert store.get_presummary("s", "k1") == {"text": clean_text("first \x00draft"), "tokens": 5,
                                               "source_tokens": 50, "level": "normal", "summarizer": "llm"}
    store.put_presummary("s", "k1", "better draft", 4, 50, "aggressive", "llm2")  # replaces
    assert store.get_presummary("s", "k1") == {"text": "better draft", "tokens": 4, "source_tokens": 50,
                                               "level": "aggressive", "summarizer": "llm2"}
    assert store.get_presummary("t", "k1")["text"] == "same key, other session"
    assert store.count_presummaries() == 3 and store.count_presummaries("s") == 2
    assert store.count_presummaries("missing") == 0
    with pytest.raises(Exception):  # noqa: B017  (either backend's integrity error)
        store.put_presummary("ghost", "k", "x", 1, 1, "normal", "llm")  # the session must exist


def test_append_to_unknown_session_fails_whole(store):
    with pytest.raises(Exception):  # noqa: B017  (either backend's integrity error)
        store.append_messages("ghost", [nm("x")])
    assert store.session_messages("ghost") == []


def test_text_with_nul_and_surrogates_is_stored(store):
    """Any str is accepted as text, cleaned as clean_text does (NUL dropped, lone
    surrogates replaced); raw (JSON) always comes back exactly."""
    store.ensure_session("s")
    text = "before\x00after \ud800 lone kiwifruit"
    (mid,) = store.append_messages("s", [nm(text, raw={"content": text})])
    rec = store.get_messages([mid])[mid]
    assert rec.raw == {"content": text}
    assert rec.text == clean_text(text) and "\x00" not in rec.text
    assert ids_of(search(store, "kiwifruit")) == [mid]
    ids = store.append_messages("s", [nm("x")])
    km, _ = store.stage_pass("s", "p", [leaf("L", ids, "summary \x00with \udfff odd text")], [("s", "L")],
                             *_vlen(store, "s"))
    assert store.get_summaries([km["L"]], include_staged=True)[km["L"]].text == clean_text(
        "summary \x00with \udfff odd text")


def test_threads_share_one_store(store):
    """Many threads appending to one session through one store object (PostgreSQL: a pool
    smaller than the number of threads) lose nothing and keep seq gap-free."""
    store.ensure_session("s")
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            for k in range(10):
                ids = store.append_messages("s", [nm(f"thread{t} item{k}")])
                while True:
                    v, entries = store.get_context("s")
                    try:
                        store.set_context("s", [*entries, ContextEntry("m", ids[0])], expected_version=v)
                        break
                    except StoreError:
                        continue
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not errors
    msgs = store.session_messages("s")
    assert [m.seq for m in msgs] == list(range(80))
    for t in range(8):
        assert [m.text for m in msgs if m.text.startswith(f"thread{t} ")] == [f"thread{t} item{k}" for k in range(10)]
    assert sorted(ref for _, ref in ctx(store, "s")) == [m.id for m in msgs]
    assert store.get_context("s")[0] == 80


_FORK_SCRIPT = r"""
import os, sys, uuid, warnings
from lossless_context.records import NewMessage
from lossless_context.store import open_store

def nm(text):
    return NewMessage(raw={"role": "user", "content": text}, role="user", ident=uuid.uuid4().hex, uid=None,
                      text=text, tokens=3, created_at=1_700_000_000.0, absorbed=[], large=False, exploration=None)

store = open_store(sys.argv[1])
store.ensure_session("s")
store.append_messages("s", [nm("before fork")])
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads running
    pid = os.fork()
if pid == 0:
    try:
        os._exit(0 if store.get_session("s") is not None else 3)
    finally:
        os._exit(4)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
store.append_messages("s", [nm("after fork")])
assert [m.text for m in store.session_messages("s")] == ["before fork", "after fork"]
store.close()
print("ok")
"""


def test_fork_after_use(location):
    """A forked child opens its own connections; the parent's keep working. In a process of
    its own: forking this test run, whose other tests leave threads of their own stores inside
    SQLite at any moment, would hand the child a library lock held by a thread it does not
    have (that is what fork does to any threaded process; our store's own threads are held
    at the fork by their at-fork hooks: index.py, merge.py)."""
    if not hasattr(os, "fork"):
        pytest.skip("no fork")
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                                                   os.environ.get("PYTHONPATH", "")]))}
    r = subprocess.run([sys.executable, "-c", _FORK_SCRIPT, location], capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stdout, r.stderr[-2000:])


# -- context -----------------------------------------------------------------------------------------

def test_context_roundtrip(store):
    store.ensure_session("s")
    assert store.get_context("s") == (0, [])
    assert store.get_context("missing") == (0, [])
    ids = store.append_messages("s", [nm("hello", tokens=7), nm("reply", "assistant", tokens=9)])
    v = set_ctx(store, "s", [("m", ids[0]), ("m", ids[1])])
    assert v == 1
    version, entries = store.get_context("s")
    assert version == 1
    assert [(e.kind, e.ref, e.role, e.tokens) for e in entries] == [("m", ids[0], "user", 7),
                                                                     ("m", ids[1], "assistant", 9)]
    msgs = store.get_messages(ids)
    assert [e.ident for e in entries] == [msgs[ids[0]].ident, msgs[ids[1]].ident]

    with pytest.raises(StoreError):
        set_ctx(store, "s", [("m", ids[0])], expected=0)
    assert ctx(store, "s") == [("m", ids[0]), ("m", ids[1])]
    assert set_ctx(store, "s", [("m", ids[1])], expected=1) == 2
    assert store.get_context("s") [0] == 2
    assert set_ctx(store, "s", []) == 3
    assert store.get_context("s") == (3, [])
    with pytest.raises(StoreError):
        set_ctx(store, "ghost", [])


def test_context_with_summary_entry(store):
    store.ensure_session("s")
    ids = store.append_messages("s", [nm("a"), nm("b"), nm("c")])
    set_ctx(store, "s", [("m", i) for i in ids])
    keymap, resolved = store.stage_pass("s", "p1", [leaf("k", ids[:2], "sum of a b")],
                                        [("s", "k"), ("m", ids[2])], 1, 3)
    assert store.publish_pass("p1")
    entries = store.get_context("s")[1]
    assert (entries[0].kind, entries[0].ref, entries[0].role, entries[0].tokens, entries[0].ident) == (
        "s", keymap["k"], "summary", 10, "")


# -- staged passes ---------------------------------------------------------------------------------------

def _session_with_messages(store, sid="s", n=6, text="message number {i} about widgets"):
    store.ensure_session(sid)
    ids = store.append_messages(sid, [nm(text.format(i=i), t=T0 + i) for i in range(n)])
    set_ctx(store, sid, [("m", i) for i in ids])
    return ids


def test_stage_then_publish(store):
    ids = _session_with_messages(store)
    version, entries = store.get_context("s")
    summaries = [leaf("L1", ids[0:2], "zanzibar leaf one"), leaf("L2", ids[2:4], "zanzibar leaf two"),
                 condensed("C", ["L1", "L2"], "zanzibar condensed")]
    keymap, resolved = store.stage_pass("s", "p1", summaries, [("s", "C"), ("m", ids[4]), ("m", ids[5])],
                                        version, len(entries))
    assert set(keymap) == {"L1", "L2", "C"}
    assert resolved == [("s", keymap["C"]), ("m", ids[4]), ("m", ids[5])]

    # Staged: invisible to readers and search, visible to the stager.
    assert store.get_summaries(list(keymap.values())) == {}
    staged = store.get_summaries(list(keymap.values()), include_staged=True)
    assert {s.state for s in staged.values()} == {"staged"} and staged[keymap["C"]].pass_id == "p1"
    assert search(store, "zanzibar", target="summaries") == []
    assert store.message_summaries(ids[0]) == []
    assert store.summary_parents(keymap["L1"]) == []
    assert ctx(store, "s") == [("m", i) for i in ids]  # the published context is untouched
    sp = store.latest_staged("s")
    assert (sp.pass_id, sp.session_id, sp.base_version, sp.base_len) == ("p1", "s", version, len(entries))
    assert sp.items == resolved and sp.top_nodes == [keymap["C"]]
    assert store.stats("s")["staged_summaries"] == 3

    assert store.publish_pass("p1") is True
    assert store.latest_staged("s") is None
    assert store.publish_pass("p1") is False  # already consumed
    assert store.publish_pass("never-staged") is False
    pub = store.get_summaries(list(keymap.values()))
    assert set(pub) == set(keymap.values()) and {s.state for s in pub.values()} == {"published"}
    rec = pub[keymap["C"]]
    assert (rec.kind, rec.depth, rec.session_id, rec.level, rec.summarizer, rec.n_messages) == (
        "condensed", 1, "s", "normal", "test", 3)
    assert ctx(store, "s") == resolved
    assert store.get_context("s")[0] == version + 1
    sess = store.get_session("s")
    assert sess["compactions"] == 1 and sess["last_compaction_at"] is not None

    assert store.summary_children(keymap["C"]) == ([keymap["L1"], keymap["L2"]], [])
    assert store.summary_children(keymap["L1"]) == ([], ids[0:2])
    assert store.summary_parents(keymap["L1"]) == [keymap["C"]]
    assert store.message_summaries(ids[0]) == [keymap["L1"]]
    assert store.message_summaries(ids[5]) == []
    assert ids_of(search(store, "zanzibar", target="summaries"))[0] in keymap.values()
    st = store.stats("s")
    assert st["summaries_by_depth"] == {0: 2, 1: 1} and st["staged_summaries"] == 0 and st["compactions"] == 1


def test_publish_into_session(store):
    ids = _session_with_messages(store, "old", 4)
    store.ensure_session("new", parent_id="old")
    km, resolved = store.stage_pass("old", "p", [leaf("L", ids[:3], "carried over")], [("s", "L"), ("m", ids[3])],
                                    *_vlen(store, "old"))
    assert store.publish_pass("p", into_session="new")
    assert ctx(store, "new") == resolved == ctx(store, "old")
    assert store.get_session("new")["context_version"] == 1
    assert store.get_session("old")["compactions"] == 1


def _vlen(store, sid):
    v, e = store.get_context(sid)
    return v, len(e)


def test_publish_after_context_moved_keeps_new_items(store):
    ids = _session_with_messages(store, "s", 4)
    v, n = _vlen(store, "s")
    km, _ = store.stage_pass("s", "p", [leaf("L", ids[:2], "early part")], [("s", "L"), ("m", ids[2]), ("m", ids[3])],
                             v, n)
    # Meanwhile the host appended two more messages to the published context.
    more = store.append_messages("s", [nm("late one"), nm("late two")])
    set_ctx(store, "s", [("m", i) for i in ids + more])
    assert store.publish_pass("p")
    assert ctx(store, "s") == [("s", km["L"]), ("m", ids[2]), ("m", ids[3]), ("m", more[0]), ("m", more[1])]


def test_discard_pass_and_stale(store):
    ids = _session_with_messages(store, "s", 4)
    v, n = _vlen(store, "s")
    k1, _ = store.stage_pass("s", "p1", [leaf("L", ids[:2], "first try")], [("s", "L"), ("m", ids[2]), ("m", ids[3])], v, n)
    time.sleep(0.01)
    k2, _ = store.stage_pass("s", "p2", [leaf("L", ids[:2], "second try")], [("s", "L"), ("m", ids[2]), ("m", ids[3])], v, n)
    time.sleep(0.01)
    k3, _ = store.stage_pass("s", "p3", [leaf("L", ids[:2], "third try")], [("s", "L"), ("m", ids[2]), ("m", ids[3])], v, n)
    assert store.latest_staged("s").pass_id == "p3"
    store.discard_pass("p3")
    assert store.get_summaries([k3["L"]], include_staged=True) == {}
    assert store.latest_staged("s").pass_id == "p2"
    store.discard_pass("p3")  # discarding twice is harmless

    assert store.discard_stale("s", keep="p2") == 1
    assert store.get_summaries([k1["L"]], include_staged=True) == {}
    assert store.latest_staged("s").pass_id == "p2"
    assert store.discard_stale("s") == 1
    assert store.latest_staged("s") is None
    assert store.get_summaries([k2["L"]], include_staged=True) == {}
    assert store.stats("s")["staged_summaries"] == 0
    assert store.discard_stale("s") == 0
    assert ctx(store, "s") == [("m", i) for i in ids]


def test_discarded_ids_are_never_reused(store):
    """A discarded stage's summary ids must not name a different summary later: the engine
    adopts a stage when the host's list carries its top nodes' ids (summary markers)."""
    ids = _session_with_messages(store, "s", 2)
    k1, _ = store.stage_pass("s", "p1", [leaf("L", ids, "first")], [("s", "L")], *_vlen(store, "s"))
    store.discard_pass("p1")
    k2, _ = store.stage_pass("s", "p2", [leaf("L", ids, "second")], [("s", "L")], *_vlen(store, "s"))
    assert k2["L"] != k1["L"]


def test_publish_discards_older_stages(store):
    ids = _session_with_messages(store, "s", 4)
    v, n = _vlen(store, "s")
    k1, _ = store.stage_pass("s", "old", [leaf("L", ids[:2], "older")], [("s", "L"), ("m", ids[2]), ("m", ids[3])], v, n)
    k2, _ = store.stage_pass("s", "new", [leaf("L", ids[:3], "newer")], [("s", "L"), ("m", ids[3])], v, n)
    assert store.publish_pass("new")
    assert store.get_summaries([k1["L"]], include_staged=True) == {}
    assert store.latest_staged("s") is None
    assert store.message_summaries(ids[0]) == [k2["L"]]


def test_publish_discards_only_its_own_engines_older_stages(store):
    """Publishing drops the older stages of the engine that staged it and those of nobody (a
    bare id); another engine's stage of the same session stays for it to commit (owners.py)."""
    ids = _session_with_messages(store, "s", 4)
    v, n = _vlen(store, "s")
    mine, other = "host:1:aaaa", "host:2:bbbb"
    keys = {}
    for pid in (f"p1@{mine}", f"p2@{other}", "p3", f"p4@{mine}"):
        keys[pid], _ = store.stage_pass("s", pid, [leaf("L", ids[:2], pid)], [("s", "L"), ("m", ids[2])], v, n)
    assert store.publish_pass(f"p4@{mine}")
    assert [p.pass_id for p in store.staged_passes("s")] == [f"p2@{other}"]
    assert store.get_summaries([keys[f"p2@{other}"]["L"]], include_staged=True)
    assert store.get_summaries([keys[f"p1@{mine}"]["L"], keys["p3"]["L"]], include_staged=True) == {}


def test_orphan_staged_summaries_are_discarded(store):
    ids = _session_with_messages(store, "s", 2)
    k, _ = store.stage_pass("s", "p", [leaf("L", ids, "orphan")], [("s", "L")], *_vlen(store, "s"))
    # Simulate a crash that lost the staged_passes row but kept its summaries.
    if store.kind == "sqlite":
        with store.tx() as c:
            c.execute("DELETE FROM staged_passes")
    else:
        store._write(lambda c: c.execute("DELETE FROM staged_passes"))
    assert store.discard_stale("s") == 1
    assert store.get_summaries([k["L"]], include_staged=True) == {}


def test_stage_resolves_node_keys_in_text(store):
    """Summary text citing a pass's temporary keys (new1) gets the real ids (s812)."""
    ids = _session_with_messages(store, "s", 4)
    km, _ = store.stage_pass("s", "p", [
        NewSummary(key="new1", kind="leaf", depth=0, text="first half", tokens=1, source_tokens=9, level="normal",
                   summarizer="t", t_start=None, t_end=None, n_messages=2, message_ids=ids[:2]),
        NewSummary(key="new2", kind="leaf", depth=0, text="second half, after new1", tokens=1, source_tokens=9,
                   level="normal", summarizer="t", t_start=None, t_end=None, n_messages=2, message_ids=ids[2:]),
        NewSummary(key="new3", kind="condensed", depth=1, text="see new1 and new2; not new9 or renew1",
                   tokens=1, source_tokens=9, level="normal", summarizer="t", t_start=None, t_end=None,
                   n_messages=4, child_keys=["new1", "new2"]),
    ], [("s", "new3")], *_vlen(store, "s"))
    got = store.get_summaries(list(km.values()), include_staged=True)
    assert got[km["new2"]].text == f"second half, after s{km['new1']}"
    assert got[km["new3"]].text == f"see s{km['new1']} and s{km['new2']}; not new9 or renew1"


def test_update_summary_text(store):
    ids = _session_with_messages(store, "s", 2)
    k, _ = store.stage_pass("s", "p", [leaf("L", ids, "original quokka words")], [("s", "L")], *_vlen(store, "s"))
    store.publish_pass("p")
    store.update_summary_text(k["L"], "rewritten platypus words", 3, "aggressive", "llm")
    rec = store.get_summaries([k["L"]])[k["L"]]
    assert (rec.text, rec.tokens, rec.level, rec.summarizer) == ("rewritten platypus words", 3, "aggressive", "llm")
    assert ids_of(search(store, "platypus", target="summaries")) == [k["L"]]
    assert search(store, "quokka", target="summaries") == []


# -- search ----------------------------------------------------------------------------------------------

CORPUS = [
    ("user", "We should raise the retry limit for the uploader, the retry limit is too low"),  # 0: most relevant
    ("assistant", "The limit on file size stays the same"),  # 1
    ("user", "Lunch was good today"),  # 2
    ("tool", "retry scheduled"),  # 3
    ("assistant", "我们把重试次数上限改成了五次"),  # 4: CJK
    ("user", "see src/billing/invoice.py and models.py for ERR_TIMEOUT"),  # 5
    ("user", "the of and"),  # 6: stop words only
]


def _corpus(store, sid="s"):
    store.ensure_session(sid)
    filler = [nm(f"filler note {i} about gardening and weather", t=T0 - 100 + i) for i in range(20)]
    store.append_messages(sid, filler)
    return store.append_messages(sid, [nm(text, role, t=T0 + i) for i, (role, text) in enumerate(CORPUS)])


def test_search_fts_ranking(store):
    ids = _corpus(store)
    rows = search(store, "what about the retry limit?", limit=10)
    got = ids_of(rows)
    assert got[0] == ids[0]
    assert set(got) == {ids[0], ids[1], ids[3]}
    ranks = [r["rank"] for r in rows]
    assert ranks == sorted(ranks) and ranks[0] < ranks[-1]  # smaller is better
    r0 = rows[0]
    assert set(r0) == {"id", "session_id", "role", "created_at", "text", "rank"}
    assert (r0["session_id"], r0["role"], r0["created_at"], r0["text"]) == ("s", "user", T0, CORPUS[0][1])
    assert ids_of(search(store, "models.py")) == [ids[5]]
    assert ids_of(search(store, "invoice")) == [ids[5]]
    assert search(store, "xylophone") == []
    # Paging.
    assert ids_of(search(store, "retry limit", limit=1)) == [ids[0]]
    assert ids_of(search(store, "retry limit", limit=2, offset=1)) == got[1:3]
    assert search(store, "retry limit", offset=10) == []
    # A plan with nothing for the full-text index yields nothing in fts mode.
    assert search(store, "重试次数上限") == []


def test_ranked_search_filters_before_the_page(store):
    """The best-scored matches of a ranked search are dropped by a filter (their role, their
    session): the page still holds the best of those left, in rank order, with paging — the
    rows are read past the first page's worth of ranked matches (store/sqlite/search.py)."""
    store.ensure_session("s")
    store.ensure_session("o")
    best = store.append_messages("s", [nm("widget " * (3 + i % 4), "user", t=T0 + i) for i in range(30)])
    other = store.append_messages("o", [nm("widget widget widget widget", "assistant", t=T0 + i) for i in range(8)])
    kept = store.append_messages("s", [nm("widget " + "and other words " * (1 + i), "assistant", t=T0 + 40 + i)
                                       for i in range(6)])
    full = search(store, "widget", role="assistant", sessions=["s"], order="rank", limit=50)
    assert ids_of(full) == kept  # (the shorter text scores better: the order they were stored in)
    ranks = [r["rank"] for r in full]
    assert ranks == sorted(ranks)
    page = search(store, "widget", role="assistant", sessions=["s"], order="rank", limit=2, offset=1)
    assert ids_of(page) == kept[1:3] and [r["rank"] for r in page] == ranks[1:3]
    assert all(r["role"] == "assistant" and r["session_id"] == "s" for r in page)
    tied = ids_of(search(store, "widget", sessions=["o"], order="rank", limit=3))  # (equal scores: any 3)
    assert len(set(tied)) == 3 and set(tied) <= set(other)
    assert ids_of(search(store, "widget", role="assistant", sessions=["s"], order="rank", limit=5, offset=4)) == kept[4:]
    assert len(best) == 30 and search(store, "widget", role="tool", order="rank") == []


def test_search_stop_words_only_falls_back(store):
    ids = _corpus(store)
    plan = plan_query("the of and")
    assert plan.terms == ("the", "of", "and")  # the plan keeps stop words when nothing else is left
    got = ids_of(store.search("messages", None, plan))
    assert ids[6] in got and ids[2] not in got


def test_search_substring_cjk(store):
    ids = _corpus(store)
    rows = store.search("messages", ["s"], plan_query("重试次数上限"), mode="substring")
    assert ids_of(rows) == [ids[4]] and rows[0]["rank"] == 0.0
    assert ids_of(store.search("messages", None, plan_query("UPLOADER"), mode="substring")) == []  # no substrings planned
    from lossless_context.search.query import QueryPlan

    p = QueryPlan(query="x", substrings=("RETRY LIMIT", "file size"))
    assert ids_of(store.search("messages", None, p, mode="substring")) == [ids[1], ids[0]]  # newest first
    p = QueryPlan(query="x", substrings=("100%_\\",))
    store.append_messages("s", [nm("done 100%_\\ ok"), nm("done 1000 ok")])
    assert [r["text"] for r in store.search("messages", None, p, mode="substring")] == ["done 100%_\\ ok"]


def test_search_substring_cjk_in_summaries(store):
    store.ensure_session("s")
    ids = store.append_messages("s", [nm(f"m{i}") for i in range(6)])
    texts = {"a": "我们把重试次数上限改成了五次", "b": "上限 and 重试 apart, not the run", "c": "no CJK at all",
             "d": "另一个摘要：重试次数上限仍是五次"}
    keymap, _ = store.stage_pass("s", "p1", [leaf(k, [ids[i]], t, t_end=T0 + i) for i, (k, t) in enumerate(texts.items())],
                                 [("s", k) for k in texts], 1, 6)
    assert store.publish_pass("p1")
    rows = store.search("summaries", ["s"], plan_query("重试次数上限"), mode="substring")
    assert ids_of(rows) == [keymap["d"], keymap["a"]]  # the whole run, newest first; not its bigrams apart
    assert ids_of(store.search("summaries", ["s"], plan_query("五次"), mode="substring", limit=1, offset=1)) == [keymap["a"]]
    assert store.search("summaries", ["other"], plan_query("重试次数上限"), mode="substring") == []


def test_substring_searches_of_several_targets_at_once_answer_as_one_by_one(store):
    from lossless_context.search.query import QueryPlan
    from lossless_context.store.base import Store

    store.ensure_session("s")
    ids = store.append_messages("s", [nm("我们把重试次数上限改成了五次"), nm("RETRY LIMIT raised"), nm("role check", "assistant"),
                                      nm("重试次数上限 again", "assistant")])
    keymap, _ = store.stage_pass("s", "p1", [leaf("a", [ids[0]], "摘要：重试次数上限是五次; retry limit")],
                                 [("s", "a")], 1, 4)
    assert store.publish_pass("p1")
    asks = [("messages", {"session_ids": ["s"], "plan": plan_query("重试次数上限"), "limit": 10, "offset": 0}),
            ("summaries", {"session_ids": ["s"], "plan": plan_query("重试次数上限"), "limit": 10, "offset": 0}),
            ("messages", {"session_ids": None, "plan": QueryPlan(query="x", substrings=("retry limit",)),
                          "role": "user", "limit": 1, "offset": 0}),
            ("messages", {"session_ids": ["s"], "plan": plan_query("重试次数上限"), "role": "assistant", "limit": 10,
                          "offset": 0}),
            ("summaries", {"session_ids": ["other"], "plan": plan_query("重试次数上限"), "limit": 10, "offset": 0}),
            ("messages", {"session_ids": ["s"], "plan": plan_query("UPLOADER"), "limit": 10, "offset": 0})]
    got = store.search_substrings(asks)
    inner = getattr(store, "inner", store)
    assert got == Store.search_substrings(inner, asks)  # the default: one search per target
    assert [ids_of(g) for g in got] == [[ids[3], ids[0]], [keymap["a"]], [ids[1]], [ids[3]], [], []]
    if inner.kind == "postgresql":  # sent together: one connection use, one round trip
        reads = []
        real = inner._read
        inner._read = lambda fn: reads.append(fn) or real(fn)
        try:
            assert inner.search_substrings(asks) == got
        finally:
            del inner._read
        assert len(reads) == 1


def test_search_regex(store):
    ids = _corpus(store)
    rx, err = compile_regex(r"retry\s+(limit|scheduled)")
    assert err is None
    rows = store.search("messages", ["s"], plan_query("x"), mode="regex", regex=rx)
    assert ids_of(rows) == [ids[3], ids[0]]
    assert ids_of(store.search("messages", ["s"], plan_query("x"), mode="regex", regex=rx, limit=1, offset=1)) == [ids[0]]
    rx2, _ = compile_regex(r"ERR_[A-Z]+")
    assert ids_of(store.search("messages", None, plan_query("x"), mode="regex", regex=rx2)) == [ids[5]]
    assert store.search("messages", None, plan_query("x"), mode="regex", regex=None) == []


def test_search_filters_and_scope(store):
    ids = _corpus(store, "s")
    store.ensure_session("t2")
    other = store.append_messages("t2", [nm("retry limit in another session", t=T0 + 50)])
    assert set(ids_of(search(store, "retry", sessions=["s", "t2"]))) == {ids[0], ids[3], other[0]}
    assert ids_of(search(store, "retry", sessions=["t2"])) == [other[0]]
    assert set(ids_of(search(store, "retry", sessions=None))) == {ids[0], ids[3], other[0]}
    assert search(store, "retry", sessions=[]) == []
    assert ids_of(search(store, "retry", role="tool")) == [ids[3]]
    assert ids_of(search(store, "retry", sessions=["s"], since=T0 + 1)) == [ids[3]]
    assert ids_of(search(store, "retry", sessions=["s"], until=T0 + 1)) == [ids[0]]
    assert search(store, "retry", since=T0 + 1, until=T0 + 2) == []
    rx, _ = compile_regex("retry")
    assert ids_of(store.search("messages", ["s"], plan_query("x"), mode="regex", regex=rx, role="user")) == [ids[0]]
    assert ids_of(store.search("messages", ["t2"], plan_query("x"), mode="regex", regex=rx)) == [other[0]]
    from lossless_context.search.query import QueryPlan

    p = QueryPlan(query="x", substrings=("retry",))
    assert ids_of(store.search("messages", ["s"], p, mode="substring", since=T0 + 2)) == [ids[3]]


@pytest.mark.parametrize("near", [10_000, 0])
def test_newest_matches_in_a_lineage_are_the_stores_newest_in_it(store, monkeypatch, near):
    """A lineage's newest matches (order="recent": SQLite searches the id ranges of its
    sessions newest first, sessions near each other as one range - or each apart: near=0;
    PostgreSQL walks each session) are the whole store's newest matches kept to the lineage,
    whatever the sessions' ids interleave or lie far apart, with paging and filters."""
    import random

    from lossless_context.store.sqlite import search as sqlite_search

    monkeypatch.setattr(sqlite_search, "NEAR_IDS", near)
    rng = random.Random(4)
    words = ["retry", "ledger", "quota", "webhook", "payout", "cache"]
    sids = ["s1", "s2", "s3", "s4", "early", "late"]
    for sid in sids:
        store.ensure_session(sid)
    for turn in range(40):
        for k, sid in enumerate(sids):
            if (turn + k) % 5 == 0 or (sid == "s4" and turn > 30) or (sid == "early" and turn > 5) or (
                    sid == "late" and turn < 34):
                continue  # sessions pause and resume at different times; some start late or stop early
            store.append_messages(sid, [nm(" ".join(rng.choice(words) for _ in range(4)),
                                           "assistant" if (turn + i) % 2 else "user", t=T0 + turn * 3 + i)
                                        for i in range(rng.randint(1, 3))])
    for q in ("retry", "ledger quota", "payout"):
        for filters in ({}, {"role": "user"}, {"since": T0 + 30, "until": T0 + 80}):
            whole = search(store, q, order="recent", limit=5000, **filters)
            for scope in (["s1"], ["s4", "s2"], ["s3", "s1", "s2", "nobody"], ["early", "late"],
                          ["late", "s4", "early"], sids):
                mine = [r["id"] for r in whole if r["session_id"] in scope]
                for limit, offset in ((5, 0), (7, 3), (100, 0)):
                    got = search(store, q, sessions=scope, order="recent", limit=limit, offset=offset, **filters)
                    assert ids_of(got) == mine[offset:offset + limit], (q, filters, scope, limit, offset)


def _corpus_under_summaries(store):
    """The corpus under leaves A (messages 0, 1) and B (3), and C condensed over A."""
    ids = _corpus(store, "s")
    v, n = _vlen(store, "s")
    km, _ = store.stage_pass("s", "p", [
        leaf("A", [ids[0], ids[1]], "alpha retry summary", t_end=T0 + 1),
        leaf("B", [ids[3]], "beta retry summary", t_end=T0 + 3),
        condensed("C", ["A"], "gamma retry condensed"),
    ], [("s", "C"), ("s", "B")], v, n)
    store.publish_pass("p")
    return ids, km


def test_search_under_summary(store):
    ids, km = _corpus_under_summaries(store)
    assert set(ids_of(search(store, "retry", under_summary=km["A"]))) == {ids[0]}
    assert set(ids_of(search(store, "retry", under_summary=km["C"]))) == {ids[0]}
    assert ids_of(search(store, "retry", under_summary=km["B"])) == [ids[3]]
    assert set(ids_of(search(store, "retry", target="summaries", under_summary=km["C"]))) == {km["C"], km["A"]}
    assert set(ids_of(search(store, "retry", target="summaries"))) == {km["A"], km["B"], km["C"]}
    rows = search(store, "beta", target="summaries", since=T0 + 2)
    assert ids_of(rows) == [km["B"]] and rows[0]["role"] == "summary" and rows[0]["created_at"] == T0 + 3
    assert search(store, "beta", target="summaries", until=T0 + 2) == []
    rx, _ = compile_regex("retry (summary|condensed)")
    got = store.search("summaries", ["s"], plan_query("x"), mode="regex", regex=rx, under_summary=km["C"])
    assert set(ids_of(got)) == {km["A"], km["C"]}
    from lossless_context.search.query import QueryPlan

    got = store.search("messages", ["s"], QueryPlan(query="x", substrings=("retry",)), mode="substring",
                       under_summary=km["A"])
    assert ids_of(got) == [ids[0]]


def test_search_under_summaries_at_once(store):
    """Several summaries' searches in one call equal one search each (the base default), with
    filters, a query of stop words only and an empty one; on PostgreSQL one round trip."""
    from lossless_context.store.base import Store

    ids, km = _corpus_under_summaries(store)
    asks = [(km["A"], plan_query("retry")), (km["C"], plan_query("retry")), (km["B"], plan_query("retry")),
            (km["C"], plan_query("the of")), (km["A"], plan_query("")), (km["B"], plan_query("absent_word"))]
    inner = getattr(store, "inner", store)
    for kw in ({}, {"role": "tool"}, {"since": T0 + 1}, {"limit": 1}):
        got = store.search_under_summaries(["s"], asks, **kw)
        assert got == Store.search_under_summaries(inner, ["s"], asks, **kw), kw
        assert store.search_under_summaries(["other"], asks, **kw) == [[]] * len(asks)
    got = store.search_under_summaries(["s"], asks)
    assert [ids_of(g) for g in got[:3]] == [[ids[0]], [ids[0]], [ids[3]]] and got[4:] == [[], []]
    assert ids_of(got[3]) == [ids[1], ids[0]]  # "the": word for word, not dropped as a stop word
    if inner.kind == "postgresql":  # sent together: one connection use (the stop words alone after it)
        reads = []
        real = inner._read
        inner._read = lambda fn: reads.append(fn) or real(fn)
        try:
            assert inner.search_under_summaries(["s"], asks[:3] + asks[4:]) == got[:3] + got[4:]
        finally:
            del inner._read
        assert len(reads) == 1


# -- maintenance -------------------------------------------------------------------------------------------

STATS_KEYS = {"backend", "location", "bytes", "sessions", "messages", "message_tokens", "summaries_by_depth",
              "staged_summaries", "compactions", "last_compaction_at", "unindexed_messages"}


def test_stats(store):
    st = store.stats()
    assert set(st) == STATS_KEYS and st["messages"] == 0 and st["sessions"] == 0
    ids = _session_with_messages(store, "s", 3)
    store.ensure_session("t")
    store.append_messages("t", [nm("x", tokens=5)])
    store.wait_indexed()  # (PostgreSQL indexes after the commit; SQLite indexes small appends in it)
    st = store.stats()
    assert set(st) == STATS_KEYS
    assert st["backend"] == store.kind and st["sessions"] == 2 and st["messages"] == 4
    assert isinstance(st["message_tokens"], int) and st["bytes"] > 0
    assert st["compactions"] == 0 and st["last_compaction_at"] is None and st["summaries_by_depth"] == {}
    assert st["unindexed_messages"] == 0
    one = store.stats("t")
    assert (one["sessions"], one["messages"], one["message_tokens"]) == (1, 1, 5)
    store.stage_pass("s", "p", [leaf("L", ids, "x")], [("s", "L")], *_vlen(store, "s"))
    assert store.stats()["staged_summaries"] == 1
    store.publish_pass("p")
    st = store.stats("s")
    assert st["summaries_by_depth"] == {0: 1} and st["compactions"] == 1 and st["last_compaction_at"]
    assert store.stats("t")["compactions"] == 0


def test_postgres_without_lz4(pg_fresh_dsn, monkeypatch, caplog):
    """A server without lz4 skips migration 015 (logged), stores and reads text with pglz, and
    lcm doctor says so as a notice."""
    from lossless_context.ops.doctor import run_doctor
    from lossless_context.store.postgres import store as pgmod, conn as postgres_conn

    # what PostgreSQL answers where lz4 is missing
    broken = [(n, "DO $$ BEGIN RAISE EXCEPTION 'compression method lz4 not supported'; END $$;"
               if n == "015_lz4_toast" else sql) for n, sql in postgres_conn.MIGRATIONS]
    monkeypatch.setattr(postgres_conn, "MIGRATIONS", broken)
    s = pgmod.PostgresStore(pg_fresh_dsn)
    try:
        s.ensure_session("s")
        assert "015_lz4_toast" not in s.applied_migrations() and "016_summaries_cjk" in s.applied_migrations()
        assert "015_lz4_toast" in caplog.text
        big = "pglz keeps this long text " * 400
        (mid,) = s.append_messages("s", [nm(big)])
        assert s.get_messages([mid])[mid].text == big
        notice = [c for c in run_doctor(s).checks if c.name == "lz4 compression of message text"][0]
        assert notice.ok and "no lz4" in notice.detail
    finally:
        s.close()
    monkeypatch.undo()
    s = pgmod.PostgresStore(pg_fresh_dsn)  # a server that has it (the next start) applies it
    try:
        s.ensure_session("s")
        assert "015_lz4_toast" in s.applied_migrations()
        assert [c for c in run_doctor(s).checks if c.name == "lz4 compression of message text"][0].detail == ""
    finally:
        s.close()


def test_postgres_location_hides_password(pg_fresh_dsn):
    from lossless_context.store.postgres.store import PostgresStore

    dsn = pg_fresh_dsn.replace("lcm@", "lcm:s3cret@")
    s = PostgresStore(dsn)
    try:
        assert "s3cret" not in s.location
        s.ensure_session("a")  # trust auth ignores the password
        assert "s3cret" not in json.dumps(s.stats())
    finally:
        s.close()


def test_postgres_without_trigram_extension(pg_fresh_dsn, monkeypatch, caplog):
    """An optional migration that fails (no pg_trgm) is skipped, not recorded, retried later."""
    from lossless_context.store.postgres import store as pgmod, conn as postgres_conn

    broken = [(n, "CREATE EXTENSION IF NOT EXISTS lcm_no_such_extension;" if n == "002_trigram" else sql)
              for n, sql in postgres_conn.MIGRATIONS]
    monkeypatch.setattr(postgres_conn, "MIGRATIONS", broken)
    s = pgmod.PostgresStore(pg_fresh_dsn)
    try:
        s.ensure_session("s")
        assert "002_trigram" not in s.applied_migrations()
        assert "001_initial" in s.applied_migrations() and "002_trigram" in caplog.text
        (mid,) = s.append_messages("s", [nm("我们把重试次数上限改成了五次")])
        assert ids_of(s.search("messages", None, plan_query("重试次数上限"), mode="substring")) == [mid]
    finally:
        s.close()
    monkeypatch.undo()
    s = pgmod.PostgresStore(pg_fresh_dsn)  # the next start applies it
    try:
        assert s.applied_migrations() == sorted(n for n, _ in postgres_conn.MIGRATIONS)
    finally:
        s.close()


def test_postgres_unreachable_fails_fast():
    from lossless_context.store.postgres.store import PostgresStore
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    import psycopg

    from lossless_context.store.postgres import conn as postgres_conn

    # "Fast" is shown by the mechanism, not a stopwatch: one direct connection attempt under
    # the DSN's connect_timeout, and no pool (whose background reconnect loop would retry).
    attempts: list[str] = []
    real_connect = psycopg.connect

    def connect(*a, **kw):
        attempts.append(a[0] if a else kw.get("conninfo", ""))
        return real_connect(*a, **kw)

    def no_pool(*a, **kw):
        raise AssertionError("a pool was opened for an unreachable server")

    s = PostgresStore(f"postgresql://nobody@127.0.0.1:{port}/x?connect_timeout=3")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(psycopg, "connect", connect)
        mp.setattr(postgres_conn, "ConnectionPool", no_pool)
        with pytest.raises(StoreError, match="cannot open store"):
            s.get_session("a")
    assert len(attempts) == 1 and "connect_timeout=3" in attempts[0]
    s.close()


def test_postgres_huge_text(pg_fresh_dsn):
    """A text whose lexemes exceed tsvector's 1 MB limit is stored; its start is searchable."""
    import random

    s = open_store(pg_fresh_dsn)
    try:
        s.ensure_session("s")
        rnd = random.Random(7)
        words = " ".join("w" + "".join(rnd.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(10))
                         for _ in range(120_000))
        text = "needleword " + words
        (mid,) = s.append_messages("s", [nm(text)])
        assert s.get_messages([mid])[mid].text == text
        assert ids_of(search(s, "needleword")) == [mid]
    finally:
        s.close()


# -- compaction lock ---------------------------------------------------------------------------------------

def test_compaction_lock_threads(store):
    store.ensure_session("s")
    held = threading.Event()
    release = threading.Event()
    results: dict[str, object] = {}

    def holder():
        with store.compaction_lock("s", 1) as ok:
            results["holder"] = ok
            held.set()
            release.wait(10)

    th = threading.Thread(target=holder)
    th.start()
    assert held.wait(10)
    t = time.monotonic()
    with store.compaction_lock("s", 0.3) as ok:
        results["contender"] = ok
    waited = time.monotonic() - t
    with store.compaction_lock("other-session", 0.3) as ok:
        results["other"] = ok
    release.set()
    th.join(10)
    # The contender gave up: the holder only lets go after `release`, set after it returned.
    assert results == {"holder": True, "contender": False, "other": True}
    # ... and only once its timeout had passed (a deadline on the same monotonic clock). No
    # upper bound: how late it returns is the scheduler's, and giving up at all is shown above.
    assert waited >= 0.3
    with store.compaction_lock("s", 0) as ok:  # released on exit
        assert ok

    # The lock is released even when the body raises.
    with pytest.raises(RuntimeError):
        with store.compaction_lock("s", 1) as ok:
            assert ok
            raise RuntimeError("boom")
    with store.compaction_lock("s", 0) as ok:
        assert ok


def test_compaction_lock_waits_for_release(store):
    """The holder lets go only once the contender has tried (and failed) to take the lock, so
    the contender's success is a wait for the release, not a lucky late start."""
    got = []
    started = threading.Event()
    tried = threading.Event()

    def holder():
        with store.compaction_lock("s", 1) as ok:
            started.set()
            got.append(ok)
            assert tried.wait(60)

    th = threading.Thread(target=holder)
    th.start()
    assert started.wait(10)
    with store.compaction_lock("s", 0) as ok:  # held: a try without waiting fails
        assert ok is False
    tried.set()
    with store.compaction_lock("s", 60) as ok:  # waits for the holder's release
        got.append(ok)
    th.join(60)
    assert got == [True, True]


def _lock_child(location: str, session_id: str, timeout: float, hold: float, q, release=None) -> None:
    """Take the lock and report; hold it until `release` is set (or for `hold` seconds)."""
    s = open_store(location)
    try:
        t = time.monotonic()
        with s.compaction_lock(session_id, timeout) as ok:
            q.put(("acquired", ok, time.monotonic() - t))
            if ok:
                if release is not None:
                    release.wait(hold)
                else:
                    time.sleep(hold)
    except BaseException as exc:  # pragma: no cover - reported to the parent
        q.put(("error", repr(exc), 0.0))
    finally:
        s.close()


def test_compaction_lock_processes(store, location):
    store.ensure_session("s")
    mp = multiprocessing.get_context("spawn")
    q = mp.Queue()
    with store.compaction_lock("s", 1) as ok:
        assert ok
        p = mp.Process(target=_lock_child, args=(location, "s", 0.5, 0, q))
        p.start()
        kind, ok2, waited = q.get(timeout=60)
        p.join(30)
        assert (kind, ok2) == ("acquired", False) and waited >= 0.45
    # Released: another process gets it, and holds it against us until told to let go.
    release = mp.Event()
    p = mp.Process(target=_lock_child, args=(location, "s", 5, 60, q, release))
    p.start()
    kind, ok3, _ = q.get(timeout=60)
    assert (kind, ok3) == ("acquired", True)
    with store.compaction_lock("s", 0.1) as ok4:
        assert ok4 is False
    release.set()
    p.join(30)
    assert p.exitcode == 0
    with store.compaction_lock("s", 5) as ok5:  # free again once the child exited
        assert ok5 is True


def test_compaction_lock_survives_holder_death(store, location):
    """A holder killed with SIGKILL leaves no stale lock (kernel/server release it)."""
    store.ensure_session("s")
    mp = multiprocessing.get_context("spawn")
    q = mp.Queue()
    p = mp.Process(target=_lock_child, args=(location, "s", 5, 60, q))
    p.start()
    kind, ok, _ = q.get(timeout=60)
    assert (kind, ok) == ("acquired", True)
    with store.compaction_lock("s", 0) as held_elsewhere:
        assert held_elsewhere is False
    p.kill()
    p.join(30)
    with store.compaction_lock("s", 10) as ok2:
        assert ok2 is True


# -- differential: the PostgreSQL store behaves exactly like the SQLite store ----------------------

WORDS = ("retry limit uploader widget invoice models.py ERR_TIMEOUT billing cache lunch garden "
         "deploy rollback 重试次数上限 emoji🚀 the of and").split()


def test_postgres_matches_sqlite_on_random_operations(tmp_path, pg_fresh_dsn):
    import random

    rnd = random.Random(20240611)
    a, b = open_store(str(tmp_path / "diff.db")), open_store(pg_fresh_dsn)
    smap: dict[int, int] = {}  # PostgreSQL summary id -> SQLite summary id (creation order)
    sessions = ["s1", "s2", "s3"]
    pass_no = 0

    def m_s(kind: str, ref: int) -> tuple[str, int]:
        return (kind, smap[ref] if kind == "s" else ref)

    def both(fn):
        ra, rb = fn(a), fn(b)
        return ra, rb

    def check(sid: str, full: bool = True) -> None:
        (va, ea), (vb, eb) = both(lambda s: s.get_context(sid))
        assert va == vb
        assert [(e.kind, e.ref, e.ident, e.role, e.tokens) for e in ea] == [
            (*m_s(e.kind, e.ref), e.ident, e.role, e.tokens) for e in eb]
        sa, sb = both(lambda s: s.latest_staged(sid))
        assert (sa is None) == (sb is None)
        if sa:
            assert (sa.pass_id, sa.base_version, sa.base_len) == (sb.pass_id, sb.base_version, sb.base_len)
            assert sa.items == [m_s(k, r) for k, r in sb.items] and sa.top_nodes == [smap[r] for r in sb.top_nodes]
        ma, mb = both(lambda s: s.session_messages(sid))
        assert [(m.id, m.seq, m.text, safe_json(m.raw)) for m in ma] == [(m.id, m.seq, m.text, safe_json(m.raw)) for m in mb]
        ga, gb = both(lambda s: {k: v for k, v in s.get_session(sid).items() if not k.endswith("_at")})
        assert ga == gb
        sta, stb = both(lambda s: s.stats(sid))
        for k in ("sessions", "messages", "message_tokens", "summaries_by_depth", "staged_summaries", "compactions"):
            assert sta[k] == stb[k], k
        if not full:
            return
        for q in ("retry limit", "invoice", "重试次数上限", "the of and", "ERR_TIMEOUT"):
            plan = plan_query(q)
            for target in ("messages", "summaries"):
                fa, fb = both(lambda s: s.search(target, [sid], plan, limit=500))
                ida = {r["id"] for r in fa}
                idb = {(smap[r["id"]] if target == "summaries" else r["id"]) for r in fb}
                assert ida == idb, (q, target)
                pa, pb = both(lambda s: s.search(target, [sid], plan, mode="substring", limit=500))
                assert [r["id"] for r in pa] == [(smap[r["id"]] if target == "summaries" else r["id"]) for r in pb]
        for (kind, ref) in [(e.kind, e.ref) for e in ea]:
            if kind == "s":
                ref_b = next(k for k, v in smap.items() if v == ref)
                ca, cb = a.summary_children(ref), b.summary_children(ref_b)
                assert ca == ([smap[x] for x in cb[0]], cb[1])
                assert a.summary_parents(ref) == [smap[x] for x in b.summary_parents(ref_b)]
            else:
                assert a.message_summaries(ref) == [smap[x] for x in b.message_summaries(ref)]

    try:
        for step in range(160):
            sid = rnd.choice(sessions)
            op = rnd.random()
            if step < 3:
                for s in (a, b):
                    s.ensure_session(sessions[step], parent_id=sessions[0] if step else None,
                                     conversation_id="c" if step == 2 else None)
                continue
            if op < 0.35:
                rows = [" ".join(rnd.choice(WORDS) for _ in range(rnd.randint(1, 6))) for _ in range(rnd.randint(1, 3))]
                role = rnd.choice(["user", "assistant", "tool"])
                batch = [nm(r, role, t=T0 + step, tokens=len(r), uid=rnd.choice([None, "u1", "u2"])) for r in rows]
                new = both(lambda s: s.append_messages(sid, batch))
                assert new[0] == new[1]
                if rnd.random() < 0.3:
                    pairs = [(f"alias{rnd.randint(0, 5)}", rnd.choice(new[0]))]
                    both(lambda s: s.add_aliases(pairs))
                if rnd.random() < 0.8:
                    v, entries = a.get_context(sid)
                    items = [(e.kind, e.ref) for e in entries] + [("m", i) for i in new[0]]
                    rev = {v2: k2 for k2, v2 in smap.items()}
                    assert set_ctx(a, sid, items, expected=v) == set_ctx(
                        b, sid, [(k, rev[r] if k == "s" else r) for k, r in items], expected=v)
            elif op < 0.55:
                v, entries = a.get_context(sid)
                if len(entries) < 2:
                    continue
                half = rnd.randint(1, len(entries) - 1)
                prefix = entries[:half]
                mids = [e.ref for e in prefix if e.kind == "m"]
                sids_a = [e.ref for e in prefix if e.kind == "s"]
                rev = {v2: k2 for k2, v2 in smap.items()}
                pass_no += 1
                pid = f"pass{pass_no}"
                word = rnd.choice(WORDS)
                res = []
                for s, conv in ((a, lambda x: x), (b, lambda x: rev[x])):
                    sums = []
                    if mids:
                        sums.append(leaf("new1", mids, f"leaf {word} summary"))
                    if sids_a:
                        sums.append(condensed("new2", [conv(x) for x in sids_a] + (["new1"] if mids else []),
                                              f"condensed {word} over new1"))
                    top = "new2" if sids_a else "new1"
                    items = [("s", top)] + [(e.kind, conv(e.ref) if e.kind == "s" else e.ref) for e in entries[half:]]
                    res.append(s.stage_pass(sid, pid, sums, items, v, len(entries)))
                (ka, _), (kb, _) = res
                for key in ka:
                    for stale in [k for k, v in smap.items() if v == ka[key]]:
                        del smap[stale]  # SQLite reused the id of a discarded summary
                    smap[kb[key]] = ka[key]
            elif op < 0.75:
                st = a.latest_staged(sid)
                if st is None:
                    continue
                into = rnd.choice([None, None, rnd.choice(sessions)])
                if rnd.random() < 0.3:  # the context moved on since staging
                    late = [nm("moved on " + rnd.choice(WORDS), t=T0 + step)]
                    extra = both(lambda s: s.append_messages(sid, late))
                    for s in (a, b):
                        s.set_context(sid, [*s.get_context(sid)[1], ContextEntry("m", extra[0][0])])
                assert a.publish_pass(st.pass_id, into) == b.publish_pass(st.pass_id, into)
            elif op < 0.85:
                st = a.latest_staged(sid)
                if st is not None:
                    for s in (a, b):
                        s.discard_pass(st.pass_id)
            elif op < 0.92:
                keep = a.latest_staged(sid)
                keep_id = keep.pass_id if keep and rnd.random() < 0.5 else None
                assert a.discard_stale(sid, keep_id) == b.discard_stale(sid, keep_id)
            else:
                pub = [e.ref for e in a.get_context(sid)[1] if e.kind == "s"]
                if pub:
                    ref = rnd.choice(pub)
                    rev = {v2: k2 for k2, v2 in smap.items()}
                    a.update_summary_text(ref, "rewritten invoice text", 2, "aggressive", "x")
                    b.update_summary_text(rev[ref], "rewritten invoice text", 2, "aggressive", "x")
            check(sid, full=step % 10 == 0)
        for sid in sessions:
            check(sid)
            assert a.lineage(sid) == b.lineage(sid) or set(a.lineage(sid)) == set(b.lineage(sid))
        la = [{k: v for k, v in r.items() if not k.endswith("_at")} for r in a.list_sessions()]
        lb = [{k: v for k, v in r.items() if not k.endswith("_at")} for r in b.list_sessions()]
        assert sorted(la, key=lambda r: r["id"]) == sorted(lb, key=lambda r: r["id"])
        assert [m.id for m in a.iter_all_messages(batch=7)] == [m.id for m in b.iter_all_messages(batch=7)]
        all_ids = [m.id for m in a.iter_all_messages()]
        assert a.aliases_for(all_ids) == b.aliases_for(all_ids)
        for u in ("u1", "u2"):
            assert a.find_uid(sessions, u) == b.find_uid(sessions, u)
        assert a.log_after(sessions, 3, 50) == b.log_after(sessions, 3, 50)
    finally:
        a.close()
        b.close()


def test_sqlite_status_totals_read_an_index_not_every_row(tmp_path):
    # A store made before migration 010 (its session index without tokens) is upgraded;
    # the totals of stats() then come from a covering index scan, and are exact.
    path = str(tmp_path / "old.db")
    s = SQLiteStore(path)
    s.ensure_session("a")
    s.ensure_session("b")
    for sid, n in (("a", 30), ("b", 12)):
        s.append_messages(sid, [NewMessage(raw={"role": "user", "content": f"m{i}"}, role="user",
                                           ident=uuid.uuid4().hex, uid=None, text=f"m{i}", tokens=i + 1,
                                           created_at=1.0 + i) for i in range(n)])
    c = s.conn()
    c.execute("DROP INDEX messages_session_id")
    c.execute("CREATE INDEX messages_session_id ON messages(session_id, id)")
    c.execute("DELETE FROM lcm_migrations WHERE name='010_session_index_covers_tokens'")
    s.close()
    s = SQLiteStore(path)
    assert "010_session_index_covers_tokens" in s.applied_migrations()
    c = s.conn()
    for where, args in (("", ()), (" WHERE session_id=?", ("a",))):
        plan = " ".join(r[3] for r in c.execute(
            f"EXPLAIN QUERY PLAN SELECT COUNT(*), COALESCE(SUM(tokens),0) FROM messages{where}", args))
        assert "COVERING INDEX messages_session_id" in plan, plan
    assert (s.stats()["messages"], s.stats()["message_tokens"]) == (42, sum(range(1, 31)) + sum(range(1, 13)))
    assert (s.stats("b")["messages"], s.stats("b")["message_tokens"]) == (12, sum(range(1, 13)))
    s.close()
