"""The `lcm demo` replay: a long deterministic coding session driven through a real engine.

Holds `run_demo()`, which generates `sessions.coding_session(n, seed)` and feeds it to an
`LCMEngine` exactly the way the Hermes host does (docs/host-contract.md#r19-order-of-calls): turn by
turn, a preflight `should_compress(estimate)` when the user message arrives and again
after every tool batch, up to three `compress()` passes, and — only when the host adopts
a result — the commit: `on_session_end(sid, messages)` then `on_session_start(new_sid,
boundary_reason="compression", old_session_id=sid)`. Each message carries a simulated
host `timestamp`, as live host messages do. Afterwards every planted canary is
searched with `lcm_grep` and its hit expanded with `lcm_expand`, which must return the
original message byte for byte. No CLI code here: the CLI renders the `DemoResult`.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..config import LCMConfig
from .host_driver import R19Host
from .sessions import SYSTEM_PROMPT, Canary, coding_session
from ..tokens import estimate_messages_tokens, estimate_text_tokens

DEFAULT_MESSAGES = 3000
DEFAULT_CONTEXT_LENGTH = 64_000  # the smallest window the real host accepts
TOOL_SCHEMA_TOKENS = 2_500  # what the host's estimate adds for tool schemas


@dataclass
class CanaryCheck:
    key: str
    kind: str
    value: str
    question: str
    found: bool = False  # lcm_grep returned the planted message
    hit_id: str | None = None
    summary_chain: list[str] = field(default_factory=list)
    expanded_verbatim: bool = False  # lcm_expand returned the original message byte for byte
    note: str = ""

    @property
    def recovered(self) -> bool:
        return self.found and self.expanded_verbatim


@dataclass
class DemoResult:
    store: str
    session_id: str
    final_session_id: str
    seed: int
    messages_generated: int
    messages_stored: int
    tokens_before: int  # the whole session as one request would be
    tokens_after: int  # the final context the host holds
    context_length: int
    threshold_tokens: int
    compactions: int
    no_progress_passes: int
    nodes_by_depth: dict[int, int]
    summarizer: str
    summarizer_calls: int
    summarizer_failures: int
    canaries: list[CanaryCheck]
    seconds: float
    replay_seconds: float
    sessions: list[str]
    html: str | None = None

    @property
    def canaries_recovered(self) -> int:
        return sum(1 for c in self.canaries if c.recovered)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["canaries_recovered"] = self.canaries_recovered
        d["nodes_by_depth"] = {str(k): v for k, v in sorted(self.nodes_by_depth.items())}
        return d


def demo_config(store: str, summarizer: str = "extractive", base_url: str = "", model: str = "",
                api_key_env: str = "") -> LCMConfig:
    """A config that ignores the user's config.yaml and LCM_* variables: the demo is reproducible."""
    over: dict[str, Any] = {"store": store, "summarizer": summarizer}
    if summarizer == "openai":
        over.update(summary_base_url=base_url, summary_model=model or "demo",
                    summary_api_key_env=api_key_env or "")
    return LCMConfig.load(over, read_file=False, environ={})


def _unique_session_id(store: Any, base: str) -> str:
    sid, n = base, 1
    while store.get_session(sid) is not None:
        n += 1
        sid = f"{base}-{n}"
    return sid


DEMO_START = 1_767_603_600.0  # 2026-01-05 09:00 UTC: the session's simulated start


def with_timestamps(messages: list[dict[str, Any]], start: float = DEMO_START) -> list[dict[str, Any]]:
    """Copies carrying the host-only `timestamp` a live host stamps on every message: 20 s
    between messages, a few minutes between turns (deterministic, so spans and the tools'
    since/until filters mean something)."""
    out, t = [], start
    for i, m in enumerate(messages):
        if i and m.get("role") == "user":
            t += 180 + (i * 37) % 420
        out.append({**m, "timestamp": t})
        t += 20
    return out


