"""Smoke test of the benchmark suite: `python -m bench --quick` runs end to end and writes
RESULTS.md and results.json with every section and numeric values. No timing thresholds:
the benchmark reports numbers, it does not judge them here."""

from __future__ import annotations

import json
import numbers
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _num(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def test_bench_quick_writes_results(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "bench", "--quick", "--out-dir", str(tmp_path)], cwd=ROOT,
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, f"stdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-5000:]}"
    md = (tmp_path / "RESULTS.md").read_text(encoding="utf-8")
    data = json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))

    for heading in ("## Machine", "## Summary", "## 1. Scale curves", "## 2. Side by side",
                    "## 3. Summary quality", "## 4. SQLite vs PostgreSQL", "## 5. Zero-wait compaction", "## 6. Long sessions",
                    "## 7. The cost of a pass",
                    "## 8. lcm_grep through `lcm mcp`", "## 9. Zero wait by default", "## How to run"):
        assert heading in md, heading
    assert data["meta"]["mode"] == "quick"
    m = data["machine"]
    assert m["cpu_model"] and _num(m["cores"]) and _num(m["ram_gb"]) and m["python"] and m["sqlite"]

    parts = data["parts"]
    assert set(parts) == {"scale", "side_by_side", "quality", "backends", "background", "long_sessions", "realtalk",
                          "recall_demo", "pass_cost", "mcp", "bg_cost"}
    for p in parts["pass_cost"]["points"]:
        assert p["after"]["late_passes"] > 0 and _num(p["after"]["engine_ms"]["p50"]), p
    assert "skipped" in parts["realtalk"]  # no REALTALK data in CI: reported, not failed
    demo = parts["recall_demo"]["sessions"][0]
    assert demo["after"]["questions"] > 0
    assert demo["after"]["identifier_first_hit_is_original"] >= demo["before"]["identifier_first_hit_is_original"]
    for name, p in parts.items():
        assert not p.get("error"), (name, p.get("error"))

    sc = parts["scale"]
    assert len(sc["rows"]) >= 2
    for row in sc["rows"]:
        for key in ("compress_engine_p50_ms", "should_compress_p50_ms", "select_context_cached_p50_ms",
                    "grep_text_p50_ms", "grep_identifier_p50_ms", "grep_cjk_p50_ms", "expand_p50_ms",
                    "bytes_per_1k_messages", "measure_peak_rss_mb", "ingest_msgs_per_s"):
            assert _num(row[key]), (key, row[key])
    assert _num(sc["fits"]["compress_engine_p50_ms"]["exponent"])
    assert sc["targets"] and all(t["met"] in (True, False) for t in sc["targets"])
    for p in sc["points"]:
        assert isinstance(p["measure"]["select_context"]["same_object_every_call"], bool)

    be = parts["backends"]
    if not be.get("skipped") and not be.get("pg_stopped_early"):  # PG grown by SQL replication, measured again
        big = be["postgresql_large"]
        assert big["grow"]["n_stored"] == 2 * be["n_compared"] and big["grow"]["pending_after"] == 0
    if not be.get("skipped"):  # a gateway's store on both backends: one user's hits as in its history alone
        gw = be["gateway"]
        assert not gw.get("error"), gw.get("error")
        for backend in ("sqlite", "postgresql"):
            rows = gw[backend]["rows"]
            assert len(rows) == 9 and all(_num(r["alone_ms"]) and _num(r["gateway_ms"]) for r in rows)
            assert all(r["hits_alone"] == r["hits_gateway"] and r["hits_alone"] for r in rows), rows
        assert _num(big["measure"]["lcm_grep"]["text"]["ms"]["p50"])
        assert big["measure"]["lcm_grep"]["identifier"]["hits"] >= 2  # the copies are indexed too
        assert "PostgreSQL grown to" in md

    sbs = parts["side_by_side"]
    if not sbs.get("skipped"):
        assert {(r["session"], r["engine"]) for r in sbs["runs"]} == {
            (s, e) for s in ("coding", "chat", "mixed") for e in ("lcm", "lcm_no_tier0", "builtin")}
        for r in sbs["runs"]:
            assert _num(r["compactions"]) and _num(r["summariser"]["calls"]) and _num(r["final_context_tokens"])
            rc = r["recall"]
            assert rc["canaries"] > 0 and 0 <= rc["exact_anywhere"] <= rc["canaries"]
            if r["engine"] == "builtin":
                assert rc["via_tools_exact"] == 0  # no tools, by construction

    q = parts["quality"]
    assert len(q["runs"]) == 2
    for r in q["runs"]:
        assert r["nodes"] > 0 and r["by_level"] and r["by_depth"]
        assert 0 <= r["overall"]["in_text_share"] <= r["overall"]["reachable_share"] <= 1

    b = parts["backends"]
    required = os.environ.get("LCM_REQUIRE_POSTGRES", "").strip().lower() not in ("", "0", "false", "no")
    if b.get("skipped"):
        assert b["reason"]
        assert not required, f"LCM_REQUIRE_POSTGRES is set but the PostgreSQL part was skipped: {b['reason']}"
    else:
        rows = {r["metric"]: r for r in b["rows"]}
        for metric in ("ingest msgs/s", "compress() engine ms p50", "lcm_grep text ms p50",
                       "store bytes per 1k messages"):
            assert _num(rows[metric]["sqlite"]) and _num(rows[metric]["postgresql"]), rows[metric]
            assert _num(rows[metric]["ratio_pg_over_sqlite"])

    bg = parts["background"]
    for k in ("off", "on"):
        assert _num(bg[k]["passes"]) and _num(bg[k]["wait_below_hard_total_s"]) and bg[k]["summary_levels"]

    ls = parts["long_sessions"]
    lcm = [r for r in ls["runs"] if r["engine"] == "lcm"]
    assert lcm and ls["grid"]
    for r in lcm:
        for key in ("leaves", "max_depth", "depth_bound", "summariser_calls", "calls_bound",
                    "tokens_sent_per_1k_messages", "facts_in_context", "first_hit_original", "planted"):
            assert _num(r[key]), (key, r[key])
        assert 0 <= r["first_hit_original"] <= r["planted"] and 0 <= r["facts_in_context"] <= r["planted"]

    mc = parts["mcp"]["sqlite"]  # through `lcm mcp` and in-process: the same answers, both timed
    assert mc["same_answers"] is True and any(mc["hits"]), mc
    assert _num(mc["ratio_mcp_engine"]) and _num(mc["mcp_pass_ms"]) and _num(mc["engine_pass_ms"])


