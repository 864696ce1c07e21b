"""`python -m bench` — run the benchmarks and write `RESULTS.md` + `results.json`.

    python -m bench               # full run (default): scale 1k/10k/100k/1M, 3,000-message sessions, …
    python -m bench --quick       # the CI smoke configuration: seconds, small sizes
    python -m bench --only scale  # one part (scale | side_by_side | quality | backends | background |
                                  # long_sessions | realtalk | recall_demo | pass_cost | mcp | bg_cost,
                                  # or on request script_growth | lifecycle | pg_ident); the result is
                                  # merged into an existing results.json and RESULTS.md is re-rendered
    python -m bench --out-dir DIR # write the two files elsewhere (the smoke test does)
    python -m bench --only script_growth   # on request only: search growth by script at 3k..1M
                                  # messages on both backends (stores built once, kept in
                                  # $LCM_BENCH_DATA or ~/.cache/lcm-bench; see bench/script_growth.py)

Each part runs in this process except the scale/backends workers, which are child processes
(fresh memory per point). Everything runs offline: the only network is 127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

from . import common

PARTS = ("scale", "side_by_side", "quality", "backends", "background", "long_sessions", "realtalk", "recall_demo",
         "pass_cost", "mcp", "bg_cost")
# Run only when asked (--only): they build large stores once and keep them (bench/script_growth.py)
ON_REQUEST = ("script_growth", "lifecycle", "pg_ident")  # (lifecycle: two 100k stores, a 1M prune; pg_ident: 100k, 1M)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="CI smoke configuration (seconds)")
    mode.add_argument("--full", action="store_true", help="the complete run (default)")
    ap.add_argument("--only", choices=PARTS + ON_REQUEST, action="append", help="run only this part (repeatable)")
    ap.add_argument("--out-dir", default=str(common.BENCH_DIR), help="where RESULTS.md and results.json go")
    ap.add_argument("--no-profile", action="store_true", help="skip the cProfile runs of the full mode")
    ap.add_argument("--keep-scratch", action="store_true", help="keep the scratch directory (stores, configs)")
    ap.add_argument("--scale-sizes", help="comma-separated history sizes (overrides the mode's)")
    ap.add_argument("--long-grid", help="long_sessions points as WINDOWxMESSAGES,… (overrides the mode's grid)")
    ap.add_argument("--data", help="REALTALK's data directory (the Chat_*.json files) for --only realtalk")
    ap.add_argument("--pg-budget", type=float, help="seconds PostgreSQL's build may take before it stops early")
    a = ap.parse_args(argv)

    scratch = common.isolate_env()
    common.quiet_logs()
    quick = bool(a.quick)
    cfg: dict = {"quick": quick, "profile": not a.no_profile}
    if a.scale_sizes:
        cfg["scale_sizes"] = [int(x) for x in a.scale_sizes.split(",") if x.strip()]
    if a.long_grid:
        cfg["long_grid"] = [tuple(int(x) for x in p.split("x")) for p in a.long_grid.split(",") if p.strip()]
    if a.data:
        cfg["data"] = a.data
    if a.pg_budget:
        cfg["pg_budget"] = a.pg_budget
    parts = list(dict.fromkeys(a.only)) if a.only else list(PARTS)
    out_dir = Path(a.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / "results.json"
    results: dict = {}
    if a.only and json_path.exists():
        try:
            results = json.loads(json_path.read_text(encoding="utf-8"))
        except ValueError:
            results = {}
    started = time.perf_counter()
    results["machine"] = common.machine_info()
    results.setdefault("parts", {})
    results["meta"] = {
        "mode": "quick" if quick else "full",
        "started": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "command": "python -m bench" + (" --quick" if quick else "") + "".join(f" --only {p}" for p in a.only or []),
        "parts_run": parts,
    }
    print(f"lossless-context bench ({results['meta']['mode']}): {', '.join(parts)}; scratch {scratch}", flush=True)
    try:
        for name in parts:
            t0 = time.perf_counter()
            print(f"[{name}]", flush=True)
            try:
                mod = __import__(f"bench.{name}", fromlist=["run"])
                if name == "backends":
                    res = mod.run(cfg, results["parts"].get("scale") if "scale" in parts else None)
                else:
                    res = mod.run(cfg)
            except Exception as exc:  # one broken part must not lose the others' results
                traceback.print_exc()
                res = {"error": f"{type(exc).__name__}: {exc}"}
            res["wall_seconds"] = round(time.perf_counter() - t0, 1)
            res["mode"] = "quick" if quick else "full"
            if name == "long_sessions" and a.long_grid:
                res = _merge_long_points(results["parts"].get(name), res)
            results["parts"][name] = res
            print(f"[{name}] done in {res['wall_seconds']} s", flush=True)
    finally:
        common.stop_fake_server()
        results["meta"]["wall_seconds"] = round(time.perf_counter() - started, 1)
        results["meta"]["load_avg_at_end"] = common._loadavg()
        json_path.write_text(json.dumps(results, indent=1, default=str, ensure_ascii=False) + "\n", encoding="utf-8")
        from .report import render

        (out_dir / "RESULTS.md").write_text(render(results), encoding="utf-8")
        if not a.keep_scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    print(f"wrote {out_dir / 'RESULTS.md'} and {json_path} in {results['meta']['wall_seconds']} s", flush=True)
    failed = [n for n in parts if results["parts"].get(n, {}).get("error")]
    return 1 if failed else 0


def _merge_long_points(old: dict | None, new: dict) -> dict:
    """Keep an earlier run's long_sessions points that `--long-grid` did not re-run.

    The full grid takes hours on a shared 2-core machine, so its points are run a few at a time;
    a point run again replaces its earlier figures, the others stay (each run says when it ran)."""
    if not old or old.get("error") or new.get("error"):
        return new
    key = lambda r: (r.get("engine"), r.get("window"), r.get("messages"))  # noqa: E731
    fresh = {key(r) for r in new.get("runs", [])}
    kept = [r for r in old.get("runs", []) if key(r) not in fresh]
    merged = {**old, **new}  # keeps what only the earlier run recorded (e.g. its before/after table)
    merged["runs"] = sorted(kept + list(new.get("runs", [])), key=lambda r: (r.get("window", 0), r.get("messages", 0), r.get("engine", "")))
    points = {tuple(p) for p in old.get("grid", [])} | {tuple(p) for p in new.get("grid", [])}
    merged["grid"] = [list(p) for p in sorted(points)]
    merged["wall_seconds"] = round(float(old.get("wall_seconds", 0)) + float(new.get("wall_seconds", 0)), 1)
    return merged


if __name__ == "__main__":
    sys.exit(main())
