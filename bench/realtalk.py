"""Recall on REALTALK: do ``lcm_grep`` hits hold the turns that answer a plain-language question?

REALTALK (github.com/danny911kr/REALTALK, ``data/Chat_*.json``) holds ten real two-person chats
(about 9,000 turns) and 726 questions, each with the ids of the turns that answer it. It has no
licence, so it is never part of this repository: pass the directory holding the
``Chat_*.json`` files (``python -m bench --only realtalk --data DIR`` or ``LCM_REALTALK=DIR``);
without it the part reports that it was skipped.

Protocol:

* every chat is one Hermes session, driven through our engine by ``bench.host.HostDriver``
  (the calls hermes-agent 0.19.0 makes, a 64K window, the extractive summariser): the first
  speaker is the user, the second the assistant, each message carries its time from
  ``date_time`` and its speaker in OpenAI's ``name`` field (how a chat of named people reaches
  a model; Hermes' gateway writes ``[Name]`` before each user message of a shared session
  instead — both are read by ``messages.speaker_of``). A second store is fed the same chats
  without names ("roles only": the protocol before speaker ranking);
* each question is asked with ``lcm_grep(query=question, scope="messages", limit=k)`` from an
  engine bound to that chat's session, k = 5, 10, 25; recall@k = the share of a question's
  evidence turns among those k message hits, averaged over the questions;
* the baseline is a plain SQLite FTS5 index per chat (same tokenizer as the store) queried
  with the OR of the question's terms, ordered by ``bm25()``;
* figures per category (the data's own numbers: 1 multi-hop, 2 temporal, 3 commonsense), for
  all chats and for the halves chats 1-5 ("dev": where any parameter was chosen) and 6-10
  ("test": never looked at while choosing).
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Sequence

from . import common

KS = (5, 10, 25)
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "commonsense"}
DEV_CHATS = range(1, 6)  # parameters may be chosen on these; 6-10 are held out


@dataclass
class Turn:
    dia_id: str
    speaker: str
    text: str
    ts: float


@dataclass
class Question:
    question: str
    evidence: list[str]
    category: int


@dataclass
class Chat:
    number: int
    name: str
    speakers: tuple[str, str]
    turns: list[Turn] = field(default_factory=list)
    questions: list[Question] = field(default_factory=list)


def _ts(value: str) -> float:
    """``29.12.2023, 22:42:04`` as a UTC epoch (the data names no time zone)."""
    try:
        return datetime.strptime(value.strip(), "%d.%m.%Y, %H:%M:%S").replace(tzinfo=timezone.utc).timestamp()
    except (ValueError, AttributeError):
        return 0.0


def load(path: str | Path) -> list[Chat]:
    """The chats in ``path`` (its ``Chat_<n>_*.json`` files), in chat-number order."""
    chats: list[Chat] = []
    for f in Path(path).glob("Chat_*.json"):
        m = re.match(r"Chat_(\d+)_(.*)\.json$", f.name)
        if not m:
            continue
        d = json.loads(f.read_text(encoding="utf-8"))
        names = d.get("name") or {}
        chat = Chat(int(m.group(1)), m.group(2), (str(names.get("speaker_1", "")), str(names.get("speaker_2", ""))))
        keys = sorted((k for k in d if re.fullmatch(r"session_\d+", k)), key=lambda k: int(k.split("_")[1]))
        last = 0.0
        for k in keys:
            for t in d[k]:
                text = (t.get("clean_text") or "").strip()
                if not text:
                    continue
                ts = _ts(t.get("date_time", "")) or last
                last = ts
                chat.turns.append(Turn(str(t.get("dia_id")), str(t.get("speaker", "")), text, ts))
        for q in d.get("qa") or []:
            if q.get("question") and q.get("evidence"):
                chat.questions.append(Question(q["question"], [str(e) for e in q["evidence"]], int(q.get("category") or 0)))
        chats.append(chat)
    return sorted(chats, key=lambda c: c.number)


def to_messages(chat: Chat, names: bool = True) -> list[dict[str, Any]]:
    """The chat as the host's message list: first speaker user, the other assistant; with
    ``names`` each message also carries its speaker in OpenAI's ``name`` field."""
    first = chat.turns[0].speaker.casefold() if chat.turns else ""
    return [{"role": "user" if t.speaker.casefold() == first else "assistant", "content": t.text,
             "timestamp": t.ts, **({"name": t.speaker} if names else {})} for t in chat.turns]


