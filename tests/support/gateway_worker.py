"""One process of a simulated Hermes gateway on a shared store (run as a script).

    python tests/support/gateway_worker.py <store> <proc> <threads> <sessions_per_thread> <turns> <out.json>

Each thread drives its sessions one after another the way the gateway's agents do: one engine
copy per agent, the R19 call order (should_compress → compress → commit signal), a small
window so every session compacts. Every message a session sends carries a unique marker; the
result file lists them per session with every error, invalid output and exception the host
saw, for the parent test to check against the store.
"""

from __future__ import annotations

import copy
import json
import sys
import threading
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from lossless_context import LCMEngine  # noqa: E402
from lossless_context.pipeline.validate import pairing_problems  # noqa: E402
from lossless_context.config import LCMConfig  # noqa: E402
from lossless_context.tokens import estimate_messages_tokens  # noqa: E402

WINDOW = 16_000
FILLER = ("the deploy pipeline for this service was checked step by step and the notes were kept "
          "for the next review of the gateway configuration ") * 12


def marker(sid: str, n: int) -> str:
    return f"MK-{sid}-{n:04d}"


def drive(store: str, sid: str, turns: int, out: dict) -> None:
    e = LCMEngine(config=LCMConfig.load({"store": store, "store_retry_seconds": 1}, read_file=False))
    e.update_model(model="m", context_length=WINDOW, base_url="http://127.0.0.1:9/v1", api_key="k",
                   provider="custom", api_mode="chat_completions")
    e.bind_session_state(None, sid)
    e.on_session_start(sid, platform="gateway", model="m", context_length=WINDOW)
    host: list[dict] = []
    sent: list[str] = []
    rec = out.setdefault(sid, {"sent": sent, "errors": [], "passes": 0, "unchanged": 0})
    n = 0
    for t in range(turns):
        for role in ("user", "assistant"):
            mk = marker(sid, n)
            n += 1
            host.append({"role": role, "content": f"{mk} {role} turn {t}: {FILLER}"})
            sent.append(mk)
        tokens = estimate_messages_tokens(host)
        if not e.should_compress(tokens):
            continue
        before = copy.deepcopy(host)
        try:
            result = e.compress(host, current_tokens=tokens)
        except Exception as exc:  # the contract: compress() never raises
            rec["errors"].append(f"compress raised {type(exc).__name__}: {exc}")
            continue
        bad = pairing_problems(result)
        if bad:
            rec["errors"].append(f"invalid output: {bad[:3]}")
            continue
        if result == before:
            rec["unchanged"] += 1
            continue
        e.on_session_end(sid, before)
        host = [m for m in result if m.get("role") != "system"]
        e.on_session_start(sid, boundary_reason="compression", old_session_id=sid, platform="gateway")
        rec["passes"] += 1
    e.on_session_end(sid, copy.deepcopy(host))


def main(argv: list[str]) -> int:
    store, proc, threads, per_thread, turns, out_path = argv
    out: dict = {}
    failures: list[str] = []

    def run(k: int) -> None:
        try:
            for j in range(int(per_thread)):
                drive(store, f"g{proc}t{k}s{j}", int(turns), out)
        except BaseException:  # noqa: BLE001 (reported to the parent, never swallowed)
            failures.append(traceback.format_exc())

    ts = [threading.Thread(target=run, args=(k,)) for k in range(int(threads))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    Path(out_path).write_text(json.dumps({"sessions": out, "failures": failures}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
