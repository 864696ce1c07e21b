"""SQLite store: the embedded default. One file, WAL, foreign keys, FTS5, 0600 in a 0700 dir.

Connections are per thread; every write is a short `BEGIN IMMEDIATE` transaction with a
bounded busy wait, so a gateway and a CLI can share one file. No network wait ever
happens while a transaction is open: the engine summarises first, then writes.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import sqlite3
import threading
import time
from pathlib import Path
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable, Iterator, Sequence

from ...messages import clean_text
from ...records import ContextEntry, MessageRecord, NewMessage, NewSummary, StagedPass, SummaryRecord
from ..base import Store, StoreError, resolve_keys
from .. import migrate, passes
from ..rows import MSG_COLS, SUM_COLS, message_record, summary_record
from . import append as sqlite_append, index as sqlite_index, merge as sqlite_merge, wal as sqlite_wal
from . import cipher as sqlite_cipher, writelock
from .migrations import MIGRATIONS
from .wal import AUTOCHECKPOINT_PAGES, PAGE_SIZE
from .costs import SQLiteCosts
from .vectors import SQLiteVectors
from .records import SQLiteRecords
from .lifecycle import SQLiteLifecycle
from .search import SQLiteSearch
from .maintenance import SQLiteMaintenance


BUSY_TIMEOUT_MS = 30_000


def _private_dir(path: Path, ours: bool) -> None:
    """Create `path` private (0700). An existing directory is tightened only when it is
    `ours` (the lock directory): a store configured as /tmp/x.db or ~/notes/lcm.db must not
    change the mode of /tmp or ~/notes — the store's own files are 0600 wherever they are."""
    if not path.is_dir():
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        ours = True
    if ours:
        try:
            if path.stat().st_mode & 0o077:
                os.chmod(path, 0o700)
        except OSError:
            pass


