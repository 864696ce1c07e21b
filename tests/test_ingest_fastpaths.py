"""The fast ingest paths compute exactly what the original code did.

Idents, token counts and the stored `raw` JSON are persistent: a changed ident makes the
engine store known messages again, a changed raw breaks export round-trips. Each fast
function is compared with its frozen original (tests/support/ingest_oracle.py) on hostile
messages, and the SQLite store's bulk indexing with what the triggers did.
"""

from __future__ import annotations

import sqlite3
from collections import OrderedDict
from typing import Any

from hypothesis import HealthCheck, given, settings, strategies as st

from lossless_context import messages as M
from lossless_context import tokens as T
from lossless_context.pipeline.ingest import new_message
from lossless_context.store.sqlite.store import SQLiteStore
from tests.support import ingest_oracle as ORACLE

SPECIAL = ["\ud800", "x\udc00y", "\x00", "a\x00b", "\U0001f642", "\\", '"', "é", "→", "数据库", "가나", "カナ",
           "\u2e80", "\u9fff", "\uac00", "\ud7af", "\u3040", "\u30ff", "\u2e7f", "\ua000", "\ud7b0", "\u3100"]
TEXT = st.lists(st.one_of(st.text(max_size=30), st.sampled_from(SPECIAL)), max_size=6).map("".join)
SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), TEXT, st.floats(allow_nan=True))
JSONISH = st.recursive(SCALAR, lambda kids: st.one_of(st.lists(kids, max_size=3),
                                                      st.dictionaries(TEXT, kids, max_size=3)), max_leaves=8)
TOOL_CALL = st.one_of(
    st.fixed_dictionaries({"id": st.one_of(TEXT, st.none()), "type": st.just("function"),
                           "function": st.fixed_dictionaries({"name": TEXT, "arguments": st.one_of(TEXT, JSONISH)})}),
    JSONISH,
)
PART = st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["text", "input_text"]), "text": TEXT}),
    st.fixed_dictionaries({"type": st.sampled_from(["image_url", "input_image", "image", "input_audio"]),
                           "image_url": st.fixed_dictionaries({"url": TEXT})}),
    JSONISH,
)
FIELD = {
    "role": st.one_of(st.sampled_from(["user", "assistant", "tool", "system", "weird"]), JSONISH),
    "content": st.one_of(TEXT, TEXT, st.lists(PART, max_size=3), JSONISH),
    "tool_calls": st.one_of(st.lists(TOOL_CALL, max_size=3), JSONISH),
    "tool_call_id": st.one_of(TEXT, JSONISH),
    "name": st.one_of(TEXT, JSONISH),
    "_private": JSONISH,
    "timestamp": SCALAR,
}


@st.composite
def messages(draw) -> Any:
    if draw(st.integers(0, 9)) == 0:
        return draw(JSONISH)  # not a dict at all
    keys = draw(st.lists(st.sampled_from(sorted(FIELD)), unique=True, max_size=len(FIELD)))
    msg = {k: draw(FIELD[k]) for k in keys}
    if draw(st.integers(0, 9)) == 0:
        msg = OrderedDict(msg)  # a dict subclass: its own repr
    return msg


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(msg=messages())
def test_fast_paths_match_the_originals(msg: Any) -> None:
    assert M.content_ident(msg) == ORACLE.content_ident(msg)
    assert T.estimate_message_tokens(msg) == ORACLE.estimate_message_tokens(msg)
    assert M.safe_json(msg) == ORACLE.safe_json(msg)


def test_safe_json_of_objects_json_does_not_know_is_the_original() -> None:
    import decimal
    import enum

    class Colour(enum.Enum):
        RED = 1

    for value in (decimal.Decimal("1.5"), {1, 2}, Colour.RED, b"bytes", 3 + 4j, float("inf"), 10**30, (1, "t")):
        msg = {"role": "tool", "content": "x", "extra": [value, {"k": value}]}
        assert M.safe_json(msg) == ORACLE.safe_json(msg)


# Long enough for the counting path of tokens._repr_len (> 256 characters), with every kind of
# character repr escapes: quotes of both kinds, backslashes, \t \n \r, other controls, DEL.
ESCAPES = ["'", '"', "\\", "\t", "\n", "\r", "\x00", "\x01", "\x1f", "\x7f", "\x0b", "\x0c", "a", " "]
LONG_TEXT = st.tuples(st.lists(st.sampled_from(ESCAPES), min_size=1, max_size=40), st.integers(8, 40)).map(
    lambda t: "".join(t[0]) * t[1])


@settings(max_examples=400, deadline=None)
@given(text=st.one_of(LONG_TEXT, TEXT), other=st.dictionaries(TEXT, SCALAR, max_size=3))
def test_token_estimate_measures_repr_without_building_it(text: str, other: dict) -> None:
    msg = {"role": "tool", "content": text, **other}
    assert T._str_len(msg) == len(str(msg))
    assert T._repr_len(text) == len(repr(text))
    assert T.estimate_message_tokens(msg) == ORACLE.estimate_message_tokens(msg)


@settings(max_examples=300, deadline=None)
@given(text=TEXT)
def test_clean_text_and_cjk_match(text: str) -> None:
    assert M.clean_text(text) == ORACLE.clean_text(text)
    cleaned = M.clean_text(text)
    # has_cjk decides which rows the store puts in the trigram table; the delete trigger
    # decides with SQLite's GLOB: they must agree on every stored text.
    glob = sqlite3.connect(":memory:").execute(
        "SELECT ? GLOB '*[⺀-鿿가-힯぀-ヿ]*'", (cleaned,)).fetchone()[0]
    assert M.has_cjk(cleaned) == bool(glob)


