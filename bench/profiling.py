"""cProfile wrapper: run a callable under the profiler and report where the time goes.

Returns the top functions by own time and by cumulative time, each with its share of
the profiled wall time, and writes the full pstats listing next to the results
(`bench/out/profiles/<label>.txt`, not committed).
"""

from __future__ import annotations

import cProfile
import io
import pstats
import time
from typing import Any, Callable

from .common import BENCH_DIR

PROFILE_DIR = BENCH_DIR / "out" / "profiles"


def _name(func: tuple) -> str:
    filename, line, name = func
    if filename == "~":
        return name  # a builtin, e.g. "<method 'execute' of 'sqlite3.Connection' objects>"
    short = filename
    for marker in ("/lossless_context/", "/site-packages/", "/lib/python3"):
        if marker in filename:
            short = filename.split(marker, 1)[1]
            if marker == "/lossless_context/":
                short = "lossless_context/" + short
            break
    return f"{short}:{line}({name})"


def profile(label: str, fn: Callable[[], Any], top: int = 12) -> dict[str, Any]:
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    try:
        fn()
    finally:
        prof.disable()
    wall = time.perf_counter() - t0
    st = pstats.Stats(prof)
    total = st.total_tt or wall
    rows = []
    for func, (_cc, nc, tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        rows.append((func, nc, tt, ct))
    by_own = sorted(rows, key=lambda r: -r[2])[:top]
    ours = [r for r in rows if "lossless_context" in r[0][0]]
    by_cum = sorted(ours, key=lambda r: -r[3])[:top]
    PROFILE_DIR.mkdir(parents=True, exist_ok=True)
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(60)
    buf.write("\n\n")
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(40)
    path = PROFILE_DIR / f"{label}.txt"
    path.write_text(buf.getvalue(), encoding="utf-8")
    fmt = lambda r, i: {"function": _name(r[0]), "calls": r[1], "seconds": round(r[i], 4),  # noqa: E731
                         "share": round(r[i] / total, 3) if total else None}
    return {
        "label": label,
        "profiled_seconds": round(wall, 3),
        "by_own_time": [fmt(r, 2) for r in by_own],
        "by_cumulative_time_ours": [fmt(r, 3) for r in by_cum],
        "listing": str(path.relative_to(BENCH_DIR.parent)),
    }