class SQLiteStore(SQLiteRecords, SQLiteLifecycle, SQLiteSearch, SQLiteCosts, SQLiteVectors, SQLiteMaintenance, Store):
    kind = "sqlite"

    def __init__(self, location: str) -> None:
        self.location = str(Path(location).expanduser())
        self._local = threading.local()
        self._conns: list[sqlite3.Connection] = []
        self._conns_lock = threading.Lock()
        self._ready = False
        self._ready_lock = threading.Lock()
        self._thread_locks: dict[str, threading.Lock] = {}
        self._writer_lock = threading.Lock()
        self._writer_ex: ThreadPoolExecutor | None = None
        self._writer_pid = 0
        self._checkpointer = sqlite_wal.Checkpointer(self.location, self._connect)
        self.merger = sqlite_merge.Merger(self._own_connect)
        self._indexer = sqlite_index.Indexer(self.conn, self._begin, self._writer, done=self.merger.poke)
        self._key: sqlite_cipher.StoreKey | None = None  # an encrypted file's key (store/sqlite/cipher.py)
        self._new_key = False

    @property
    def encrypted(self) -> bool:
        """Whether the file is encrypted at rest (SQLCipher; looked at when the store opens)."""
        return self.conn() is not None and self._key is not None

    def encryption(self) -> str:
        return "sqlcipher" if self.encrypted else "none"

    # -- connections ----------------------------------------------------------

    def _prepare_file(self) -> None:
        path = Path(self.location)
        _private_dir(path.parent, ours=False)
        if not path.exists():
            # Create the file with 0600 before SQLite touches it (umask-proof).
            fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
            os.close(fd)
        try:
            if path.stat().st_mode & 0o077:
                os.chmod(path, 0o600)
        except OSError:
            pass
        self._key = sqlite_cipher.key_for(path)
        self._new_key = self._key is not None and not sqlite_cipher.is_encrypted_file(path)

    def conn(self) -> sqlite3.Connection:
        c = getattr(self._local, "conn", None)
        if c is not None:
            return c
        if not self._ready:
            with self._ready_lock:
                if not self._ready:
                    self._prepare_file()
                    c0 = self._connect()
                    self._migrate(c0)
                    if self._new_key:
                        # (a new encrypted file: its salt reaches the file now, not at a later
                        # checkpoint, so another process opening it reads the right one)
                        c0.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
                    self._ready = True
                    self._local.conn = c0
                    return c0
        c = self._connect()
        self._local.conn = c
        return c

    def _connect(self) -> sqlite3.Connection:
        try:
            c = sqlite_cipher.connect(
                self.location, self._key, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None,
                check_same_thread=False,
            )
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open store {self.location}: {exc}") from exc
        c.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        # 16 KB pages for a new file (an existing one keeps its own size; this is then a no-op):
        # rows of ~2 KB and FTS segments spill over fewer pages — bulk appends spend ~15% less
        # in SQLite, and a commit writes ~35% less to the WAL.
        c.execute(f"PRAGMA page_size={PAGE_SIZE}")
        # A new file frees the pages of what a prune removes (ops/retention.py) in place. An
        # existing file keeps its mode (switching needs a rewrite: `lcm vacuum`), and setting it
        # there waits for the write lock (another process's transaction: up to the busy timeout,
        # in every connection a background thread opens), so only an empty file is told.
        if c.execute("PRAGMA page_count").fetchone()[0] == 0:
            c.execute("PRAGMA auto_vacuum=INCREMENTAL")
        # Switching to WAL ignores the busy timeout: retry while another process opens
        # the same new file at the same moment.
        deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
        while True:
            try:
                c.execute("PRAGMA journal_mode=WAL")
                break
            except sqlite3.OperationalError as exc:
                if ("locked" not in str(exc) and "busy" not in str(exc)) or time.monotonic() > deadline:
                    raise StoreError(f"cannot open store {self.location}: {exc}") from exc
                time.sleep(0.05)
        c.execute("PRAGMA synchronous=NORMAL")
        c.execute("PRAGMA foreign_keys=ON")
        # 16 MB (default 2 MB): an ingest batch's dirty pages stay in memory until COMMIT
        # instead of spilling to the WAL mid-transaction (~40% fewer WAL writes). Allocated
        # only as used.
        c.execute(f"PRAGMA cache_size={sqlite_cipher.cache_size(self._key)}")
        # Checkpoints of large appends run on a background thread (store/sqlite/wal.py).
        c.execute(f"PRAGMA wal_autocheckpoint={AUTOCHECKPOINT_PAGES}")
        with self._conns_lock:
            self._conns.append(c)
        return c

    @contextlib.contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """A write transaction; BEGIN IMMEDIATE takes the single writer slot up front."""
        c = self.conn()
        self._indexer.before_write(c)  # (deferred indexing: store/sqlite/index.py)
        self._begin(c)
        try:
            yield c
        except BaseException:
            # (SQLite has rolled back itself after some errors — a full disk, an I/O error:
            # a ROLLBACK then fails with "no transaction is active" and would hide the cause)
            if c.in_transaction:
                c.execute("ROLLBACK")
            raise
        else:
            c.execute("COMMIT")
            self.merger.poke()  # (the write's index segments: store/sqlite/merge.py)

    def merges_held(self) -> contextlib.AbstractContextManager[None]:
        return self.merger.hold()

    @staticmethod
    def _begin(c: sqlite3.Connection) -> None:
        # (polled, not SQLite's busy handler: a writer behind a prune's short transactions
        # takes the lock in their pauses — store/sqlite/writelock.py)
        try:
            writelock.begin_immediate(c, BUSY_TIMEOUT_MS / 1000 * 2, BUSY_TIMEOUT_MS)
        except sqlite3.OperationalError as exc:
            if not writelock.is_busy(exc):
                raise
            raise StoreError(f"store busy for too long: {exc}") from exc

    def _migrate(self, c: sqlite3.Connection) -> None:
        c.execute(
            "CREATE TABLE IF NOT EXISTS lcm_migrations (name TEXT PRIMARY KEY, applied_at REAL NOT NULL)"
        )
        done = {r[0] for r in c.execute("SELECT name FROM lcm_migrations")}

        def apply(name: str, sql: str) -> bool:
            # One transaction per entry, under the write lock.
            c.execute("BEGIN IMMEDIATE")
            try:
                # Re-check under the write lock: another process may have migrated meanwhile.
                if c.execute("SELECT 1 FROM lcm_migrations WHERE name=?", (name,)).fetchone():
                    c.execute("COMMIT")
                    return False
                for stmt in migrate.split_sql(sql):
                    c.execute(stmt)
                c.execute("INSERT INTO lcm_migrations(name, applied_at) VALUES (?, ?)", (name, time.time()))
                c.execute("COMMIT")
            except BaseException:
                if c.in_transaction:  # (as in tx(): keep the cause SQLite rolled back for)
                    c.execute("ROLLBACK")
                raise
            return True

        migrate.apply_pending(self.location, MIGRATIONS, done, apply)

    def migration_state(self) -> migrate.MigrationState:
        """The store's migrations against this version's list (`lcm doctor`)."""
        return migrate.MigrationState.of(MIGRATIONS, self.applied_migrations())

    def applied_migrations(self) -> list[str]:
        return [r[0] for r in self.conn().execute("SELECT name FROM lcm_migrations ORDER BY name")]

    def close(self) -> None:
        # The writer's jobs first (an indexing job that ends pokes the merger), then the
        # background threads, then the connections; the replacements (if the store is used
        # again) only once nothing can poke the old ones into starting a thread.
        ex, self._writer_ex = self._writer_ex, None
        if ex is not None and self._writer_pid == os.getpid():
            ex.shutdown(wait=True)
        self.merger.stop()
        self._checkpointer.stop()
        with self._conns_lock:
            conns, self._conns = self._conns, []
        for c in conns:
            try:
                c.close()
            except sqlite3.Error:
                pass
        self._local = threading.local()
        self._ready = False
        self.merger = sqlite_merge.Merger(self._own_connect)
        self._indexer.done = self.merger.poke
        self._checkpointer = sqlite_wal.Checkpointer(self.location, self._connect)

    def _own_connect(self) -> sqlite3.Connection:
        """A connection its thread owns and closes itself (the merge thread's): close() must
        not close it under a step, whose thread closes it once stopped."""
        c = self._connect()
        with self._conns_lock:
            if c in self._conns:
                self._conns.remove(c)
        return c

    # -- sessions -----------------------------------------------------------

    def ensure_session(
        self,
        session_id: str,
        *,
        parent_id: str | None = None,
        conversation_id: str | None = None,
        platform: str | None = None,
        model: str | None = None,
        boundary_reason: str | None = None,
    ) -> None:
        now = time.time()
        with self.tx() as c:
            if parent_id and parent_id != session_id:
                c.execute(
                    "INSERT OR IGNORE INTO sessions(id, created_at, updated_at) VALUES (?, ?, ?)",
                    (parent_id, now, now),
                )
            else:
                parent_id = None
            row = c.execute("SELECT parent_id, conversation_id FROM sessions WHERE id=?", (session_id,)).fetchone()
            if row is None:
                c.execute(
                    "INSERT INTO sessions(id, parent_id, conversation_id, platform, model, created_at,"
                    " updated_at, boundary_reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (session_id, parent_id, conversation_id, platform, model, now, now, boundary_reason),
                )
            else:
                c.execute(
                    "UPDATE sessions SET parent_id=COALESCE(parent_id, ?),"
                    " conversation_id=COALESCE(conversation_id, ?), platform=COALESCE(?, platform),"
                    " model=COALESCE(?, model), updated_at=?,"
                    " boundary_reason=COALESCE(?, boundary_reason) WHERE id=?",
                    (parent_id, conversation_id, platform, model, now, boundary_reason, session_id),
                )

    def get_session(self, session_id: str) -> dict[str, Any] | None:
        c = self.conn()
        c.row_factory = None
        row = c.execute(
            "SELECT id, parent_id, conversation_id, platform, model, created_at, updated_at,"
            " context_version, compactions, last_compaction_at, boundary_reason FROM sessions WHERE id=?",
            (session_id,),
        ).fetchone()
        if row is None:
            return None
        keys = ("id", "parent_id", "conversation_id", "platform", "model", "created_at", "updated_at",
                "context_version", "compactions", "last_compaction_at", "boundary_reason")
        return dict(zip(keys, row))

    def list_sessions(self) -> list[dict[str, Any]]:
        rows = self.conn().execute(
            "SELECT s.id, s.parent_id, s.conversation_id, s.created_at, s.updated_at, s.compactions,"
            " s.last_compaction_at,"
            " (SELECT COUNT(*) FROM messages m WHERE m.session_id = s.id),"
            " (SELECT COUNT(*) FROM summaries x WHERE x.session_id = s.id AND x.state='published'),"
            " s.boundary_reason FROM sessions s ORDER BY s.created_at, s.id"
        ).fetchall()
        keys = ("id", "parent_id", "conversation_id", "created_at", "updated_at", "compactions",
                "last_compaction_at", "messages", "summaries", "boundary_reason")
        return [dict(zip(keys, r)) for r in rows]

    def lineage(self, session_id: str) -> list[str]:
        c = self.conn()
        seen: list[str] = []
        frontier = [session_id]
        conv: set[str] = set()
        while frontier:
            sid = frontier.pop()
            if sid in seen:
                continue
            seen.append(sid)
            row = c.execute("SELECT parent_id, conversation_id FROM sessions WHERE id=?", (sid,)).fetchone()
            if row is None:
                continue
            if row[0]:
                frontier.append(row[0])
            if row[1] and row[1] not in conv:
                conv.add(row[1])
                frontier.extend(
                    r[0] for r in c.execute("SELECT id FROM sessions WHERE conversation_id=?", (row[1],))
                )
        return seen

    # -- messages -------------------------------------------------------------

    def append_messages(self, session_id: str, rows: Iterable[NewMessage],
                        context: Sequence[tuple[str, int]] | None = None,
                        context_known: tuple[int, int] | None = None,
                        on_ids: Callable[[list[int]], None] | None = None) -> list[int]:
        # `rows` may be a lazy iterable: then the append is pipelined, its SQL on the writer
        # thread while this thread builds the next rows (store/sqlite/append.py).
        built = isinstance(rows, (list, tuple))  # rows already built: nothing to overlap with
        batch = sqlite_append.Batch(self.conn, self._begin, self._write_context, session_id, context, context_known,
                                    defer_index=not built)
        if built:
            self._indexer.before_write(self.conn())
            ids = sqlite_append.append(batch, rows, None, on_ids)
        else:
            with self._writer_lock:  # one pipelined append at a time per writer connection
                ids = sqlite_append.append(batch, rows, self._writer, on_ids)
            if ids:  # its rows are full-text indexed after the commit (store/sqlite/index.py)
                self._indexer.soon()
        if ids:
            self.merger.poke()
        self._checkpointer.poke()
        return ids

    def wait_indexed(self) -> None:
        self._indexer.wait()

    def _index_before_search(self) -> None:
        self._indexer.wait(lock_wait=sqlite_index.SEARCH_LOCK_WAIT)

    def _writer(self) -> ThreadPoolExecutor:
        """The thread (with its own connection and warm page cache) that runs large appends' SQL."""
        if self._writer_ex is None or self._writer_pid != os.getpid():  # threads do not survive fork
            self._writer_ex = ThreadPoolExecutor(1, thread_name_prefix="lcm-writer")
            self._writer_pid = os.getpid()
        return self._writer_ex

    def get_messages(self, ids: Sequence[int]) -> dict[int, MessageRecord]:
        out: dict[int, MessageRecord] = {}
        ids = list(dict.fromkeys(int(i) for i in ids))
        c = self.conn()
        for i in range(0, len(ids), 500):
            chunk = ids[i : i + 500]
            q = f"SELECT {MSG_COLS} FROM messages WHERE id IN ({','.join('?' * len(chunk))})"
            for row in c.execute(q, chunk):
                out[row[0]] = message_record(row)
        return out

    def log_after(self, session_ids: Sequence[str], after_id: int, limit: int) -> list[tuple[int, str, str | None]]:
        if not session_ids:
            return []
        q = (
            f"SELECT id, ident, uid FROM messages WHERE session_id IN ({','.join('?' * len(session_ids))})"
            " AND id > ? ORDER BY id LIMIT ?"
        )
        return [tuple(r) for r in self.conn().execute(q, (*session_ids, after_id, limit))]

    def find_uid(self, session_ids: Sequence[str], uid: str) -> tuple[int, str] | None:
        q = (
            f"SELECT id, ident FROM messages WHERE uid=? AND session_id IN ({','.join('?' * len(session_ids))})"
            " ORDER BY id DESC LIMIT 1"
        )
        row = self.conn().execute(q, (uid, *session_ids)).fetchone()
        return (row[0], row[1]) if row else None

    def find_ident(self, session_id: str, ident: str, after_id: int) -> tuple[int, str | None] | None:
        row = self.conn().execute(
            "SELECT id, uid FROM messages WHERE session_id=? AND ident=? AND id>? ORDER BY id LIMIT 1",
            (session_id, ident, after_id),
        ).fetchone()
        return (row[0], row[1]) if row else None

    def add_aliases(self, pairs: Sequence[tuple[str, int]]) -> None:
        if not pairs:
            return
        with self.tx() as c:
            c.executemany("INSERT OR IGNORE INTO message_aliases(ident, message_id) VALUES (?, ?)", list(pairs))

    def aliases_for(self, message_ids: Sequence[int]) -> dict[str, int]:
        out: dict[str, int] = {}
        ids = list(dict.fromkeys(message_ids))
        for i in range(0, len(ids), 500):
            chunk = ids[i : i + 500]
            q = f"SELECT ident, message_id FROM message_aliases WHERE message_id IN ({','.join('?' * len(chunk))})"
            out.update({r[0]: r[1] for r in self.conn().execute(q, chunk)})
        return out

    def session_messages(self, session_id: str, after_seq: int = -1, limit: int = 1000) -> list[MessageRecord]:
        rows = self.conn().execute(
            f"SELECT {MSG_COLS} FROM messages WHERE session_id=? AND seq>? ORDER BY seq LIMIT ?",
            (session_id, after_seq, limit),
        )
        return [message_record(r) for r in rows]

    def iter_all_messages(self, batch: int = 1000) -> Iterator[MessageRecord]:
        last = 0
        while True:
            rows = self.conn().execute(
                f"SELECT {MSG_COLS} FROM messages WHERE id>? ORDER BY id LIMIT ?", (last, batch)
            ).fetchall()
            if not rows:
                return
            for r in rows:
                yield message_record(r)
            last = rows[-1][0]

    # -- active context ---------------------------------------------------------

    def context_version(self, session_id: str) -> int:
        row = self.conn().execute("SELECT context_version FROM sessions WHERE id=?", (session_id,)).fetchone()
        return row[0] if row else 0

    def get_context(self, session_id: str) -> tuple[int, list[ContextEntry]]:
        # One statement, so the version and the items come from the same snapshot (a writer
        # between two reads would pair a version with another version's items).
        rows = self.conn().execute(
            "SELECT x.context_version, ci.pos, ci.message_id, ci.summary_id, m.ident, m.role, m.tokens, s.tokens"
            " FROM sessions x LEFT JOIN context_items ci ON ci.session_id = x.id"
            " LEFT JOIN messages m ON m.id = ci.message_id"
            " LEFT JOIN summaries s ON s.id = ci.summary_id WHERE x.id=? ORDER BY ci.pos",
            (session_id,),
        ).fetchall()
        if not rows:
            return 0, []
        entries = []
        for _v, pos, mid, sid, m_ident, m_role, m_tokens, s_tokens in rows:
            if pos is None:
                continue
            if mid is not None:
                entries.append(ContextEntry("m", mid, m_ident, m_role, m_tokens))
            else:
                entries.append(ContextEntry("s", sid, "", "summary", s_tokens or 0))
        return rows[0][0], entries

    def set_context(self, session_id: str, entries: Sequence[ContextEntry], expected_version: int | None = None) -> int:
        with self.tx() as c:
            row = c.execute("SELECT context_version FROM sessions WHERE id=?", (session_id,)).fetchone()
            if row is None:
                raise StoreError(f"unknown session {session_id}")
            if expected_version is not None and row[0] != expected_version:
                raise StoreError("context changed concurrently")
            self._write_context(c, session_id, [(e.kind, e.ref) for e in entries])
            return row[0] + 1

    @staticmethod
    def _write_context(c: sqlite3.Connection, session_id: str, items: Sequence[tuple[str, int]],
                       known: int | None = None) -> None:
        # Only the tail that differs is rewritten: after an ingest the old context is a
        # prefix of the new one, and rewriting every row was O(context) per ingest. With
        # `known` (the caller checked the version: the stored context is items[:known])
        # not even the old rows are read.
        if known is not None:
            keep = known
            c.execute("DELETE FROM context_items WHERE session_id=? AND pos>=?", (session_id, keep))
        else:
            new = [(ref if kind == "m" else None, ref if kind == "s" else None) for kind, ref in items]
            old = c.execute("SELECT message_id, summary_id FROM context_items WHERE session_id=? ORDER BY pos",
                            (session_id,)).fetchall()
            keep = min(len(old), len(new))
            if old[:keep] != new[:keep]:
                keep = next(k for k in range(keep) if old[k] != new[k])
            if keep < len(old):
                c.execute("DELETE FROM context_items WHERE session_id=? AND pos>=?", (session_id, keep))
        tail = items[keep:]
        if tail:
            # One statement over a JSON array (summaries as negative ids): ~4x faster than a
            # statement run per row, and ingest writes a row per new message.
            c.execute(
                "INSERT INTO context_items(session_id, pos, message_id, summary_id)"
                " SELECT ?, ? + key, CASE WHEN value > 0 THEN value END, CASE WHEN value < 0 THEN -value END"
                " FROM json_each(?)",
                (session_id, keep, "[" + ",".join([str(int(ref)) if kind == "m" else str(-int(ref))
                                                   for kind, ref in tail]) + "]"),
            )
        c.execute(
            "UPDATE sessions SET context_version = context_version + 1, updated_at=? WHERE id=?",
            (time.time(), session_id),
        )

    # -- staged passes ------------------------------------------------------------

    def stage_pass(
        self,
        session_id: str,
        pass_id: str,
        summaries: Sequence[NewSummary],
        items: Sequence[tuple[str, Any]],
        base_version: int,
        base_len: int,
    ) -> tuple[dict[str, int], list[tuple[str, int]]]:
        keymap: dict[str, int] = {}
        now = time.time()
        with self.tx() as c:
            for s in summaries:
                sid = _insert_summary(c, session_id, s, resolve_keys(s.text, keymap), "staged", pass_id, now)
                keymap[s.key] = sid
                c.executemany(
                    "INSERT INTO summary_messages(summary_id, message_id, ord) VALUES (?,?,?)",
                    [(sid, mid, i) for i, mid in enumerate(s.message_ids)],
                )
                c.executemany(
                    "INSERT INTO summary_parents(parent_id, child_id, ord) VALUES (?,?,?)",
                    [(sid, keymap[k] if isinstance(k, str) else k, i) for i, k in enumerate(s.child_keys)],
                )
            resolved = [(k, keymap[r] if isinstance(r, str) else int(r)) for k, r in items]
            top = [r for k, r in resolved if k == "s"]
            c.execute(
                "INSERT INTO staged_passes(pass_id, session_id, base_version, base_len, items, top_nodes,"
                " created_at) VALUES (?,?,?,?,?,?,?)",
                (pass_id, session_id, base_version, base_len, json.dumps(resolved), json.dumps(top), now),
            )
        return keymap, resolved

    def staged_passes(self, session_id: str) -> list[StagedPass]:
        rows = self.conn().execute(
            "SELECT pass_id, session_id, base_version, base_len, items, top_nodes, created_at"
            " FROM staged_passes WHERE session_id=? ORDER BY created_at DESC, rowid DESC",
            (session_id,),
        ).fetchall()
        return [StagedPass(r[0], r[1], r[2], r[3], [tuple(x) for x in json.loads(r[4])], json.loads(r[5]), r[6])
                for r in rows]

    def publish_pass(self, pass_id: str, into_session: str | None = None) -> bool:
        with self.tx() as c:  # (BEGIN IMMEDIATE: the stage and the sessions are this writer's)
            return passes.publish(self._pass_writes(c), pass_id, into_session)

    def _pass_writes(self, c: sqlite3.Connection) -> passes.PortablePassWrites:
        return passes.PortablePassWrites(lambda sql, params=(): c.execute(sql, tuple(params)),
                                         lambda sid, items: self._write_context(c, sid, items))

    def discard_pass(self, pass_id: str) -> None:
        with self.tx() as c:
            self._pass_writes(c).delete_passes([pass_id])

    def discard_stale(self, session_id: str, keep: str | None = None) -> int:
        with self.tx() as c:
            return passes.discard_stale(self._pass_writes(c), session_id, keep)

    # -- summaries -------------------------------------------------------------------

    def get_summaries(self, ids: Sequence[int], include_staged: bool = False) -> dict[int, SummaryRecord]:
        out: dict[int, SummaryRecord] = {}
        ids = list(dict.fromkeys(int(i) for i in ids))
        state = "" if include_staged else " AND state='published'"
        for i in range(0, len(ids), 500):
            chunk = ids[i : i + 500]
            q = f"SELECT {SUM_COLS} FROM summaries WHERE id IN ({','.join('?' * len(chunk))}){state}"
            for row in self.conn().execute(q, chunk):
                out[row[0]] = summary_record(row)
        return out

    def summary_children(self, summary_id: int) -> tuple[list[int], list[int]]:
        c = self.conn()
        kids = [r[0] for r in c.execute(
            "SELECT child_id FROM summary_parents WHERE parent_id=? ORDER BY ord", (summary_id,))]
        msgs = [r[0] for r in c.execute(
            "SELECT message_id FROM summary_messages WHERE summary_id=? ORDER BY ord", (summary_id,))]
        return kids, msgs

    def summary_parents(self, summary_id: int) -> list[int]:
        return [r[0] for r in self.conn().execute(
            "SELECT sp.parent_id FROM summary_parents sp JOIN summaries s ON s.id = sp.parent_id"
            " WHERE sp.child_id=? AND s.state='published' ORDER BY sp.parent_id", (summary_id,))]

    def message_summaries(self, message_id: int) -> list[int]:
        return [r[0] for r in self.conn().execute(
            "SELECT sm.summary_id FROM summary_messages sm JOIN summaries s ON s.id = sm.summary_id"
            " WHERE sm.message_id=? AND s.state='published' ORDER BY sm.summary_id", (message_id,))]

    def update_summary_text(self, summary_id: int, text: str, tokens: int, level: str, summarizer: str) -> None:
        with self.tx() as c:
            c.execute(
                "UPDATE summaries SET text=?, tokens=?, level=?, summarizer=? WHERE id=?",
                (clean_text(text), tokens, level, summarizer, summary_id),
            )

    def rebalance_summary(self, summary_id: int, summaries: Sequence[NewSummary],
                          child_keys: Sequence[str | int], depth: int) -> dict[str, int]:
        keymap: dict[str, int] = {}
        now = time.time()
        with self.tx() as c:
            session_id = c.execute("SELECT session_id FROM summaries WHERE id=?", (summary_id,)).fetchone()[0]
            for s in summaries:
                sid = _insert_summary(c, session_id, s, s.text, "published", None, now)
                keymap[s.key] = sid
                c.executemany("INSERT INTO summary_parents(parent_id, child_id, ord) VALUES (?,?,?)",
                              [(sid, keymap[k] if isinstance(k, str) else k, i) for i, k in enumerate(s.child_keys)])
            c.execute("DELETE FROM summary_parents WHERE parent_id=?", (summary_id,))
            c.executemany("INSERT INTO summary_parents(parent_id, child_id, ord) VALUES (?,?,?)",
                          [(summary_id, keymap[k] if isinstance(k, str) else k, i) for i, k in enumerate(child_keys)])
            c.execute("UPDATE summaries SET depth=? WHERE id=?", (depth, summary_id))
        return keymap

    # -- presummaries ------------------------------------------------------------------

    def put_presummary(self, session_id: str, span_key: str, text: str, tokens: int, source_tokens: int,
                       level: str, summarizer: str) -> None:
        with self.tx() as c:
            c.execute(
                "INSERT OR REPLACE INTO presummaries(session_id, span_key, text, tokens, source_tokens, level,"
                " summarizer, created_at) VALUES (?,?,?,?,?,?,?,?)",
                (session_id, span_key, clean_text(text), tokens, source_tokens, level, summarizer, time.time()),
            )

    def get_presummary(self, session_id: str, span_key: str) -> dict[str, Any] | None:
        row = self.conn().execute(
            "SELECT text, tokens, source_tokens, level, summarizer FROM presummaries WHERE session_id=? AND span_key=?",
            (session_id, span_key),
        ).fetchone()
        if row is None:
            return None
        return dict(zip(("text", "tokens", "source_tokens", "level", "summarizer"), row))

    def count_presummaries(self, session_id: str | None = None) -> int:
        if session_id is None:
            return self.conn().execute("SELECT COUNT(*) FROM presummaries").fetchone()[0]
        return self.conn().execute("SELECT COUNT(*) FROM presummaries WHERE session_id=?", (session_id,)).fetchone()[0]

    # -- maintenance -----------------------------------------------------------------------

    def stats(self, session_id: str | None = None) -> dict[str, Any]:
        c = self.conn()
        w, p = ("", ()) if session_id is None else (" WHERE session_id=?", (session_id,))
        msgs = c.execute(f"SELECT COUNT(*), COALESCE(SUM(tokens),0) FROM messages{w}", p).fetchone()
        by_depth = {
            int(d): n
            for d, n in c.execute(
                f"SELECT depth, COUNT(*) FROM summaries{w}{' AND' if w else ' WHERE'} state='published'"
                " GROUP BY depth ORDER BY depth", p)
        }
        staged = c.execute(
            f"SELECT COUNT(*) FROM summaries{w}{' AND' if w else ' WHERE'} state='staged'", p).fetchone()[0]
        sess = c.execute("SELECT COUNT(*), COALESCE(SUM(compactions),0), MAX(last_compaction_at) FROM sessions"
                         + ("" if session_id is None else " WHERE id=?"), p).fetchone()
        try:
            size = sum(os.path.getsize(self.location + suf) for suf in ("", "-wal") if os.path.exists(self.location + suf))
        except OSError:
            size = 0
        return {
            "backend": "sqlite",
            "location": self.location,
            "bytes": size,
            "sessions": sess[0],
            "messages": msgs[0],
            "message_tokens": msgs[1],
            "summaries_by_depth": by_depth,
            "staged_summaries": staged,
            "compactions": sess[1],
            "last_compaction_at": sess[2],
            # (whole store) messages stored but not yet in the full-text index (index.py)
            "unindexed_messages": self._indexer.pending(),
        }

    @contextlib.contextmanager
    def compaction_lock(self, session_id: str, timeout: float) -> Iterator[bool]:
        """flock on a per-session file: works across threads and processes, and is
        released by the kernel if the holder dies (SIGKILL leaves no stale lock)."""
        lockdir = Path(self.location + ".locks")
        _private_dir(lockdir, ours=True)
        name = hashlib.blake2b(session_id.encode("utf-8", "surrogatepass"), digest_size=12).hexdigest()
        path = lockdir / f"{name}.lock"
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
        acquired = False
        try:
            deadline = time.monotonic() + max(0.0, timeout)
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    acquired = True
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        break
                    time.sleep(0.02)
            yield acquired
        finally:
            if acquired:
                try:
                    fcntl.flock(fd, fcntl.LOCK_UN)
                except OSError:
                    pass
            os.close(fd)


def _insert_summary(c: sqlite3.Connection, session_id: str, s: NewSummary, text: str, state: str,
                    pass_id: str | None, now: float) -> int:
    """Insert one summary node under a fresh id; its id. Ids are never reused (a discarded
    stage's ids must not name new nodes: adoption is judged by the ids in the host's summary
    marker)."""
    sid = c.execute("UPDATE summary_id_watermark SET id = MAX(id, (SELECT COALESCE(MAX(id), 0)"
                    " FROM summaries)) + 1 RETURNING id").fetchone()[0]
    c.execute(
        "INSERT INTO summaries(id, session_id, kind, depth, text, tokens, source_tokens, level,"
        " summarizer, t_start, t_end, n_messages, state, pass_id, created_at)"
        " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        (sid, session_id, s.kind, s.depth, clean_text(text), s.tokens, s.source_tokens, s.level,
         s.summarizer, s.t_start, s.t_end, s.n_messages, state, pass_id, now),
    )
    return sid
