"""RESULTS.md section of issue 43's part: encryption's cost and a host's waits during a prune
(`lifecycle`)."""

from __future__ import annotations

from typing import Any


def _f(v: Any, digits: int = 1) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def lifecycle(res: dict[str, Any]) -> list[str]:
    L = ["", "## 11. Data lifecycle: encryption at rest and pruning (`bench/lifecycle.py`)", ""]
    if res.get("error"):
        return L + [f"error: {res['error']}"]
    enc = res.get("encryption") or {}
    if enc:
        p, e, r = enc.get("plaintext", {}), enc.get("encrypted", {}), enc.get("ratios", {})
        L += [f"SQLite store of {_f(enc.get('n'))} messages built by the engine (the scale part's build and "
              "measure), plaintext and encrypted (SQLCipher 4, `LCM_ENCRYPTION_KEY`), in one run "
              f"(encrypted file starts as plain SQLite: {enc.get('encrypted_file_starts_as_sqlite')}). Goal: within ×1.2.",
              "", "| | plaintext | encrypted | encrypted / plaintext |", "|---|---:|---:|---:|",
              f"| ingest (msgs/s; ratio: time per message) | {_f(p.get('ingest_msgs_per_s'))} | "
              f"{_f(e.get('ingest_msgs_per_s'))} | ×{_f(r.get('ingest_time'), 2)} |"]
        for key, label in (("grep_text_p50_ms", "lcm_grep text p50 (ms)"),
                           ("grep_text_cpu_p50_ms", "lcm_grep text p50 (CPU ms)"),
                           ("grep_identifier_p50_ms", "lcm_grep identifier p50 (ms)"),
                           ("grep_identifier_cpu_p50_ms", "lcm_grep identifier p50 (CPU ms)"),
                           ("grep_cjk_p50_ms", "lcm_grep CJK substring p50 (ms)"),
                           ("grep_cjk_cpu_p50_ms", "lcm_grep CJK substring p50 (CPU ms)"),
                           ("compress_engine_p50_ms", "compress() engine p50 (ms)"),
                           ("expand_p50_ms", "lcm_expand p50 (ms)"), ("store_bytes", "store bytes")):
            if key in p or key in e:
                L.append(f"| {label} | {_f(p.get(key), 2)} | {_f(e.get(key), 2)} | ×{_f(r.get(key), 2)} |")
    L += _cold(enc.get("cold") or {}, enc.get("before") or {})
    if enc.get("note"):
        L += ["", enc["note"]]
    inter = enc.get("interleaved") or {}
    if inter.get("rounds"):
        L += ["", f"Ingest of {_f(inter.get('n'))} messages, plaintext then encrypted, {len(inter['rounds'])} times over "
              "(each round's two builds one after the other, the load of a shared machine drifting over minutes): "
              "time per message encrypted / plaintext per round "
              + ", ".join(f"×{_f(r.get('ratio'), 2)}" for r in inter["rounds"])
              + f"; median ×{_f(inter.get('median_ingest_time_ratio'), 2)}."]
    for key in ("prune_wait", "prune_wait_controlled"):
        if res.get(key):
            L += _prune(res[key])
    if res.get("prune_ab"):
        L += _prune_ab(res["prune_ab"])
    return L


