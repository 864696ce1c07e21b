"""`lcm import hermes`: backfill the store from the host's own session database.

Holds the read-only reader of `$HERMES_HOME/state.db` (opened with `mode=ro`; the host's
file is never written) and the backfill itself. Each stored row becomes the OpenAI
message dict the host would hand the engine after resuming that session
(`SessionDB.get_messages_as_conversation`): `role`, `content` (JSON-encoded multimodal
content decoded; user/assistant text cleaned of injected memory-context blocks and
stripped, as the host does), `tool_calls`, `tool_call_id`, `tool_name`, `timestamp`, and
the assistant reasoning fields. Matching the host's resume view means a session resumed
later with the lcm engine aligns with what was imported instead of being stored twice.

A session the store already holds, or whose live transcript holds our summary block (the
lcm engine compacted it), is imported from its *active* transcript only — what the host would
resume: the engine aligns it with the rows and summaries already stored, so only turns never
handed over are added. The rows the host archived at each of our compactions (`active = 0,
compacted = 1`) and the head and tail it re-persisted are copies of what the store holds
(0.19.0 keeps them; importing them stored every turn two or three times, and the session's
active context grew past the window).

For any other session, history that the built-in compressor archived (`active = 0,
compacted = 1`) is imported too — it is exactly what lossless context exists to keep. The compressor's own summary
messages are skipped (the summary DAG replaces them), and so are the protected head and
tail messages it re-inserted as copies after each compaction. Rewound rows (`active = 0,
compacted = 0`, "the user took it back") are not part of the conversation and are skipped.

Messages go in through `engine.ingest(messages, session_id=...)`, which aligns them with
what the store already holds: importing twice adds nothing. Parents are imported before
children and `parent_session_id` becomes the session's parent (lineage).
"""

from __future__ import annotations

import json
import re
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable
from urllib.parse import quote

from ..messages import content_ident, summary_node_ids

_CONTENT_JSON_PREFIX = "\x00json:"
COMPRESSOR_PREFIXES = ("[CONTEXT COMPACTION", "[CONTEXT SUMMARY]:")
MAX_COPY_RUN = 400  # longest run of re-inserted tail messages looked for after a summary
MAX_HEAD_COPIES = 12

# The host's sanitize_context (agent.memory_manager), used when the host is not installed.
_FENCE_TAG_RE = re.compile(r"</?\s*memory-context\s*>", re.IGNORECASE)
_INTERNAL_CONTEXT_RE = re.compile(r"<\s*memory-context\s*>[\s\S]*?</\s*memory-context\s*>", re.IGNORECASE)
_INTERNAL_NOTE_RE = re.compile(
    r"\[System note:\s*The following is recalled memory context,\s*NOT new user input\.\s*Treat as "
    r"(?:informational background data|authoritative reference data[^\]]*)\.\]\s*",
    re.IGNORECASE,
)


class HermesImportError(RuntimeError):
    """A user-facing problem: no database, unreadable database, unknown session."""


def _sanitize_context(text: str) -> str:
    from ..hostapi import memory_sanitizer

    sanitize = memory_sanitizer()
    try:
        if sanitize is None:
            raise LookupError("no host")
        return sanitize(text)
    except Exception:
        text = _INTERNAL_CONTEXT_RE.sub("", text)
        text = _INTERNAL_NOTE_RE.sub("", text)
        return _FENCE_TAG_RE.sub("", text)


@dataclass
class SessionImport:
    session_id: str
    parent_id: str | None
    rows: int
    messages: int  # messages handed to the engine
    added: int  # messages newly stored
    skipped_summaries: int = 0
    skipped_copies: int = 0
    skipped_rewound: int = 0
    skipped_archived: int = 0  # rows the host archived at our compactions (the store holds them)


@dataclass
class HermesImportReport:
    db_path: str
    sessions: list[SessionImport] = field(default_factory=list)

    @property
    def added(self) -> int:
        return sum(s.added for s in self.sessions)


def state_db_path(hermes_home: Path) -> Path:
    return Path(hermes_home).expanduser() / "state.db"


def open_readonly(path: Path) -> sqlite3.Connection:
    if not path.is_file():
        raise HermesImportError(f"no Hermes session database at {path}")
    try:
        conn = sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode=ro", uri=True, timeout=10)
        conn.row_factory = sqlite3.Row
        conn.execute("SELECT 1 FROM sessions LIMIT 1").fetchall()
        conn.execute("SELECT 1 FROM messages LIMIT 1").fetchall()
    except sqlite3.Error as exc:
        raise HermesImportError(f"cannot read {path}: {exc}") from exc
    return conn


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}