def replay(engine: Any, messages: list[dict[str, Any]], session_id: str, context_length: int,
           rotate: bool = False, progress: Callable[[int], None] | None = None) -> R19Host:
    """Drive `messages` through `engine` turn by turn with the R19 host driver (a pass is
    considered when a user message arrives and after every tool batch; the provider reports
    usage after every assistant message); returns the host state at the end."""
    host = R19Host(engine, session_id=session_id, system_prompt=SYSTEM_PROMPT, overhead_tokens=TOOL_SCHEMA_TOKENS,
                   context_length=context_length, model="demo-model", base_url="", api_key="", rotate=rotate)
    host.start()
    i, n = 0, len(messages)
    while i < n:
        m = messages[i]
        host.add(m)
        i += 1
        role = m.get("role")
        if role == "user":
            host.maybe_compress()  # preflight at turn start
        elif role == "assistant":
            host.respond()
            if m.get("tool_calls"):
                while i < n and messages[i].get("role") == "tool":
                    host.add(messages[i])
                    i += 1
                host.maybe_compress()  # after every tool batch
        if progress is not None:
            progress(i)
    host.end()
    return host


def check_canary(engine: Any, canary: Canary, original: dict[str, Any]) -> CanaryCheck:
    """lcm_grep the value; lcm_expand the hit; compare with the original byte for byte."""
    chk = CanaryCheck(canary.key, canary.kind, canary.value, canary.question)
    res = json.loads(engine.handle_tool_call("lcm_grep", {"query": canary.value, "limit": 10}))
    if "error" in res:
        chk.note = f"grep error: {res['error']}"
        return chk
    want = json.dumps(original, sort_keys=True, ensure_ascii=True)
    for group in res.get("groups", []):
        for hit in group.get("hits", []):
            if hit.get("kind") != "message":
                continue
            msg = expand_message(engine, hit["id"])
            if msg is None or canary.value not in json.dumps(msg, ensure_ascii=True):
                continue
            chk.found = True
            chk.hit_id = hit["id"]
            chk.summary_chain = list(hit.get("summary_chain") or [])
            chk.expanded_verbatim = json.dumps(msg, sort_keys=True, ensure_ascii=True) == want
            if not chk.expanded_verbatim:
                chk.note = "expanded message differs from the original"
            return chk
    chk.note = "not found by lcm_grep"
    return chk


def expand_message(engine: Any, mid: str) -> dict[str, Any] | None:
    """The whole stored message behind an id, following `next_cursor` pages."""
    page = json.loads(engine.handle_tool_call("lcm_expand", {"id": mid, "max_tokens": 12000}))
    if "error" in page:
        return None
    if "message" in page:
        return page["message"]
    pieces = [page.get("page", "")]
    fields = dict(page.get("message_fields") or {})
    field_name = page.get("paged_field", "content")
    guard = 0
    while page.get("next_cursor") and guard < 10_000:
        guard += 1
        page = json.loads(engine.handle_tool_call("lcm_expand", {"id": mid, "max_tokens": 12000,
                                                                 "cursor": page["next_cursor"]}))
        if "error" in page:
            return None
        pieces.append(page.get("page", ""))
    text = "".join(pieces)
    if field_name == "message_json":
        try:
            return json.loads(text)
        except ValueError:
            return None
    msg = dict(fields)
    msg.setdefault("role", page.get("role"))
    msg["content"] = text
    return msg


