"""A host of our own following docs/host-contract.md#n-optional-hooks and
docs/host-contract.md#n-message-identity (the newer Hermes contract).

Stamps `message_uid` on every message (and `_tool_call_uids`/`_tool_call_uid`), calls
`select_context` before every request, `on_turn_complete` after every turn,
`clone_for_agent` per agent, and runs `compress()` on a worker thread under a timeout
with `_compression_cancelled_check`; it sends the commit signal only when it adopts the
result. Provider-facing copies strip underscore keys and `message_uid`.
"""

from __future__ import annotations

import copy
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

from lossless_context.tokens import estimate_messages_tokens


def stamp(msg: dict[str, Any]) -> dict[str, Any]:
    m = dict(msg)
    m.setdefault("message_uid", uuid.uuid4().hex)
    if m.get("role") == "assistant" and m.get("tool_calls"):
        m["_tool_call_uids"] = {tc["id"]: uuid.uuid4().hex for tc in m["tool_calls"]}
    if m.get("role") == "tool":
        m["_tool_call_uid"] = uuid.uuid4().hex
    return m


def provider_copy(msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in m.items() if not k.startswith("_") and k != "message_uid"} for m in msgs]


@dataclass
class NewHost:
    engine: Any
    session_id: str
    system_prompt: str = "You are Hermes (newer host)."
    timeout: float = 30.0
    history: list[dict[str, Any]] = field(default_factory=list)
    requests: list[list[dict[str, Any]]] = field(default_factory=list)
    selections: list[Any] = field(default_factory=list)
    commits: int = 0
    abandoned: int = 0

    def start(self, context_length: int = 64_000) -> None:
        self.engine.model_thresholds = {"test-model": 0.75}
        self.engine.update_model(model="test-model", context_length=context_length, base_url="", api_key="",
                                 provider="custom", api_mode="chat_completions")
        self.engine.bind_session_state(None, self.session_id)
        self.engine.on_session_start(self.session_id, platform="gateway", conversation_id=f"conv-{self.session_id}")

    def request(self) -> list[dict[str, Any]]:
        req = [{"role": "system", "content": self.system_prompt}] + copy.deepcopy(self.history)
        sel = self.engine.select_context(req, conversation_messages=copy.deepcopy(self.history),
                                         incoming_message=None, budget_tokens=self.engine.threshold_tokens)
        self.selections.append(sel)
        use = req
        if isinstance(sel, list) and sel and all(isinstance(m, dict) for m in sel):
            if sel[0] == req[0] and not any(m.get("role") == "system" for m in sel[1:]) and \
                    all(m.get("tool_call_id") for m in sel if m.get("role") == "tool"):
                use = sel
        out = provider_copy(use)
        self.requests.append(out)
        return out

    def turn(self, *msgs: dict[str, Any]) -> None:
        for m in msgs:
            self.history.append(stamp(m))
        self.request()
        self.engine.on_turn_complete(copy.deepcopy(self.history), usage={"prompt_tokens": 1}, turn_id=uuid.uuid4().hex,
                                     task_id=self.session_id, api_call_count=1, interrupted=False, failed=False,
                                     turn_exit_reason="text_response")

    def estimate(self) -> int:
        return estimate_messages_tokens(self.history) + len(self.system_prompt) // 4

    def compress(self, force: bool = False, timeout: float | None = None) -> bool:
        """Run compress() on a worker thread with a private deep copy, under a timeout."""
        if not force and not self.engine.should_compress(self.estimate()):
            return False
        cancelled = threading.Event()
        self.engine._compression_cancelled_check = cancelled.is_set
        box: dict[str, Any] = {}
        private = copy.deepcopy(self.history)

        def work() -> None:
            try:
                box["out"] = self.engine.compress(private, current_tokens=self.estimate(), force=force,
                                                  session_id=self.session_id)
            except BaseException as exc:  # noqa: BLE001 - the host records and discards
                box["exc"] = exc

        t = threading.Thread(target=work, daemon=True)
        t.start()
        t.join(timeout if timeout is not None else self.timeout)
        if t.is_alive() or "exc" in box:
            cancelled.set()
            self.abandoned += 1
            t.join(60)
            return False
        out = box["out"]
        if not out or out == self.history:
            return False
        self.engine.on_session_end(self.session_id, copy.deepcopy(self.history))
        self.history = [m for m in out if m.get("role") != "system"]
        self.commits += 1
        self.engine.on_session_start(self.session_id, boundary_reason="compression",
                                     old_session_id=self.session_id, platform="gateway",
                                     conversation_id=f"conv-{self.session_id}")
        return True


# --------------------------------------------------------------------------------------------
# Upstream main (0.20+) on top of the contract above: what docs/host-contract.md#n-the-pass-on-a-worker-thread describes.
# --------------------------------------------------------------------------------------------

