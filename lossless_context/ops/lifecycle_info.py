"""What `lcm status` and `lcm doctor` say about a store's lifecycle: its size (and the space
free inside the file), growth per day, the oldest session, the retention in force, the
last prune, what prunes left behind, and whether the store is encrypted at rest (and, for
PostgreSQL, whether the connection to a remote server is).
"""

from __future__ import annotations

import time
from typing import Any

from ..config import RetentionPolicy
from ..store.base import Store
from .retention import DAY, human_bytes, interrupted, lineages

GROWTH_DAYS = 7  # growth per day: the messages stored in the last week


def store_facts(store: Store, policy: RetentionPolicy | None = None, now: float | None = None) -> dict[str, Any]:
    now = time.time() if now is None else now
    space = store.space()
    groups = lineages(store)
    messages = sum(g.messages for g in groups)
    recent = store.messages_since(now - GROWTH_DAYS * DAY) if messages else 0
    per_message = space["used_bytes"] / messages if messages else 0.0
    oldest = groups[0] if groups else None
    runs = store.retention_runs(1)
    facts: dict[str, Any] = {
        "file_bytes": space["file_bytes"], "used_bytes": space["used_bytes"], "free_bytes": space["free_bytes"],
        "auto_vacuum": space["auto_vacuum"],
        "growth_bytes_per_day": int(per_message * recent / GROWTH_DAYS),
        "messages_last_7_days": recent,
        "oldest_lineage": None if oldest is None else {
            "session": oldest.sessions[0], "sessions": len(oldest.sessions), "last_activity": oldest.last_activity,
            "age_days": round((now - oldest.last_activity) / DAY, 1)},
        "retention": (policy.as_dict() | {"enabled": policy.enabled}) if policy is not None else None,
        "last_prune": runs[0] if runs else None,
        "pruned": store.pruned_totals(),
        "interrupted_prunes": len(interrupted(store)),
        "encrypted": encryption_state(store),
    }
    if "dead_rows" in space:
        facts["dead_rows"] = space["dead_rows"]
    return facts


def encryption_state(store: Store) -> str:
    """"sqlcipher" (encrypted at rest), "none" (an SQLite file in plaintext), or for
    PostgreSQL what protects the connection ("tls", "local", "unencrypted")."""
    return store.encryption()


def render_facts(f: dict[str, Any]) -> list[str]:
    """The facts as lines (`lcm status`, `lcm doctor`)."""
    lines = [f"size: {human_bytes(f['file_bytes'])} on disk, {human_bytes(f['used_bytes'])} in use"
             + (f", {human_bytes(f['free_bytes'])} free inside the file" if f.get("free_bytes") else "")
             + ("" if f["auto_vacuum"] in ("incremental", "server") else
                " (made without incremental auto-vacuum: `lcm vacuum` rewrites it so prunes shrink the file)"),
             f"growth: ≈{human_bytes(f['growth_bytes_per_day'])} a day ({f['messages_last_7_days']:,} messages "
             "in the last 7 days)"]
    o = f.get("oldest_lineage")
    if o:
        lines.append(f"oldest session: {o['session']}" + (f" (+{o['sessions'] - 1} in its lineage)" if o["sessions"] > 1
                                                          else "")
                     + f", last active {time.strftime('%Y-%m-%d', time.gmtime(o['last_activity']))}"
                     f" ({o['age_days']:g} days ago)")
    r = f.get("retention")
    if r is not None:
        if r["enabled"]:
            parts = ([f"older than {r['max_age_days']:g} days"] if r["max_age_days"] else []) + (
                [f"above {r['max_store_mb']:g} MB"] if r["max_store_mb"] else [])
            lines.append("retention: prunes " + " and ".join(parts) + (" (keeping summaries)" if r["keep_summaries"]
                                                                       else " (whole sessions)")
                         + f", at most every {r['interval_hours']:g} h")
        else:
            lines.append("retention: off (nothing is ever removed but by `lcm forget` / `lcm prune`)")
    last = f.get("last_prune")
    if last:
        when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(last["started_at"]))
        lines.append(f"last prune: {when} UTC ({last['trigger']}, {last['mode']}): "
                     + (f"{last['sessions']} sessions, {last['messages']:,} messages, {last['summaries']} summaries"
                        if last["finished_at"] else "did not finish"))
    p = f.get("pruned") or {}
    if p.get("summaries"):
        lines.append(f"kept summaries whose originals were pruned: {p['summaries']:,} ({p['messages']:,} messages"
                     " removed)")
    enc = f.get("encrypted")
    lines.append("encrypted at rest: " + {"sqlcipher": "yes (SQLCipher)",
                                          "none": "no (plaintext SQLite file; `lcm encrypt` encrypts it)",
                                          "local": "server side (PostgreSQL on this machine: disk encryption)",
                                          "tls": "server side (PostgreSQL; the connection uses TLS)",
                                          "unencrypted": "server side; WARNING: the connection to the server is"
                                                         " NOT encrypted (use sslmode=verify-full)"}.get(str(enc),
                                                                                                     str(enc)))
    return lines


def lifecycle_checks(store: Store, rep: Any, finished: int = 0, policy: RetentionPolicy | None = None) -> None:
    """The doctor's lifecycle lines: the facts, an interrupted prune as a failure (``finished``:
    how many ``--repair`` finished before the checks ran), PostgreSQL's VACUUM advice after
    prunes, and an unencrypted connection to a remote PostgreSQL server."""
    try:
        facts = store_facts(store, policy)
    except Exception as exc:  # a report, not a reason to stop the doctor
        rep.add("store lifecycle", True, f"not measured: {type(exc).__name__}: {exc}", info=True)
        return
    rep.facts.extend(render_facts(facts))
    stuck = facts["interrupted_prunes"]
    name = "no interrupted prune"
    if finished:
        chk = rep.add(name, False, f"{finished} prune(s) had stopped before the end; finished")
        chk.repaired = True
    elif stuck:
        rep.add(name, False, f"{stuck} prune(s) stopped before the end (sessions half removed); "
                "`lcm doctor --repair` finishes them")
    else:
        rep.add(name, True)
    dead = facts.get("dead_rows") or {}
    bloated = {t: d for t, d in dead.items() if d["dead"] > 10_000 and d["dead"] > d["live"] / 5}
    if bloated:
        rep.add("space of removed rows", True,
                "notice: " + ", ".join(f"{t}: {d['dead']:,} dead rows" for t, d in sorted(bloated.items()))
                + f" — run `VACUUM (ANALYZE) {', '.join(sorted(bloated))};` to make their space reusable (autovacuum"
                " will, later); `VACUUM FULL` or pg_repack returns it to the file system (VACUUM FULL locks each"
                " table while it runs)", info=True)
    if facts.get("encrypted") == "unencrypted":
        rep.add("connection to the store server encrypted", True,
                "WARNING: the connection to a remote PostgreSQL server is not encrypted: every message travels in"
                " plaintext; add sslmode=verify-full (and sslrootcert) to the DSN", info=True)
