"""Shared helpers: isolated environment, machine description, statistics, timers, memory,
the engine factory and the shared FakeOpenAI summariser server.

The bench never touches the user's `~/.hermes`: `isolate_env()` points `HERMES_HOME` and
`HOME` at a scratch directory before anything from the host or the engine is imported.
"""

from __future__ import annotations

import json
import logging
import math
import os
import platform
import re
import sqlite3
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

ROOT = Path(__file__).resolve().parents[1]
BENCH_DIR = ROOT / "bench"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MODEL = "fake-model"
API_KEY = "sk-fake-bench-key"


# -- environment -------------------------------------------------------------------------

def isolate_env(scratch: Path | None = None) -> Path:
    """Point HERMES_HOME/HOME at a scratch dir (idempotent; children inherit it)."""
    if os.environ.get("LCM_BENCH_SCRATCH"):
        return Path(os.environ["LCM_BENCH_SCRATCH"])
    base = Path(scratch) if scratch else Path(tempfile.mkdtemp(prefix="lcm-bench-"))
    (base / "hermes").mkdir(parents=True, exist_ok=True)
    (base / "home").mkdir(parents=True, exist_ok=True)
    os.environ["LCM_BENCH_SCRATCH"] = str(base)
    os.environ["HERMES_HOME"] = str(base / "hermes")
    os.environ["HOME"] = str(base / "home")
    from lossless_context.config import _fields

    for f in _fields():  # no engine settings leak in from the caller's environment
        os.environ.pop("LCM_" + f.name.upper(), None)
    return base


def quiet_logs() -> None:
    """Engine warnings (e.g. 'target unreachable') would flood the console; keep errors only."""
    for name in ("lossless_context", "agent", "run_agent", "httpx", "openai"):
        logging.getLogger(name).setLevel(logging.ERROR)


# -- machine ------------------------------------------------------------------------------

def machine_info() -> dict[str, Any]:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        cpu = platform.processor()
    ram_gb = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram_gb = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    try:
        from importlib.metadata import version

        hermes = version("hermes-agent")
    except Exception:
        hermes = None
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True, timeout=5).stdout.strip() or None
        dirty = bool(subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True,
                                    text=True, timeout=10).stdout.strip())
    except Exception:
        commit, dirty = None, None
    return {
        "cpu_model": cpu or "unknown",
        "cores": os.cpu_count(),
        "ram_gb": ram_gb,
        "python": platform.python_version(),
        "python_impl": platform.python_implementation(),
        "sqlite": sqlite3.sqlite_version,
        "os": f"{platform.system()} {platform.release()}",
        "hermes_agent": hermes,
        "git_commit": commit,
        "git_dirty": dirty,
        "load_avg_at_start": _loadavg(),
    }


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


# -- statistics ---------------------------------------------------------------------------

def get_path(d: Any, path: str) -> Any:
    """``d["a"]["b"]`` for ``"a.b"``; None where a level is missing or not a dict."""
    for k in path.split("."):
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    xs = sorted(values)
    if len(xs) == 1:
        return float(xs[0])
    pos = (len(xs) - 1) * q / 100.0
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(xs) - 1)
    return float(xs[lo] + (xs[hi] - xs[lo]) * (pos - lo))


def dist(values: Sequence[float], digits: int = 4) -> dict[str, Any]:
    """p50/p95/mean/min/max of a sample (same unit as the input)."""
    if not values:
        return {"n": 0, "p50": None, "p95": None, "mean": None, "min": None, "max": None}
    r = lambda v: None if v is None else round(float(v), digits)  # noqa: E731
    return {"n": len(values), "p50": r(percentile(values, 50)), "p95": r(percentile(values, 95)),
            "mean": r(sum(values) / len(values)), "min": r(min(values)), "max": r(max(values))}


def fit_loglog(xs: Sequence[float], ys: Sequence[float | None]) -> dict[str, Any] | None:
    """Least squares on log-log: y ≈ a·x^k. Returns k (the growth exponent), a and r²."""
    pts = [(float(x), float(y)) for x, y in zip(xs, ys) if x and y is not None and x > 0 and y > 0]
    if len(pts) < 2:
        return None
    lx = [math.log(x) for x, _ in pts]
    ly = [math.log(y) for _, y in pts]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    sxx = sum((a - mx) ** 2 for a in lx)
    if sxx == 0:
        return None
    k = sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sxx
    a = my - k * mx
    ss_tot = sum((b - my) ** 2 for b in ly)
    ss_res = sum((b - (a + k * x)) ** 2 for x, b in zip(lx, ly))
    r2 = 1 - ss_res / ss_tot if ss_tot > 0 else 1.0
    return {"exponent": round(k, 3), "coef": math.exp(a), "r2": round(r2, 3), "points": len(pts)}


def extrapolate(fit: dict[str, Any] | None, x: float) -> float | None:
    if not fit:
        return None
    return fit["coef"] * x ** fit["exponent"]


# -- memory & time ------------------------------------------------------------------------

