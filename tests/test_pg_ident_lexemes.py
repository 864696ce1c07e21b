"""Issue #41: migration 035 computes the identifier lexemes of migration 033 in one flat query
(store/postgres/idents.py) instead of 033's per-text CTEs and sub-selects. Vectors stored under
033 are kept as they are, so both functions must give the same lexemes: 033's own SQL (taken
from its migration, renamed) and 035's, over a generated corpus of identifiers (snake_case,
kebab-case, dotted names, paths, mixed case, stop words and inflections among the parts, runs
longer than 12 parts, one of over 2,047 letters), prose, CJK, URLs, numbers, a long text and one
with over 1,000 distinct identifiers (033's batches and its 16,000-part limit). Real PostgreSQL server (tests/support/pg.py).
"""

from __future__ import annotations

import random
import re

import pytest

from lossless_context.demo.sessions import make_session
from lossless_context.store.postgres.migrations import MIGRATIONS

psycopg = pytest.importorskip("psycopg")

_WORDS = ("reconcile", "reconciled", "days", "day", "retry", "policies", "running", "the", "of", "and",
          "is", "a", "to", "invoice", "billing", "src", "py", "json", "Config", "HTTPServer", "v2",
          "06e82d63", "x", "QX", "6153", "narwhal", "gossamer", "38", "was", "being", "tests", "api")


def _old_functions() -> str:
    """033's two functions as it created them, renamed *_033 (the old one calls the old one)."""
    sql = dict(MIGRATIONS)["033_identifier_lexemes"]
    fns = re.findall(r"CREATE (?:OR REPLACE )?FUNCTION .*?\$fn\$;", sql, re.S)
    assert len(fns) == 2
    out = []
    for f in fns:
        f = f.replace("FUNCTION lcm_ident_lexemes(", "FUNCTION lcm_ident_lexemes_033(")
        f = f.replace("FUNCTION lcm_tsvector_of(", "FUNCTION lcm_tsvector_of_033(")
        out.append(f.replace("idents := lcm_ident_lexemes(t)", "idents := lcm_ident_lexemes_033(t)"))
    assert "lcm_ident_lexemes_033(t)" in out[1]
    return "\n".join(out)


def _ident(rng: random.Random, parts: int) -> str:
    words = [rng.choice(_WORDS) for _ in range(parts)]
    seps = [rng.choice("_-./") for _ in range(parts - 1)]
    return words[0] + "".join(s + w for s, w in zip(seps, words[1:]))


def _corpus() -> list[str]:
    rng = random.Random(41)
    texts = []
    for _ in range(300):
        bits = []
        for _ in range(rng.randint(1, 30)):
            r = rng.random()
            if r < 0.35:
                bits.append(_ident(rng, rng.choice((2, 2, 3, 4, 5, 6, 13, 16))))
            elif r < 0.45:
                bits.append(rng.choice(("青龙七号暗号", "設定_ファイル", "配置文件 reconcile_day 已更新", "ÄÖÜ_straße")))
            elif r < 0.55:
                bits.append(rng.choice(("https://example.test/a_b/c-d.html?x=1", "me@host.example", "1.28s",
                                        "3.14", "2024-01-15", "v1.2.3", "10.0.0.1:8080", "e.g.", "a_", "-b", "_")))
            else:
                bits.append(" ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 8))))
        texts.append(" ".join(bits))
    for m in make_session("coding", 200, seed=5).messages:
        text = m.get("content") if isinstance(m.get("content"), str) else ""
        texts.append(text + " ".join(tc["function"]["arguments"] for tc in m.get("tool_calls") or []))
    # long: a part's 256th occurrence and on stay as 033 left them (a tsvector keeps 255 positions)
    texts.append(" ".join(_ident(rng, rng.randint(2, 6)) for _ in range(12_000)))
    # a part of over 2,047 letters, which to_tsvector drops unnumbered (033's stems shift after it)
    texts.append("x_" + "q" * 2100 + "_running_tests " + " ".join(_ident(rng, 3) for _ in range(200)))
    # Over 1,000 distinct identifiers: the first batch (sorted: "a...") kept, the second (1,000
    # identifiers of 17 parts) over 16,000 parts and left out by both, the third kept.
    many = [f"a{i:04d}_{rng.choice(_WORDS)}" for i in range(1000)]
    many += [f"b{i:04d}_" + "_".join(rng.choice(_WORDS) for _ in range(16)) for i in range(1000)]
    many += [f"c{i:04d}-{rng.choice(_WORDS)}-{rng.choice(_WORDS)}" for i in range(500)]
    rng.shuffle(many)
    texts.append(" ".join(many))
    return texts


def test_flat_lexemes_equal_033s(pg_fresh_dsn):
    from lossless_context.store import open_store

    st = open_store(pg_fresh_dsn)
    try:
        assert "035_identifier_lexemes_flat" in st.applied_migrations()  # (connects: every migration runs)
    finally:
        st.close()
    texts = _corpus()
    with psycopg.connect(pg_fresh_dsn, autocommit=True) as c:
        c.execute(_old_functions())
        rows = c.execute(
            "SELECT ord,"
            " ARRAY(SELECT DISTINCT x FROM unnest(lcm_ident_lexemes_033(t)) x ORDER BY x),"
            " ARRAY(SELECT DISTINCT x FROM unnest(lcm_ident_lexemes(t)) x ORDER BY x),"
            " lcm_tsvector_of_033(t)::text, lcm_tsvector_of(t)::text"
            " FROM unnest(%s::text[]) WITH ORDINALITY AS u(t, ord) ORDER BY ord", (texts,)).fetchall()
    assert len(rows) == len(texts)
    differ = [(int(o) - 1, old, new) for o, old, new, _, _ in rows if old != new]
    assert not differ, [(texts[i][:80], sorted(set(a) ^ set(b))[:10]) for i, a, b in differ[:3]]
    assert all(old_v == new_v for _, _, _, old_v, new_v in rows)
    lexemes = {x for _, old, _, _, _ in rows for x in old}
    # (the corpus reaches what the lexemes are made of: stems, stop words as written, runs of
    # 2 to 4 parts, only the first 12 parts, and 033's batch limit)
    assert {"reconcil/day", "the/reconcil", "run/test/api", "qx/6153"} & lexemes
    assert sum(1 for _, old, _, _, _ in rows if old) > 250
    big = rows[-1][1]
    assert any(x.startswith("a0999/") for x in big) and any(x.startswith("c0499/") for x in big)
    assert not any(x.startswith("b0") for x in big)
    assert max(x.count("/") for x in lexemes) == 3