import concurrent.futures  # noqa: E402
import time  # noqa: E402
from contextlib import contextmanager  # noqa: E402

MARKER = "Compacting context"
HOST_STATUS = f"🗜️ {MARKER} — summarizing earlier conversation so I can continue..."
_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="sim-compress")
_progress = threading.local()  # like the host's aux client: the progress hook is per thread


class VirtualClock:
    """Host time that passes only when the test says so: a model call "takes" its seconds
    (`advance`) and everything else — the engine's own work, however slow a loaded machine
    makes it — takes none. Give the same clock to the host (MainHost(clock=...)) and to the
    engine (`engine.pass_clock = clock.now`): then what the host decides (wait on, or cut the
    pass off) and what the engine plans depend on no machine's speed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._now = 1000.0

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += max(0.0, float(seconds))


class Fence:
    """The host's commit fence: cut off after `silence` seconds without progress (or past the
    `ceiling`); progress ticks extend the wait. Decided on the host's clock when anyone looks
    (the engine's cancel check included), once and for good."""

    def __init__(self, clock: Any = time.monotonic, silence: float = float("inf"),
                 ceiling: float = float("inf")) -> None:
        self._cancelled = threading.Event()
        self.clock = clock
        self.silence, self.ceiling = silence, ceiling
        self.started = self.last_progress = clock()
        self.ticks = 0
        self.longest_silence = 0.0

    def touch_progress(self) -> None:
        if self.is_cancelled:
            return  # (progress after the cut does not bring the pass back)
        now = self.clock()
        self.longest_silence = max(self.longest_silence, now - self.last_progress)
        self.last_progress = now
        self.ticks += 1

    def since_progress(self) -> float:
        return self.clock() - self.last_progress

    def elapsed(self) -> float:
        return self.clock() - self.started

    def cancel(self) -> None:
        self._cancelled.set()

    @property
    def is_cancelled(self) -> bool:
        if not self._cancelled.is_set() and (self.since_progress() >= self.silence or self.elapsed() >= self.ceiling):
            self._cancelled.set()
        return self._cancelled.is_set()


class SlowModel:
    """A summariser endpoint (a FakeOpenAI responder) that takes `seconds` of host time to
    answer each call (a model the host cannot see streaming: no progress), then answers."""

    def __init__(self, clock: VirtualClock, seconds: float, base: Any = None) -> None:
        from tests.support.fake_openai import SummariserResponder

        self.clock, self.seconds = clock, seconds
        self.base = base or SummariserResponder(max_chars=600)
        self.calls = 0

    def __call__(self, req: Any) -> Any:
        self.calls += 1
        self.clock.advance(self.seconds)
        return self.base(req)


def status_message(engine: Any, *, phase: str, default_message: str, **context: Any) -> str | None:
    """The host's resolution of the automatic-compaction status line."""
    if not getattr(engine, "emit_automatic_compaction_status", True):
        return None
    fmt = getattr(engine, "get_automatic_compaction_status_message", None)
    msg = fmt(phase=phase, default_message=default_message, **context) if callable(fmt) else default_message
    if msg is None:
        return None
    return str(msg).strip() or None


@contextmanager
def host_aux_client(base_url: str, clock: VirtualClock | None = None, latency: float = 0.0,
                    silent: bool = False):
    """Stand in for the host's `agent.auxiliary_client.call_llm` (the host side of the simulator):
    a call dispatched and a reply received count as progress of the pass on this thread. With a
    `clock`, each call takes `latency` seconds of it; a `silent` model streams nothing and
    answers nothing: the call waits the whole `timeout` the engine gave it, then fails."""
    import json
    import urllib.request

    import agent.auxiliary_client as aux  # the real module of the installed host

    def call_llm(task: str = "", main_runtime: Any = None, messages: Any = None, max_tokens: int = 0,
                 timeout: float = 120.0, **kw: Any) -> Any:
        hook = getattr(_progress, "hook", None)
        if hook:
            hook()
        if clock is not None and silent:
            clock.advance(timeout)
            raise TimeoutError(f"no reply within {timeout:.1f} s")
        if clock is not None:
            clock.advance(latency)
        body = json.dumps({"model": "aux", "messages": messages, "max_tokens": max_tokens}).encode()
        req = urllib.request.Request(f"{base_url}/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            data = json.loads(resp.read())
        if hook:
            hook()

        class _Msg:
            content = data["choices"][0]["message"].get("content")

        class _Choice:
            message = _Msg()

        class _Resp:
            choices = [_Choice()]

        return _Resp()

    saved = aux.call_llm
    aux.call_llm = call_llm
    try:
        yield
    finally:
        aux.call_llm = saved


@dataclass
class MainHost(NewHost):
    """Upstream main: pooled worker, silence budget with progress, commit fence, discarded late
    work, status lines, preflight deferral and cool-down, idle compaction and gateway hygiene."""

    idle_timeout: float = 120.0  # compression.context_timeout_seconds
    ceiling: float = 600.0  # compression.context_total_ceiling_seconds
    hygiene_limit: int = 5000  # compression.hygiene_hard_message_limit
    hygiene_timeout: float = 30.0  # compression.hygiene_timeout_seconds
    statuses: list[tuple[str, str | None]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    late: list[Any] = field(default_factory=list)  # futures of passes the host gave up on
    waited: list[float] = field(default_factory=list)
    fences: list[Fence] = field(default_factory=list)  # each pass's fence (its ticks and silences)
    # The host's clock: wall time by default; a VirtualClock makes every decision independent
    # of the machine's speed (the engine's work takes no time on it, a model call its latency).
    clock: Any = None

    def run_pass(self, phase: str = "compress", *, force: bool = False, silence: float | None = None) -> bool:
        """One automatic (or forced) pass exactly as main runs it; True when committed."""
        approx = self.estimate()
        if not force:
            self.statuses.append((phase, status_message(self.engine, phase=phase, default_message=HOST_STATUS,
                                                        approx_tokens=approx, message_count=len(self.history),
                                                        model="test-model", focus_topic=None)))
        virtual = isinstance(self.clock, VirtualClock)
        now = self.clock.now if virtual else time.monotonic
        budget = self.idle_timeout if silence is None else silence
        fence = Fence(now, budget, self.ceiling)
        self.fences.append(fence)
        self.engine._compression_cancelled_check = lambda: fence.is_cancelled
        private = copy.deepcopy(self.history)

        def work() -> Any:
            _progress.hook = fence.touch_progress
            try:
                return self.engine.compress(private, current_tokens=approx, force=force,
                                            session_id=self.session_id)
            finally:
                _progress.hook = None

        fut = _POOL.submit(work)
        while True:
            # (wall time: sleep until the budget could run out; a virtual clock is looked at
            # every few milliseconds, and only it decides)
            wait = 0.01 if virtual else min(max(budget - fence.since_progress(), 0.005),
                                             max(self.ceiling - fence.elapsed(), 0.005))
            try:
                out = fut.result(timeout=wait)
                break
            except concurrent.futures.TimeoutError:
                if not fence.is_cancelled:
                    continue
                # late work is discarded: nothing of this pass may be published
                self.abandoned += 1
                self.late.append(fut)
                self.waited.append(fence.elapsed())
                return False
        self.waited.append(fence.elapsed())
        self.engine._compression_cancelled_check = None
        if fence.is_cancelled:  # (the host gave up before the result came: thrown away)
            self.abandoned += 1
            return False
        if not out or out == self.history:
            return False
        self.engine.on_session_end(self.session_id, copy.deepcopy(self.history))
        self.history = [m for m in out if m.get("role") != "system"]
        self.commits += 1
        self.engine.on_session_start(self.session_id, boundary_reason="compression",
                                     old_session_id=self.session_id, platform="gateway",
                                     conversation_id=f"conv-{self.session_id}")
        self.engine.last_prompt_tokens = -1
        self.engine.awaiting_real_usage_after_compression = True
        return True

    def preflight(self, rough: int | None = None) -> bool:
        """Turn start: deferral to real usage, the cool-down, then should_compress / its reason."""
        tokens = self.estimate() if rough is None else rough
        defer = getattr(self.engine, "should_defer_preflight_to_real_usage", lambda _t: False)(tokens)
        cooldown = getattr(self.engine, "get_active_compression_failure_cooldown", lambda: None)()
        if defer:
            return False
        if cooldown:
            if tokens >= self.engine.threshold_tokens:
                self.warnings.append(f"cooldown:{cooldown.get('remaining_seconds', 0):.0f}")
            return False
        if self.engine.should_compress(tokens):
            return self.run_pass("preflight")
        reason = self.engine.should_compress_info(tokens)[1]
        if reason:  # main reads any reason as "over the threshold but compression is blocked"
            self.warnings.append(reason)
        return False

    def reply(self, prompt_tokens: int) -> None:
        self.engine.update_from_response({"prompt_tokens": prompt_tokens, "completion_tokens": 10,
                                          "total_tokens": prompt_tokens + 10})

    def idle_resume(self) -> bool:
        """A session resumed after the idle gap: compact when above threshold × summary_target_ratio."""
        tokens = self.estimate()
        floor = int(self.engine.threshold_tokens * self.engine.summary_target_ratio)
        cooldown = getattr(self.engine, "get_active_compression_failure_cooldown", lambda: None)()
        if tokens <= floor or cooldown:
            return False
        return self.run_pass("idle")

    def hygiene(self) -> bool:
        """Gateway hygiene: a forced pass at the message limit under its own silence budget."""
        if len(self.history) < self.hygiene_limit:
            return False
        return self.run_pass("hygiene", silence=self.hygiene_timeout)
