"""lcm_grep recall on both backends: originals first for identifiers (summaries that only repeat
a message's match are folded into it), and the context-aware ranking of natural-language
questions (neighbouring turns, named days), with stable paging."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timezone

import pytest

from lossless_context import LCMEngine
from lossless_context.config import LCMConfig
from lossless_context.retrieval.ranking import named_days
from lossless_context.records import NewMessage, NewSummary

T0 = 1_704_585_600.0  # 2024-01-07 00:00 UTC
DAY = 86_400.0
IDENT = "ERR_QUOTA_MOVE_7731"


@pytest.fixture(params=["sqlite", "postgres"])
def engine(request, tmp_path):
    loc = str(tmp_path / "lcm.db") if request.param == "sqlite" else request.getfixturevalue("pg_fresh_dsn")
    e = LCMEngine(config=LCMConfig.load({"store": loc, "summarizer": "extractive"}, read_file=False))
    e.bind_session_state(session_db=None, session_id="s")
    e.on_session_start("s", platform="cli")
    yield e
    e.store.close()


def nm(text: str, role: str = "user", t: float = T0) -> NewMessage:
    return NewMessage(raw={"role": role, "content": text}, role=role, ident=uuid.uuid4().hex, uid=None, text=text,
                      tokens=len(text) // 4 + 1, created_at=t, absorbed=[])


def leaf(key: str, mids: list[int], text: str, t_end: float) -> NewSummary:
    return NewSummary(key=key, kind="leaf", depth=0, text=text, tokens=10, source_tokens=100, level="normal",
                      summarizer="test", t_start=T0, t_end=t_end, n_messages=len(mids), message_ids=list(mids))


def condensed(key: str, children: list[str], text: str, depth: int, t_end: float) -> NewSummary:
    return NewSummary(key=key, kind="condensed", depth=depth, text=text, tokens=10, source_tokens=100,
                      level="normal", summarizer="test", t_start=T0, t_end=t_end, n_messages=0,
                      child_keys=list(children))


def grep(e, **args) -> dict:
    return json.loads(e.handle_tool_call("lcm_grep", args))


def hits(res: dict) -> list[dict]:
    return [h for g in res["groups"] for h in g["hits"]]


def _chain_store(e) -> tuple[list[int], dict[str, int]]:
    """20 messages; m[3] and m[14] quote IDENT; a leaf over each half, both quoting it, a
    condensed node over the two and one above that, all quoting it and all newer than the
    messages (so by time alone they would rank first)."""
    st = e.store
    texts = [f"routine step {i} of the quota migration" for i in range(20)]
    texts[3] = f"the move failed with {IDENT} while copying the quota file"
    texts[14] = f"retried: {IDENT} again, the target was read-only"
    ids = st.append_messages("s", [nm(t, "tool" if i % 2 else "assistant", T0 + i) for i, t in enumerate(texts)])
    km, _ = st.stage_pass("s", "p1", [
        leaf("a", ids[:10], f"First half: the quota move failed with {IDENT}.", T0 + 1000),
        leaf("b", ids[10:], f"Second half: {IDENT} again on retry.", T0 + 1001),
        condensed("c", ["a", "b"], f"Quota move: {IDENT} twice; fixed by remounting.", 1, T0 + 1002),
        condensed("d", ["c"], f"Session so far: quota migration, {IDENT}.", 2, T0 + 1003),
    ], [("s", "d")], st.get_context("s")[0], 0)
    assert st.publish_pass("p1")
    return ids, km


def test_identifier_in_a_leaf_and_two_ancestors_returns_the_original_first(engine):
    ids, km = _chain_store(engine)
    res = grep(engine, query=IDENT)
    got = hits(res)
    assert [h["kind"] for h in got] == ["message", "message"]  # every summary folded
    assert {h["id"] for h in got} == {f"m{ids[3]}", f"m{ids[14]}"}
    first = next(h for h in got if h["id"] == f"m{ids[3]}")
    assert first["summary_chain"] == [f"s{km['a']}", f"s{km['c']}", f"s{km['d']}"]  # chain still shown
    folded = {s for h in got for s in h.get("folded", [])}
    assert folded == {f"s{km[k]}" for k in "abcd"}
    assert all(IDENT in h["message"]["content"] for h in got)
    assert len(res["groups"]) == 1 and res["groups"][0]["summary_id"] == f"s{km['d']}"


def test_folded_results_page_without_repeats(engine):
    ids, km = _chain_store(engine)
    seen, cursor = [], None
    for _ in range(5):
        args = {"query": IDENT, "limit": 1, **({"cursor": cursor} if cursor else {})}
        res = grep(engine, **args)
        seen += [h["id"] for h in hits(res)]
        cursor = res["next_cursor"]
        if not cursor:
            break
    assert sorted(seen) == sorted({f"m{ids[3]}", f"m{ids[14]}"}) and len(seen) == 2


def test_summary_that_alone_holds_the_match_keeps_its_slot(engine):
    st = engine.store
    ids = st.append_messages("s", [nm(f"plain message {i}", t=T0 + i) for i in range(4)])
    km, _ = st.stage_pass("s", "p1", [leaf("a", ids, "The team named this work QUOTA_PLAN_B.", T0 + 100)],
                          [("s", "a")], st.get_context("s")[0], 0)
    assert st.publish_pass("p1")
    got = hits(grep(engine, query="QUOTA_PLAN_B"))
    assert [h["id"] for h in got] == [f"s{km['a']}"]


def test_scope_summaries_is_not_folded(engine):
    _, km = _chain_store(engine)
    got = hits(grep(engine, query=IDENT, scope="summaries", limit=10))
    assert {h["id"] for h in got} == {f"s{km[k]}" for k in "abcd"}


def _dialogue(e) -> list[int]:
    turns = [
        ("user", "Did you sign up for the yoga class you mentioned?", T0),
        ("assistant", "Yes! My first lesson is today at five, I bought a new mat.", T0 + 60),
        ("user", "The weather is nice for the class of cooking tomorrow.", T0 + 120),
    ]
    turns += [("user" if i % 2 else "assistant", f"unrelated chat line {i} about films and books", T0 + 200 + i)
              for i in range(30)]
    return e.store.append_messages("s", [nm(t, r, ts) for r, t, ts in turns])


def test_answer_turn_without_query_words_is_found_through_its_neighbour(engine):
    ids = _dialogue(engine)
    got = [h["id"] for h in hits(grep(engine, query="did she sign up for yoga?", scope="messages", limit=5))]
    assert got[0] == f"m{ids[0]}"
    assert f"m{ids[1]}" in got  # shares no term with the question: found through the turn before it


def test_natural_language_pages_are_one_stable_ranking(engine):
    _dialogue(engine)
    whole = [h["id"] for h in hits(grep(engine, query="what did we chat about films and books?", scope="messages", limit=12))]
    paged, cursor = [], None
    for _ in range(4):
        res = grep(engine, query="what did we chat about films and books?", scope="messages", limit=3,
                   **({"cursor": cursor} if cursor else {}))
        paged += [h["id"] for h in hits(res)]
        cursor = res["next_cursor"]
    assert len(whole) == 12 and len(set(paged)) == 12
    assert set(paged) == set(whole)


def test_a_named_day_raises_that_days_messages(engine):
    st = engine.store
    ids = st.append_messages("s", [
        nm("I will buy a red scarf at the market", t=T0 - 5 * DAY),
        nm("I will buy a red scarf at the market", t=T0 + 3600),
        nm("I will buy a red scarf at the market", t=T0 + 9 * DAY),
    ])
    got = [h["id"] for h in hits(grep(engine, query="What did she buy on 7 Jan 2024?", scope="messages"))]
    assert got[0] == f"m{ids[1]}"
    got = [h["id"] for h in hits(grep(engine, query="What did she buy on 16 January 2024?", scope="messages"))]
    assert got[0] == f"m{ids[2]}"


def test_named_days_parses_common_forms_and_ignores_nonsense():
    day = datetime(2024, 1, 7, tzinfo=timezone.utc).timestamp()
    for q in ("on 7 Jan 2024", "on Jan 7, 2024", "the 7th of January 2024", "2024-01-07", "07.01.2024"):
        assert named_days(q) == [(day - DAY, day + 2 * DAY)], q
    assert named_days("on 31 Feb 2024") == []
    assert named_days("in the spring") == []
    assert named_days("x" * 5000) == []


def named(text: str, role: str, name: str | None, t: float, prefix: bool = False) -> NewMessage:
    """A turn as a chat of named people sends it: OpenAI's ``name`` field, or (``prefix``) the
    ``[Name] `` prefix Hermes' gateway writes on user messages of a shared session."""
    raw: dict = {"role": role, "content": f"[{name}] {text}" if prefix else text}
    if name and not prefix:
        raw["name"] = name
    return NewMessage(raw=raw, role=role, ident=uuid.uuid4().hex, uid=None, text=raw["content"],
                      tokens=len(text) // 4 + 1, created_at=t, absorbed=[])


def _two_people(e, *, names: bool, prefix: bool = False) -> list[int]:
    """Elise asks Kevin about hiking twice (her turns hold both "Kevin" and "hiking"); Kevin's
    answers say "hiking" without his own name; filler after."""
    role = {"Kevin": "user", "Elise": "user" if prefix else "assistant"}
    turns = [("Elise", "Kevin, do you still go hiking in the hills? Hiking there is lovely, Kevin."),
             ("Kevin", "Yes, I go hiking most weekends with my brother."),
             ("Elise", "Kevin, hiking boots or trail shoes for hiking, Kevin?")]
    turns += [("Kevin" if i % 2 else "Elise", f"small talk line {i} about lunch and weather") for i in range(20)]
    return e.store.append_messages("s", [
        named(text, role[who], who if names else None, T0 + 60 * i, prefix=prefix)
        for i, (who, text) in enumerate(turns)])


@pytest.mark.parametrize("prefix", [False, True], ids=["name-field", "gateway-prefix"])
def test_a_named_speakers_own_turn_ranks_above_turns_that_only_name_them(engine, prefix):
    ids = _two_people(engine, names=True, prefix=prefix)
    got = [h["id"] for h in hits(grep(engine, query="Does Kevin like hiking?", scope="messages", limit=3))]
    assert got[0] == f"m{ids[1]}"


def test_without_speakers_the_turns_that_name_them_rank_first(engine):
    # the same chat with roles only: nothing says who Kevin is, so his name is a search word
    ids = _two_people(engine, names=False)
    got = [h["id"] for h in hits(grep(engine, query="Does Kevin like hiking?", scope="messages", limit=3))]
    assert got[0] in (f"m{ids[0]}", f"m{ids[2]}")


def test_speaker_of_reads_the_name_field_and_the_gateway_prefix():
    from lossless_context.messages import speaker_of

    assert speaker_of({"role": "user", "content": "hi", "name": "  Fahim   Khan "}) == "Fahim Khan"
    assert speaker_of({"role": "assistant", "content": "hi", "name": "Hermes"}) == "Hermes"
    assert speaker_of({"role": "user", "content": "[Akib] see you at six"}) == "Akib"
    assert speaker_of({"role": "assistant", "content": "[Akib] not a gateway prefix"}) is None
    assert speaker_of({"role": "tool", "content": "ok", "name": "terminal"}) is None  # a tool's name
    assert speaker_of({"role": "user", "content": "[] empty"}) is None
    assert speaker_of({"role": "user", "content": "plain"}) is None
    assert speaker_of("not a message") is None


def test_a_speakers_name_written_in_lower_case_is_a_search_word(engine):
    # "kevin" in lower case is not read as a name: the question is searched as typed
    ids = _two_people(engine, names=True)
    got = [h["id"] for h in hits(grep(engine, query="does kevin like hiking?", scope="messages", limit=3))]
    assert got[0] in (f"m{ids[0]}", f"m{ids[2]}")
