"""`lcm export` / `lcm import jsonl`: a real store round-trips through the JSONL format.

export → import into an empty store → export again gives the same records (the header
alone carries the export time and source); importing twice adds nothing; a lineage export
holds exactly that lineage; an import into a store that already uses the ids remaps them
and the tools still find everything.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from tests.test_cli import lcm_at, ok, one_line_failure, run_lcm


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    d = tmp_path_factory.mktemp("export")
    home = d / "hermes"
    home.mkdir()
    store = d / "src.db"
    data = json.loads(ok(run_lcm("demo", "--messages", "500", "--rotate", "--store", str(store), "--json",
                                 home=home)).stdout)
    # a second, unrelated session in the same store
    ok(run_lcm("demo", "--messages", "120", "--seed", "7", "--store", str(store), "--json", home=home))
    c = sqlite3.connect(store)  # an alias identity, as host repairs leave them
    c.execute("INSERT INTO message_aliases(ident, message_id) VALUES ('0123456789abcdef0123456789abcdef', 5)")
    c.commit()
    c.close()
    return type("Src", (), {"store": store, "home": home, "dir": d, "data": data})


def export(store: Path, home: Path, out: Path, *session: str) -> list[str]:
    ok(run_lcm("--store", str(store), "export", *session, "-o", str(out), home=home))
    lines = out.read_text().splitlines()
    header = json.loads(lines[0])
    assert header["format"] == "lossless-context" and header["version"] == 2
    return lines


def table_counts(store: Path) -> dict[str, int]:
    c = sqlite3.connect(store)
    try:
        return {t: c.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in
                ("sessions", "messages", "summaries", "summary_messages", "summary_parents", "context_items",
                 "message_absorbed", "message_aliases")}
    finally:
        c.close()


def test_round_trip_is_identical_and_idempotent(src, tmp_path):
    first = export(src.store, src.home, tmp_path / "a.jsonl")
    header = json.loads(first[0])
    types = [json.loads(x)["type"] for x in first[1:]]
    assert header["counts"]["messages"] == types.count("message") == 620
    assert header["counts"]["sessions"] == types.count("session") == len(src.data["sessions"]) + 1
    assert types.count("summary") == header["counts"]["summaries"] > 0
    assert types.count("context") >= 2
    assert any(json.loads(x).get("aliases") == ["0123456789abcdef0123456789abcdef"] for x in first[1:])

    dest = tmp_path / "dest.db"
    r = ok(run_lcm("--store", str(dest), "import", "jsonl", str(tmp_path / "a.jsonl"), home=src.home))
    assert "620 messages" in r.stdout
    second = export(dest, src.home, tmp_path / "b.jsonl")
    assert second[1:] == first[1:], "export → import → export must be identical"

    counts = table_counts(dest)
    r2 = ok(run_lcm("--store", str(dest), "import", "jsonl", str(tmp_path / "a.jsonl"), home=src.home))
    assert "nothing new" in r2.stdout
    assert table_counts(dest) == counts
    assert export(dest, src.home, tmp_path / "c.jsonl")[1:] == first[1:]
    assert table_counts(dest) == table_counts(src.store)

    # the imported store is healthy and fully usable by the tools
    ok(run_lcm("--store", str(dest), "doctor", home=src.home))
    last = src.data["sessions"][-1]
    for c in src.data["canaries"]:
        hits = json.loads(ok(run_lcm("--store", str(dest), "grep", c["value"], "--session", last, "--json",
                                     home=src.home)).stdout)
        assert c["hit_id"] in [h["id"] for g in hits["groups"] for h in g["hits"]]
        exp = json.loads(ok(run_lcm("--store", str(dest), "expand", c["hit_id"], "--session", last,
                                    "--max-tokens", "12000", "--json", home=src.home)).stdout)
        assert c["value"] in json.dumps(exp["message"])


def test_raw_messages_are_byte_identical(src, tmp_path):
    export(src.store, src.home, tmp_path / "a.jsonl")
    dest = tmp_path / "d.db"
    ok(run_lcm("--store", str(dest), "import", "jsonl", str(tmp_path / "a.jsonl"), home=src.home))
    a, b = sqlite3.connect(src.store), sqlite3.connect(dest)
    try:
        q = "SELECT id, session_id, seq, ident, raw, text, tokens, created_at FROM messages ORDER BY id"
        assert a.execute(q).fetchall() == b.execute(q).fetchall()
        q = "SELECT id, text, depth, kind, t_start, t_end FROM summaries WHERE state='published' ORDER BY id"
        assert a.execute(q).fetchall() == b.execute(q).fetchall()
    finally:
        a.close()
        b.close()


def test_lineage_export(src, tmp_path):
    last = src.data["sessions"][-1]
    lines = export(src.store, src.home, tmp_path / "l.jsonl", last)
    recs = [json.loads(x) for x in lines[1:]]
    sessions = [r["id"] for r in recs if r["type"] == "session"]
    assert sessions == src.data["sessions"], "the rotation chain, parents first, and nothing else"
    assert json.loads(lines[0])["scope"] == {"session": last}
    assert sum(r["type"] == "message" for r in recs) == 500
    dest = tmp_path / "l.db"
    ok(run_lcm("--store", str(dest), "import", "jsonl", str(tmp_path / "l.jsonl"), home=src.home))
    assert export(dest, src.home, tmp_path / "l2.jsonl", last)[1:] == lines[1:]


def test_import_into_store_with_colliding_ids(src, tmp_path):
    export(src.store, src.home, tmp_path / "a.jsonl")
    other = tmp_path / "other.db"
    ok(run_lcm("demo", "--messages", "150", "--seed", "11", "--store", str(other), home=src.home))
    before = table_counts(other)
    r = ok(run_lcm("--store", str(other), "import", "jsonl", str(tmp_path / "a.jsonl"), home=src.home))
    assert "ids remapped" in r.stdout
    after = table_counts(other)
    assert after["messages"] == before["messages"] + 620
    r2 = ok(run_lcm("--store", str(other), "import", "jsonl", str(tmp_path / "a.jsonl"), home=src.home))
    assert "nothing new" in r2.stdout and table_counts(other) == after
    ok(run_lcm("--store", str(other), "doctor", home=src.home))
    last = src.data["sessions"][-1]
    for c in src.data["canaries"]:
        hits = json.loads(ok(run_lcm("--store", str(other), "grep", c["value"], "--session", last, "--json",
                                     home=src.home)).stdout)
        ids = [h["id"] for g in hits["groups"] for h in g["hits"] if h["kind"] == "message"]
        assert ids, c
        exp = json.loads(ok(run_lcm("--store", str(other), "expand", ids[0], "--session", last,
                                    "--max-tokens", "12000", "--json", home=src.home)).stdout)
        assert c["value"] in json.dumps(exp["message"])
    # citations in remapped summaries point at the remapped ids: every [mN] cited exists
    c = sqlite3.connect(other)
    try:
        mids = {r[0] for r in c.execute("SELECT id FROM messages")}
        import re

        for (text,) in c.execute("SELECT text FROM summaries WHERE session_id LIKE 'demo-0%'"):
            for n in re.findall(r"\[m(\d+)\]", text):
                assert int(n) in mids
    finally:
        c.close()


def test_bad_files_fail_cleanly(src, tmp_path):
    empty = tmp_path / "e.db"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"format": "lossless-context", "version": 99}\n')
    assert "unsupported" in one_line_failure(run_lcm("--store", str(empty), "import", "jsonl", str(bad),
                                                     home=src.home), 1)
    bad.write_text('{"format": "lossless-context", "version": 1}\n{"type": "message", "id": 1}\n')
    assert "line 2" in one_line_failure(run_lcm("--store", str(empty), "import", "jsonl", str(bad),
                                                home=src.home), 1)
    bad.write_text('{"format": "lossless-context", "version": 1}\nnot json\n')
    assert "line 2" in one_line_failure(run_lcm("--store", str(empty), "import", "jsonl", str(bad),
                                                home=src.home), 1)
    bad.write_bytes(b"\xff\xfe\x00garbage")
    one_line_failure(run_lcm("--store", str(empty), "import", "jsonl", str(bad), home=src.home), 1)
    # a failed import leaves nothing half-written
    lines = export(src.store, src.home, tmp_path / "a.jsonl")
    broken = tmp_path / "broken.jsonl"
    summ = next(i for i, x in enumerate(lines) if json.loads(x).get("type") == "summary")
    rec = json.loads(lines[summ])
    rec["messages"] = [987654321]
    rec["children"] = []
    broken.write_text("\n".join(lines[:summ] + [json.dumps(rec)] + lines[summ + 1:]) + "\n")
    dest = tmp_path / "atomic.db"
    assert "does not hold" in one_line_failure(run_lcm("--store", str(dest), "import", "jsonl", str(broken),
                                                       home=src.home), 1)
    if dest.exists():
        assert table_counts(dest)["messages"] == 0


def test_export_to_stdout(src, tmp_path):
    r = ok(lcm_at(type("D", (), {"store": src.store, "home": src.home}), "export"))
    lines = r.stdout.splitlines()
    assert json.loads(lines[0])["format"] == "lossless-context"
    assert lines[1:] == export(src.store, src.home, tmp_path / "x.jsonl")[1:]


@pytest.mark.postgres
def test_round_trip_through_postgres(src, tmp_path, pg_fresh_dsn):
    """The same export imported into PostgreSQL exports the same records; the tools work there."""
    first = export(src.store, src.home, tmp_path / "a.jsonl")
    r = ok(run_lcm("--store", pg_fresh_dsn, "import", "jsonl", str(tmp_path / "a.jsonl"), home=src.home))
    assert "620 messages" in r.stdout
    again = ok(run_lcm("--store", pg_fresh_dsn, "import", "jsonl", str(tmp_path / "a.jsonl"), home=src.home))
    assert "nothing new" in again.stdout
    out = ok(run_lcm("--store", pg_fresh_dsn, "export", home=src.home)).stdout.splitlines()
    assert out[1:] == first[1:]
    last = src.data["sessions"][-1]
    c = src.data["canaries"][0]
    hits = json.loads(ok(run_lcm("--store", pg_fresh_dsn, "grep", c["value"], "--session", last, "--json",
                                 home=src.home)).stdout)
    assert c["hit_id"] in [h["id"] for g in hits["groups"] for h in g["hits"]]
    st = json.loads(ok(run_lcm("--store", pg_fresh_dsn, "status", "--json", home=src.home)).stdout)
    assert st["messages"] == 620 and st["backend"] == "postgresql"
    view = tmp_path / "pg.html"
    ok(run_lcm("--store", pg_fresh_dsn, "view", last, "-o", str(view), home=src.home))
    assert "lcm-data" in view.read_text()
    assert "pg_dump" in one_line_failure(run_lcm("--store", pg_fresh_dsn, "backup", "-o", str(tmp_path / "b"),
                                                 home=src.home), 1)
