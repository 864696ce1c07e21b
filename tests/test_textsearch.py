"""lcm_grep's text search strategy (lossless_context/retrieval/textsearch.py) on both backends.

The strategy only changes behaviour once terms are common, which at full scale means
hundreds of thousands of matches. Here the rarity budget is lowered so a few dozen matches
count as "common" and the same code paths run on a small real store."""

from __future__ import annotations

import json

import pytest

from lossless_context import LCMEngine
from lossless_context.retrieval import textsearch
from lossless_context.config import LCMConfig
from tests.support.pg import module_store_location

N_GROUP = 64  # messages holding every on-topic term (more than one ranking block)
N_DECIDE = 12  # messages holding the question's off-topic word and nothing else of it


def _history() -> list[dict]:
    msgs: list[dict] = []
    for k in range(N_GROUP):
        msgs.append({"role": "user", "content": f"status {k}: flaky webhook retries hit the retry limit again"})
        msgs.append({"role": "assistant", "content": f"noted {k}; nothing else changed in the billing module"})
    for k in range(N_DECIDE):
        msgs.append({"role": "user", "content": f"we decide the menu on fridays, week {k}"})
    msgs.append({"role": "user", "content": "the zeppelin landed next to nothing at all"})
    for k in range(30):
        msgs.append({"role": "assistant", "content": f"webhook delivery report {k} looks normal"})
    return msgs


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def engine(request, tmp_path_factory):
    location = module_store_location(request, tmp_path_factory, "textsearch")
    e = LCMEngine(config=LCMConfig.load({"store": location, "summarizer": "extractive"}, read_file=False))
    e.on_session_start("ts", platform="cli")
    e.ingest(_history(), session_id="ts")
    return e


@pytest.fixture
def small_budget(monkeypatch):
    monkeypatch.setattr(textsearch, "RANK_BUDGET", 5)


def grep(e, **args) -> dict:
    return json.loads(e.handle_tool_call("lcm_grep", args))


def contents(res: dict) -> list[str]:
    return [h["message"]["content"] for g in res["groups"] for h in g["hits"] if "message" in h]


QUESTION = "what did we decide about the retry limit for flaky webhook retries?"


@pytest.mark.parametrize("budget", ["default", "small"])
def test_question_with_an_off_topic_word_finds_the_on_topic_messages(engine, budget, request):
    if budget == "small":
        request.getfixturevalue("small_budget")
    res = grep(engine, query=QUESTION, limit=10)
    got = contents(res)
    assert len(got) == 10
    # "decide" never occurs with the other terms: the best hits hold all the others.
    assert all("flaky webhook retries hit the retry limit" in c for c in got), got


def test_common_terms_are_never_ranked_by_scoring_every_match(engine, small_budget):
    calls: list[tuple[str, str | None, str | None]] = []
    store = engine.store
    real = store.search

    def spy(target, scope, plan, **kw):
        if kw.get("mode") == "fts":
            calls.append((kw.get("order", "rank"), plan.fts_match, plan.pg_tsquery))
        return real(target, scope, plan, **kw)

    store.search = spy
    try:
        res = grep(engine, query=QUESTION, limit=10, scope="messages")
    finally:
        del store.search
    assert contents(res)
    assert calls and all(order == "recent" for order, _, _ in calls), calls


def test_rare_term_outranks_common_one(engine, small_budget):
    # No message holds both words; the rare one's message must come first (BM25 idf).
    res = grep(engine, query="webhook zeppelin", limit=5, scope="messages")
    got = contents(res)
    assert got and "zeppelin" in got[0]
    assert any("webhook" in c for c in got[1:])


def test_term_found_nowhere_does_not_empty_the_result(engine, small_budget):
    got = contents(grep(engine, query="flaky webhook xyzzyplughword", limit=5, scope="messages"))
    assert len(got) == 5 and all("flaky webhook" in c for c in got)


@pytest.mark.parametrize("budget", ["default", "small"])
def test_pages_neither_repeat_nor_skip_across_ranking_blocks(engine, budget, request):
    if budget == "small":
        request.getfixturevalue("small_budget")
    whole = grep(engine, query="webhook retries", limit=100, scope="messages")
    ids_whole = [h["id"] for g in whole["groups"] for h in g["hits"]]
    assert len(ids_whole) == N_GROUP + 30  # every message that mentions webhook
    seen: list[str] = []
    cursor = None
    for _ in range(30):
        page = grep(engine, query="webhook retries", limit=7, scope="messages", **({"cursor": cursor} if cursor else {}))
        seen += [h["id"] for g in page["groups"] for h in g["hits"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert len(seen) == len(set(seen)), "a hit was repeated on a later page"
    assert sorted(seen) == sorted(ids_whole), "a hit was skipped or invented"
    # Both words first: the messages that hold "retries" outrank those with "webhook" only.
    both = [i for i, c in enumerate(contents(whole)) if "retries" in c]
    assert both == list(range(N_GROUP))


def test_pool_end_has_no_cursor(engine):
    res = grep(engine, query="noted", limit=100, scope="messages")
    assert res["hits"] == N_GROUP and res["next_cursor"] is None