def peak_rss_mb() -> float:
    """The process's peak resident set (the kernel's high-water mark, VmHWM on Linux)."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # ru_maxrss is in kilobytes on Linux and in bytes on macOS
    kb = peak / 1024 if sys.platform == "darwin" else peak
    return round(kb / 1024, 1)


def ms_since(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0


class SummariserClock:
    """Wraps `Escalator.summarize` (every summary the engine asks for, any level) with a timer,
    so engine time can be reported with summariser time subtracted."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0
        self._orig: Callable | None = None

    def __enter__(self) -> "SummariserClock":
        from lossless_context.summarizers.summarize import Escalator

        self._orig = Escalator.summarize
        clock = self
        orig = self._orig

        def timed(esc, *a, **kw):  # type: ignore[no-untyped-def]
            t0 = time.perf_counter()
            try:
                return orig(esc, *a, **kw)
            finally:
                clock.seconds += time.perf_counter() - t0
                clock.calls += 1

        Escalator.summarize = timed  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: Any) -> None:
        from lossless_context.summarizers.summarize import Escalator

        if self._orig is not None:
            Escalator.summarize = self._orig  # type: ignore[method-assign]

    def lap(self) -> tuple[float, int]:
        return self.seconds, self.calls


# -- engine -------------------------------------------------------------------------------

def make_engine(store: str, *, context_length: int, summarizer: str = "extractive",
                summary_base_url: str = "", **overrides: Any):
    """Our engine on `store`, as the host would build it, with bench-friendly guards:
    the spend guard is lifted (a 3,000-message session needs more than 200 summaries/hour),
    everything else is the default configuration."""
    from lossless_context.engine import LCMEngine

    kw: dict[str, Any] = {"store": store, "summarizer": summarizer, "max_summarizer_calls": 10_000_000}
    if summary_base_url:
        kw["summary_base_url"] = summary_base_url
        kw["summary_model"] = MODEL
    kw.update(overrides)
    return LCMEngine(context_length=context_length, **kw)


def settle_indexes(store: Any) -> None:
    """Wait for a store's index upkeep: its deferred full-text indexing and SQLite's merging of
    index segments (store/sqlite/merge.py, after a quiet moment), and PostgreSQL's identifier
    lexemes for rows stored before migration 033 (until every row has them a search keeps an
    identifier a phrase and rechecks each candidate: a store upgraded in place would time the
    upgrade's transition, not the search), so that timed searches neither share the cores with
    it nor read segments it is about to merge."""
    store.wait_indexed()
    backfill = getattr(getattr(store, "inner", store), "backfill_identifiers", None)
    if backfill is not None:
        backfill()
    merger = getattr(getattr(store, "inner", store), "merger", None)
    if merger is not None:
        merger.settle()


def settle_postgres(dsn: str) -> float | None:
    """VACUUM (ANALYZE) a bench database, as autovacuum leaves it a while after a burst of
    writes (and so that autovacuum does not start on it during a measurement, on the same
    cores); seconds taken (None without psycopg)."""
    try:
        import psycopg
    except ImportError:
        return None
    t0 = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("VACUUM (ANALYZE)")
    return round(time.perf_counter() - t0, 2)


def checkpoint(path: str) -> None:
    """Fold the WAL into the main file so file sizes are comparable."""
    try:
        c = sqlite3.connect(path)
        c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        c.close()
    except sqlite3.Error:
        pass


def store_bytes(path: str) -> int:
    return sum(os.path.getsize(path + s) for s in ("", "-wal") if os.path.exists(path + s))


# -- fake summariser server ---------------------------------------------------------------

_FAKE: Any = None


def fake_server():
    """One FakeOpenAI with the deterministic SummariserResponder for the whole run; the host's
    auxiliary client is configured to it through $HERMES_HOME/config.yaml."""
    global _FAKE
    if _FAKE is not None:
        return _FAKE
    import yaml

    from tests.support.fake_openai import FakeOpenAI, SummariserResponder
    from tests.support.hermes_host import build_config

    srv = FakeOpenAI(responder=SummariserResponder(), model=MODEL, context_length=128_000).start()
    cfg = build_config(srv.base_url, model=MODEL, api_key=API_KEY, context_length=128_000,
                       engine="compressor", plugins_enabled=[])
    home = Path(os.environ.get("HERMES_HOME", isolate_env() / "hermes"))
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.yaml").write_text(yaml.safe_dump(cfg), encoding="utf-8")
    _FAKE = srv
    return srv


def stop_fake_server() -> None:
    global _FAKE
    if _FAKE is not None:
        _FAKE.stop()
        _FAKE = None


def chat_request_stats(reqs: Sequence[Any]) -> dict[str, Any]:
    """Calls, bytes and (chars/4) tokens sent to the summariser."""
    chat = [r for r in reqs if getattr(r, "is_chat", False)]
    chars = 0
    for r in chat:
        for m in r.messages:
            c = m.get("content")
            chars += len(c) if isinstance(c, str) else len(json.dumps(c))
    return {"calls": len(chat), "bytes_sent": sum(len(r.raw) for r in chat), "tokens_sent": (chars + 3) // 4}


# -- misc ---------------------------------------------------------------------------------

@contextmanager
def stopwatch() -> Iterator[list[float]]:
    box: list[float] = []
    t0 = time.perf_counter()
    try:
        yield box
    finally:
        box.append(time.perf_counter() - t0)


_WORD = re.compile(r"[A-Za-z]{3,}|\d{3,}")


def words(text: str) -> set[str]:
    return {w.lower() for w in _WORD.findall(text)}


def leaves(obj: Any) -> Iterator[str]:
    """Every string inside a parsed JSON value (so escaping never hides or fakes a match)."""
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from leaves(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from leaves(v)