def test_ident_of_common_shapes_is_pinned() -> None:
    # Literal values from the original implementation: stores in the field hold these.
    assert M.content_ident({"role": "user", "content": "hi"}) == "d5d2a8825072199d9990fe8907ab7b8d"
    tool = {"role": "tool", "content": " out ", "tool_call_id": "c1", "name": "terminal"}
    assert M.content_ident(tool) == "35c00ecfc2627b932c2e922609ed465f"
    call = {"role": "assistant", "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "t", "arguments": "{}"}}]}
    assert M.content_ident(call) == "30ee8cbb1f616d2cfd6081205c0192c5"


def _fts_rows(path: str) -> tuple[list, list, list]:
    c = sqlite3.connect(path)
    try:
        # The index contents themselves (term, row, column, offset), not just MATCH results.
        c.execute("CREATE VIRTUAL TABLE temp.v1 USING fts5vocab(main, messages_fts, instance)")
        c.execute("CREATE VIRTUAL TABLE temp.v2 USING fts5vocab(main, messages_cjk, instance)")
        return (sorted(c.execute("SELECT term, doc, col, offset FROM temp.v1")),
                sorted(c.execute("SELECT term, doc, col, offset FROM temp.v2")),
                c.execute("SELECT id, text FROM messages ORDER BY id").fetchall())
    finally:
        c.close()


def test_bulk_indexing_equals_the_triggers(tmp_path) -> None:
    texts = ["plain ascii words", "数据库迁移计划 mixed", "→ arrow only", "", "ハングル 가나다 kana カナ",
             "x\udc00y surrogate", "nul\x00byte", "é accents café", "\u2e80 edge \u9fff"]
    bulk = SQLiteStore(str(tmp_path / "bulk.db"))
    bulk.ensure_session("s")
    rows = [new_message({"role": "user", "content": t}, 25_000, 600) for t in texts]
    ids = bulk.append_messages("s", rows)
    assert ids == list(range(1, len(texts) + 1))
    bulk.close()
    # The same rows written by another writer (no gate): the triggers index them.
    trig = str(tmp_path / "trig.db")
    SQLiteStore(trig).conn()
    c = sqlite3.connect(trig, isolation_level=None)
    c.execute("INSERT INTO sessions(id, created_at, updated_at) VALUES ('s', 0, 0)")
    for i, r in enumerate(rows):
        c.execute("INSERT INTO messages(session_id, seq, ident, role, raw, text, tokens, created_at)"
                  " VALUES ('s', ?, ?, 'user', '{}', ?, 1, 0)", (i, r.ident, M.clean_text(r.text)))
    c.close()
    assert _fts_rows(str(tmp_path / "bulk.db")) == _fts_rows(trig)
    for path in (str(tmp_path / "bulk.db"), trig):
        c = sqlite3.connect(path)
        c.execute("INSERT INTO messages_fts(messages_fts, rank) VALUES ('integrity-check', 1)")
        # rank 0: the trigram index is partial by design (CJK rows only), so only its structure.
        c.execute("INSERT INTO messages_cjk(messages_cjk, rank) VALUES ('integrity-check', 0)")
        c.close()
    # Deleting through the triggers leaves both indexes consistent (a wrong 'delete' corrupts them).
    c = sqlite3.connect(str(tmp_path / "bulk.db"), isolation_level=None)
    c.execute("DELETE FROM messages")
    c.execute("INSERT INTO messages_fts(messages_fts, rank) VALUES ('integrity-check', 1)")
    c.execute("INSERT INTO messages_cjk(messages_cjk, rank) VALUES ('integrity-check', 1)")  # now empty
    assert c.execute("SELECT count(*) FROM messages_cjk WHERE messages_cjk MATCH '数据库'").fetchone()[0] == 0
    assert c.execute("SELECT count(*) FROM messages_fts WHERE messages_fts MATCH 'plain'").fetchone()[0] == 0
    assert c.execute("SELECT count(*) FROM lcm_bulk_indexing").fetchone()[0] == 0
    c.close()


def _calls(m: dict) -> list:
    if not isinstance(m.get("tool_calls"), list):
        m["tool_calls"] = []
    return m["tool_calls"]


MUTATIONS = [
    lambda m: m.__setitem__("content", str(m.get("content")) + "x"),
    lambda m: m.__setitem__("content", None),
    lambda m: m.__setitem__("role", "assistant" if m.get("role") != "assistant" else "user"),
    lambda m: m.__setitem__("tool_call_id", "other"),
    lambda m: m.__setitem__("name", "renamed"),
    lambda m: m.pop("tool_calls", None),
    lambda m: _calls(m).append({"id": "c9", "type": "function", "function": {"name": "t", "arguments": "{}"}}),
    # In place, deep inside: the dicts are the same objects, their values are not.
    lambda m: [tc["function"].__setitem__("arguments", "changed") for tc in _calls(m)
               if isinstance(tc, dict) and isinstance(tc.get("function"), dict)],
    lambda m: [tc.__setitem__("id", "changed") for tc in _calls(m) if isinstance(tc, dict)],
    lambda m: None,  # unchanged
]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(msgs=st.lists(messages(), max_size=8), picks=st.lists(st.integers(0, len(MUTATIONS) - 1), max_size=8))
def test_ident_memo_is_content_ident_after_any_change(msgs: list, picks: list[int]) -> None:
    first = M.IdentMemo("memo-test")
    assert [first.ident(m) for m in msgs] == [ORACLE.content_ident(m) for m in msgs]
    first.save()
    for m, p in zip(msgs, picks):
        if isinstance(m, dict):
            MUTATIONS[p](m)
    again = M.IdentMemo("memo-test")
    assert [again.ident(m) for m in msgs] == [ORACLE.content_ident(m) for m in msgs]
    again.save()
