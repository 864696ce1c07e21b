"""Issue #41: PostgreSQL indexes snake_case / kebab-case identifiers as whole lexemes
(store/postgres/idents.py, migration 033), so an identifier's search is one GIN probe instead of
a phrase rechecked row by row. The results must not change: the same hits as the phrase gave
on PostgreSQL and as SQLite gives, for the identifiers of a generated coding history; rows
indexed before the migration keep the phrase until the indexer has given them their lexemes.
Real SQLite files and a real PostgreSQL server (tests/support/pg.py)."""

from __future__ import annotations

import collections
import json
import re

import pytest

from lossless_context import LCMEngine
from lossless_context.config import LCMConfig
from lossless_context.demo.sessions import make_session
from lossless_context.store.postgres.idents import whole_identifiers

psycopg = pytest.importorskip("psycopg")

_IDENT = re.compile(r"(?<![\w.-])[A-Za-z0-9]+(?:[_-][A-Za-z0-9]+){1,3}(?![\w-])")


def _engine(store: str) -> LCMEngine:
    e = LCMEngine(config=LCMConfig.load({"store": store, "summarizer": "extractive"}, read_file=False))
    e.on_session_start("ids", platform="cli", conversation_id="c")
    return e


def _history() -> list[dict]:
    return make_session("coding", 900, seed=23).messages


def _queries(msgs: list[dict]) -> list[str]:
    """Identifiers of the history: the most frequent and a spread of rare ones."""
    counts: collections.Counter[str] = collections.Counter()
    for m in msgs:
        text = m.get("content") if isinstance(m.get("content"), str) else ""
        for tc in m.get("tool_calls") or []:
            text += " " + tc["function"]["arguments"]
        counts.update(_IDENT.findall(text))
    common = [w for w, _ in counts.most_common(12)]
    rare = sorted(w for w, n in counts.items() if n == 1)[::17][:12]
    return common + rare


def _hits(e: LCMEngine, q: str) -> tuple[int, list[str]]:
    r = json.loads(e.handle_tool_call("lcm_grep", {"query": q, "limit": 50}))
    ids = sorted(h["id"] for g in r.get("groups", []) for h in g["hits"])
    return r.get("hits"), ids


def _phrase(e: LCMEngine) -> None:
    """Searches of this store keep the phrase (as before migration 033)."""
    e.store.inner.__dict__["_idents_state"] = (float("inf"), False)


def test_identifier_results_equal_before_and_after_on_both_backends(tmp_path, pg_fresh_dsn):
    """PostgreSQL with the whole lexemes finds what SQLite finds (SQLite: unchanged); where its
    phrase search found something else before (hex ids and dates the english parser cuts
    oddly), the lexeme agrees with SQLite and the phrase did not."""
    msgs = _history()
    sq, pg = _engine(str(tmp_path / "ids.db")), _engine(pg_fresh_dsn)
    for e in (sq, pg):
        e.ingest(msgs, session_id="ids")
        e.store.wait_indexed()
    queries = _queries(msgs)
    assert len(queries) >= 16
    rewritten = full = changed = 0
    for q in queries:
        lexeme = pg.store.inner._ident_lexeme(q)
        rewritten += bool(lexeme) and pg.store.inner._tsq(f"'{q}'") == f"'{lexeme}'"
        after, sqlite = _hits(pg, q), _hits(sq, q)
        _phrase(pg)
        before = _hits(pg, q)
        pg.store.inner.__dict__.pop("_idents_state")
        assert after[0] > 0 and after[0] == sqlite[0], q
        if after[0] < 50:  # every hit on the page (a full page's choice is each backend's ranking)
            full += 1
            assert after == sqlite, q
            if before != after:
                changed += 1
                assert before != sqlite, q
    assert rewritten == len(queries) and full >= 12  # every query took the whole lexeme
    assert changed < full  # (most are the same; the rest are the phrase's disagreements with SQLite)


def test_rows_indexed_before_the_migration_keep_the_phrase_until_backfilled(pg_fresh_dsn):
    msgs = _history()
    e = _engine(pg_fresh_dsn)
    e.ingest(msgs, session_id="ids")
    e.store.wait_indexed()
    queries = _queries(msgs)[:8]
    want = {q: _hits(e, q) for q in queries}
    _phrase(e)
    phrase = {q: _hits(e, q) for q in queries}
    # A store indexed before migration 033: no identifier lexemes, the backfill pending.
    with psycopg.connect(pg_fresh_dsn, autocommit=True) as c:
        c.execute("UPDATE message_index x SET tsv = ts_delete(x.tsv, lcm_ident_lexemes(m.text))"
                  " FROM messages m WHERE m.id = x.id AND lcm_ident_lexemes(m.text) IS NOT NULL")
        c.execute("INSERT INTO lcm_ident_backfill(messages_below, summaries_below)"
                  " SELECT max(id) + 1, 1 FROM messages")
    e.store.close()
    e2 = _engine(pg_fresh_dsn)
    for q in queries:
        assert e2.store.inner._tsq(f"'{q}'") == f"'{q}'"  # the phrase while rows lack lexemes
        assert _hits(e2, q) == phrase[q], q
    e2.store.backfill_identifiers()
    with psycopg.connect(pg_fresh_dsn, autocommit=True) as c:
        assert c.execute("SELECT count(*) FROM lcm_ident_backfill").fetchone()[0] == 0
    for q in queries:
        assert e2.store.inner._tsq(f"'{q}'") == f"'{e2.store.inner._ident_lexeme(q)}'"
        assert _hits(e2, q) == want[q], q


def test_only_free_standing_identifiers_of_two_to_four_parts_are_rewritten():
    lexeme = lambda ident: ident.replace("_", "/").replace("-", "/").lower()  # noqa: E731
    assert whole_identifiers("'reconcile_day' | 'QX-6153'", lexeme) == "'reconcile/day' | 'qx/6153'"
    # inside a quoted phrase, five parts, a dotted one, a plain word: the phrase stays
    for tsq in ("('fix' <-> 'reconcile_day' <-> 'now')", "'a_b_c_d_e'", "'foo.bar_baz'", "'word'"):
        assert whole_identifiers(tsq, lexeme) == tsq
    assert whole_identifiers("'reconcile_day'", lambda ident: None) == "'reconcile_day'"


def test_the_lexeme_is_the_stemmed_run_the_parser_keeps_whole(pg_fresh_dsn):
    e = _engine(pg_fresh_dsn)
    st = e.store.inner
    assert st._ident_lexeme("reconcile_day") == st._ident_lexeme("Reconciled-Days") == "reconcil/day"
    assert st._ident_lexeme("QX-6153") == "qx/6153"
    with psycopg.connect(pg_fresh_dsn, autocommit=True) as c:
        got = c.execute("SELECT lcm_ident_lexemes('run x_reconcile_days_v2 now')").fetchone()[0]
    assert set(got) == {"x/reconcil", "x/reconcil/day", "x/reconcil/day/v2", "reconcil/day", "reconcil/day/v2",
                        "day/v2"}
