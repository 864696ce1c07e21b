"""Retracted messages, fork points, forgetting (and the marks of forgotten messages), batched DAG reads and summary outlines, for the PostgreSQL store (a mixin of
:class:`~.postgres.PostgresStore`; the interface is documented on :class:`~.base.Store`)."""

from __future__ import annotations

import contextlib

import secrets
import time
from typing import Any, Callable, Sequence

from ...records import MessageRecord, SummaryRecord
from ..rows import MSG_COLS, SUM_COLS, message_record, outline_items, summary_record
from .text import pg_text as _t
from .versions import touch_scopes


_CHAINS = "SELECT kind, ref, other FROM lcm_summary_chains(%s::bigint[], %s::bigint[])"


def _chains(rows: Sequence[tuple], covering: dict[int, list[int]]) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
    """``covering`` and parents filled from lcm_summary_chains' rows (kind 0: a message's
    leaf, 1: a walked summary, 2: a walked summary's parent)."""
    parents: dict[int, list[int]] = {}
    for kind, ref, other in rows:
        if kind == 0:
            covering[ref].append(other)
        elif kind == 1:
            parents[ref] = []
        else:
            parents[ref].append(other)
    return covering, parents


class PostgresRecords:
    _read: Callable[..., Any]
    _write: Callable[..., Any]
    _write_context: Callable[..., None]

    # One round trip for many ids (search ranks and groups dozens of hits per call).
    def message_summaries_many(self, message_ids: Sequence[int]) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {m: [] for m in message_ids}
        if out:
            for mid, sid in self._read(lambda c: c.execute(
                    "SELECT sm.message_id, sm.summary_id FROM summary_messages sm JOIN summaries s"
                    " ON s.id = sm.summary_id WHERE sm.message_id = ANY(%s) AND s.state='published'"
                    " ORDER BY sm.message_id, sm.summary_id", (list(out),)).fetchall()):
                out[mid].append(sid)
        return out

    def summary_parents_many(self, summary_ids: Sequence[int]) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {s: [] for s in summary_ids}
        if out:
            for child, parent in self._read(lambda c: c.execute(
                    "SELECT sp.child_id, sp.parent_id FROM summary_parents sp JOIN summaries s ON s.id = sp.parent_id"
                    " WHERE sp.child_id = ANY(%s) AND s.state='published' ORDER BY sp.child_id, sp.parent_id",
                    (list(out),)).fetchall()):
                out[child].append(parent)
        return out

    def summary_chains(self, message_ids: Sequence[int],
                       summary_ids: Sequence[int]) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
        # One statement instead of one read for the covering leaves and one per DAG level
        # (lcm_summary_chains, migration 018): the walk follows each node's first published
        # parent (as the default does); UNION keeps it finite whatever the rows hold.
        covering: dict[int, list[int]] = {int(m): [] for m in message_ids}
        parents: dict[int, list[int]] = {}
        if not covering and not summary_ids:
            return covering, parents
        rows = self._read(lambda c: c.execute(_CHAINS, ([int(m) for m in covering],
                                                          [int(x) for x in summary_ids])).fetchall())
        return _chains(rows, covering)

    def hit_details(self, message_ids: Sequence[int], summary_ids: Sequence[int]) -> tuple[
            set[int], dict[int, MessageRecord], dict[int, list[int]], dict[int, list[int]]]:
        # The three reads sent together (pipeline mode): one round trip instead of three.
        mids = list(dict.fromkeys(int(m) for m in message_ids))
        sids = [int(s) for s in summary_ids]
        if not mids and not sids:
            return set(), {}, {}, {}

        def run(c: Any) -> tuple[list, list, list]:
            with c.pipeline():
                hidden = c.execute("SELECT message_id FROM message_retractions WHERE message_id = ANY(%s::bigint[])",
                                   (mids,))
                msgs = c.execute(f"SELECT {MSG_COLS} FROM messages WHERE id = ANY(%s::bigint[])", (mids,))
                chains = c.execute(_CHAINS, (mids, sids))
            return hidden.fetchall(), msgs.fetchall(), chains.fetchall()

        hidden, msgs, chains = self._read(run)
        covering, parents = _chains(chains, {m: [] for m in mids})
        return {r[0] for r in hidden}, {r[0]: message_record(r) for r in msgs}, covering, parents

    def summary_outline(self, summary_id: int) -> tuple[SummaryRecord | None, list[tuple[str, int, int]]]:
        # the summary and its children's sizes sent together (pipeline mode): one round trip
        def run(c: Any) -> tuple[Any, list]:
            with c.pipeline():
                rec = c.execute(f"SELECT {SUM_COLS} FROM summaries WHERE id = %s AND state = 'published'",
                                (summary_id,))
                kids = c.execute("SELECT * FROM lcm_summary_outline(%s)", (summary_id,))  # migration 022
            return rec.fetchone(), kids.fetchall()

        row, kids = self._read(run)
        return (summary_record(row), outline_items(kids)) if row is not None else (None, [])

    def forget_salt(self) -> bytes:
        salt = getattr(self, "_forget_salt", None)
        if salt is None:
            row = self._read(lambda c: c.execute("SELECT salt FROM forget_salt WHERE id = 1").fetchone())
            if row is None:
                fresh = secrets.token_bytes(32)

                def tx(c: Any) -> Any:  # (two processes at once: the first one's salt stays)
                    c.execute("INSERT INTO forget_salt(id, salt) VALUES (1, %s) ON CONFLICT DO NOTHING", (fresh,))
                    return c.execute("SELECT salt FROM forget_salt WHERE id = 1").fetchone()

                row = self._write(tx)
            salt = self._forget_salt = bytes(row[0])
        return salt

    def forget_marks(self, scope: Sequence[str]) -> dict[int, set[str]]:
        sessions = [_t(s) for s in scope]
        out: dict[int, set[str]] = {}
        for anchor, digest in self._read(lambda c: c.execute(
                "SELECT anchor, digest FROM forget_marks WHERE session_id = ANY(%s)", (sessions,)).fetchall()):
            out.setdefault(int(anchor), set()).add(digest)
        return out

    def add_forget_marks(self, marks: Sequence[tuple[str, int, str]], moved: dict[int, int]) -> None:
        now = time.time()
        olds, news = [int(k) for k in moved], [int(v) for v in moved.values()]
        rows = [(_t(s), int(a), str(d), now) for s, a, d in marks]

        def tx(c: Any) -> None:
            if olds:
                # (moved through a copy: a mark may already stand at the new anchor)
                c.execute("INSERT INTO forget_marks(session_id, anchor, digest, forgotten_at)"
                          " SELECT f.session_id, m.new, f.digest, f.forgotten_at FROM forget_marks f"
                          " JOIN unnest(%s::bigint[], %s::bigint[]) AS m(old, new) ON f.anchor = m.old"
                          " ON CONFLICT DO NOTHING", (olds, news))
                c.execute("DELETE FROM forget_marks WHERE anchor = ANY(%s)", (olds,))
            if rows:
                c.execute("INSERT INTO forget_marks(session_id, anchor, digest, forgotten_at)"
                          " SELECT * FROM unnest(%s::text[], %s::bigint[], %s::text[], %s::float8[])"
                          " ON CONFLICT DO NOTHING", [list(col) for col in zip(*rows)])

        self._write(tx)

    def retract_messages(self, message_ids: Sequence[int]) -> int:
        if not message_ids:
            return 0
        ids = [int(i) for i in message_ids]
        return self._write(lambda c: c.execute(
            "INSERT INTO message_retractions(message_id, retracted_at) SELECT u, %s FROM unnest(%s::bigint[]) u"
            " ON CONFLICT DO NOTHING", (time.time(), ids)).rowcount)

    def restore_messages(self, message_ids: Sequence[int]) -> int:
        if not message_ids:
            return 0
        ids = [int(i) for i in message_ids]
        return self._write(lambda c: c.execute("DELETE FROM message_retractions WHERE message_id = ANY(%s)",
                                               (ids,)).rowcount)

    def retracted(self, message_ids: Sequence[int]) -> set[int]:
        if not message_ids:
            return set()
        ids = [int(i) for i in message_ids]
        return self._read(lambda c: {r[0] for r in c.execute(
            "SELECT message_id FROM message_retractions WHERE message_id = ANY(%s)", (ids,))})

    def set_fork_point(self, session_id: str) -> None:
        def tx(c: Any) -> None:
            touch_scopes()
            c.execute("UPDATE sessions SET fork_message_id=(SELECT COALESCE(MAX(id), 0) FROM messages),"
                      " fork_summary_id=(SELECT COALESCE(MAX(id), 0) FROM summaries)"
                      " WHERE id=%s AND fork_message_id IS NULL", (_t(session_id),))

        self._write(tx)

    def fork_point(self, session_id: str) -> tuple[int, int] | None:
        row = self._read(lambda c: c.execute("SELECT fork_message_id, fork_summary_id FROM sessions WHERE id=%s",
                                             (_t(session_id),)).fetchone())
        return (int(row[0]), int(row[1] or 0)) if row and row[0] is not None else None

    def read_lineage(self, session_id: str) -> list[str]:
        """The lineage as the server has it now (``lineage`` keeps it while nothing changes)."""
        # The walk of the original per-session queries, with each session's row fetched
        # together with its whole conversation (every tool call runs this: one or two round
        # trips instead of one per session).
        def run(c: Any) -> list[str]:
            rows: dict[str, tuple[str | None, str | None]] = {}
            members: dict[str, list[str]] = {}

            def load(sid: str) -> None:
                got = c.execute(
                    "SELECT o.id, o.parent_id, o.conversation_id FROM sessions s JOIN sessions o"
                    " ON o.id = s.id OR (s.conversation_id IS NOT NULL AND o.conversation_id = s.conversation_id)"
                    " WHERE s.id = %s ORDER BY o.created_at, o.id", (sid,)).fetchall()
                conv = next((r[2] for r in got if r[0] == sid), None)
                for oid, parent, oconv in got:
                    rows[oid] = (parent, oconv)
                if conv is not None:
                    members[conv] = [r[0] for r in got if r[2] == conv]

            seen: list[str] = []
            frontier = [_t(session_id)]
            conv_done: set[str] = set()
            while frontier:
                sid = frontier.pop()
                if sid in seen:
                    continue
                seen.append(sid)
                if sid not in rows:
                    load(sid)
                row = rows.get(sid)
                if row is None:
                    continue
                if row[0]:
                    frontier.append(row[0])
                if row[1] and row[1] not in conv_done:
                    conv_done.add(row[1])
                    if row[1] not in members:
                        load(sid)
                    frontier.extend(members.get(row[1], []))
            return seen

        return self._read(run)

    def ancestry(self, session_id: str, limit: int = 256) -> list[tuple[str, str | None, tuple[int, int] | None]]:
        rows = self._read(lambda c: c.execute(
            "WITH RECURSIVE up(id, parent_id, fm, fs, n, path) AS ("
            " SELECT id, parent_id, fork_message_id, fork_summary_id, 1, ARRAY[id] FROM sessions WHERE id=%s"
            " UNION ALL SELECT s.id, s.parent_id, s.fork_message_id, s.fork_summary_id, up.n + 1, up.path || s.id"
            " FROM up JOIN sessions s ON s.id = up.parent_id WHERE up.n < %s AND NOT s.id = ANY(up.path))"
            " SELECT id, parent_id, fm, fs FROM up ORDER BY n", (_t(session_id), limit)).fetchall())
        return [(sid, parent, (int(fm), int(fs or 0)) if fm is not None else None) for sid, parent, fm, fs in rows]

    def session_message_ids(self, session_id: str) -> list[int]:
        return self._read(lambda c: [r[0] for r in c.execute(
            "SELECT id FROM messages WHERE session_id=%s ORDER BY id", (_t(session_id),))])

    def session_summary_ids(self, session_id: str) -> list[int]:
        return self._read(lambda c: [r[0] for r in c.execute(
            "SELECT id FROM summaries WHERE session_id=%s ORDER BY id", (_t(session_id),))])

    def summaries_over(self, message_ids: Sequence[int], summary_ids: Sequence[int]) -> set[int]:
        m, s = [int(i) for i in message_ids], [int(i) for i in summary_ids]

        def run(c: Any) -> set[int]:
            out = {r[0] for r in c.execute("SELECT DISTINCT summary_id FROM summary_messages"
                                           " WHERE message_id = ANY(%s)", (m,))}
            out.update(r[0] for r in c.execute("SELECT DISTINCT parent_id FROM summary_parents"
                                               " WHERE child_id = ANY(%s)", (s,)))
            return out

        return self._read(run)

    def set_message_times(self, pairs: Sequence[tuple[int, float]]) -> None:
        if not pairs:
            return
        ids, times = [int(i) for i, _t in pairs], [float(t) for _i, t in pairs]
        self._write(lambda c: c.execute(
            "UPDATE messages m SET created_at = x.t FROM unnest(%s::bigint[], %s::float8[]) AS x(id, t)"
            " WHERE m.id = x.id", (ids, times)))

    def rewrite_summaries(self, rows: Sequence[tuple[int, str, int, int]], sessions: Sequence[str]) -> None:
        ids = [int(r[0]) for r in rows]
        xs = [_t(x) for x in dict.fromkeys(str(x) for x in sessions)]

        def tx(c: Any) -> None:
            for sid, text, tokens, n in rows:
                c.execute("UPDATE summaries SET text=%s, tokens=%s, n_messages=%s, level='deterministic',"
                          " summarizer='extractive' WHERE id=%s", (_t(text), tokens, n, sid))
            c.execute("DELETE FROM summary_history WHERE summary_id = ANY(%s)", (ids,))
            c.execute("DELETE FROM presummaries WHERE session_id = ANY(%s)", (xs,))
            c.execute("DELETE FROM session_continuity WHERE session_id = ANY(%s)", (xs,))

        self._write(tx)

    def scrub(self) -> dict[str, Any]:
        """VACUUM the tables a forget deletes from: deleted row versions (and their index
        entries, GIN's included) stay on disk until a vacuum removes them."""
        tables = ("messages", "message_index", "summaries", "summary_history", "summary_messages",
                  "summary_parents", "context_items", "presummaries", "session_continuity", "message_vectors")

        def run(c: Any) -> list[str]:
            c.commit()  # (VACUUM runs outside a transaction)
            c.autocommit = True
            try:
                c.execute("SET statement_timeout = 0")  # (a large table's vacuum may take minutes)
                for t in tables:
                    c.execute(f"VACUUM {t}")
            finally:
                c.execute("RESET statement_timeout")
                c.autocommit = False
            return list(tables)

        return {"vacuumed": self._read(run)}

    def forget_records(self, session_ids: Sequence[str], message_ids: Sequence[int], summary_ids: Sequence[int],
                       contexts: dict[str, list[tuple[str, int]]]) -> dict[str, int]:
        return dict(self._write(lambda c: self._forget_in(c, session_ids, message_ids, summary_ids, contexts)))

    def _forget_in(self, c: Any, session_ids: Sequence[str], message_ids: Sequence[int], summary_ids: Sequence[int],
                   contexts: dict[str, list[tuple[str, int]]]) -> dict[str, int]:
        """forget_records' statements inside the caller's transaction (also remove_rows':
        store/postgres/lifecycle.py)."""
        x = [_t(s) for s in session_ids]
        m, s = [int(i) for i in message_ids], [int(i) for i in summary_ids]
        touch_scopes()
        for sid, items in contexts.items():
            if _t(sid) not in x:
                self._write_context(c, _t(sid), items)
        # Only the statements with keys to look up, sent together (pipeline mode: one round trip,
        # which is most of what a prune's small group of rows costs); a session's removal
        # below reads its counts as it goes, so it runs without.
        cur_s = cur_m = None
        with c.pipeline() if not x else contextlib.nullcontext():
            # (one statement per key, each by its index: an OR of them scanned the table)
            if x:
                c.execute("DELETE FROM context_items WHERE session_id = ANY(%s)", (x,))
                c.execute("DELETE FROM staged_passes WHERE session_id = ANY(%s)", (x,))
                c.execute("DELETE FROM presummaries WHERE session_id = ANY(%s)", (x,))
            if m:
                c.execute("DELETE FROM context_items WHERE message_id = ANY(%s)", (m,))
            if s:
                c.execute("DELETE FROM context_items WHERE summary_id = ANY(%s)", (s,))
                c.execute("DELETE FROM summary_parents WHERE parent_id = ANY(%s)", (s,))
                c.execute("DELETE FROM summary_parents WHERE child_id = ANY(%s)", (s,))
                c.execute("DELETE FROM summary_messages WHERE summary_id = ANY(%s)", (s,))
            if m:
                c.execute("DELETE FROM summary_messages WHERE message_id = ANY(%s)", (m,))
            if s:
                # (a node's earlier texts and costs carry its words too; pruned_spans: ON DELETE CASCADE)
                c.execute("DELETE FROM summary_history WHERE summary_id = ANY(%s)", (s,))
                c.execute("DELETE FROM summary_costs WHERE summary_id = ANY(%s)", (s,))
                cur_s = c.execute("DELETE FROM summaries WHERE id = ANY(%s)", (s,))
            if m:
                c.execute("DELETE FROM message_aliases WHERE message_id = ANY(%s)", (m,))
                c.execute("DELETE FROM message_absorbed WHERE message_id = ANY(%s)", (m,))
                c.execute("DELETE FROM message_retractions WHERE message_id = ANY(%s)", (m,))
                c.execute("DELETE FROM message_vectors WHERE message_id = ANY(%s)", (m,))
            if x:
                c.execute("DELETE FROM message_vectors WHERE session_id = ANY(%s)", (x,))
            if m:
                c.execute("UPDATE messages SET supersedes=NULL WHERE supersedes = ANY(%s)", (m,))
                cur_m = c.execute("DELETE FROM messages WHERE id = ANY(%s)", (m,))
        n_s = cur_s.rowcount if cur_s is not None else 0
        n_m = cur_m.rowcount if cur_m is not None else 0
        if not x:
            return {"sessions": 0, "messages": n_m, "summaries": n_s}
        for _ in range(len(x) + 1):
            if not c.execute("UPDATE sessions SET parent_id=(SELECT p.parent_id FROM sessions p"
                             " WHERE p.id=sessions.parent_id) WHERE parent_id = ANY(%s)"
                             " AND NOT (id = ANY(%s))", (x, x)).rowcount:
                break
        c.execute("UPDATE sessions SET parent_id=NULL WHERE parent_id = ANY(%s)", (x,))
        n_x = c.execute("DELETE FROM sessions WHERE id = ANY(%s)", (x,)).rowcount
        return {"sessions": n_x, "messages": n_m, "summaries": n_s}
