"""An engine-agnostic host driver that makes the calls hermes-agent 0.19.0 (R19) makes.

Used for both our engine and the host's built-in `ContextCompressor`, so the two see the
same call sequence (HOST_CONTRACT.md §3, §8):

* start: `update_model(...)`, `bind_session_state(None, sid)`, `on_session_start(sid, ...)`;
* every user turn starts with the preflight (agent/turn_context.py): the host's rough estimate,
  `should_defer_preflight_to_real_usage(est)` when the engine has it (the built-in does), then
  `should_compress(est)` → up to 3 `compress(messages, current_tokens=est)` passes (no system
  message: R19 keeps it apart);
* before every provider call in the tool loop the pre-API check (same guards, one pass, at most
  3 per turn); after every assistant message `update_from_response(usage)` with prompt tokens =
  the estimate of the request that produced it; after every tool batch `should_compress` with
  the engine's `last_prompt_tokens` (0 while it is -1 after a compaction);
* a pass is adopted unless `_last_compress_aborted`, the result equals the input, or it is
  empty; adoption = `on_session_end(sid, before)`, list replaced, `on_session_start(sid,
  boundary_reason="compression", old_session_id=sid)`, `last_prompt_tokens = -1`;
* at the end `on_session_end(sid, messages)` (CLI exit).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

try:  # the host's own rough estimator when installed (it decides when to compress)
    from agent.model_metadata import estimate_messages_tokens_rough as _host_estimate
except Exception:  # pragma: no cover - host not installed
    _host_estimate = None
try:  # its per-message part (chars), so the driver can keep a running total
    from agent.model_metadata import _estimate_message_chars as _host_chars
except Exception:  # pragma: no cover
    _host_chars = None


def estimate(messages: Sequence[dict]) -> int:
    if _host_estimate is not None:
        return int(_host_estimate(list(messages)))
    from lossless_context.tokens import estimate_messages_tokens

    return estimate_messages_tokens(messages)


def _chars(m: dict) -> int | None:
    """Chars the host's estimator counts for one message (None: no additive form available)."""
    if _host_chars is None or not isinstance(m, dict):
        return None
    c = m.get("content")
    if isinstance(c, list) and any(isinstance(p, dict) and p.get("type") not in ("text", None) for p in c):
        return None  # media parts have a flat token cost: use the full estimator
    return int(_host_chars(m))


@dataclass
class PassRecord:
    wall_ms: float
    tokens_before: int
    tokens_after: int
    adopted: bool
    n_before: int
    n_after: int


