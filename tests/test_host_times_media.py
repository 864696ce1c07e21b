"""Issue #40 item 8: message times come from the host where it has them (0.19.0's live lists
carry none; its session database does), and a message with a large inline image expands to a
label such as ``[image: png, 270 KB]`` with the raw form on request.
"""

from __future__ import annotations

import base64
import json

from lossless_context.messages import media_shown
from tests import test_branch_undo_forget as undo
from tests.test_branch_undo_forget import _engine, _turns

location = undo.location  # the fixture: SQLite and PostgreSQL


class _HostRecord:
    """The host's session database as the engine reads it (get_messages_as_conversation)."""

    def __init__(self) -> None:
        self.rows: list[dict] = []
        self.reads = 0

    def get_messages_as_conversation(self, sid, **kw):
        self.reads += 1
        return [dict(m) for m in self.rows]

    def get_session(self, sid):
        return {"id": sid, "parent_session_id": None}


def test_rows_stored_from_a_timeless_list_take_the_hosts_times(location):
    e = _engine(location)
    db = _HostRecord()
    e.bind_session_state(db, "T")
    live = _turns("chat", 4) + [{"role": "user", "content": "chat question 0 "}]  # "continue" twice
    t0 = 1_700_000_000.0
    db.rows = [dict(m, timestamp=t0 + 60 * i) for i, m in enumerate(live)]
    current = [{"role": "user", "content": "the question in flight"}]
    e.on_session_end("T", live + current)  # what 0.19.0 hands over: no timestamps
    stored = sorted(e.store.session_messages("T"), key=lambda r: r.seq)
    assert [r.created_at for r in stored[:len(live)]] == [t0 + 60 * i for i in range(len(live))]
    assert stored[-1].created_at > t0 + 10**6  # the turn in flight: when it was stored (now)
    # grep's times and since/until follow
    ans = json.loads(e.handle_tool_call("lcm_grep", {"query": "chat answer 2", "until": "2023-11-14T22:20:00Z"}))
    hits = [h for g in ans["groups"] for h in g["hits"]]
    assert hits and hits[0]["time"].startswith("2023-11-14T22:")
    # a list whose new rows are all in the turn in flight does not read the host's record
    reads = db.reads
    e.on_session_end("T", live + current + [{"role": "assistant", "content": "an answer"}])
    assert db.reads == reads


def test_an_inline_image_expands_to_a_label(location):
    e = _engine(location)
    e.bind_session_state(None, "I")
    png = base64.b64encode(b"\x89PNG" + bytes(276_000)).decode()
    msg = {"role": "user", "content": [{"type": "text", "text": "what is in this screenshot?"},
                                       {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}}]}
    e.on_session_end("I", [msg, {"role": "assistant", "content": "a login form"}])
    mid = min(r.id for r in e.store.session_messages("I"))
    shown = json.loads(e.handle_tool_call("lcm_expand", {"id": f"m{mid}"}))
    assert shown["truncated"] is False and "media" in shown
    part = shown["message"]["content"][1]
    assert part["image_url"]["url"] == "[image: png, 270 KB]"
    assert shown["message"]["content"][0]["text"] == "what is in this screenshot?"
    raw = json.loads(e.handle_tool_call("lcm_expand", {"id": f"m{mid}", "raw": True}))
    assert raw["truncated"] is True and raw["total_chars"] > 360_000 and "media" not in raw


def test_media_labels():
    b64 = base64.b64encode(bytes(3000)).decode()
    assert media_shown(f"data:image/jpeg;base64,{b64}") == "[image: jpeg, 2.9 KB]"
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/webp", "data": b64}}
    assert media_shown(block)["source"]["data"] == "[image: webp, 2.9 KB]"
    assert media_shown("data:image/png;base64,AAAA") == "data:image/png;base64,AAAA"  # tiny: as it is
    assert media_shown({"a": ["plain text", 3]}) == {"a": ["plain text", 3]}
