"""The cost of a pass (issue 41): engine time per compaction pass with every default on.

A generated coding session (tool calls with large outputs) is driven through the R19 host
driver (`demo/host_driver.py`: the calls Hermes 0.19.0 makes, the host's own estimator
deciding when to compress) at a 40,000-token window with the extractive summariser, at
several session lengths. Per adopted pass: the time spent inside the engine's hooks of that
pass (`compress()` and the commit's `on_session_end`/`on_session_start`), with the time inside
the summariser (`Escalator.summarize`) reported apart, and the calling thread's CPU time in
those hooks (summariser included: robust to other processes on a shared machine); passes in the second half of the
session ("late") are the ones reported. Each point runs with the defaults (tier 0 on) and
with `tool_stubs: false`, and each both on this tree's code and on a baseline commit's
(`lossless_context/` of that commit extracted with `git archive`): before and after in one
run, on the same messages, in child processes of their own.

`--profile` adds a cProfile of the late passes (engine hooks only): the functions by own
time, per pass.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import io
import time
from pathlib import Path
from typing import Any

from . import common

BASELINE = "5f49764"  # main when issue 41 was taken up (tier-0 stubs made on every pass)
WINDOW = 40_000


def _drive(store: str, n: int, stubs: bool, seed: int, profile: bool) -> dict[str, Any]:
    import cProfile
    import pstats

    from lossless_context.demo.host_driver import R19Host
    from lossless_context.demo.sessions import SessionStream

    from .scale import _Peek

    eng = common.make_engine(store, context_length=WINDOW, tool_stubs=stubs)
    clock = common.SummariserClock()
    prof = cProfile.Profile() if profile else None
    state: dict[str, Any] = {"late": False}
    passes: list[dict[str, float]] = []

    def hook(name: str, fn: Any) -> Any:
        def timed(*a: Any, **k: Any) -> Any:
            s0 = clock.seconds
            on = prof is not None and state["late"]
            if on:
                prof.enable()  # type: ignore[union-attr]
            t0, c0, pc0 = time.perf_counter(), time.thread_time(), time.process_time()
            try:
                return fn(*a, **k)
            finally:
                dt, dc = time.perf_counter() - t0, time.thread_time() - c0
                dpc = time.process_time() - pc0
                if on:
                    prof.disable()  # type: ignore[union-attr]
                if name == "compress":
                    passes.append({"total": 0.0, "cpu": 0.0, "process_cpu": 0.0, "summariser": 0.0, "compress": 0.0,
                                   "late": float(state["late"])})
                if passes:
                    p = passes[-1]
                    p["total"] += dt * 1000
                    p["cpu"] += dc * 1000
                    p["process_cpu"] += dpc * 1000
                    p["summariser"] += (clock.seconds - s0) * 1000
                    if name == "compress":
                        p["compress"] = dt * 1000
        return timed

    for name in ("compress", "on_session_end", "on_session_start"):
        setattr(eng, name, hook(name, getattr(eng, name)))
    host = R19Host(eng, context_length=WINDOW, session_id="pass-cost", estimator="host")
    host.start()
    stream = SessionStream("coding", n, seed)
    peek = _Peek(iter(stream))
    fed = 0
    t_all = time.perf_counter()
    with clock:
        while not peek.done:
            chunk = peek.take_until_turn(500)
            state["late"] = fed >= n // 2
            host.feed(chunk)
            fed += len(chunk)
    wall = time.perf_counter() - t_all
    adopted = [r for r, rec in zip(passes, host.passes) if rec.adopted]
    late = [p for p in adopted if p["late"]]
    out: dict[str, Any] = {
        "messages": fed, "passes": len(passes), "adopted": len(adopted), "late_passes": len(late),
        "engine_ms": common.dist([p["total"] - p["summariser"] for p in late], 3),
        "total_ms": common.dist([p["total"] for p in late], 3),
        # CPU time of the calling thread in the pass's hooks, summariser included: what the pass
        # costs when the machine's other processes take the cores (wall time then waits for them)
        "cpu_ms": common.dist([p["cpu"] for p in late], 3),
        # every thread of the process in those hooks (the store's writer thread indexing rows,
        # a stub preparer): what moved off the calling thread still shows here
        "process_cpu_ms": common.dist([p["process_cpu"] for p in late], 3),
        "summariser_ms": common.dist([p["summariser"] for p in late], 3),
        "compress_ms": common.dist([p["compress"] for p in late], 3),
        "session_wall_s": round(wall, 2),
        "stored_messages": eng.store.stats()["messages"],
    }
    if prof is not None and late:
        st = pstats.Stats(prof)
        rows = sorted(((f, tt, ct, nc) for f, (cc, nc, tt, ct, _c) in st.stats.items()),  # type: ignore[attr-defined]
                      key=lambda r: -r[1])
        from .profiling import _name

        out["profile_by_own_ms_per_pass"] = [
            {"function": _name(f), "own_ms": round(tt * 1000 / len(late), 3), "cum_ms": round(ct * 1000 / len(late), 3),
             "calls_per_pass": round(nc / len(late), 1)} for f, tt, ct, nc in rows[:15]]
        ours = sorted((r for r in rows if "lossless_context" in r[0][0]), key=lambda r: -r[2])
        out["profile_by_cum_ms_per_pass"] = [
            {"function": _name(f), "cum_ms": round(ct * 1000 / len(late), 3)} for f, tt, ct, nc in ours[:15]]
    eng.store.close()
    return out


def _baseline_code(rev: str, dest: Path) -> Path | None:
    """`lossless_context/` of commit `rev`, extracted under `dest` (None when git cannot)."""
    target = dest / f"baseline-{rev}"
    if (target / "lossless_context" / "__init__.py").exists():
        return target
    try:
        data = subprocess.run(["git", "archive", "--format=tar", rev, "lossless_context"], cwd=common.ROOT,
                              capture_output=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    target.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        try:
            tf.extractall(target, filter="data")
        except TypeError:  # (Python before 3.11.4: no filter argument)
            tf.extractall(target)
    return target


def _worker(code: Path | None, args: list[str], timeout: float) -> dict[str, Any]:
    out = Path(common.isolate_env()) / f"pass-cost-{os.getpid()}-{time.time_ns()}.json"
    # bench.common first (it puts this tree on sys.path), then the code under test in front.
    boot = ("import sys, runpy; import bench.common; "
            + (f"sys.path.insert(0, {str(code)!r}); " if code is not None else "")
            + "sys.argv = ['pass_cost'] + sys.argv[1:]; runpy.run_module('bench.pass_cost', run_name='__main__')")
    r = subprocess.run([sys.executable, "-c", boot, *args, "--out", str(out)], cwd=common.ROOT,
                       capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"pass_cost worker failed ({r.returncode}):\n{r.stderr[-4000:]}")
    data = json.loads(out.read_text())
    out.unlink()
    return data


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    quick = cfg.get("quick")
    sizes = cfg.get("pass_cost_sizes") or ([1_500] if quick else [2_700, 13_500, 100_000])
    rev = cfg.get("baseline", BASELINE)
    work = Path(common.isolate_env()) / "pass_cost"
    work.mkdir(parents=True, exist_ok=True)
    base = None if quick else _baseline_code(rev, work)
    codes: list[tuple[str, Path | None]] = [("after", None)] + ([("before", base)] if base is not None else [])
    profile = not quick and cfg.get("profile", True)
    points = []
    for n in sizes:
        for stubs in (True, False):
            row: dict[str, Any] = {"n": n, "tool_stubs": stubs}
            for label, code in codes:
                store = work / f"{label}-{n}-{int(stubs)}.db"
                args = ["--store", str(store), "--n", str(n), "--seed", "5"] + (["--no-stubs"] if not stubs else [])
                if profile and stubs and n == sizes[0]:
                    args.append("--profile")
                t0 = time.perf_counter()
                row[label] = _worker(code, args, 7200)
                row[label]["wall_seconds"] = round(time.perf_counter() - t0, 1)
                for suf in ("", "-wal", "-shm"):
                    Path(str(store) + suf).unlink(missing_ok=True)
                print(f"  pass_cost n={n:,} stubs={'on' if stubs else 'off'} {label}: engine p50 "
                      f"{row[label]['engine_ms']['p50']} ms over {row[label]['late_passes']} late passes", flush=True)
            points.append(row)
    return {"window": WINDOW, "baseline": rev if base is not None else None, "sizes": sizes, "points": points,
            "growth": _growth(points, [c for c, _ in codes])}


def _growth(points: list[dict[str, Any]], labels: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label in labels:
        for stubs in (True, False):
            pts = [p for p in points if p["tool_stubs"] == stubs and label in p]
            fit = common.fit_loglog([p["n"] for p in pts], [common.get_path(p, f"{label}.engine_ms.p50") for p in pts])
            out[f"{label}_{'on' if stubs else 'off'}"] = fit["exponent"] if fit else None
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", required=True)
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--no-stubs", action="store_true")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    common.isolate_env()
    common.quiet_logs()
    import lossless_context

    res = _drive(a.store, a.n, not a.no_stubs, a.seed, a.profile)
    res["code"] = str(Path(lossless_context.__file__).resolve().parent.parent)
    Path(a.out).write_text(json.dumps(res), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
