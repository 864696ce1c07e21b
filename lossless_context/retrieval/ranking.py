"""Context-aware ranking of message hits for natural-language queries (``lcm_grep`` text mode).

A question's answer is often a turn that shares no word with it ("Yes, I signed up — first
class is at five"), right after the turn that does ("Did you sign up for the yoga lesson?").
A flat index scores each message alone; the store knows more about it: the turns around it
in its session, the leaf summary that covers it, and when it was said. This module re-scores
the lexical candidates with that context, through the public store interface only (the same
on SQLite and PostgreSQL):

* **own** — the message's BM25-style score (``query.score_hit`` with the idf of the search);
* **neighbours** — the turns up to ``WINDOW`` seqs away in the same session: the best
  neighbour's own score, decayed with distance. The neighbours of the best ``SEEDS``
  candidates also become candidates themselves (filters permitting);
* **summary** — the covering leaf summary's score, for the best candidates (a message inside
  a span that is about the question ranks above a stray mention);
* **speaker** — a question naming one of the conversation's speakers ("what does Kevin do to
  relax?") is searched without the name, which the speaker's own turns rarely contain (it is
  the other side that says "Kevin"), and that speaker's turns are raised by ``SPEAKER_BOOST``.
  Speakers are what the messages say of themselves (``messages.speaker_of``: OpenAI's
  ``name`` field, or the ``[Name]`` prefix Hermes' gateway writes in shared sessions), read
  from the candidates; a conversation whose messages name no one is ranked without this;
* **time** — a question naming a day ("on 7 Jan 2024", "2024-01-07") raises the messages
  of that day (a day's margin on each side: the host's time zone is unknown) and searches that
  window for more candidates.

Only questions are re-ranked (:func:`wants_context`). The final score is ``own + W_NEIGHBOUR · neighbours + W_SUMMARY · summary``, times
``1 + TIME_BOOST`` inside a named day and ``1 + SPEAKER_BOOST`` for the named speaker. Queries with an identifier, a quoted phrase or a
substring item are not re-ranked: they stay exact-first.

Constants were chosen on REALTALK chats 1–5 only (``bench/realtalk.py``); 6–10 are held out.
"""

from __future__ import annotations

import calendar
import re
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Sequence

from ..messages import speaker_of
from ..search.query import QueryPlan, plan_query, score_hit
from ..store.search_api import SearchAPI

SEEDS = 40  # best candidates whose neighbours are fetched (and whose leaf summary is scored)
WINDOW = 1  # neighbouring turns on each side that lend a message their score
DECAY = 0.5  # (WINDOW > 1) a neighbour two turns away counts half as much as the adjacent one
W_NEIGHBOUR = 0.35  # dev chats 1-5: 0.6 gave R@10 51.6, 0.35 gave 52.3 (and R@5 43.2 vs 42.5)
W_SUMMARY = 0.3
TIME_BOOST = 1.0
SPEAKER_BOOST = 1.0
SPEAKER_POOL = 200  # candidates whose speakers are read to recognise a name in the question
AVG_CHARS = 2_000.0

_MONTHS = {m.casefold(): i for i, m in enumerate(calendar.month_name) if m}
_MONTHS.update({m.casefold(): i for i, m in enumerate(calendar.month_abbr) if m})
_MONTHS["sept"] = 9
_MON = "(" + "|".join(sorted(_MONTHS, key=len, reverse=True)) + r")\.?"
_DAY = r"(\d{1,2})(?:st|nd|rd|th)?"
_DATES = [
    (re.compile(rf"\b{_DAY}\s+(?:of\s+)?{_MON},?\s+(\d{{4}})\b", re.I), (3, 2, 1)),  # 7 Jan 2024
    (re.compile(rf"\b{_MON}\s+{_DAY},?\s+(\d{{4}})\b", re.I), (3, 1, 2)),  # Jan 7, 2024
    (re.compile(r"\b(\d{4})-(\d{2})-(\d{2})\b"), (1, 2, 3)),  # 2024-01-07
    (re.compile(r"\b(\d{1,2})\.(\d{1,2})\.(\d{4})\b"), (3, 2, 1)),  # 07.01.2024
]


