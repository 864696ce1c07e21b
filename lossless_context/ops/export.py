"""`lcm export` / `lcm import jsonl`: the whole store or one lineage as versioned JSONL.

Format ``lossless-context`` version 2 — one JSON object per line, UTF-8, ASCII-escaped
(version 1, read too, had no ``retracted``: an older lcm refuses a version-2 file rather than
make what the user undid searchable again):

1. Header (always the first line)::

     {"format": "lossless-context", "version": 1, "exported_at": "<ISO time>",
      "source": "<store location>", "scope": "all" | {"session": "<id>"},
      "counts": {"sessions": n, "messages": n, "summaries": n, "contexts": n}}

   Only the header carries volatile values (export time, source path): two exports of
   the same data are identical from line 2 on.

2. ``{"type": "session", "id", "parent_id", "conversation_id", "platform", "model",
   "created_at", "updated_at", "compactions", "last_compaction_at", "boundary_reason"}``
   — parents before children.

3. ``{"type": "message", "id", "session_id", "seq", "uid", "ident", "role", "tokens",
   "created_at", "large", "exploration", "supersedes", "absorbed": [uid, ...],
   "aliases": [ident, ...], "retracted": true (only when), "text", "raw"}`` — by id.
   ``retracted``: the host rolled the message back (undo, retry): kept, hidden from search,
   and hidden again in the store it is imported into. ``aliases`` are other identities the
   host has shown this message under (e.g. after repairing it); alignment uses them. ``raw`` is the message exactly as the host gave it (the stored JSON,
   parsed); a stored value that is not JSON is written as ``"raw_text"`` instead.

4. ``{"type": "summary", "id", "session_id", "kind": "leaf"|"condensed", "depth", "tokens",
   "source_tokens", "level", "summarizer", "t_start", "t_end", "n_messages",
   "created_at", "messages": [message ids, in order], "children": [summary ids, in
   order], "text"}`` — published summaries only (staged work is never exported), by id;
   the edges of the DAG are the ``messages`` / ``children`` lists.

5. ``{"type": "context", "session_id", "items": [["m", id] | ["s", id], ...]}`` — each
   session's active context, in order.

Not exported: staged (uncommitted) passes and the pre-summary cache — both are rebuilt by
the engine as needed.

Ids are the store's own ids (summary texts cite them as [m123] / [s12]). Import keeps an
id when it is free in the target store (always, for an empty store: export → import →
export gives the same lines), otherwise gives a new id and rewrites the [mN]/[sN]
citations of the imported summaries. Import is idempotent: a message already present
(same session, seq and identity), a summary already present (same session, kind, depth
and sources) or a session already present is reused, never duplicated; a session's active
context is only written when that session had none. One import is one transaction.

Also holds `StoreSQL`, the whole-table listings (over the store's portable SQL reads,
`Store.query_rows`) that the exporter and the HTML viewer share.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import IO, Any, Callable, Iterable, Iterator, Sequence

from ..messages import safe_json
from ..store.base import Execute, Store

FORMAT = "lossless-context"
VERSION = 2
_CITE_RE = re.compile(r"\[([ms])(\d+)\]")


class ExportError(RuntimeError):
    """A user-facing problem with an export file (unreadable, wrong format, bad record)."""


# --------------------------------------------------------------------------- backend access


class StoreSQL:
    """Whole-table listings over the store's portable SQL reads (`Store.query_rows`):
    statements use `?` placeholders."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        return self.store.query_rows(sql, params)

    def in_list(self, ids: Sequence[Any]) -> str:
        return ",".join("?" * len(ids))

    # -- whole-table listings shared with the viewer ----------------------------------

    def sessions(self, only: Sequence[str] | None = None) -> list[dict[str, Any]]:
        keys = ("id", "parent_id", "conversation_id", "platform", "model", "created_at", "updated_at",
                "compactions", "last_compaction_at", "boundary_reason")
        sql = f"SELECT {', '.join(keys)} FROM sessions"
        rows = self.rows(sql)
        out = [dict(zip(keys, r)) for r in rows]
        if only is not None:
            keep = set(only)
            out = [s for s in out if s["id"] in keep]
        return _parents_first(out)

    def summaries(self, session_ids: Sequence[str] | None) -> list[dict[str, Any]]:
        keys = ("id", "session_id", "kind", "depth", "tokens", "source_tokens", "level", "summarizer",
                "t_start", "t_end", "n_messages", "created_at", "text")
        where, params = "state='published'", []
        if session_ids is not None:
            if not session_ids:
                return []
            where += f" AND session_id IN ({self.in_list(session_ids)})"
            params = list(session_ids)
        rows = self.rows(f"SELECT {', '.join(keys)} FROM summaries WHERE {where} ORDER BY id", params)
        out = [dict(zip(keys, r)) for r in rows]
        if not out:
            return out
        by_id = {s["id"]: s for s in out}
        for s in out:
            s["messages"], s["children"] = [], []
        for sid, mid in self.rows(
            "SELECT sm.summary_id, sm.message_id FROM summary_messages sm JOIN summaries s ON s.id = sm.summary_id"
            " WHERE s.state='published' ORDER BY sm.summary_id, sm.ord"
        ):
            if sid in by_id:
                by_id[sid]["messages"].append(mid)
        for pid, cid in self.rows(
            "SELECT sp.parent_id, sp.child_id FROM summary_parents sp JOIN summaries s ON s.id = sp.parent_id"
            " WHERE s.state='published' ORDER BY sp.parent_id, sp.ord"
        ):
            if pid in by_id:
                by_id[pid]["children"].append(cid)
        return out

    def contexts(self, session_ids: Sequence[str]) -> dict[str, list[list[Any]]]:
        out: dict[str, list[list[Any]]] = {s: [] for s in session_ids}
        if not session_ids:
            return out
        for sess, mid, sid in self.rows(
            f"SELECT session_id, message_id, summary_id FROM context_items WHERE session_id IN"
            f" ({self.in_list(session_ids)}) ORDER BY session_id, pos", list(session_ids)
        ):
            out[sess].append(["m", mid] if mid is not None else ["s", sid])
        return out

    def message_rows(self, session_ids: Sequence[str] | None, batch: int = 2000) -> Iterator[tuple]:
        """(id, session_id, seq, uid, ident, role, tokens, created_at, large, exploration,
        supersedes, text, raw) by id, in batches."""
        cols = ("id, session_id, seq, uid, ident, role, tokens, created_at, large, exploration,"
                " supersedes, text, raw")
        last = 0
        extra, params = "", []
        if session_ids is not None:
            if not session_ids:
                return
            extra = f" AND session_id IN ({self.in_list(session_ids)})"
            params = list(session_ids)
        while True:
            rows = self.rows(f"SELECT {cols} FROM messages WHERE id > ?{extra} ORDER BY id LIMIT ?",
                             [last, *params, batch])
            if not rows:
                return
            yield from rows
            last = rows[-1][0]

    def absorbed(self) -> dict[int, list[str]]:
        out: dict[int, list[str]] = {}
        for mid, uid in self.rows("SELECT message_id, uid FROM message_absorbed ORDER BY message_id, uid"):
            out.setdefault(mid, []).append(uid)
        return out

    def retracted(self) -> set[int]:
        """Ids of the messages the host rolled back (hidden from search)."""
        return {r[0] for r in self.rows("SELECT message_id FROM message_retractions")}

    def aliases(self) -> dict[int, list[str]]:
        out: dict[int, list[str]] = {}
        try:
            rows = self.rows("SELECT message_id, ident FROM message_aliases ORDER BY message_id, ident")
        except Exception:  # a store from before migration 002 has no aliases
            return out
        for mid, ident in rows:
            out.setdefault(mid, []).append(ident)
        return out


