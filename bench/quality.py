"""A summary-quality metric that needs no model: how many concrete facts survive summarisation.

A long "mixed" session is driven through our engine (`bench.host.HostDriver`, a 64K window so
the DAG gets deep), once with the extractive summariser and once with the fake model
(FakeOpenAI + the deterministic `SummariserResponder`). Then for every published summary node:

* **facts of its sources** are regex-extracted — identifiers (snake_case, UPPER_SNAKE,
  CamelCase, camelCase, ticket ids), paths and file names, numbers (3+ digits) and quoted
  strings — from the source messages' text (leaf nodes) or the child summaries' texts
  (condensed nodes);
* **in text**: the share of those facts found verbatim in the node's summary text;
* **in text or reachable**: the share found in the text *or* in what `lcm_expand` of the node
  returns (all pages). Expansion returns the children verbatim, so in a lossless store this
  is ~100% by construction — it checks that the DAG links really lead back to every source;
  the "in text" share is the actual summary quality (what the model sees without a tool call).

Reported per escalation level (`level`: normal / aggressive / deterministic) and per depth,
as the micro share (all facts pooled) and the mean per node, plus per fact category.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

from . import common
from .host import HostDriver

_PATH = re.compile(r"(?<![\w./-])(?:[A-Za-z0-9_.-]+/)+[A-Za-z0-9_.-]*[A-Za-z0-9_]")
_FILE = re.compile(r"\b[A-Za-z_][\w-]*\.(?:py|md|txt|json|ya?ml|toml|cfg|ini|sql|sh|log|csv|js|ts|html)\b")
_IDENTS = [
    re.compile(r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b"),  # snake_case
    re.compile(r"\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b"),  # UPPER_SNAKE
    re.compile(r"\b[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]+)+\b"),  # CamelCase
    re.compile(r"\b[a-z]+(?:[A-Z][a-z0-9]+)+\b"),  # camelCase
    re.compile(r"\b[A-Z]{2,}-\d+\b"),  # ticket ids
]
_NUMBER = re.compile(r"(?<![\w.])\d{3,}(?:\.\d+)?(?![\w])")
_QUOTED = re.compile(r'"([^"\n]{3,80})"(?!\s*:)|\'([^\'\n]{3,80})\'|`([^`\n]{2,80})`')
CATEGORIES = ("identifier", "path", "number", "quoted")


def extract_facts(text: str) -> dict[str, set[str]]:
    facts: dict[str, set[str]] = {c: set() for c in CATEGORIES}
    for m in _PATH.finditer(text):
        if re.search(r"[A-Za-z]", m.group(0)):
            facts["path"].add(m.group(0))
    facts["path"].update(_FILE.findall(text))
    for rx in _IDENTS:
        facts["identifier"].update(rx.findall(text))
    facts["number"].update(_NUMBER.findall(text))
    for m in _QUOTED.finditer(text):
        q = next(g for g in m.groups() if g is not None).strip()
        if len(q) >= 2:
            facts["quoted"].add(q)
    return facts




def _expand_all(engine: Any, node_id: int, max_pages: int = 50) -> str:
    """Everything lcm_expand returns for a node, all pages (and pages of oversized messages)."""
    out: list[str] = []
    cursor = None
    for _ in range(max_pages):
        args: dict[str, Any] = {"id": f"s{node_id}", "max_tokens": 12000}
        if cursor:
            args["cursor"] = cursor
        page = json.loads(engine.handle_tool_call("lcm_expand", args))
        for ch in page.get("children", []):
            if ch.get("truncated") and ch.get("id", "").startswith("m"):
                out.append(_expand_message(engine, ch["id"]))
            else:
                out.extend(common.leaves(ch))
        cursor = page.get("next_cursor")
        if not cursor:
            break
    return "\n".join(out)


def _expand_message(engine: Any, mid: str, max_pages: int = 50) -> str:
    out: list[str] = []
    cursor = None
    for _ in range(max_pages):
        args: dict[str, Any] = {"id": mid, "max_tokens": 12000}
        if cursor:
            args["cursor"] = cursor
        page = json.loads(engine.handle_tool_call("lcm_expand", args))
        out.extend(common.leaves(page))
        cursor = page.get("next_cursor")
        if not cursor:
            break
    return "\n".join(out)


def score_store(engine: Any) -> list[dict[str, Any]]:
    st = engine.store
    c = st.conn()
    ids = [r[0] for r in c.execute("SELECT id FROM summaries WHERE state='published' ORDER BY id")]
    sums = st.get_summaries(ids)
    nodes = []
    for sid in ids:
        rec = sums[sid]
        kids, mids = st.summary_children(sid)
        if kids:
            src = "\n".join(sums[k].text if k in sums else "" for k in kids)
        else:
            src = "\n".join(m.text for m in st.get_messages(mids).values())
        facts = extract_facts(src)
        reach = _expand_all(engine, sid)
        row: dict[str, Any] = {"id": sid, "kind": rec.kind, "depth": rec.depth, "level": rec.level,
                               "tokens": rec.tokens, "source_tokens": rec.source_tokens}
        tot = kept = reached = 0
        for cat in CATEGORIES:
            fs = facts[cat]
            k = sum(1 for f in fs if f in rec.text)
            r = sum(1 for f in fs if f in rec.text or f in reach)
            row[cat] = {"facts": len(fs), "in_text": k, "reachable": r}
            tot, kept, reached = tot + len(fs), kept + k, reached + r
        row.update({"facts": tot, "in_text": kept, "reachable": reached})
        nodes.append(row)
    return nodes


def aggregate(nodes: list[dict[str, Any]], key: str) -> dict[str, Any]:
    groups: dict[Any, list[dict[str, Any]]] = {}
    for n in nodes:
        groups.setdefault(n[key], []).append(n)
    out = {}
    for g, rows in sorted(groups.items(), key=lambda kv: str(kv[0])):
        facts = sum(r["facts"] for r in rows)
        with_facts = [r for r in rows if r["facts"]]
        entry: dict[str, Any] = {
            "nodes": len(rows),
            "facts": facts,
            "in_text_share": round(sum(r["in_text"] for r in rows) / facts, 4) if facts else None,
            "reachable_share": round(sum(r["reachable"] for r in rows) / facts, 4) if facts else None,
            "mean_node_in_text_share": round(sum(r["in_text"] / r["facts"] for r in with_facts) / len(with_facts), 4)
            if with_facts else None,
            "compression_ratio": round(sum(r["tokens"] for r in rows) / max(1, sum(r["source_tokens"] for r in rows)), 4),
        }
        for cat in CATEGORIES:
            f = sum(r[cat]["facts"] for r in rows)
            entry[f"{cat}_in_text_share"] = round(sum(r[cat]["in_text"] for r in rows) / f, 4) if f else None
        out[str(g)] = entry
    return out


def run_one(summarizer: str, session: Any, work: Path, ctx: int) -> dict[str, Any]:
    from lossless_context.demo.sessions import SYSTEM_PROMPT

    srv = common.fake_server() if summarizer == "openai" else None
    store = str(work / f"quality-{summarizer}.db")
    eng = common.make_engine(store, context_length=ctx, summarizer=summarizer,
                             summary_base_url=srv.base_url if srv else "")
    drv = HostDriver(eng, session_id=f"quality-{summarizer}", system_prompt=SYSTEM_PROMPT, context_length=ctx,
                     model=common.MODEL, base_url=srv.base_url if srv else "http://127.0.0.1:9/v1",
                     api_key=common.API_KEY)
    drv.start()
    t0 = time.perf_counter()
    drv.feed(session.messages)
    drv.end()
    build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    nodes = score_store(eng)
    score_s = time.perf_counter() - t0
    eng.store.close()
    total = aggregate(nodes, "kind")
    facts = sum(n["facts"] for n in nodes)
    return {
        "summarizer": "extractive" if summarizer == "extractive" else "fake model (SummariserResponder)",
        "compactions": sum(1 for p in drv.passes if p.adopted),
        "nodes": len(nodes),
        "overall": {
            "facts": facts,
            "in_text_share": round(sum(n["in_text"] for n in nodes) / facts, 4) if facts else None,
            "reachable_share": round(sum(n["reachable"] for n in nodes) / facts, 4) if facts else None,
        },
        "by_level": aggregate(nodes, "level"),
        "by_depth": aggregate(nodes, "depth"),
        "by_kind": total,
        "build_seconds": round(build_s, 2), "score_seconds": round(score_s, 2),
    }


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    from lossless_context.demo.sessions import mixed_session

    quick = cfg["quick"]
    n = cfg.get("quality_messages") or (400 if quick else 3000)
    ctx = 64_000
    session = mixed_session(n, seed=23)
    work = Path(common.isolate_env()) / "quality"
    work.mkdir(parents=True, exist_ok=True)
    out = {"messages": n, "context_length": ctx, "runs": []}
    for summarizer in ("extractive", "openai"):
        t0 = time.perf_counter()
        r = run_one(summarizer, session, work, ctx)
        out["runs"].append(r)
        print(f"  quality {r['summarizer']}: {r['nodes']} nodes, in text {r['overall']['in_text_share']}, "
              f"{time.perf_counter() - t0:.1f}s", flush=True)
    return out