_QUESTION = re.compile(r"^\s*(?:who|whom|whose|what|when|where|which|why|how|did|does|do|is|are|was|"
                       r"were|has|have|had|can|could|would|will|should)\b|\?\s*$", re.I)


def wants_context(plan: QueryPlan) -> bool:
    """Plain-language questions only (a question word first or a "?" last): their answer may be a
    turn without their words. Keyword searches keep the lexical ranking and return only
    matching rows; identifiers, phrases and substrings stay exact-first."""
    return (bool(plan.terms) and not plan.exact and not plan.substrings
            and bool(_QUESTION.search(plan.query)))


def named_days(query: str) -> list[tuple[float, float]]:
    """(start, end) epoch windows of the calendar days a question names, a day's margin each side."""
    out: list[tuple[float, float]] = []
    for rx, (yi, mi, di) in _DATES:
        for m in rx.finditer(query or ""):
            try:
                mon = m.group(mi)
                month = int(mon) if mon.isdigit() else _MONTHS[mon.casefold().rstrip(".")]
                day = datetime(int(m.group(yi)), month, int(m.group(di)), tzinfo=timezone.utc)
            except (KeyError, ValueError, OverflowError):
                continue
            win = ((day - timedelta(days=1)).timestamp(), (day + timedelta(days=2)).timestamp())
            if win not in out:
                out.append(win)
    return out[:4]


def named_speakers(store: SearchAPI, plan: QueryPlan, rows: Sequence[dict[str, Any]]) -> tuple[list[str], QueryPlan | None]:
    """The speakers of ``rows`` (the first ``SPEAKER_POOL``) that the question names by a word
    of their name, and the question's plan without those words (``None`` when nothing is
    named, or when the name is all the question holds). Only words written with a capital
    count as names ("what did Mark say", not "what did we mark as done"), which also spares
    the read for most questions."""
    capitals = {w.casefold() for w in re.findall(r"[^\W_]+", plan.query) if w[0].isupper()}
    if not capitals.intersection(plan.terms):
        return [], None
    recs = store.get_messages([r["id"] for r in rows[:SPEAKER_POOL]])
    words: dict[str, set[str]] = {}
    for rec in recs.values():
        who = speaker_of(rec.raw)
        if who:
            for w in re.findall(r"[^\W_]+", who.casefold()):
                if len(w) > 1:
                    words.setdefault(w, set()).add(who)
    hit = [t for t in plan.terms if t in words and t in capitals]
    named = sorted({who for t in hit for who in words[t]})
    if not named:
        return [], None
    drop = re.compile(r"(?<!\w)(?:" + "|".join(re.escape(t) for t in hit) + r")(?:'s)?(?!\w)", re.I)
    narrowed = plan_query(drop.sub(" ", plan.query))
    return named, (narrowed if narrowed.terms and wants_context(narrowed) else None)


