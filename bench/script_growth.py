"""Search growth by script: rare and common terms of every script as the history grows.

    python -m bench.script_growth                   # build what is missing, measure, print a table
    python -m bench.script_growth --sizes 3000,30000 --backends sqlite
    python -m bench.script_growth --data DIR        # where the stores are kept (built once, reused)
    python -m bench --only script_growth            # the same, into bench/RESULTS.md

One session of N messages (a long-lived session, as a gateway's or a daily CLI user's; user/assistant turns of generated English
prose with some Cyrillic, Chinese, Japanese and Korean sentences), at N = 3k, 30k, 300k, 1M, on
SQLite and PostgreSQL. Each store holds, for every script — an English word, an identifier,
Cyrillic, Chinese, Japanese, Korean — a *rare* term said once, early (3% into the history), and
a *common* one said in every 50th message. The engine, bound to that session as the host
continues it, then runs `lcm_grep` for each term; p50/p95 in ms, and each cost's growth
exponent (least-squares slope of log(ms) on log(N)). Goal: exponent < 0.3, p50 < 20 ms at 1M.

The stores are built straight through the store's append (the rows `pipeline/ingest.py` would
make; no summaries) and kept in ``--data`` (default ``$LCM_BENCH_DATA`` or
``~/.cache/lcm-bench``): SQLite files ``growth-N.db``; PostgreSQL databases ``growth_N`` in a
cluster of their own under ``DATA/pg`` (started and stopped by the bench; PostgreSQL's binaries
as the test suite finds them). A store is rebuilt only when its ``.meta.json`` says another
generator version built it. Building 1M takes tens of minutes per backend on two cores.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

from . import common

GENERATOR = 2  # bump when the generated history changes: stores built by another version are rebuilt
CONV = "growth-conv"
SESSION = "growth-main"
BATCH = 2_000
COMMON_EVERY = 50
RARE_AT = 0.03
SIZES = (3_000, 30_000, 300_000, 1_000_000)
QUICK_SIZES = (1_000, 5_000)
BACKENDS = ("sqlite", "postgres")

# (script, rare term, common term); each rare term occurs in exactly one message.
TERMS = (
    ("word", "quillwort", "retry"),
    ("identifier", "vault_key_7731", "reconcile_day"),
    ("cyrillic", "полынья", "миграция"),
    ("chinese", "青龙七号暗号", "数据库迁移计划"),
    ("japanese", "ひみつのあいことば", "デプロイ手順書"),
    ("korean", "비밀번호변경요청", "배포일정표"),
)

_WORDS = ("the deploy config service cache queue worker schema table index build test fix error log "
          "request response user account billing invoice report job task plan review branch merge "
          "commit release docs file path module function class value field timeout limit budget "
          "metric alert server client token session window summary history store search query result "
          "page batch stream event handler retry_policy backoff latency throughput memory disk network "
          "we should could would will can need want check look update change move keep drop add remove "
          "run start stop open close read write send receive parse format validate migrate rollback "
          "today tomorrow yesterday later soon first next last again still already also only just "
          "quickly carefully maybe probably certainly clearly exactly roughly nearly mostly").split()
_RU = "сервер база запрос ответ очередь задача ошибка журнал отчёт сборка проверка выпуск".split()
_ZH = "服务器 配置 日志 队列 任务 错误 报告 版本 测试 用户 缓存 索引".split()
_JA = "サーバー 設定 ログ キュー タスク エラー レポート テスト ユーザー キャッシュ".split()
_KO = "서버 설정 로그 대기열 작업 오류 보고서 테스트 사용자 캐시".split()


def default_data_dir() -> Path:
    return Path(os.environ.get("LCM_BENCH_DATA") or Path.home() / ".cache" / "lcm-bench")


# ------------------------------------------------------------------------------------ history

def _sentence(rng: random.Random) -> str:
    words = [rng.choice(_WORDS) for _ in range(rng.randint(8, 24))]
    r = rng.random()
    if r < 0.04:
        words += [rng.choice(_RU) for _ in range(rng.randint(3, 8))]
    elif r < 0.08:
        words.append("".join(rng.choice(_ZH) for _ in range(rng.randint(3, 8))))
    elif r < 0.10:
        words.append("".join(rng.choice(_JA) for _ in range(rng.randint(3, 6))))
    elif r < 0.12:
        words.append(" ".join(rng.choice(_KO) for _ in range(rng.randint(3, 6))))
    return " ".join(words) + "."


def _said(script: str, term: str) -> str:
    """`term` as it is written in running text: CJK inside a run of its script (no spaces:
    a word tokenizer sees one long token), Korean with a particle attached."""
    return {"chinese": f"备注请记住发布前的{term}不要外传。", "japanese": f"これは{term}ですからね。",
            "korean": f"{term}을 확인하세요.", "cyrillic": f"проверь {term} сегодня.",
            "identifier": f"see `{term}`.", "word": f"the {term} again."}[script]


def messages(n: int, seed: int = 40) -> Iterator[dict[str, Any]]:
    """The deterministic history of `n` messages (user/assistant turns)."""
    rng = random.Random(seed)
    rare_at = max(1, int(n * RARE_AT))
    t0 = 1_700_000_000.0
    for i in range(n):
        text = " ".join(_sentence(rng) for _ in range(rng.randint(1, 4)))
        if i == rare_at:
            text += " " + " ".join(_said(script, rare) for script, rare, _c in TERMS)
        if i % COMMON_EVERY == COMMON_EVERY // 2:
            text += " " + " ".join(_said(script, frequent) for script, _r, frequent in TERMS)
        yield {"role": "user" if i % 2 == 0 else "assistant", "content": text, "timestamp": t0 + i * 7}


# ------------------------------------------------------------------------------------ stores

class _Cluster:
    """A PostgreSQL cluster kept in ``DATA/pg`` across runs (the test suite's PgServer, whose
    directory is temporary, started on a data directory that stays)."""

    def __init__(self, root: Path) -> None:
        from tests.support import pg as pgsupport

        bindir = pgsupport.find_bindir()
        if bindir is None:
            raise RuntimeError("PostgreSQL server binaries not found (install postgresql or set LCM_PG_BINDIR)")
        self.srv = pgsupport.PgServer(bindir, shared_buffers="2GB")
        shutil.rmtree(self.srv.base, ignore_errors=True)
        self.srv.base = root
        self.srv.data = root / "data"
        self.srv.log = root / "server.log"
        root.mkdir(parents=True, exist_ok=True)
        if self.srv.user:
            import pwd

            pw = pwd.getpwnam(self.srv.user)
            os.chown(root, pw.pw_uid, pw.pw_gid)
        os.chmod(root, 0o700)

    def start(self) -> None:
        s = self.srv
        if not (s.data / "PG_VERSION").exists():
            s.start()  # initdb + start
            atexit.unregister(s.stop)  # (the test suite's server deletes its directory at exit)
            return
        s.port = common_free_port()
        s._opts = (f"-c listen_addresses=127.0.0.1 -p {s.port} -k {s.base} -c fsync=off"
                   " -c synchronous_commit=off -c full_page_writes=off -c max_connections=300"
                   f" -c shared_buffers={s.shared_buffers}")
        s._run(str(s.bindir / "pg_ctl"), "-D", str(s.data), "-m", "immediate", "-w", "stop")
        s.resume()
        s.started = True

    def stop(self) -> None:
        s = self.srv
        if s.started:
            s.started = False
            s._run(str(s.bindir / "pg_ctl"), "-D", str(s.data), "-m", "fast", "-w", "stop", timeout=120)

    def database(self, name: str, fresh: bool) -> str:
        import psycopg

        with psycopg.connect(self.srv.dsn("postgres"), autocommit=True, connect_timeout=10) as c:
            exists = c.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
            if exists and fresh:
                c.execute(f"DROP DATABASE {name} WITH (FORCE)")
                exists = None
            if not exists:
                c.execute(f"CREATE DATABASE {name} TEMPLATE template0")
        return self.srv.dsn(name)


def common_free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _meta_path(data: Path, backend: str, n: int) -> Path:
    return data / f"growth-{backend}-{n}.meta.json"


def _built(data: Path, backend: str, n: int) -> bool:
    p = _meta_path(data, backend, n)
    try:
        return json.loads(p.read_text()).get("generator") == GENERATOR
    except (OSError, ValueError):
        return False


def build(location: str, n: int) -> dict[str, Any]:
    """Append the history of `n` messages to the store at `location` (one conversation)."""
    from lossless_context.pipeline.ingest import new_message
    from lossless_context.store import open_store

    st = open_store(location)
    t0 = time.perf_counter()
    try:
        it = messages(n)
        st.ensure_session(SESSION, conversation_id=CONV, platform="cli")
        k = 0
        while k < n:
            take = min(BATCH, n - k)
            st.append_messages(SESSION, [new_message(next(it), 10**9, 0) for _ in range(take)])
            k += take
            if k % 100_000 == 0 or k == n:
                print(f"    {k:,} / {n:,} ({time.perf_counter() - t0:.0f} s)", flush=True)
        st.wait_indexed()
    finally:
        st.close()
    return {"messages": n, "build_seconds": round(time.perf_counter() - t0, 1), "generator": GENERATOR}


# ------------------------------------------------------------------------------------ measure

def measure(location: str, reps: int) -> dict[str, Any]:
    eng = common.make_engine(location, context_length=64_000)
    try:
        eng.on_session_start(SESSION, conversation_id=CONV, platform="cli")
        common.settle_indexes(eng.store)
        out: dict[str, Any] = {}
        for script, rare, frequent in TERMS:
            for kind, term in (("rare", rare), ("common", frequent)):
                args = {"query": term}
                first = json.loads(eng.handle_tool_call("lcm_grep", args))  # warm the cache
                ts = []
                for _ in range(reps):
                    t = time.perf_counter()
                    eng.handle_tool_call("lcm_grep", args)
                    ts.append((time.perf_counter() - t) * 1000)
                out[f"{script}/{kind}"] = {"query": term, "hits": first.get("hits"), "ms": common.dist(ts, 2)}
        return out
    finally:
        eng.store.close()


def _fit(points: dict[int, dict[str, Any]], key: str) -> float | None:
    xs = sorted(points)
    fit = common.fit_loglog(xs, [points[x][key]["ms"]["p50"] for x in xs])
    return None if fit is None else round(fit["exponent"], 3)


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    """The bench part (``python -m bench --only script_growth``)."""
    sizes = tuple(cfg.get("scale_sizes") or (QUICK_SIZES if cfg.get("quick") else SIZES))
    reps = 5 if cfg.get("quick") else 15
    res = growth(Path(cfg.get("growth_data") or default_data_dir()), sizes,
                 tuple(cfg.get("growth_backends") or BACKENDS), reps=reps)
    res["reps"] = reps
    return res


def growth(data: Path, sizes: tuple[int, ...], backends: tuple[str, ...], reps: int,
           build_only: bool = False, rebuild: bool = False) -> dict[str, Any]:
    data.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"sizes": list(sizes), "terms": [list(t) for t in TERMS], "backends": {}}
    for backend in backends:
        cluster = None
        try:
            if backend == "postgres":
                cluster = _Cluster(data / "pg")
                cluster.start()
            points: dict[int, dict[str, Any]] = {}
            builds: dict[int, Any] = {}
            for n in sizes:
                fresh = rebuild or not _built(data, backend, n)
                if backend == "sqlite":
                    location = str(data / f"growth-{n}.db")
                    if fresh:
                        for suffix in ("", "-wal", "-shm"):
                            Path(location + suffix).unlink(missing_ok=True)
                else:
                    assert cluster is not None
                    location = cluster.database(f"growth_{n}", fresh)
                if fresh:
                    print(f"  {backend}: building {n:,} messages", flush=True)
                    builds[n] = build(location, n)
                    if backend == "postgres":
                        common.settle_postgres(location)
                    _meta_path(data, backend, n).write_text(json.dumps(builds[n]))
                else:
                    builds[n] = json.loads(_meta_path(data, backend, n).read_text())
                if build_only:
                    continue
                points[n] = _child_measure(location, reps)
                print(f"  {backend} {n:,}: " + ", ".join(f"{k} {v['ms']['p50']}" for k, v in points[n].items()),
                      flush=True)
            entry: dict[str, Any] = {"builds": {str(k): v for k, v in builds.items()},
                                     "points": {str(k): v for k, v in points.items()}}
            if len(points) >= 2:
                entry["exponents"] = {key: _fit(points, key) for key in next(iter(points.values()))}
            result["backends"][backend] = entry
        finally:
            if cluster is not None:
                cluster.stop()
    return result


def _child_measure(location: str, reps: int) -> dict[str, Any]:
    """Measure in a fresh process (cold start like a host's `hermes chat -q`, own memory)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(common.ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-m", "bench.script_growth", "_measure", location, str(reps)],
                          capture_output=True, text=True, env=env, cwd=str(common.ROOT), timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"measure failed: {proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def render(res: dict[str, Any]) -> str:
    lines = []
    for backend, entry in res.get("backends", {}).items():
        pts = entry.get("points") or {}
        if not pts:
            continue
        keys = list(next(iter(pts.values())))
        lines.append(f"{backend}: lcm_grep p50 ms (hits) by history size; growth exponent")
        lines.append("| term | " + " | ".join(f"{int(n):,}" for n in pts) + " | exponent |")
        lines.append("|---|" + "---|" * (len(pts) + 1))
        for k in keys:
            cells = [f"{pts[n][k]['ms']['p50']} ({pts[n][k]['hits']})" for n in pts]
            lines.append(f"| {k} `{pts[next(iter(pts))][k]['query']}` | " + " | ".join(cells)
                         + f" | {entry.get('exponents', {}).get(k)} |")
        lines.append("")
    return "\n".join(lines)


def section(res: dict[str, Any]) -> list[str]:
    """The RESULTS.md section (bench/report.py): p50 by size, growth exponents, and the
    before/after of the same stores when the part carries one (``before``: p50s measured by
    an earlier commit's code in the same session, ``before_commit``)."""
    L = ["", "## Search growth by script (`python -m bench.script_growth`)", "",
         "One session of N messages (3k, 30k, 300k, 1M), built once through the store's append and kept "
         "outside the repository; for each script a term said once, early (3% in) and one said in every 50th "
         "message; `lcm_grep` from the engine bound to that session, p50 ms over "
         f"{res.get('reps', 15)} calls in a fresh process (hits in brackets: the page holds 10). The goal: growth "
         "exponent < 0.3 and p50 < 20 ms at 1M for every term. This machine's load average was 10-14 during "
         "the runs (other helpers' test suites): absolute times carry that noise."]
    before = res.get("before") or {}
    for backend, entry in (res.get("backends") or {}).items():
        pts = entry.get("points") or {}
        if not pts:
            continue
        keys = list(next(iter(pts.values())))
        L += ["", f"**{backend}**", ""]
        head = ["term"] + [f"{int(n):,}" for n in pts] + ["exponent"]
        if before.get(backend):
            head += [f"before at {int(n):,}" for n in pts if str(n) in before[backend]]
        rows = []
        for k in keys:
            row = [f"{k} `{pts[next(iter(pts))][k]['query']}`"]
            row += [f"{pts[n][k]['ms']['p50']} ({pts[n][k]['hits']})" for n in pts]
            row.append(str(entry.get("exponents", {}).get(k)))
            if before.get(backend):
                row += [str(before[backend][str(n)].get(k)) for n in pts if str(n) in before[backend]]
            rows.append(row)
        L.append("| " + " | ".join(head) + " |")
        L.append("|" + "---|" * len(head))
        L += ["| " + " | ".join(r) + " |" for r in rows]
    if before:
        L += ["", f"`before`: the same stores searched by {res.get('before_commit', 'the previous code')} in the same "
              "session (SQLite's old CJK search at 300k and 1M: 2 calls each, 40-234 s per call)."]
    return L


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["_measure"]:
        common.isolate_env()
        common.quiet_logs()
        print(json.dumps(measure(argv[1], int(argv[2]))))
        return 0
    ap = argparse.ArgumentParser(prog="python -m bench.script_growth", description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(default_data_dir()), help="where the stores are kept")
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    ap.add_argument("--backends", default=",".join(BACKENDS))
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--build-only", action="store_true", help="build the missing stores, measure nothing")
    ap.add_argument("--rebuild", action="store_true", help="build every store again")
    ap.add_argument("--json", help="also write the result here")
    a = ap.parse_args(argv)
    common.isolate_env()
    common.quiet_logs()
    res = growth(Path(a.data), tuple(int(x) for x in a.sizes.split(",") if x.strip()),
                 tuple(b for b in a.backends.split(",") if b.strip()), a.reps, a.build_only, a.rebuild)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1, ensure_ascii=False))
    print(render(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
