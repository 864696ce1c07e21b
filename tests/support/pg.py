"""A throw-away PostgreSQL server for the test run.

Finds Debian's server binaries (``/usr/lib/postgresql/*/bin``, or ``$LCM_PG_BINDIR``, or
``pg_config --bindir``; ``$LCM_PG_BINDIR``, when set, is the only place looked at), runs ``initdb -A trust`` in a temporary directory and starts the
server with ``pg_ctl -w`` listening only on 127.0.0.1 (a free port) and on a unix socket
inside that directory. As root the server runs as an unprivileged user (``postgres`` if it
exists, else ``nobody``) via ``runuser``. Everything is stopped and deleted at the end.

Fixtures (imported by ``tests/conftest.py``):

* ``pg_server`` (session) — the :class:`PgServer`;
* ``pg_dsn`` (session) — DSN of a database shared by the whole run;
* ``pg_fresh_dsn`` (function) — DSN of a new, empty database for one test.

Without server binaries the fixtures skip, unless ``LCM_REQUIRE_POSTGRES`` is set (CI
sets it): then they fail loudly. A server that is found but does not start always fails.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

SUPERUSER = "lcm"


def required() -> bool:
    return os.environ.get("LCM_REQUIRE_POSTGRES", "").strip().lower() not in ("", "0", "false", "no")


def find_bindir() -> Path | None:
    env = os.environ.get("LCM_PG_BINDIR")
    if env:  # an explicit choice: use exactly that directory
        p = Path(env)
        return p if all((p / b).is_file() for b in ("initdb", "pg_ctl", "postgres")) else None
    cands: list[Path] = []

    def version(p: str) -> tuple[int, ...]:
        v = Path(p).parent.parent.name
        return tuple(int(x) for x in v.split(".") if x.isdigit()) or (0,)

    cands += [Path(p).parent for p in sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=version, reverse=True)]
    pg_config = shutil.which("pg_config")
    if pg_config:
        try:
            out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, timeout=10).stdout.strip()
            if out:
                cands.append(Path(out))
        except (OSError, subprocess.SubprocessError):
            pass
    which = shutil.which("initdb")
    if which:
        cands.append(Path(which).parent)
    for c in cands:
        if (c / "initdb").is_file() and (c / "pg_ctl").is_file() and (c / "postgres").is_file():
            return c
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _world_traversable(path: Path) -> bool:
    for p in [path, *path.parents]:
        try:
            if not p.stat().st_mode & 0o001:
                return False
        except OSError:
            return False
    return True


class PgServer:
    """One PostgreSQL cluster in a temporary directory."""

    def __init__(self, bindir: Path, shared_buffers: str = "32MB") -> None:
        # (the test run's many small servers stay small; the bench sizes its one server's cache
        # for its store, as an operator sizes a gateway's server)
        self.bindir = bindir
        self.shared_buffers = shared_buffers
        self.user: str | None = None
        if os.geteuid() == 0:
            for name in ("postgres", "nobody"):
                try:
                    pwd.getpwnam(name)
                except KeyError:
                    continue
                self.user = name
                break
            if self.user is None:
                raise RuntimeError("running as root and no unprivileged user (postgres, nobody) exists")
        parent = Path(tempfile.gettempdir())
        if self.user and not _world_traversable(parent):
            parent = Path("/tmp")
        self.base = Path(tempfile.mkdtemp(prefix="lcm-pg-", dir=parent))
        self.data = self.base / "data"
        self.log = self.base / "server.log"
        self.port = 0
        self.started = False
        self._file_copy: bool | None = None
        if self.user:
            pw = pwd.getpwnam(self.user)
            os.chown(self.base, pw.pw_uid, pw.pw_gid)
        os.chmod(self.base, 0o700)

    # -- process helpers ---------------------------------------------------------
    def _cmd(self, *args: str) -> list[str]:
        if self.user:
            runuser = shutil.which("runuser")
            if runuser:
                return [runuser, "-u", self.user, "--", *args]
            return ["su", "-s", "/bin/sh", self.user, "-c", " ".join(_shq(a) for a in args)]
        return list(args)

    def _run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_ALL"] = "C"
        return subprocess.run(self._cmd(*args), capture_output=True, text=True, timeout=timeout,
                              env=env, cwd=str(self.base), stdin=subprocess.DEVNULL)

    def start(self) -> None:
        res = self._run(str(self.bindir / "initdb"), "-D", str(self.data), "-A", "trust", "-U", SUPERUSER,
                        "-E", "UTF8", "--locale=C", "--no-sync")
        if res.returncode != 0:
            raise RuntimeError(f"initdb failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
        last = ""
        for _ in range(5):  # a port picked as free can be taken before the server binds it
            self.port = _free_port()
            opts = (f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.base}"
                    " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
                    f" -c max_connections=300 -c shared_buffers={self.shared_buffers}")
            res = self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.log),
                            "-w", "-t", "60", "-o", opts, "start")
            if res.returncode == 0:
                self._opts = opts
                self.started = True
                atexit.register(self.stop)
                return
            last = f"{res.stdout}\n{res.stderr}\n{self._log_tail()}"
            self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        raise RuntimeError(f"pg_ctl start failed:\n{last}")

    def pause(self) -> None:
        """Stop the server as an operator's restart would (fast: open connections are cut)."""
        res = self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")
        if res.returncode != 0:
            raise RuntimeError(f"pg_ctl stop failed:\n{res.stdout}\n{res.stderr}")

    def resume(self) -> None:
        """Start the paused server again: same data directory, same port."""
        res = self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.log),
                        "-w", "-t", "60", "-o", self._opts, "start")
        if res.returncode != 0:
            raise RuntimeError(f"pg_ctl start failed:\n{res.stdout}\n{res.stderr}\n{self._log_tail()}")

    def server_pids(self) -> list[int]:
        """The postmaster and every process it started (backends, background workers)."""
        try:
            postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError) as exc:
            raise RuntimeError(f"no running postmaster in {self.data}: {exc}") from exc
        pids = [postmaster]
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid == postmaster:
                pids.append(int(entry))
        return pids

    @contextlib.contextmanager
    def frozen(self):
        """The server frozen as a paused VM or a storage stall freezes it: SIGSTOP to the
        postmaster and its backends (the kernel still accepts connections and acknowledges
        every packet; nothing answers). Always thawed (SIGCONT) on the way out."""
        pids = self.server_pids()
        stopped: list[int] = []
        try:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGSTOP)
                    stopped.append(pid)
                except ProcessLookupError:
                    pass
            yield pids
        finally:
            for pid in stopped:
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass

    def _log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.started:
            self.started = False
            try:
                self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop",
                          timeout=60)
            except (OSError, subprocess.SubprocessError):
                pass
        shutil.rmtree(self.base, ignore_errors=True)

    # -- databases ----------------------------------------------------------------
    def dsn(self, dbname: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{dbname}?sslmode=disable"

    def admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(self.dsn("postgres"), autocommit=True, connect_timeout=10) as c:
            c.execute(sql)

    def create_database(self, prefix: str = "test") -> str:
        name = f"{prefix}_{uuid.uuid4().hex[:16]}"
        if self._file_copy is None:
            import psycopg

            with psycopg.connect(self.dsn("postgres"), autocommit=True, connect_timeout=10) as c:
                self._file_copy = int(c.execute("SHOW server_version_num").fetchone()[0]) >= 150000
        # FILE_COPY (PostgreSQL 15+) skips WAL-logging the template: faster with fsync off.
        strategy = " STRATEGY = FILE_COPY" if self._file_copy else ""
        self.admin(f"CREATE DATABASE {name} TEMPLATE template0{strategy}")
        return name

    def drop_database(self, name: str) -> None:
        for sql in (f"DROP DATABASE IF EXISTS {name} WITH (FORCE)", f"DROP DATABASE IF EXISTS {name}"):
            try:  # WITH (FORCE) needs PostgreSQL 13+
                self.admin(sql)
                return
            except Exception:  # the server goes away at the end anyway
                continue


def _shq(s: str) -> str:
    return "'" + s.replace("'", "'\\''") + "'"


def start_server() -> PgServer:
    """Start a server or skip/fail as the environment demands (see the module docstring)."""
    bindir = find_bindir()
    if bindir is None:
        msg = ("PostgreSQL server binaries not found (install postgresql, or set LCM_PG_BINDIR)")
        if required():
            pytest.fail(msg + " and LCM_REQUIRE_POSTGRES is set", pytrace=False)
        pytest.skip(msg)
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError as exc:
        if required():
            pytest.fail(f"psycopg 3 / psycopg-pool missing and LCM_REQUIRE_POSTGRES is set: {exc}", pytrace=False)
        pytest.skip(f"psycopg 3 / psycopg-pool missing: {exc}")
    server = PgServer(bindir)
    try:
        server.start()
    except BaseException as exc:
        server.stop()
        pytest.fail(f"could not start a test PostgreSQL server from {bindir}: {exc}", pytrace=False)
    return server


def close_pools(dbname: str | None = None) -> int:
    """Close the psycopg connection pools still open (on ``dbname`` only, when given): an
    engine or store a test did not close keeps its pool, whose worker thread reconnects to a
    dropped database or a stopped server for the rest of the run (log noise, connections
    held, and its jitter draws from the global ``random`` module while hypothesis generates
    data). How many were closed."""
    try:
        from psycopg_pool import ConnectionPool
    except ImportError:
        return 0
    pools = [o for o in gc.get_objects() if isinstance(o, ConnectionPool) and not o.closed
             and (dbname is None or f"/{dbname}?" in o.conninfo or o.conninfo.endswith(f"/{dbname}"))]
    for pool in pools:
        try:
            pool.close(timeout=2.0)
        except Exception:  # best effort: the server goes away at the end anyway
            pass
    return len(pools)


@pytest.fixture(scope="session")
def pg_server():
    server = start_server()
    try:
        yield server
    finally:
        close_pools()
        server.stop()


@pytest.fixture(scope="session")
def pg_dsn(pg_server: PgServer) -> str:
    """A database shared by the whole test run."""
    return pg_server.dsn(pg_server.create_database("shared"))


@pytest.fixture
def pg_fresh_dsn(pg_server: PgServer):
    """A new, empty database for one test, dropped afterwards."""
    name = pg_server.create_database()
    yield pg_server.dsn(name)
    close_pools(name)
    pg_server.drop_database(name)


def module_store_location(request, tmp_path_factory, name: str) -> str:
    """For a module fixture parametrised over ["sqlite", "postgres"]: a fresh store location
    (a new database on the shared server, or a file in a new temporary directory)."""
    if request.param == "postgres":
        server = request.getfixturevalue("pg_server")
        return server.dsn(server.create_database(name))
    return str(tmp_path_factory.mktemp(name) / "lcm.db")


def counted(store, c, counter_sql: str, fn):
    """(fn(), how much a server statistics counter grew while fn ran). ``counter_sql`` reads
    one number from pg_stat_* on ``c``. The server counts per backend and publishes its counts
    late: ``store`` must have one pooled connection (``pool_max=1``), whose statistics are
    flushed (``pg_stat_force_next_flush``, PostgreSQL 15+) before and after ``fn``."""
    def flush() -> None:
        with store.maintenance_connection() as own:
            own.execute("SELECT pg_stat_force_next_flush()")

    flush()
    before = c.execute(counter_sql).fetchone()[0]
    out = fn()
    flush()
    return out, c.execute(counter_sql).fetchone()[0] - before