@dataclass
class HostDriver:
    engine: Any
    session_id: str = "bench-session"
    system_prompt: str = ""
    context_length: int = 128_000
    model: str = "fake-model"
    base_url: str = "http://127.0.0.1:9/v1"
    api_key: str = "sk-fake"
    conversation_id: str | None = None
    max_passes: int = 3
    messages: list[dict[str, Any]] = field(default_factory=list)
    passes: list[PassRecord] = field(default_factory=list)
    no_progress: int = 0
    on_pass: Callable[["HostDriver", PassRecord], None] | None = None

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> None:
        e = self.engine
        e.update_model(model=self.model, context_length=self.context_length, base_url=self.base_url,
                       api_key=self.api_key, provider="custom", api_mode="chat_completions")
        if hasattr(e, "bind_session_state"):
            e.bind_session_state(session_db=None, session_id=self.session_id)
        kw: dict[str, Any] = {"platform": "cli", "model": self.model, "context_length": self.context_length}
        if self.conversation_id:
            kw["conversation_id"] = self.conversation_id
        e.on_session_start(self.session_id, **kw)

    def end(self) -> None:
        self.engine.on_session_end(self.session_id, copy.deepcopy(self.messages))

    # -- the turn loop ----------------------------------------------------------------------
    def estimate(self) -> int:
        """The host's rough estimate of the next request, equal to
        `estimate_messages_tokens_rough(messages)` + the system prompt. The host's estimator is
        additive, so the driver keeps per-message char counts for the list it holds (appends are
        O(1)); otherwise a 3,000-message session would cost O(n²) in the driver itself."""
        sys_tokens = (len(self.system_prompt) + 3) // 4
        lst, chars = getattr(self, "_char_cache", (None, []))
        if lst is not self.messages or len(chars) > len(self.messages):
            lst, chars = self.messages, []
        for m in self.messages[len(chars):]:
            c = _chars(m)
            if c is None:  # no additive form for this message: the full estimator
                self._char_cache = (None, [])
                return sys_tokens + estimate(self.messages)
            chars.append(c)
        self._char_cache = (lst, chars)
        return sys_tokens + (sum(chars) + 3) // 4

    def feed(self, messages: Sequence[dict[str, Any]]) -> None:
        """Append a recorded conversation message by message, making the host's calls."""
        i, n = 0, len(messages)
        attempts = 0
        while i < n:
            m = messages[i]
            role = m.get("role")
            if role == "user":
                self.preflight()
                attempts = 0
                self.messages.append(copy.deepcopy(m))
                i += 1
                continue
            if role == "assistant":
                attempts = self.pre_api(attempts)
                prompt = self.estimate()
                self.messages.append(copy.deepcopy(m))
                comp = estimate([m])
                self.engine.update_from_response({"prompt_tokens": prompt, "completion_tokens": comp,
                                                  "total_tokens": prompt + comp})
                i += 1
                if m.get("tool_calls"):
                    while i < n and messages[i].get("role") == "tool":
                        self.messages.append(copy.deepcopy(messages[i]))
                        i += 1
                    self.post_tool()
                continue
            self.messages.append(copy.deepcopy(m))  # stray tool/system message: just keep it
            i += 1

    def _deferred(self, tokens: int) -> bool:
        fn = getattr(self.engine, "should_defer_preflight_to_real_usage", None)
        try:
            return bool(fn(tokens)) if callable(fn) else False
        except Exception:
            return False

    def preflight(self) -> None:
        """Turn start (agent/turn_context.py): rough estimate, deferral, up to 3 passes."""
        e = self.engine
        est = self.estimate()
        deferred = self._deferred(est)
        if not deferred:
            last = getattr(e, "last_prompt_tokens", 0)
            if isinstance(last, int) and last >= 0 and est > last:
                e.last_prompt_tokens = est
        if deferred or not e.should_compress(est):
            return
        for _ in range(self.max_passes):
            n0, t0 = len(self.messages), est
            self.compress_once(est)
            est = self.estimate()
            if len(self.messages) >= n0 and est >= t0:
                break
            if not e.should_compress(est):
                break

    def pre_api(self, attempts: int) -> int:
        """Before every provider call in the tool loop (agent/conversation_loop.py): one pass."""
        if attempts >= 3 or len(self.messages) <= 1:
            return attempts
        est = self.estimate()
        if not self._deferred(est) and self.engine.should_compress(est):
            self.compress_once(est)
            return attempts + 1
        return attempts

    def post_tool(self) -> None:
        """After a tool batch: the engine's last real prompt count (0 right after a compaction)."""
        e = self.engine
        last = getattr(e, "last_prompt_tokens", 0)
        real = last if last > 0 else 0 if last == -1 else self.estimate()
        if e.should_compress(real):
            self.compress_once(last if last > 0 else self.estimate())

    def maybe_compress(self, force: bool = False) -> bool:
        did = False
        for _ in range(self.max_passes):
            est = self.estimate()
            if not force and not self.engine.should_compress(est):
                break
            if self.compress_once(est, force=force):
                did = True
                force = False
            else:
                break
        return did

    def compress_once(self, est: int | None = None, force: bool = False) -> bool:
        e = self.engine
        est = self.estimate() if est is None else est
        before = copy.deepcopy(self.messages)
        t0 = time.perf_counter()
        out = e.compress(self.messages, current_tokens=est, force=force)
        wall = (time.perf_counter() - t0) * 1000
        adopted = not (getattr(e, "_last_compress_aborted", False) or not out or out == before)
        body = [m for m in out if m.get("role") != "system"] if adopted else before
        rec = PassRecord(wall, est, (len(self.system_prompt) + 3) // 4 + estimate(body), adopted,
                         len(before), len(body))
        self.passes.append(rec)
        if not adopted:
            self.no_progress += 1
            self.messages = before
        else:
            e.on_session_end(self.session_id, before)
            self.messages = body
            e.on_session_start(self.session_id, boundary_reason="compression",
                               old_session_id=self.session_id, platform="cli")
            e.last_prompt_tokens = -1
            e.awaiting_real_usage_after_compression = True
        if self.on_pass:
            self.on_pass(self, rec)
        return adopted

    def context(self) -> list[dict[str, Any]]:
        """What the provider would receive next: system prompt + the host's list."""
        sys_msg = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return sys_msg + self.messages