def list_hermes_sessions(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    cols = _columns(conn, "sessions")
    want = [c for c in ("id", "source", "model", "parent_session_id", "started_at", "title") if c in cols]
    order = "started_at, id" if "started_at" in cols else "id"
    return [dict(r) for r in conn.execute(f"SELECT {', '.join(want)} FROM sessions ORDER BY {order}")]


def _decode_content(content: Any) -> Any:
    if isinstance(content, str) and content.startswith(_CONTENT_JSON_PREFIX):
        try:
            return json.loads(content[len(_CONTENT_JSON_PREFIX):])
        except ValueError:
            return content
    return content


def _json_field(v: Any) -> Any:
    if v is None or v == "":
        return None
    try:
        return json.loads(v)
    except (TypeError, ValueError):
        return None


def row_to_message(row: dict[str, Any]) -> dict[str, Any]:
    """One `messages` row as the host's resumed conversation holds it."""
    role = row.get("role")
    content = _decode_content(row.get("content"))
    if role in ("user", "assistant") and isinstance(content, str):
        content = _sanitize_context(content).strip()
    msg: dict[str, Any] = {"role": role, "content": content}
    if row.get("api_content"):
        msg["api_content"] = row["api_content"]
    if row.get("timestamp"):
        msg["timestamp"] = row["timestamp"]
    if row.get("tool_call_id"):
        msg["tool_call_id"] = row["tool_call_id"]
    if row.get("tool_name"):
        msg["tool_name"] = row["tool_name"]
    if row.get("effect_disposition"):
        msg["effect_disposition"] = row["effect_disposition"]
    if row.get("tool_calls"):
        tcs = _json_field(row["tool_calls"])
        msg["tool_calls"] = tcs if isinstance(tcs, list) else []
    if row.get("platform_message_id"):
        msg["message_id"] = row["platform_message_id"]
    if row.get("observed"):
        msg["observed"] = True
    if role == "assistant":
        if row.get("finish_reason"):
            msg["finish_reason"] = row["finish_reason"]
        if row.get("reasoning"):
            msg["reasoning"] = row["reasoning"]
        if row.get("reasoning_content") is not None:
            msg["reasoning_content"] = row["reasoning_content"]
        for k in ("reasoning_details", "codex_reasoning_items", "codex_message_items"):
            if row.get(k):
                msg[k] = _json_field(row[k])
    return msg


def is_compressor_summary(msg: dict[str, Any]) -> bool:
    c = msg.get("content")
    return isinstance(c, str) and c.lstrip().startswith(COMPRESSOR_PREFIXES)


def _session_rows(conn: sqlite3.Connection, session_id: str) -> list[dict[str, Any]]:
    cols = _columns(conn, "messages")
    where = "session_id = ?"
    if "active" in cols and "compacted" in cols:
        sel = "*, active AS _active, compacted AS _compacted"
    elif "active" in cols:
        sel = "*, active AS _active, 0 AS _compacted"
    else:
        sel = "*, 1 AS _active, 0 AS _compacted"
    return [dict(r) for r in conn.execute(f"SELECT {sel} FROM messages WHERE {where} ORDER BY id", (session_id,))]


def reconstruct(rows: list[dict[str, Any]], before: list[str]) -> tuple[list[dict[str, Any]], SessionImport]:
    """The session's own messages in order, compressor summaries and re-inserted copies removed.

    `before` holds the identities of the parent lineage's messages: a child session made by
    a rotating compaction starts with copies of its parent's head and tail."""
    info = SessionImport("", None, len(rows), 0, 0)
    msgs: list[dict[str, Any]] = []
    idents: list[str] = []

    def history() -> list[str]:
        return before + idents

    i = 0
    while i < len(rows):
        r = rows[i]
        if not r.get("_active") and not r.get("_compacted"):
            info.skipped_rewound += 1
            i += 1
            continue
        m = row_to_message(r)
        if is_compressor_summary(m):
            info.skipped_summaries += 1
            # Head copies: the messages just before the summary that repeat the history's start.
            h = history()
            for k in range(min(MAX_HEAD_COPIES, len(idents)), 0, -1):
                if len(h) >= 2 * k and idents[-k:] == h[:k]:
                    del idents[-k:]
                    del msgs[-k:]
                    info.skipped_copies += k
                    break
            # Tail copies: the run right after the summary that repeats the history's end.
            h = history()
            nxt: list[str] = []
            j = i + 1
            while j < len(rows) and len(nxt) < MAX_COPY_RUN:
                rj = rows[j]
                if not rj.get("_active") and not rj.get("_compacted"):
                    break
                nxt.append(content_ident(row_to_message(rj)))
                j += 1
            best = 0
            for t in range(min(len(nxt), len(h)), 0, -1):
                if nxt[:t] == h[len(h) - t:]:
                    best = t
                    break
            i += 1 + best
            info.skipped_copies += best
            continue
        msgs.append(m)
        idents.append(content_ident(m))
        i += 1
    info.messages = len(msgs)
    return msgs, info


def _ancestors(by_id: dict[str, dict[str, Any]], sid: str) -> list[str]:
    out, seen = [], set()
    cur = by_id.get(sid, {}).get("parent_session_id")
    while cur and cur not in seen and cur in by_id:
        seen.add(cur)
        out.append(cur)
        cur = by_id[cur].get("parent_session_id")
    return out


def _parents_first(ids: list[str], by_id: dict[str, dict[str, Any]]) -> list[str]:
    want, out, done = set(ids), [], set()

    def visit(s: str, depth: int = 0) -> None:
        if s in done or depth > 256:
            return
        p = by_id.get(s, {}).get("parent_session_id")
        if p and p in want:
            visit(p, depth + 1)
        done.add(s)
        out.append(s)

    for s in ids:
        visit(s)
    return out


def import_hermes(engine: Any, hermes_home: Path, session_ids: list[str] | None = None,
                  progress: Callable[[str, int, int], None] | None = None) -> HermesImportReport:
    """Backfill `session_ids` (with their ancestors), or every session when None."""
    path = state_db_path(hermes_home)
    conn = open_readonly(path)
    try:
        sessions = list_hermes_sessions(conn)
        by_id = {s["id"]: s for s in sessions}
        if session_ids is None:
            chosen = [s["id"] for s in sessions]
        else:
            chosen = []
            for sid in session_ids:
                if sid not in by_id:
                    raise HermesImportError(f"no session {sid!r} in {path}")
                for x in reversed(_ancestors(by_id, sid)):
                    if x not in chosen:
                        chosen.append(x)
                if sid not in chosen:
                    chosen.append(sid)
        order = _parents_first(chosen, by_id)
        report = HermesImportReport(str(path))
        lineage_idents: dict[str, list[str]] = {}
        store = engine.store
        for n, sid in enumerate(order):
            meta = by_id[sid]
            parent = meta.get("parent_session_id") or None
            rows = _session_rows(conn, sid)
            before = lineage_idents.get(parent, []) if parent else []
            if parent and parent not in lineage_idents and parent in by_id:
                pmsgs, _ = reconstruct(_session_rows(conn, parent), [])
                before = [content_ident(m) for m in pmsgs]
            active = [r for r in rows if r.get("_active")]
            live = [row_to_message(r) for r in active]
            if _ours(store, sid, live):
                # the host's active transcript: our summary block stands for what it archived
                msgs = [m for m in live if not is_compressor_summary(m)]
                info = SessionImport(sid, parent, len(rows), len(msgs), 0,
                                     skipped_summaries=len(live) - len(msgs),
                                     skipped_archived=len(rows) - len(active))
            else:
                msgs, info = reconstruct(rows, before)
            info.session_id, info.parent_id = sid, parent
            lineage_idents[sid] = before + [content_ident(m) for m in msgs]
            store.ensure_session(sid, parent_id=parent, platform=meta.get("source") or None,
                                 model=meta.get("model") or None)
            info.added = _ingest(engine, store, sid, msgs)
            report.sessions.append(info)
            if progress is not None:
                progress(sid, n + 1, len(order))
        return report
    finally:
        conn.close()


def _ours(store: Any, sid: str, live: list[dict[str, Any]]) -> bool:
    """Whether the session's active transcript is to be aligned with what the store holds:
    the store knows the session's messages, or the transcript carries our summary block."""
    if any(summary_node_ids(m) for m in live):
        return True
    return store.get_session(sid) is not None and store.stats(sid)["messages"] > 0


def _ingest(engine: Any, store: Any, sid: str, msgs: list[dict[str, Any]]) -> int:
    if not msgs:
        return 0
    stored = store.stats(sid)["messages"]
    # Already imported in full (the common re-run): leave the session — and the active
    # context the engine may have compacted since — untouched.
    if stored >= len(msgs):
        have = [m.ident for m in store.session_messages(sid, -1, len(msgs))]
        if have == [content_ident(m) for m in msgs]:
            return 0
    engine.ingest(msgs, session_id=sid)
    return store.stats(sid)["messages"] - stored


def print_report(console: Any, rep: HermesImportReport) -> None:
    """The report as a rich table (used by `lcm import hermes`)."""
    from rich.table import Table

    t = Table(title=f"imported from {rep.db_path}", title_justify="left")
    for col in ("session", "parent", "rows", "messages", "added", "skipped"):
        t.add_column(col, overflow="fold", justify="right" if col in ("rows", "messages", "added") else "left")
    for s in rep.sessions:
        skipped = []
        if s.skipped_summaries:
            skipped.append(f"{s.skipped_summaries} compressor summaries")
        if s.skipped_copies:
            skipped.append(f"{s.skipped_copies} re-inserted copies")
        if s.skipped_rewound:
            skipped.append(f"{s.skipped_rewound} rewound")
        if s.skipped_archived:
            skipped.append(f"{s.skipped_archived} archived (already stored)")
        t.add_row(s.session_id, s.parent_id or "-", str(s.rows), str(s.messages), str(s.added),
                  ", ".join(skipped) or "-")
    console.print(t)
    console.print(f"{len(rep.sessions)} sessions, {rep.added} messages added"
                  + (" (nothing new)" if not rep.added else ""))


# --------------------------------------------------------------------------- entry point