def run_demo(
    n_messages: int = DEFAULT_MESSAGES,
    store: str | Path | None = None,
    *,
    seed: int = 0,
    summarizer: str = "extractive",
    base_url: str = "",
    model: str = "",
    api_key_env: str = "",
    context_length: int = DEFAULT_CONTEXT_LENGTH,
    rotate: bool = False,
    html: str | Path | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> DemoResult:
    """Generate, replay, verify; `progress(stage, done, total)` is called along the way."""
    from ..engine import LCMEngine

    t0 = time.perf_counter()
    if store is None:
        import tempfile

        store = Path(tempfile.mkdtemp(prefix="lcm-demo-")) / "lcm.db"
    store = str(Path(store).expanduser())
    cfg = demo_config(store, summarizer, base_url, model, api_key_env)
    engine = LCMEngine(config=cfg)
    session = coding_session(n_messages, seed)
    msgs = with_timestamps(session.messages)
    sid = _unique_session_id(engine.store, f"demo-{seed}")

    def tick(done: int) -> None:
        if progress is not None:
            progress("replay", done, len(msgs))

    t1 = time.perf_counter()
    host = replay(engine, msgs, sid, context_length, rotate=rotate, progress=tick)
    replay_seconds = time.perf_counter() - t1
    engine.wait_background()  # the model's summaries of the fast passes' outlines (pipeline/background.py)

    checks = []
    for k, c in enumerate(session.canaries):
        checks.append(check_canary(engine, c, msgs[c.message_index]))
        if progress is not None:
            progress("canaries", k + 1, len(session.canaries))

    st = engine.store.stats()
    status = engine.get_status()
    html_path = None
    if html is not False:
        from ..ops.viewer import write_view

        html_path = str(Path(html) if html else Path(store).parent / "lcm-demo.html")
        write_view(engine.store, host.session_id, html_path)
        if progress is not None:
            progress("html", 1, 1)
    return DemoResult(
        store=store,
        session_id=sid,
        final_session_id=host.session_id,
        seed=seed,
        messages_generated=len(msgs),
        messages_stored=int(st["messages"]),
        tokens_before=estimate_text_tokens(SYSTEM_PROMPT) + estimate_messages_tokens(session.messages),
        tokens_after=host.estimate() - TOOL_SCHEMA_TOKENS,
        context_length=context_length,
        threshold_tokens=int(engine.threshold_tokens),
        compactions=host.compactions,
        no_progress_passes=host.no_progress,
        nodes_by_depth={int(k): int(v) for k, v in (st.get("summaries_by_depth") or {}).items()},
        summarizer=summarizer,
        summarizer_calls=int(status.get("lcm_summarizer_calls", 0)),
        summarizer_failures=int(status.get("lcm_summarizer_failures", 0)),
        canaries=checks,
        seconds=time.perf_counter() - t0,
        replay_seconds=replay_seconds,
        sessions=list(host.sessions),
        html=html_path,
    )


def print_tables(console: Any, res: DemoResult) -> None:
    """The result as rich tables (used by `lcm demo`)."""
    from rich.table import Table

    t = Table(title=f"lcm demo — {res.messages_generated:,}-message coding session (seed {res.seed})",
              show_header=False, title_justify="left")
    t.add_column("what", style="bold")
    t.add_column("value")
    ratio = res.tokens_before / max(1, res.tokens_after)
    t.add_row("messages stored", f"{res.messages_stored:,} of {res.messages_generated:,} generated")
    t.add_row("tokens before (whole session)", f"{res.tokens_before:,}")
    t.add_row("tokens after (final context)", f"{res.tokens_after:,}  ({ratio:.1f}× smaller; window "
              f"{res.context_length:,}, threshold {res.threshold_tokens:,})")
    t.add_row("compactions", f"{res.compactions}" + (f"  ({res.no_progress_passes} passes without progress)"
                                                    if res.no_progress_passes else ""))
    t.add_row("summary nodes by depth", ", ".join(f"d{k}: {v}" for k, v in sorted(res.nodes_by_depth.items())) or "none")
    t.add_row("summariser", f"{res.summarizer}: {res.summarizer_calls} model calls, "
              f"{res.summarizer_failures} failures")
    t.add_row("canaries recovered", f"{res.canaries_recovered}/{len(res.canaries)} "
              "(lcm_grep finds the value, lcm_expand returns the original byte for byte)")
    if len(res.sessions) > 1:
        t.add_row("sessions (rotation)", f"{res.sessions[0]} → … → {res.sessions[-1]} ({len(res.sessions)})")
    t.add_row("time", f"{res.seconds:.1f} s (replay {res.replay_seconds:.1f} s)")
    t.add_row("store", res.store)
    if res.html:
        t.add_row("HTML view", res.html)
    console.print(t)
    c = Table(title="canaries", title_justify="left")
    for col in ("key", "kind", "value", "hit", "summary chain", "ok"):
        c.add_column(col, overflow="fold")
    for ch in res.canaries:
        chain = " → ".join(ch.summary_chain) if ch.summary_chain else "(active context)"
        c.add_row(ch.key, ch.kind, ch.value, ch.hit_id or "-", chain if ch.found else "-",
                  "[green]yes[/green]" if ch.recovered else f"[red]no[/red] {ch.note}")
    console.print(c)
    if res.canaries:
        console.print(f"try: lcm --store {res.store} grep '{res.canaries[0].value}'")