def session_id(chat: Chat) -> str:
    return f"realtalk-{chat.number}"


# -- ingest ----------------------------------------------------------------------------

def ingest(store: str, chats: Sequence[Chat], *, context_length: int, names: bool = True) -> dict[str, Any]:
    """Drive every chat through the engine as one session; returns timings and store stats."""
    from .host import HostDriver

    t0 = time.perf_counter()
    passes = 0
    for chat in chats:
        eng = common.make_engine(store, context_length=context_length)
        drv = HostDriver(eng, session_id=session_id(chat), context_length=context_length)
        drv.start()
        drv.feed(to_messages(chat, names))
        drv.end()
        passes += sum(1 for p in drv.passes if p.adopted)
        eng.store.wait_indexed()
    seconds = time.perf_counter() - t0
    n = sum(len(c.turns) for c in chats)
    return {"messages": n, "seconds": round(seconds, 2), "msgs_per_s": round(n / seconds, 1) if seconds else None,
            "adopted_passes": passes}


def id_map(store: Any, chat: Chat) -> dict[int, str]:
    """Stored message id → dia_id, matching the session's stored messages to the turns in order
    (content and time), so a message the engine added itself is skipped, not misaligned."""
    rows = []
    after = -1
    while True:
        batch = store.session_messages(session_id(chat), after_seq=after, limit=1000)
        if not batch:
            break
        rows.extend(batch)
        after = batch[-1].seq
    out: dict[int, str] = {}
    i = 0
    for r in rows:
        raw = r.raw if isinstance(r.raw, dict) else {}
        while i < len(chat.turns) and chat.turns[i].text != raw.get("content"):
            i += 1
        if i >= len(chat.turns):
            break
        out[r.id] = chat.turns[i].dia_id
        i += 1
    return out


# -- retrieval arms ----------------------------------------------------------------------

def grep_arm(store_path: str, chat: Chat, *, context_length: int, **overrides: Any) -> Callable[[str, int], list[str]]:
    """``lcm_grep`` from an engine bound to the chat's session: question, k → dia_ids in hit order
    (``overrides``: configuration, e.g. ``semantic=True``)."""
    eng = common.make_engine(store_path, context_length=context_length, **overrides)
    eng.bind_session_state(session_db=None, session_id=session_id(chat))
    eng.on_session_start(session_id(chat), platform="cli")
    ids = id_map(eng.store, chat)

    def ask(question: str, k: int) -> list[str]:
        res = json.loads(eng.handle_tool_call("lcm_grep", {"query": question, "scope": "messages", "limit": k}))
        hits = [h["id"] for g in res.get("groups", []) for h in g["hits"] if h["kind"] == "message"]
        return [ids[int(h[1:])] for h in hits if int(h[1:]) in ids][:k]

    return ask


def fts5_arm(chat: Chat) -> Callable[[str, int], list[str]]:
    """A plain FTS5 index of the chat's turns, queried with the OR of the question's terms."""
    from lossless_context.search.query import plan_query

    db = sqlite3.connect(":memory:")
    db.execute("CREATE VIRTUAL TABLE t USING fts5(text, tokenize='porter unicode61 remove_diacritics 2')")
    db.executemany("INSERT INTO t(rowid, text) VALUES (?, ?)", [(i, t.text) for i, t in enumerate(chat.turns)])

    def ask(question: str, k: int) -> list[str]:
        plan = plan_query(question)
        if not plan.fts_match:
            return []
        rows = db.execute("SELECT rowid FROM t WHERE t MATCH ? ORDER BY bm25(t) LIMIT ?", (plan.fts_match, k))
        return [chat.turns[r[0]].dia_id for r in rows]

    return ask


# -- scoring -------------------------------------------------------------------------------

