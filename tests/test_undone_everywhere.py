"""Issue #40 items 2 and 3: what the host rolled back (undo, retry) stays hidden on every surface
— an export and the store it is imported into, a backup, the shared HTML view — on both
backends.
"""

from __future__ import annotations

import io
import json

from lossless_context.ops.export import export_jsonl, import_jsonl
from lossless_context.ops.viewer import collect, render_view
from lossless_context.store import open_store
from tests import test_branch_undo_forget as undo
from tests.test_branch_undo_forget import _engine, _grep, _turns

location = undo.location  # the fixture: SQLite and PostgreSQL

SECRET = "OOPS-SECRET-5521"


def _undone(location: str):
    e = _engine(location)
    e.bind_session_state(None, "UE")
    base = _turns("chat", 3)
    e.on_session_end("UE", base)
    e.on_session_end("UE", base + [{"role": "user", "content": f"my password is {SECRET}"},
                                   {"role": "assistant", "content": f"noted {SECRET}"}])
    gone = _grep(e, SECRET)
    assert len(gone) == 2
    e.on_session_end("UE", base)  # /undo
    assert _grep(e, SECRET) == []
    return e, sorted(int(x[1:]) for x in gone)


def _grep_at(path: str, session: str, q: str) -> list[str]:
    from lossless_context import LCMEngine

    e = LCMEngine(store=path, summarizer="extractive")
    e.update_model("m", 64_000)
    e.on_session_start(session)
    try:
        return _grep(e, q)
    finally:
        e.store.close()


def test_an_export_carries_the_retraction_into_the_store_it_is_imported_into(location, tmp_path):
    e, gone = _undone(location)
    buf = io.StringIO()
    export_jsonl(e.store, buf)
    lines = buf.getvalue().splitlines()
    recs = [json.loads(x) for x in lines[1:]]
    marked = sorted(r["id"] for r in recs if r["type"] == "message" and r.get("retracted"))
    assert marked == gone
    # into a new store: hidden there too
    dest = str(tmp_path / "imported.db")
    st = open_store(dest)
    try:
        import_jsonl(st, lines)
    finally:
        st.close()
    assert _grep_at(dest, "UE", SECRET) == []
    assert _grep_at(dest, "UE", "chat question 1")  # the rest is there
    # into a store that already holds the message (an earlier import, before the undo): hidden from now on
    earlier = [ln.replace('"retracted":true,', "") for ln in lines]
    again = str(tmp_path / "earlier.db")
    st = open_store(again)
    try:
        import_jsonl(st, earlier)
        assert len(_grep_at(again, "UE", SECRET)) == 2
        import_jsonl(st, lines)
    finally:
        st.close()
    assert _grep_at(again, "UE", SECRET) == []


def test_an_older_reader_refuses_a_file_with_retractions(location):
    e, _gone = _undone(location)
    buf = io.StringIO()
    export_jsonl(e.store, buf)
    assert json.loads(buf.getvalue().splitlines()[0])["version"] == 2  # version 1 readers refuse it


def test_a_backup_keeps_the_retraction(tmp_path):
    from pathlib import Path

    from lossless_context.store.sqlite.file import backup_store_file

    src = str(tmp_path / "lcm.db")
    e, _gone = _undone(src)
    e.store.wait_indexed()
    dest = tmp_path / "backup.db"
    backup_store_file(Path(src), dest)
    assert _grep_at(str(dest), "UE", SECRET) == []


def test_the_viewer_shows_an_undone_message_without_its_text(location):
    e, gone = _undone(location)
    data = collect(e.store, "UE")
    page = render_view(data)
    assert SECRET not in page
    shown = {m["i"]: m for m in data["messages"]}
    for mid in gone:
        assert shown[mid]["u"] == 1 and shown[mid]["x"] == ""
    assert data["stats"]["undone"] == 2
    assert "chat question 1" in page