def test_long_grid_points_merge_into_the_earlier_run():
    """`--long-grid` runs a few points: the others stay, a re-run point replaces its figures."""
    from bench.__main__ import _merge_long_points

    def run(engine, w, n, calls):
        return {"engine": engine, "window": w, "messages": n, "summariser_calls": calls}

    old = {"grid": [[32000, 10000], [64000, 10000]], "before": [{"window": 32000}], "wall_seconds": 10,
           "runs": [run("lcm", 32000, 10000, 1), run("builtin", 32000, 10000, 2), run("lcm", 64000, 10000, 3)]}
    new = {"grid": [[64000, 10000], [64000, 100000]], "wall_seconds": 5,
           "runs": [run("lcm", 64000, 10000, 30), run("lcm", 64000, 100000, 40)]}
    m = _merge_long_points(old, new)
    assert m["grid"] == [[32000, 10000], [64000, 10000], [64000, 100000]]
    got = {(r["engine"], r["window"], r["messages"]): r["summariser_calls"] for r in m["runs"]}
    assert got == {("lcm", 32000, 10000): 1, ("builtin", 32000, 10000): 2, ("lcm", 64000, 10000): 30,
                   ("lcm", 64000, 100000): 40}
    assert m["before"] == old["before"] and m["wall_seconds"] == 15
    assert _merge_long_points({"error": "x"}, new) is new


def test_script_growth_builds_once_and_measures(tmp_path: Path) -> None:
    """`python -m bench.script_growth` on small SQLite stores: each term found as planted (a
    rare one once), a second run reuses the stores it built."""
    cmd = [sys.executable, "-m", "bench.script_growth", "--data", str(tmp_path), "--sizes", "400,800",
           "--backends", "sqlite", "--reps", "1", "--json", str(tmp_path / "g.json")]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "building 400 messages" in r.stdout and "| chinese/rare" in r.stdout
    res = json.loads((tmp_path / "g.json").read_text(encoding="utf-8"))
    pts = res["backends"]["sqlite"]["points"]
    for n in ("400", "800"):
        for key, v in pts[n].items():
            assert v["hits"] == 1 if key.endswith("/rare") else v["hits"] >= 8, (n, key, v)  # 1 in 50 is common
            assert _num(v["ms"]["p50"])
    again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert again.returncode == 0 and "building" not in again.stdout