def evaluate(chats: Sequence[Chat], arm_for: Callable[[Chat], Callable[[str, int], list[str]]]) -> dict[str, Any]:
    """Per question and k: the share of its evidence among the first k hits; then means per
    category and per half (dev = chats 1-5, test = 6-10)."""
    per: list[dict[str, Any]] = []
    t_ask: list[float] = []
    for chat in chats:
        ask = arm_for(chat)
        for q in chat.questions:
            gold = set(q.evidence)
            row: dict[str, Any] = {"chat": chat.number, "category": q.category}
            for k in KS:
                t0 = time.perf_counter()
                got = set(ask(q.question, k))
                t_ask.append((time.perf_counter() - t0) * 1000)
                row[k] = len(gold & got) / len(gold)
            per.append(row)
    return {"table": table(per), "ask_ms": common.dist(t_ask, 2), "questions": len(per), "per_question": per}


def table(per: Sequence[dict[str, Any]]) -> dict[str, Any]:
    def agg(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
        if not rows:
            return {"n": 0}
        return {"n": len(rows), **{f"R@{k}": round(100 * sum(r[k] for r in rows) / len(rows), 1) for k in KS}}

    out: dict[str, Any] = {}
    for half, pick in (("all", lambda r: True), ("dev 1-5", lambda r: r["chat"] in DEV_CHATS),
                       ("test 6-10", lambda r: r["chat"] not in DEV_CHATS)):
        rows = [r for r in per if pick(r)]
        out[half] = {"all": agg(rows), **{CATEGORIES.get(c, str(c)): agg([r for r in rows if r["category"] == c])
                                          for c in sorted({r["category"] for r in per})}}
    return out


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    data = cfg.get("data") or os.environ.get("LCM_REALTALK")
    if not data or not any(Path(data).glob("Chat_*.json")):
        return {"skipped": "no REALTALK data: pass --data DIR (the Chat_*.json files of danny911kr/REALTALK)"}
    chats = load(data)
    context_length = int(cfg.get("realtalk_context", 64_000))
    store = str(Path(os.environ.get("LCM_BENCH_SCRATCH", "/tmp")) / f"realtalk-{os.getpid()}.db")
    for suffix in ("", "-wal", "-shm"):
        Path(store + suffix).unlink(missing_ok=True)
    ing = ingest(store, chats, context_length=context_length)
    roles_store = store[:-3] + "-roles.db"
    for suffix in ("", "-wal", "-shm"):
        Path(roles_store + suffix).unlink(missing_ok=True)
    ingest(roles_store, chats, context_length=context_length, names=False)
    st = common.make_engine(store, context_length=context_length).store
    ing["summaries"] = st.max_row_id("summaries")
    ing["store_bytes"] = common.store_bytes(store)
    from .recall_demo import previous_ranking

    grep = evaluate(chats, lambda c: grep_arm(store, c, context_length=context_length))
    roles = evaluate(chats, lambda c: grep_arm(roles_store, c, context_length=context_length))
    with previous_ranking():  # the same store, the ranking before context ranking (same-run baseline)
        before = evaluate(chats, lambda c: grep_arm(store, c, context_length=context_length))
    fts = evaluate(chats, fts5_arm)
    for r in (grep, roles, before, fts):
        r.pop("per_question", None)
    out = {"context_length": context_length, "chats": len(chats), "ingest": ing,
           "lcm_grep": grep, "lcm_grep_roles": roles, "lcm_grep_previous": before, "fts5_or": fts}
    out["lcm_grep_semantic"] = _semantic(store, chats, context_length)
    return out


def _semantic(store: str, chats: Sequence[Chat], context_length: int) -> dict[str, Any]:
    """The same store with the optional semantic arm on (the `semantic` extra): its vectors
    embedded first (timed: what the background thread costs per message), then asked."""
    from lossless_context.retrieval.semantic import SemanticUnavailable

    eng = common.make_engine(store, context_length=context_length, semantic=True)
    try:
        arm = eng.semantic_arm()
    except SemanticUnavailable as exc:  # pragma: no cover - the engine logs and returns None
        return {"skipped": str(exc)}
    if arm is None:
        return {"skipped": "the semantic extra is not installed (pip install 'lossless-context[semantic]')"}
    arm.close()  # embedded here, timed, rather than by its thread
    t0 = time.perf_counter()
    kept = arm.catch_up()
    embed_ms = (time.perf_counter() - t0) * 1000 / max(1, kept)
    res = evaluate(chats, lambda c: grep_arm(store, c, context_length=context_length, semantic=True))
    res.pop("per_question", None)
    res["embed_ms_per_message"] = round(embed_ms, 2)
    res["model"] = arm.model
    return res