def _prune_ab(ab: dict[str, Any]) -> list[str]:
    """The prune before and after a change, with the host beside it (`lifecycle.py prune-ab`)."""
    L = ["", ab.get("intro") or f"`{ab.get('command')}`", "",
         "| run | code | prune (s) | msgs/s | transactions | lock held p50 / p95 / max (ms) | held > 100 ms | host write"
         " during p50 / p95 / p99 / max (ms) | writes > 100 ms | host grep during p50 / p95 / max (ms) | host write"
         " before the prune: p95 / max (ms) |",
         "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for k, run in enumerate(ab.get("runs") or [], 1):
        pr, host = run.get("prune", {}), run.get("host", {})
        held, w, g = pr.get("lock_held_ms") or {}, host.get("during", {}).get("write", {}), host.get("during", {}).get("grep", {})
        b = host.get("before", {}).get("write", {})
        rate = pr["messages"] / pr["seconds"] if pr.get("seconds") else None
        L.append(f"| {k} | {run.get('code')} | {_f(pr.get('seconds'))} | {_f(rate, 0)} | {_f(pr.get('transactions'))} | "
                 f"{_f(held.get('p50'))} / {_f(held.get('p95'))} / {_f(held.get('max'))} | "
                 f"{_f(held.get('over_100ms'))} of {_f(held.get('n'))} | {_f(w.get('p50'))} / {_f(w.get('p95'))} / "
                 f"{_f(w.get('p99'))} / {_f(w.get('max'))} | {_f(w.get('over_100ms'))} of {_f(w.get('n'))} | "
                 f"{_f(g.get('p50'))} / {_f(g.get('p95'))} / {_f(g.get('max'))} | {_f(b.get('p95'))} / {_f(b.get('max'))} "
                 f"({_f(b.get('over_100ms'))} of {_f(b.get('n'))} over 100) |")
    if ab.get("note"):
        L += ["", ab["note"]]
    return L


def _cold(cold: dict[str, Any], before: dict[str, Any]) -> list[str]:
    """The cold part (ten different questions, each first asked in a fresh process) and, when
    kept, the same measurements of the code before a change, from the same session."""
    if not cold.get("plaintext"):
        return []
    L = ["", f"lcm_grep text, {cold.get('questions')} different questions each asked once in a fresh process (its "
         "pages read from the file: decrypted and HMAC-checked when encrypted), then each again (from the page "
         f"cache); plaintext and encrypted in turn, {cold.get('rounds')} rounds, medians:", "",
         "| | plaintext | encrypted | encrypted / plaintext |", "|---|---:|---:|---:|"]
    p, e, r = cold["plaintext"], cold["encrypted"], cold.get("ratios", {})
    for key, label in (("first_wall_p50_ms", "first search p50 (ms)"), ("first_cpu_p50_ms", "first search p50 (CPU ms)"),
                       ("first_cpu_sum_ms", "first searches, total (CPU ms)"),
                       ("again_wall_p50_ms", "again p50 (ms)"), ("again_cpu_p50_ms", "again p50 (CPU ms)"),
                       ("again_cpu_sum_ms", "again, total (CPU ms)")):
        L.append(f"| {label} | {_f(p.get(key), 2)} | {_f(e.get(key), 2)} | ×{_f(r.get(key), 2)} |")
    if before.get("runs"):
        L += ["", f"Before and after {before.get('change')} (each a run of this part, "
              f"{before.get('order')}; encrypted / plaintext within each run):", "",
              "| run | code | text p50 | text p50 (CPU) | first searches (CPU total) | again (CPU total) |"
              " plaintext first / again (CPU ms) | encrypted first / again (CPU ms) |",
              "|---|---|---:|---:|---:|---:|---:|---:|"]
        for k, run in enumerate(before["runs"], 1):
            rr, cr = run.get("ratios", {}), (run.get("cold") or {}).get("ratios", {})
            cp, ce = (run.get("cold") or {}).get("plaintext", {}), (run.get("cold") or {}).get("encrypted", {})
            L.append(f"| {k} | {run.get('code')} | ×{_f(rr.get('grep_text_p50_ms'), 2)} | "
                     f"×{_f(rr.get('grep_text_cpu_p50_ms'), 2)} | ×{_f(cr.get('first_cpu_sum_ms'), 2)} | "
                     f"×{_f(cr.get('again_cpu_sum_ms'), 2)} | {_f(cp.get('first_cpu_sum_ms'))} / "
                     f"{_f(cp.get('again_cpu_sum_ms'))} | {_f(ce.get('first_cpu_sum_ms'))} / {_f(ce.get('again_cpu_sum_ms'))} |")
    return L


def _prune(pw: dict[str, Any]) -> list[str]:
    L: list[str] = []
    pr, host, cp = pw.get("prune", {}), pw.get("host", {}), pw.get("copies", {})
    L += ["", f"A host's calls while a store of {_f(pw.get('n'))} messages is pruned ({_f(pw.get('engine_built'))} "
          f"built by the engine, {_f(cp.get('copied'))} copied with SQL into {_f(cp.get('sessions'))} sessions "
          f"of their own lineage, aged {cp.get('messages_by_age_days')} days): `prune --older-than 90` in one "
          "process, the host in another storing a turn and running `lcm_grep` every ~20 ms.", "",
          f"Prune: {_f(pr.get('sessions'))} sessions, {_f(pr.get('messages'))} messages, "
          f"{_f(pr.get('summaries'))} summaries removed in {_f(pr.get('seconds'))} s (plan {_f(pr.get('plan_seconds'))} s), "
          f"{_f(pr.get('transactions'))} transactions, each holding the write lock p50 "
          f"{_f((pr.get('lock_held_ms') or {}).get('p50'))} / p95 {_f((pr.get('lock_held_ms') or {}).get('p95'))} / max "
          f"{_f((pr.get('lock_held_ms') or {}).get('max'))} ms ({_f((pr.get('lock_held_ms') or {}).get('over_100ms'))} over"
          f" 100 ms; the longest removal call, its wait for the lock included, {_f(pr.get('longest_transaction_ms'))} ms); "
          f"file {_f(pw.get('file_bytes_before'))} → {_f(pr.get('file_bytes_after'))} bytes "
          f"({_f(pr.get('bytes_returned'))} given back by incremental vacuum).", "",
          "| host call (ms) | before: n | p50 | p95 | max | during the prune: n | p50 | p95 | max | after: n | p50 | p95 | max |",
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for op in ("write", "grep"):
        cells = []
        for ph in ("before", "during", "after"):
            x = host.get(ph, {}).get(op, {})
            cells += [_f(x.get("n")), _f(x.get("p50")), _f(x.get("p95")), _f(x.get("max"))]
        L.append(f"| {op} | " + " | ".join(cells) + " |")
    if pw.get("note"):
        L += ["", pw["note"]]
    return L
