"""PostgreSQL store connections: the pools, one-transaction writes with retries, migrations
and the advisory compaction lock (the mixin :class:`~.postgres.PostgresStore` is built on).

psycopg 3 with a small ``psycopg_pool.ConnectionPool`` (autocommit), opened on first use,
never at construction; migrations run then, once per process, serialised across processes
and hosts by ``pg_advisory_xact_lock``. A forked child opens its own pools.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import random
import re
import threading
import time
import weakref
from typing import Any, Callable, Iterator, TypeVar
from urllib.parse import urlsplit, urlunsplit

from ..base import StoreError
from .. import migrate
from .deadline import fired, watch
from .migrations import DEFINITIONS, MIGRATION_LOCK_KEY, MIGRATIONS, OPTIONAL

try:  # optional dependency: `pip install lossless-context[postgres]`
    import psycopg
    from psycopg import errors as pg_errors
    from psycopg_pool import ConnectionPool, PoolTimeout
except ImportError:  # pragma: no cover - reported when the store is first used
    # Without psycopg the module still imports: the store reports the install hint on use.
    psycopg = None  # type: ignore[assignment]  # (see above)
    pg_errors = None  # type: ignore[assignment]  # (see above)
    ConnectionPool = None  # type: ignore[assignment,misc]  # (see above)
    PoolTimeout = Exception  # type: ignore[assignment,misc]  # (see above)

log = logging.getLogger("lossless_context.store")


def _pipelined_transaction(conn: Any, fn: Callable[[Any], T]) -> T:
    """`fn(conn)` between BEGIN and COMMIT, all in one pipeline: COMMIT's answer comes with the
    pipeline's closing sync (psycopg's transaction block would add a sync of its own). Whatever
    fails — a statement, the commit, `fn` itself — leaves no transaction open."""
    try:
        with conn.pipeline():
            conn.execute("BEGIN")
            out = fn(conn)
            conn.execute("COMMIT")
        return out
    except BaseException:
        if not conn.closed and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            try:
                conn.execute("ROLLBACK")
            except psycopg.Error:  # the connection is broken: the pool discards it
                pass
        raise


def rolled_back(exc: BaseException) -> bool:
    """Whether the server rolled the transaction back and it may simply run again: SQLSTATE
    class 40 (serialization failure 40001, deadlock 40P01, ...). psycopg's classes for those
    codes derive from OperationalError, not from its TransactionRollback (class 40's own
    code): an isinstance check on that class missed every deadlock."""
    return isinstance(exc, psycopg.Error) and str(getattr(exc, "sqlstate", None) or "").startswith("40")


def pipeline_supported() -> bool:
    """Whether this psycopg and its libpq can run pipeline mode (libpq 14+)."""
    if psycopg is None:
        return False
    try:
        return bool(psycopg.Pipeline.is_supported())
    except Exception:  # an old psycopg without the check: the plain path
        return False

T = TypeVar("T")

POOL_MIN, POOL_MAX = 1, 4
LOCK_POOL_MAX = 16
# Hot-path limits: the engine runs inside the host's turn loop, and the store circuit
# breaker (store/guard.py) makes every call fail fast for a cool-down after one timeout.
CONNECT_TIMEOUT = 5.0  # seconds to reach the server
POOL_TIMEOUT = 5.0  # seconds to wait for a free (or re-established) pooled connection
STATEMENT_TIMEOUT_MS = 60_000  # one statement; a server that accepts and never answers
# Client-side bounds (deadline.py): a server that is frozen (a paused VM, SIGSTOP, a storage
# stall) answers no statement_timeout, keepalive or TCP timeout; these end the call anyway.
CALL_TIMEOUT = 10.0  # one store call (its statements, its transaction) on the hot path
CHECK_TIMEOUT = 3.0  # the pool's round trip over a connection that sat idle
MAINTENANCE_TIMEOUT = 900.0  # lcm doctor, export, import, migrations: whole-store work
# Dead peers and partitions: the kernel notices an idle connection's peer is gone after
# about a minute (keepalives), and unacknowledged data fails after the call bound.
_KEEPALIVES = {"keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10, "keepalives_count": 3}
# JIT off: our statements run in milliseconds, but the planner's cost of a search's pending-rows
# branch (a table the indexer keeps near-empty, its statistics often stale) crosses
# jit_above_cost, and compiling then took 270-360 ms of a 4 ms search at 100k messages.
_SESSION_OPTIONS = f"-c statement_timeout={STATEMENT_TIMEOUT_MS} -c jit=off"
WRITE_RETRIES = 6


def _lock_key(namespace: str, name: str) -> int:
    """A signed 64-bit advisory-lock key, the same on every host and server version."""
    data = namespace.encode() + b"\x00" + name.encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big", signed=True)


def _mask_dsn(dsn: str) -> str:
    """The DSN without its password (it shows in stats and logs)."""
    try:
        parts = urlsplit(dsn)
        if parts.password is not None:
            user, host = parts.netloc.rsplit("@", 1)[0].split(":", 1)[0], parts.netloc.rsplit("@", 1)[1]
            parts = parts._replace(netloc=f"{user}:***@{host}")
        query = re.sub(r"(?i)(^|&)(password=)[^&]*", r"\1\2***", parts.query)
        return urlunsplit(parts._replace(query=query))
    except (ValueError, IndexError):
        return re.sub(r":[^:@/]*@", ":***@", dsn)


IDLE_CHECK_SECONDS = 2.0  # a pooled connection idle longer than this is checked before use
_returned: "weakref.WeakKeyDictionary[Any, float]" = weakref.WeakKeyDictionary()


def _mark_returned(conn: Any) -> None:
    """Remember when the connection was last handed back. Called by the store itself as it
    hands a connection back, not as the pool's ``reset`` hook: with a reset hook the pool
    returns every connection through its worker thread (a queue hand-off per store call,
    ~0.1 ms of the ~0.25 ms a one-row read took)."""
    _returned[conn] = time.monotonic()


def _check_if_idle(conn: Any, seconds: float = CHECK_TIMEOUT) -> None:
    """Pool check hook: a round trip (``check_connection``) only for a connection that sat
    idle for a while (a server restart or an idle timeout may have ended it); a connection
    in steady use is handed out as is, saving a round trip on every store call. A call
    that still meets a dead connection fails with StoreError; the pool drops that one.
    The round trip itself is bounded (a frozen server never answers it): past `seconds`
    the connection is cut, the check fails, and the pool tries another until its timeout."""
    last = _returned.get(conn)
    if last is None or time.monotonic() - last >= IDLE_CHECK_SECONDS:  # (>=: 0 checks every checkout)
        with watch(conn, seconds):
            ConnectionPool.check_connection(conn)


class PostgresConnections:
    """Connection handling for the PostgreSQL store."""

    location: str

    def __init__(self, location: str, *, pool_max: int = POOL_MAX, call_timeout: float = CALL_TIMEOUT) -> None:
        """`call_timeout`: the client-side bound of one store call (seconds)."""
        self._dsn = location
        self.location = _mask_dsn(location)
        self._pool_max = max(POOL_MIN, int(pool_max))
        self._call_timeout = max(0.1, float(call_timeout))
        self._pool: Any = None
        self._lock_pool: Any = None
        self._pool_lock = threading.Lock()
        self._pid = os.getpid()

    # -- connections ----------------------------------------------------------------

    def _pools(self) -> tuple[Any, Any]:
        pool, lock_pool = self._pool, self._lock_pool
        if pool is not None and lock_pool is not None and self._pid == os.getpid():
            return pool, lock_pool
        with self._pool_lock:
            if self._pid != os.getpid():
                # A forked child must not touch the parent's sockets (closing them would end
                # the parent's sessions): forget the inherited pools and open new ones.
                self._pool = self._lock_pool = None
                self._pid = os.getpid()
            if self._pool is None:
                if psycopg is None:
                    raise StoreError(
                        "the PostgreSQL store needs psycopg 3 and psycopg-pool: "
                        "pip install 'lossless-context[postgres]'")
                # Connect and migrate directly first: an unreachable server fails fast and
                # clearly here instead of inside the pool's background reconnect loop.
                with self._connect_once() as conn:
                    try:
                        self._migrate(conn)
                    except psycopg.Error as exc:
                        if conn.closed:  # cut by its deadline: the server did not answer
                            raise StoreError(f"cannot open store {self.location}: timeout: no answer"
                                             f" ({str(exc).strip()})") from exc
                        raise StoreError(f"cannot migrate store {self.location}: {str(exc).strip()}") from exc
                self._pool = self._new_pool(POOL_MIN, self._pool_max, "lcm")
                self._lock_pool = self._new_pool(0, LOCK_POOL_MAX, "lcm-locks")
                opened = True
            else:
                opened = False
            pools = (self._pool, self._lock_pool)
        if opened:
            self._on_open()
        return pools

    def _on_open(self) -> None:
        """Called once the pools are open (the store starts its background work here)."""

    def _connect_once(self) -> Any:
        kwargs: dict[str, Any] = self._conn_kwargs()
        try:
            if "connect_timeout" not in psycopg.conninfo.conninfo_to_dict(self._dsn):
                kwargs["connect_timeout"] = int(CONNECT_TIMEOUT)
        except psycopg.ProgrammingError as exc:
            raise StoreError(f"invalid store DSN {self.location}: {exc}") from exc
        try:
            return psycopg.connect(self._dsn, **kwargs)
        except psycopg.Error as exc:
            raise StoreError(f"cannot open store {self.location}: {str(exc).strip()}") from exc

    def _conn_kwargs(self) -> dict[str, Any]:
        """Connection parameters for every connection: autocommit, and the connect and
        statement timeouts, TCP keepalives and the TCP user timeout unless the DSN sets
        its own."""
        kwargs: dict[str, Any] = {"autocommit": True}
        try:
            given = psycopg.conninfo.conninfo_to_dict(self._dsn)
        except psycopg.ProgrammingError:
            return kwargs
        if "connect_timeout" not in given:
            kwargs["connect_timeout"] = int(CONNECT_TIMEOUT)
        if "options" not in given:
            kwargs["options"] = _SESSION_OPTIONS
        for key, value in _KEEPALIVES.items():
            if key not in given:
                kwargs[key] = value
        if "tcp_user_timeout" not in given and psycopg.pq.version() >= 120000:  # (libpq 12+)
            kwargs["tcp_user_timeout"] = int(self._call_timeout * 1000)
        return kwargs

    def _new_pool(self, min_size: int, max_size: int, name: str) -> Any:
        # Opened without waiting: the server was just reached; the pool fills in the background.
        pool = ConnectionPool(
            self._dsn, min_size=min_size, max_size=max_size, open=False, name=name,
            kwargs=self._conn_kwargs(), check=self._check,
            timeout=POOL_TIMEOUT, num_workers=1,
        )
        pool.open(wait=False)
        return pool

    def _check(self, conn: Any) -> None:
        _check_if_idle(conn, min(CHECK_TIMEOUT, self._call_timeout))

    def _expired(self, seconds: float, exc: BaseException | None = None) -> StoreError:
        why = f" ({str(exc).strip().splitlines()[0]})" if exc is not None and str(exc).strip() else ""
        return StoreError(f"store {self.location}: timeout: the server did not answer within {seconds:g} s"
                          f" (client-side bound){why}")

    @contextlib.contextmanager
    def _connection(self, seconds: float | None = None) -> Iterator[Any]:
        """A pooled connection for one store call, bounded by `seconds` on the client side
        (the call bound by default): past it the connection is cut (deadline.py) and the
        call fails with a StoreError saying so — an outage for the store's breaker."""
        pool, _ = self._pools()
        bound = self._call_timeout if seconds is None else float(seconds)
        w = None
        try:
            with pool.connection() as conn:
                try:
                    with watch(conn, bound) as w:
                        yield conn
                    if fired(w):
                        conn.close()  # (it answered just as it was cut: never hand it out again)
                finally:
                    _mark_returned(conn)
        except PoolTimeout as exc:
            raise StoreError(f"store {self.location}: no connection available: {exc}") from exc
        except psycopg.Error as exc:
            if fired(w):
                raise self._expired(bound, exc) from exc
            if not isinstance(exc, psycopg.OperationalError) or rolled_back(exc):
                raise
            raise StoreError(f"store {self.location}: {exc}") from exc

    def maintenance_connection(self) -> contextlib.AbstractContextManager[Any]:
        """A pooled connection for the SQL checks of operations (`lcm doctor`): reads only;
        changes go through the store's own methods. Bounded by MAINTENANCE_TIMEOUT."""
        return self._connection(MAINTENANCE_TIMEOUT)

    def read_sql(self, fn: Callable[[Any], T]) -> T:
        """`fn(connection)` for the SQL of operations (export, doctor): reads only."""
        return self._read(fn, MAINTENANCE_TIMEOUT)

    def write_sql(self, fn: Callable[[Any], T]) -> T:
        """`fn(connection)` in one transaction, for operations that write rows as they are
        (import): the store's own methods are used for everything else."""
        return self._write(fn, MAINTENANCE_TIMEOUT)

    def _read(self, fn: Callable[[Any], T], seconds: float | None = None) -> T:
        with self._connection(seconds) as conn:
            return fn(conn)

    def _write(self, fn: Callable[[Any], T], seconds: float | None = None, *, pipeline: bool = False) -> T:
        """Run `fn(conn)` in one transaction; deadlocks and serialisation failures retry.

        `pipeline`: in libpq's pipeline mode, so BEGIN, the statements `fn` sends without
        reading a result, and COMMIT travel together: a round trip per result `fn` reads
        (plus one) instead of one per statement. Errors still surface (at the next read, or at
        the end) and roll the transaction back (_pipelined_transaction)."""
        if pg_errors is None:  # psycopg missing: the install hint, not an AttributeError below
            self._pools()
        piped = pipeline and pipeline_supported()
        for attempt in range(WRITE_RETRIES):
            try:
                with self._connection(seconds) as conn:
                    if piped:
                        return _pipelined_transaction(conn, fn)
                    with conn.transaction():
                        return fn(conn)
            except psycopg.Error as exc:
                if not rolled_back(exc):
                    raise
                if attempt == WRITE_RETRIES - 1:  # (rolled back: safe to run again)
                    raise StoreError(f"store {self.location}: {exc}") from exc
                time.sleep(0.01 * (2 ** attempt) * (1 + random.random()))
        raise AssertionError("unreachable")  # pragma: no cover

    def _migrate(self, conn: Any) -> None:
        def recorded() -> tuple[set[str], dict[str, int]]:
            return recorded_schema(conn)

        def apply(name: str, sql: str) -> bool:
            conn.execute(sql)
            conn.execute("INSERT INTO lcm_migrations(name, applied_at) VALUES (%s, %s)", (name, time.time()))
            return True

        def define(d: migrate.Definition) -> None:
            # (a definition's text is a literal of migrations/functions.py, read by name: the SQL
            # check cannot follow a dataclass field, so the statement is run through a callback)
            d.run(lambda sql: conn.execute(sql))
            conn.execute("INSERT INTO lcm_definitions(name, revision, applied_at) VALUES (%s, %s, %s)"
                         " ON CONFLICT (name) DO UPDATE SET revision = excluded.revision,"
                         " applied_at = excluded.applied_at", (d.name, d.revision, time.time()))

        with watch(conn, self._call_timeout):  # every open asks this: the hot path's bound
            names, revisions = recorded()
            if not migrate.pending(MIGRATIONS, names) and not migrate.definitions_due(DEFINITIONS, revisions):
                return
        # Migrating may build indexes over a large table (and wait for another process's
        # migration): bounded, but by the maintenance bound. One transaction holds the lock;
        # an optional entry runs in a savepoint (conn.transaction() nested). The functions'
        # current definitions (migrations/functions.py) run after the migrations, in the same
        # transaction.
        with watch(conn, MAINTENANCE_TIMEOUT), conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_KEY,))
            conn.execute(
                "CREATE TABLE IF NOT EXISTS lcm_migrations"
                " (name TEXT PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS lcm_definitions"
                " (name TEXT PRIMARY KEY, revision INTEGER NOT NULL, applied_at DOUBLE PRECISION NOT NULL)")
            # (re-read under the lock: another process may have migrated)
            migrate.apply_pending(self.location, MIGRATIONS, recorded()[0], apply, optional=OPTIONAL,
                                  savepoint=conn.transaction, failure=psycopg.Error)
            migrate.apply_definitions(self.location, DEFINITIONS, recorded()[1], define)

    def applied_migrations(self) -> list[str]:
        return self._read(lambda c: [r[0] for r in c.execute("SELECT name FROM lcm_migrations ORDER BY name")])

    def migration_state(self) -> migrate.MigrationState:
        """The store's migrations against this version's list (`lcm doctor`); a function whose
        current definition the store lacks counts as a pending entry."""
        names, revisions = self._read(recorded_schema)
        state = migrate.MigrationState.of(MIGRATIONS, names, OPTIONAL)
        due = [f"{d.name} (definition, revision {d.revision})" for d in migrate.definitions_due(DEFINITIONS, revisions)]
        return dataclasses.replace(state, pending=state.pending + due)

    def close(self) -> None:
        self._drop_pools(timeout=5.0)

    def reset_connections(self) -> None:
        """After an outage: drop the pools. The next call then connects directly (it fails
        fast and clearly, or the store is back at once) instead of waiting on a pool's
        reconnect back-off, and no pool keeps retrying (and logging) in the background.
        The pools close on a thread of their own: the caller does not wait for their workers
        (one may be inside a connect to a server that does not answer), and they get the time
        to stop quietly."""
        pools = self._take_pools()
        if any(p is not None for p in pools):
            threading.Thread(target=self._close_pools, args=(pools, CONNECT_TIMEOUT + 1.0),
                             name="lcm-pg-close", daemon=True).start()

    def _drop_pools(self, timeout: float) -> None:
        self._close_pools(self._take_pools(), timeout)

    def _take_pools(self) -> tuple[Any, Any]:
        with self._pool_lock:
            pools, self._pool, self._lock_pool = (self._pool, self._lock_pool), None, None
        return pools

    @staticmethod
    def _close_pools(pools: tuple[Any, Any], timeout: float) -> None:
        for p in pools:
            if p is not None:
                try:
                    p.close(timeout=timeout)
                except Exception:  # pragma: no cover - closing must not raise
                    pass

    @contextlib.contextmanager
    def compaction_lock(self, session_id: str, timeout: float) -> Iterator[bool]:
        """A session-level advisory lock on a dedicated connection: works across threads,
        processes and hosts, and the server releases it if the holder's connection dies."""
        _, lock_pool = self._pools()
        key = _lock_key("lcm.compaction", session_id)
        try:
            conn = lock_pool.getconn()
        except PoolTimeout as exc:
            raise StoreError(f"store {self.location}: no connection for the compaction lock: {exc}") from exc
        acquired = False
        try:
            deadline = time.monotonic() + max(0.0, timeout)
            w = None
            try:
                while True:
                    with watch(conn, self._call_timeout) as w:
                        got = conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()[0]
                    if fired(w):  # (answered as it was cut: whatever it said, the session is gone)
                        raise self._expired(self._call_timeout)
                    if got:
                        acquired = True
                        break
                    if time.monotonic() >= deadline:
                        break
                    time.sleep(0.02)
            except psycopg.Error as exc:
                if fired(w):
                    raise self._expired(self._call_timeout, exc) from exc
                if not isinstance(exc, psycopg.OperationalError):
                    raise
                raise StoreError(f"store {self.location}: compaction lock failed: {exc}") from exc
            yield acquired
        finally:
            clean = not conn.closed
            if acquired and clean:
                try:
                    with watch(conn, self._call_timeout) as w:
                        clean = bool(conn.execute("SELECT pg_advisory_unlock(%s)", (key,)).fetchone()[0])
                    clean = clean and not fired(w)
                except psycopg.Error:
                    clean = False
            if not clean:
                conn.close()  # never hand a connection that may still hold the lock to anyone
            lock_pool.putconn(conn)


def recorded_schema(conn: Any) -> tuple[set[str], dict[str, int]]:
    """What a store recorded: the names of its migrations and each function definition's
    revision (empty for a store that has no such table yet)."""
    migrations, definitions = conn.execute(
        "SELECT to_regclass('lcm_migrations'), to_regclass('lcm_definitions')").fetchone()
    names = {r[0] for r in conn.execute("SELECT name FROM lcm_migrations")} if migrations is not None else set()
    revisions = ({r[0]: r[1] for r in conn.execute("SELECT name, revision FROM lcm_definitions")}
                 if definitions is not None else {})
    return names, revisions