def _parents_first(sessions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Order by (created_at, id), then move every parent before its children."""
    sessions = sorted(sessions, key=lambda s: (s["created_at"] or 0, s["id"]))
    by_id = {s["id"]: s for s in sessions}
    out: list[dict[str, Any]] = []
    done: set[str] = set()

    def visit(s: dict[str, Any], stack: set[str]) -> None:
        if s["id"] in done or s["id"] in stack:
            return
        p = by_id.get(s["parent_id"]) if s["parent_id"] else None
        if p is not None:
            visit(p, stack | {s["id"]})
        done.add(s["id"])
        out.append(s)

    for s in sessions:
        visit(s, set())
    return out


def lineage_sessions(store: Store, session_id: str) -> list[str]:
    """The session, its ancestors and its conversation, plus every session their DAG touches."""
    if store.get_session(session_id) is None:
        raise ExportError(f"unknown session {session_id!r}")
    db = StoreSQL(store)
    scope = list(dict.fromkeys(store.lineage(session_id)))
    for _ in range(16):  # closure: summaries may cover messages of another session
        q = db.in_list(scope)
        extra = {r[0] for r in db.rows(
            f"SELECT DISTINCT m.session_id FROM summary_messages sm JOIN summaries s ON s.id = sm.summary_id"
            f" JOIN messages m ON m.id = sm.message_id WHERE s.state='published' AND s.session_id IN ({q})",
            scope)}
        extra |= {r[0] for r in db.rows(
            f"SELECT DISTINCT s.session_id FROM context_items ci JOIN summaries s ON s.id = ci.summary_id"
            f" WHERE ci.session_id IN ({q})", scope)}
        extra |= {r[0] for r in db.rows(
            f"SELECT DISTINCT m.session_id FROM context_items ci JOIN messages m ON m.id = ci.message_id"
            f" WHERE ci.session_id IN ({q})", scope)}
        new = [s for s in sorted(extra) if s not in scope]
        if not new:
            break
        for s in new:
            scope.extend(x for x in store.lineage(s) if x not in scope)
    return scope


# --------------------------------------------------------------------------- export


def _dump(obj: dict[str, Any]) -> str:
    return json.dumps(obj, ensure_ascii=True, separators=(",", ":"), allow_nan=True)


def _raw_field(raw: Any) -> tuple[str, Any]:
    if isinstance(raw, str):
        try:
            val = json.loads(raw)
        except ValueError:
            return "raw_text", raw
        if safe_json(val) == raw:
            return "raw", val
        return "raw_text", raw
    return "raw", raw


def iter_export(store: Store, session_id: str | None = None) -> Iterator[str]:
    """The export's lines (without newlines), header first."""
    db = StoreSQL(store)
    scope = lineage_sessions(store, session_id) if session_id else None
    sessions = db.sessions(scope)
    sids = [s["id"] for s in sessions]
    summaries = db.summaries(sids if scope is not None else None)
    contexts = db.contexts(sids)
    published = {s["id"] for s in summaries}
    if scope is None:
        n_msgs = db.rows("SELECT COUNT(*) FROM messages")[0][0]
    else:
        n_msgs = db.rows(f"SELECT COUNT(*) FROM messages WHERE session_id IN ({db.in_list(sids)})", sids)[0][0]
    yield _dump({
        "format": FORMAT, "version": VERSION,
        "exported_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "source": store.location, "scope": "all" if session_id is None else {"session": session_id},
        "counts": {"sessions": len(sessions), "messages": int(n_msgs), "summaries": len(summaries),
                   "contexts": sum(1 for s in sids if contexts.get(s))},
    })
    for s in sessions:
        yield _dump({"type": "session", **s})
    absorbed = db.absorbed()
    aliases = db.aliases()
    retracted = db.retracted()
    for r in db.message_rows(scope):
        (mid, sess, seq, uid, ident, role, tokens, created_at, large, exploration, supersedes, text, raw) = r
        key, val = _raw_field(raw)
        yield _dump({
            "type": "message", "id": mid, "session_id": sess, "seq": seq, "uid": uid, "ident": ident,
            "role": role, "tokens": tokens, "created_at": created_at, "large": bool(large),
            "exploration": exploration, "supersedes": supersedes, "absorbed": absorbed.get(mid, []),
            "aliases": aliases.get(mid, []), **({"retracted": True} if mid in retracted else {}),
            "text": text, key: val,
        })
    for s in summaries:
        yield _dump({"type": "summary", **{k: s[k] for k in (
            "id", "session_id", "kind", "depth", "tokens", "source_tokens", "level", "summarizer", "t_start",
            "t_end", "n_messages", "created_at", "messages", "children", "text")}})
    for sess in sids:
        items = [it for it in contexts.get(sess, []) if it[0] == "m" or it[1] in published]
        if items:
            yield _dump({"type": "context", "session_id": sess, "items": items})


def export_jsonl(store: Store, out: IO[str], session_id: str | None = None,
                 progress: Callable[[int], None] | None = None) -> int:
    """Write the export to `out`; returns the number of records (header excluded)."""
    n = 0
    for i, line in enumerate(iter_export(store, session_id)):
        out.write(line + "\n")
        if i:
            n += 1
            if progress is not None and n % 500 == 0:
                progress(n)
    if progress is not None:
        progress(n)
    return n


# --------------------------------------------------------------------------- import


@dataclass
class ImportReport:
    sessions_added: int = 0
    messages_added: int = 0
    summaries_added: int = 0
    contexts_set: int = 0
    ids_remapped: int = 0
    warnings: list[str] = field(default_factory=list)

    @property
    def added(self) -> int:
        return self.sessions_added + self.messages_added + self.summaries_added + self.contexts_set


def read_records(lines: Iterable[str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    header: dict[str, Any] | None = None
    records: list[dict[str, Any]] = []
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            if header is None:
                raise ExportError(f"not a {FORMAT} export (line {no} is not JSON)") from exc
            raise ExportError(f"line {no}: not JSON ({getattr(exc, 'msg', exc)})") from exc
        if not isinstance(obj, dict):
            raise ExportError(f"line {no}: expected a JSON object")
        if header is None:
            if obj.get("format") != FORMAT:
                raise ExportError(f"not a {FORMAT} export (line 1 has no \"format\": \"{FORMAT}\")")
            v = obj.get("version")
            if not isinstance(v, int) or v < 1 or v > VERSION:
                raise ExportError(f"unsupported {FORMAT} version {v!r} (this lcm reads version {VERSION})")
            header = obj
            continue
        t = obj.get("type")
        if t not in ("session", "message", "summary", "context"):
            raise ExportError(f"line {no}: unknown record type {t!r}")
        need = {"session": ("id",), "message": ("id", "session_id", "seq", "ident", "role"),
                "summary": ("id", "session_id", "kind", "depth", "text"), "context": ("session_id", "items")}[t]
        for k in need:
            if obj.get(k) is None:
                raise ExportError(f"line {no}: {t} record without {k!r}")
        obj["_line"] = no
        records.append(obj)
    if header is None:
        raise ExportError("empty file: no lossless-context header")
    return header, records


def import_jsonl(store: Store, lines: Iterable[str]) -> ImportReport:
    header, records = read_records(lines)
    rep = ImportReport()
    by_type: dict[str, list[dict[str, Any]]] = {"session": [], "message": [], "summary": [], "context": []}
    for r in records:
        by_type[r["type"]].append(r)

    def run(ex: Execute) -> None:
        _Importer(ex, rep).run(by_type)

    store.write_rows(run, explicit_ids=("messages", "summaries"))
    return rep


class _Importer:
    def __init__(self, ex: Execute, rep: ImportReport) -> None:
        self.ex, self.rep = ex, rep
        self.mmap: dict[int, int] = {}
        self.smap: dict[int, int] = {}
        self.new_sessions: set[str] = set()

    def one(self, sql: str, p: Sequence[Any] = ()) -> Any:
        row = self.ex(sql, p).fetchone()
        return row

    def run(self, recs: dict[str, list[dict[str, Any]]]) -> None:
        for s in recs["session"]:
            self.session(s)
        for m in sorted(recs["message"], key=lambda r: int(r["id"])):
            self.message(m)
        for s in sorted(recs["summary"], key=lambda r: int(r["id"])):
            self.summary(s)
        for c in recs["context"]:
            self.context(c)
        self.session_meta(recs["session"])

    # -- records ---------------------------------------------------------------------

    def _ensure_bare(self, sid: str, now: float) -> None:
        if self.one("SELECT 1 FROM sessions WHERE id=?", (sid,)) is None:
            self.ex("INSERT INTO sessions(id, created_at, updated_at) VALUES (?, ?, ?)", (sid, now, now))
            self.new_sessions.add(sid)
            self.rep.sessions_added += 1

    def session(self, s: dict[str, Any]) -> None:
        sid = str(s["id"])
        if self.one("SELECT 1 FROM sessions WHERE id=?", (sid,)) is not None:
            return
        now = float(s.get("created_at") or 0.0)
        parent = s.get("parent_id")
        if parent:
            self._ensure_bare(str(parent), now)
        self.ex(
            "INSERT INTO sessions(id, parent_id, conversation_id, platform, model, created_at, updated_at,"
            " compactions, last_compaction_at, boundary_reason) VALUES (?,?,?,?,?,?,?,?,?,?)",
            (sid, parent or None, s.get("conversation_id"), s.get("platform"), s.get("model"), now,
             float(s.get("updated_at") or now), int(s.get("compactions") or 0), s.get("last_compaction_at"),
             s.get("boundary_reason")),
        )
        self.new_sessions.add(sid)
        self.rep.sessions_added += 1

    def session_meta(self, sessions: list[dict[str, Any]]) -> None:
        """Restore the recorded times of sessions this import created (writes bumped them)."""
        for s in sessions:
            if str(s["id"]) in self.new_sessions:
                self.ex("UPDATE sessions SET updated_at=?, created_at=? WHERE id=?",
                        (float(s.get("updated_at") or s.get("created_at") or 0.0),
                         float(s.get("created_at") or 0.0), str(s["id"])))

    def _free(self, table: str, rid: int) -> bool:
        return self.one(f"SELECT 1 FROM {table} WHERE id=?", (rid,)) is None

    def message(self, m: dict[str, Any]) -> None:
        old = int(m["id"])
        sess = str(m["session_id"])
        self._ensure_bare(sess, float(m.get("created_at") or 0.0))
        row = self.one("SELECT id, ident FROM messages WHERE session_id=? AND seq=?", (sess, int(m["seq"])))
        if row is not None and row[1] == m["ident"]:
            self.mmap[old] = row[0]
            self._extras(row[0], m)  # aliases learnt since an earlier import
            return
        seq = int(m["seq"])
        if row is not None:
            seq = self.one("SELECT COALESCE(MAX(seq), -1) + 1 FROM messages WHERE session_id=?", (sess,))[0]
            self.rep.warnings.append(f"message {old}: session {sess} already has a different message at seq "
                                     f"{m['seq']}; appended at seq {seq}")
        raw = safe_json(m["raw"]) if "raw" in m else str(m.get("raw_text", ""))
        sup = m.get("supersedes")
        sup = self.mmap.get(int(sup)) if sup is not None else None
        vals = (sess, seq, m.get("uid"), m["ident"], m["role"], raw, m.get("text") or "", int(m.get("tokens") or 0),
                float(m.get("created_at") or 0.0), sup, bool(m.get("large")), m.get("exploration"))
        cols = "session_id, seq, uid, ident, role, raw, text, tokens, created_at, supersedes, large, exploration"
        if self._free("messages", old):
            self.ex(f"INSERT INTO messages(id, {cols}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)", (old, *vals))
            new = old
        else:
            new = self.one(f"INSERT INTO messages({cols}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?) RETURNING id", vals)[0]
            self.rep.ids_remapped += 1
        self.mmap[old] = new
        self._extras(new, m)
        self.rep.messages_added += 1

    def _extras(self, mid: int, m: dict[str, Any]) -> None:
        if m.get("retracted") is True and self.one(
                "SELECT 1 FROM message_retractions WHERE message_id=?", (mid,)) is None:
            # undone in the source: hidden here too (and when it is already here, from now on)
            self.ex("INSERT INTO message_retractions(message_id, retracted_at) VALUES (?, ?)",
                    (mid, time.time()))
        for u in m.get("absorbed") or []:
            if self.one("SELECT 1 FROM message_absorbed WHERE message_id=? AND uid=?", (mid, u)) is None:
                self.ex("INSERT INTO message_absorbed(message_id, uid) VALUES (?, ?)", (mid, u))
        for ident in m.get("aliases") or []:
            if self.one("SELECT 1 FROM message_aliases WHERE ident=? AND message_id=?", (ident, mid)) is None:
                self.ex("INSERT INTO message_aliases(ident, message_id) VALUES (?, ?)", (ident, mid))

    def _existing_summary(self, sess: str, kind: str, depth: int, mids: list[int], kids: list[int]) -> int | None:
        if mids:
            cands = [r[0] for r in self.ex(
                "SELECT sm.summary_id FROM summary_messages sm JOIN summaries s ON s.id = sm.summary_id"
                " WHERE sm.message_id=? AND s.state='published'", (mids[0],)).fetchall()]
        elif kids:
            cands = [r[0] for r in self.ex(
                "SELECT sp.parent_id FROM summary_parents sp JOIN summaries s ON s.id = sp.parent_id"
                " WHERE sp.child_id=? AND s.state='published'", (kids[0],)).fetchall()]
        else:
            return None
        for cid in cands:
            meta = self.one("SELECT session_id, kind, depth FROM summaries WHERE id=?", (cid,))
            if meta is None or (meta[0], meta[1], int(meta[2])) != (sess, kind, depth):
                continue
            have_m = [r[0] for r in self.ex("SELECT message_id FROM summary_messages WHERE summary_id=? ORDER BY ord",
                                            (cid,)).fetchall()]
            have_k = [r[0] for r in self.ex("SELECT child_id FROM summary_parents WHERE parent_id=? ORDER BY ord",
                                            (cid,)).fetchall()]
            if have_m == mids and have_k == kids:
                return cid
        return None

    def _cite(self, text: str) -> str:
        def sub(mo: re.Match) -> str:
            k, n = mo.group(1), int(mo.group(2))
            new = (self.mmap if k == "m" else self.smap).get(n, n)
            return f"[{k}{new}]"

        if any(k != v for k, v in self.mmap.items()) or any(k != v for k, v in self.smap.items()):
            return _CITE_RE.sub(sub, text)
        return text

    def summary(self, s: dict[str, Any]) -> None:
        old = int(s["id"])
        sess = str(s["session_id"])
        self._ensure_bare(sess, float(s.get("created_at") or 0.0))
        try:
            mids = [self.mmap[int(x)] for x in s.get("messages") or []]
            kids = [self.smap[int(x)] for x in s.get("children") or []]
        except KeyError as exc:
            raise ExportError(f"line {s['_line']}: summary s{old} refers to {exc.args[0]}, which the file "
                              "does not hold") from exc
        kind, depth = str(s["kind"]), int(s["depth"])
        hit = self._existing_summary(sess, kind, depth, mids, kids)
        if hit is not None:
            self.smap[old] = hit
            return
        vals = (sess, kind, depth, self._cite(str(s["text"])), int(s.get("tokens") or 0),
                int(s.get("source_tokens") or 0), s.get("level") or "normal", s.get("summarizer") or "import",
                s.get("t_start"), s.get("t_end"), int(s.get("n_messages") or 0), float(s.get("created_at") or 0.0))
        cols = ("session_id, kind, depth, text, tokens, source_tokens, level, summarizer, t_start, t_end,"
                " n_messages, created_at, state")
        if self._free("summaries", old):
            self.ex(f"INSERT INTO summaries(id, {cols}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,'published')", (old, *vals))
            new = old
        else:
            new = self.one(f"INSERT INTO summaries({cols}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,'published') RETURNING id",
                           vals)[0]
            self.rep.ids_remapped += 1
        self.smap[old] = new
        for i, mid in enumerate(mids):
            self.ex("INSERT INTO summary_messages(summary_id, message_id, ord) VALUES (?,?,?)", (new, mid, i))
        for i, kid in enumerate(kids):
            self.ex("INSERT INTO summary_parents(parent_id, child_id, ord) VALUES (?,?,?)", (new, kid, i))
        self.rep.summaries_added += 1

    def context(self, c: dict[str, Any]) -> None:
        sess = str(c["session_id"])
        items: list[tuple[str, int]] = []
        for it in c.get("items") or []:
            if not (isinstance(it, list) and len(it) == 2 and it[0] in ("m", "s")):
                raise ExportError(f"line {c['_line']}: context item {it!r} is not [\"m\"|\"s\", id]")
            ref = (self.mmap if it[0] == "m" else self.smap).get(int(it[1]))
            if ref is None:
                raise ExportError(f"line {c['_line']}: context refers to {it[0]}{it[1]}, which the file does not hold")
            items.append((it[0], ref))
        have = [("m", r[0]) if r[0] is not None else ("s", r[1]) for r in self.ex(
            "SELECT message_id, summary_id FROM context_items WHERE session_id=? ORDER BY pos", (sess,)).fetchall()]
        if have == items:
            return
        if have:
            self.rep.warnings.append(f"session {sess} already has an active context; kept it")
            return
        for pos, (k, ref) in enumerate(items):
            self.ex("INSERT INTO context_items(session_id, pos, message_id, summary_id) VALUES (?,?,?,?)",
                    (sess, pos, ref if k == "m" else None, ref if k == "s" else None))
        self.ex("UPDATE sessions SET context_version = context_version + 1 WHERE id=?", (sess,))
        self.rep.contexts_set += 1