def rerank(store: SearchAPI, plan: QueryPlan, rows: list[dict[str, Any]], idf: dict[str, float], *,
           role: str | None = None, since: float | None = None, until: float | None = None,
           under_summary: int | None = None, speakers: Sequence[str] = (),
           more: Callable[[float, float], list[dict[str, Any]]] | None = None) -> list[dict[str, Any]]:
    """``rows`` (message candidates with ``text`` and ``score``) re-scored with their context,
    best first, joined by neighbouring turns of the best ones. ``more(since, until)`` returns
    extra candidates inside a time window (used for the days a question names); ``speakers`` are
    the speakers the question names (:func:`named_speakers`): one of them is raised."""
    days = named_days(plan.query)
    have = {r["id"] for r in rows}
    if more is not None:
        for lo, hi in days:
            lo, hi = max(lo, since) if since is not None else lo, min(hi, until) if until is not None else hi
            if lo < hi:
                for r in more(lo, hi):
                    if r["id"] not in have:
                        have.add(r["id"])
                        r["score"] = score_hit(plan, r["text"], idf, AVG_CHARS)
                        rows.append(r)
    if not rows:
        return rows
    rows.sort(key=lambda r: (-r["score"], -r["id"]))
    seeds = rows[:SEEDS]
    recs = store.get_messages([r["id"] for r in (rows if len(speakers) == 1 else seeds)])
    # every turn within WINDOW of a seed (overlapping windows merged), all sessions in one read
    spans: dict[str, list[list[int]]] = {}
    for r in seeds:
        rec = recs.get(r["id"])
        if rec is None:
            continue
        runs = spans.setdefault(rec.session_id, [])
        runs.append([rec.seq - WINDOW, rec.seq + WINDOW])
    own: dict[tuple[str, int], float] = {}
    info: dict[tuple[str, int], Any] = {}
    wanted: list[tuple[str, int, int]] = []
    for sid, runs in spans.items():
        runs.sort()
        merged: list[list[int]] = []
        for lo, hi in runs:
            if merged and lo <= merged[-1][1] + 1:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
        wanted += [(sid, lo, hi) for lo, hi in merged]
    for rec in store.messages_in(wanted):  # every session's windows in one read
        key = (rec.session_id, rec.seq)
        info[key] = rec
        own[key] = score_hit(plan, rec.text, idf, AVG_CHARS)
    by_id = {rec.id: key for key, rec in info.items()}
    for r in rows:
        rec = recs.get(r["id"])
        if rec is not None:
            own[(rec.session_id, rec.seq)] = r["score"]
    # neighbours become candidates when the filters let them
    for key, rec in info.items():
        if rec.id in have or under_summary is not None or not admits(rec, role, since, until):
            continue
        have.add(rec.id)
        rows.append(message_row(rec, own[key]))
    leaf = _leaf_scores(store, plan, idf, [r["id"] for r in seeds])
    for r in rows:
        at = by_id.get(r["id"])
        ctx = 0.0
        if at is not None:
            sid, seq = at
            for d in range(1, WINDOW + 1):
                w = DECAY ** (d - 1)
                ctx = max(ctx, w * own.get((sid, seq - d), 0.0), w * own.get((sid, seq + d), 0.0))
        score = r["score"] + W_NEIGHBOUR * ctx + W_SUMMARY * leaf.get(r["id"], 0.0)
        t = r.get("created_at") or 0.0
        if days and any(lo <= t < hi for lo, hi in days):
            score *= 1.0 + TIME_BOOST
        if len(speakers) == 1:
            rec = recs.get(r["id"]) or (info.get(key) if key is not None else None)
            if rec is not None and speaker_of(rec.raw) == speakers[0]:
                score *= 1.0 + SPEAKER_BOOST
        r["score"] = score
    rows.sort(key=lambda r: (-r["score"], -(r.get("created_at") or 0), -r["id"]))
    return rows


def admits(rec: Any, role: str | None, since: float | None, until: float | None) -> bool:
    """Whether a message found by other means than the search (a neighbour, a vector) passes
    the search's role and time filters."""
    return not ((role and rec.role != role) or (since is not None and rec.created_at < since)
                or (until is not None and rec.created_at > until))


def message_row(rec: Any, score: float) -> dict[str, Any]:
    """A candidate row, as the store's searches return them, for a message record."""
    return {"id": rec.id, "session_id": rec.session_id, "role": rec.role, "created_at": rec.created_at,
            "text": rec.text, "rank": 0.0, "score": score, "kind": "m"}


def _leaf_scores(store: SearchAPI, plan: QueryPlan, idf: dict[str, float], ids: Sequence[int]) -> dict[int, float]:
    """Message id → the score of the leaf summary covering it (0 when not yet summarised),
    normalised so a summary's length does not outweigh the message's own score."""
    covering = {mid: leaves[0] for mid, leaves in store.message_summaries_many(ids).items() if leaves}
    if not covering:
        return {}
    texts = store.get_summaries(sorted(set(covering.values())))
    raw = {sid: score_hit(plan, rec.text, idf, max(AVG_CHARS, float(len(rec.text or ""))))
           for sid, rec in texts.items()}
    return {mid: raw.get(sid, 0.0) for mid, sid in covering.items()}
