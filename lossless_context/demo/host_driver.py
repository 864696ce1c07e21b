"""The one R19 host driver: the calls hermes-agent 0.19.0 makes on a context engine.

Shared by `lcm demo`, the tests and the benchmarks, and engine-agnostic (the benchmarks drive
the host's own `ContextCompressor` with it too). It holds the conversation list the way the host
does and follows docs/host-contract.md#r19-order-of-calls and
docs/host-contract.md#r19-passes-and-the-commit-signal:

* start: `update_model(...)`, `bind_session_state(None, sid)`, `on_session_start(sid, ...)`;
* `feed(messages)` replays a recorded conversation with the host's checks: every user turn
  starts with the preflight (the rough estimate, `should_defer_preflight_to_real_usage` when the
  engine has it, then `should_compress` → up to 3 passes); before every provider call in the tool
  loop one pre-API pass (at most 3 per turn); after every assistant message
  `update_from_response(usage)`; after every tool batch `should_compress` with the engine's
  `last_prompt_tokens`;
* `add(...)` + `maybe_compress()` let a test place its own checks;
* a pass is adopted unless `_last_compress_aborted`, the result equals the input, or it is empty;
  adopting = `on_session_end(sid, before)`, the list replaced (without the system message),
  `on_session_start(new_sid, boundary_reason="compression", old_session_id=sid)`,
  `last_prompt_tokens = -1`. The new session id is the same one unless `rotate` is set (the host's
  session-splitting mode: a child id per compaction);
* `end()`: `on_session_end(sid, messages)` (CLI exit).

Whose estimate decides when to compress: `estimator="host"` uses the host's own rough estimator
when Hermes is installed (as the real loop does); `"engine"` uses ours (no host needed).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..hostapi import rough_estimator
from ..pipeline.validate import pairing_problems, pending_calls
from ..tokens import estimate_message_tokens, estimate_text_tokens


@dataclass
class PassRecord:
    """One compress() call as the host saw it."""

    wall_ms: float
    tokens_before: int
    tokens_after: int
    adopted: bool
    n_before: int
    n_after: int


@dataclass
class R19Host:
    engine: Any
    session_id: str = "sess-1"
    system_prompt: str = ""
    context_length: int = 64_000
    model: str = "test-model"
    base_url: str = "http://127.0.0.1:9/v1"
    api_key: str = "k"
    platform: str = "cli"
    conversation_id: str | None = None
    overhead_tokens: int = 0  # tool schemas etc., counted in the host's estimate
    estimator: str = "engine"  # "engine" (ours) or "host" (Hermes' rough estimator when installed)
    rotate: bool = False  # a new child session id per adopted pass
    commit: bool = True  # send the commit signal on adoption (False: a host that never commits)
    max_passes: int = 3
    messages: list[dict[str, Any]] = field(default_factory=list)
    passes: list[PassRecord] = field(default_factory=list)
    sessions: list[str] = field(default_factory=list)
    no_progress: int = 0
    invalid: list[str] = field(default_factory=list)  # problems found in adopted outputs
    on_pass: Callable[["R19Host", PassRecord], None] | None = None
    on_output: Callable[[list[dict[str, Any]]], None] | None = None

    def __post_init__(self) -> None:
        self._host_est = rough_estimator() if self.estimator == "host" else None
        self._cache: tuple[Any, list[int]] = (None, [])  # (the list, per-message counts)

    # -- lifecycle --------------------------------------------------------------------------
    def start(self, context_length: int | None = None, model: str | None = None) -> None:
        if context_length is not None:
            self.context_length = context_length
        if model is not None:
            self.model = model
        e = self.engine
        e.update_model(model=self.model, context_length=self.context_length, base_url=self.base_url,
                       api_key=self.api_key, provider="custom", api_mode="chat_completions")
        if hasattr(e, "bind_session_state"):
            e.bind_session_state(None, self.session_id)
        kw: dict[str, Any] = {"platform": self.platform, "model": self.model, "context_length": self.context_length}
        if self.conversation_id:
            kw["conversation_id"] = self.conversation_id
        e.on_session_start(self.session_id, **kw)
        self.sessions = [self.session_id]

    def end(self) -> None:
        """CLI exit: the host hands the whole list over once more."""
        self.engine.on_session_end(self.session_id, copy.deepcopy(self.messages))

    @property
    def compactions(self) -> int:
        return sum(1 for p in self.passes if p.adopted)

    # -- the host's estimate ----------------------------------------------------------------
    def _one(self, m: dict[str, Any]) -> int | None:
        """What one message adds to the estimate (chars for the host's, tokens for ours)."""
        if self._host_est is None:
            return estimate_message_tokens(m)
        per = self._host_est[1]
        c = m.get("content") if isinstance(m, dict) else None
        if per is None or (isinstance(c, list) and any(isinstance(p, dict) and p.get("type") not in ("text", None)
                                                      for p in c)):
            return None  # media parts have a flat cost: the full estimator
        return int(per(m))

    def estimate(self) -> int:
        """The host's rough estimate of the next request. Kept as a running total over the list
        it holds (appends cost O(1); a 3,000-message replay would otherwise be O(n²))."""
        fixed = estimate_text_tokens(self.system_prompt) + self.overhead_tokens
        lst, counts = self._cache
        if lst is not self.messages or len(counts) > len(self.messages):
            lst, counts = self.messages, []
        for m in self.messages[len(counts):]:
            k = self._one(m)
            if k is None:
                self._cache = (None, [])
                return fixed + self._tokens_of(self.messages)
            counts.append(k)
        self._cache = (lst, counts)
        return fixed + ((sum(counts) + 3) // 4 if self._host_est is not None else sum(counts))

    def _tokens_of(self, messages: Sequence[dict[str, Any]]) -> int:
        """The estimate of some messages alone (no system prompt, no overhead)."""
        if self._host_est is not None:
            return int(self._host_est[0](list(messages)))
        return sum(estimate_message_tokens(m) for m in messages)

    def _estimate_of(self, messages: Sequence[dict[str, Any]]) -> int:
        return estimate_text_tokens(self.system_prompt) + self._tokens_of(messages)

    # -- a test's own turn loop ---------------------------------------------------------------
    def add(self, *msgs: dict[str, Any]) -> None:
        self.messages.extend(copy.deepcopy(list(msgs)))

    def respond(self, completion_tokens: int = 200) -> None:
        """A provider response: the host reports usage for the request it just sent."""
        p = self.estimate()
        self.engine.update_from_response({"prompt_tokens": p, "completion_tokens": completion_tokens,
                                          "total_tokens": p + completion_tokens})

    def maybe_compress(self, force: bool = False, focus: str | None = None) -> bool:
        """Up to `max_passes` passes while the engine asks for one (or once when forced)."""
        did = False
        for _ in range(self.max_passes):
            est = self.estimate()
            if not force and not self.engine.should_compress(est):
                break
            if not self.compress_once(est, force=force, focus=focus):
                break
            did, force = True, False
        return did

    # -- replaying a recorded conversation ------------------------------------------------------
    def feed(self, messages: Sequence[dict[str, Any]], progress: Callable[[int], None] | None = None) -> None:
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
            elif role == "assistant":
                attempts = self.pre_api(attempts)
                prompt = self.estimate()
                self.messages.append(copy.deepcopy(m))
                comp = self._tokens_of([m])
                self.engine.update_from_response({"prompt_tokens": prompt, "completion_tokens": comp,
                                                  "total_tokens": prompt + comp})
                i += 1
                if m.get("tool_calls"):
                    while i < n and messages[i].get("role") == "tool":
                        self.messages.append(copy.deepcopy(messages[i]))
                        i += 1
                    self.post_tool()
            else:
                self.messages.append(copy.deepcopy(m))  # a stray tool/system message: kept as is
                i += 1
            if progress is not None:
                progress(i)

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

    # -- one pass ---------------------------------------------------------------------------------
    def compress_once(self, est: int | None = None, force: bool = False, focus: str | None = None) -> bool:
        e = self.engine
        est = self.estimate() if est is None else est
        before = copy.deepcopy(self.messages)
        kw: dict[str, Any] = {"current_tokens": est}
        if force:
            kw["force"] = True
        if focus is not None:
            kw["focus_topic"] = focus
        t0 = time.perf_counter()
        out = e.compress(self.messages, **kw)
        wall = (time.perf_counter() - t0) * 1000
        adopted = not (getattr(e, "_last_compress_aborted", False) or not out or out == before)
        body = [m for m in out if m.get("role") != "system"] if adopted else before
        rec = PassRecord(wall, est, self._estimate_of(body), adopted, len(before), len(body))
        self.passes.append(rec)
        if not adopted:
            self.no_progress += 1
            self.messages = before
        else:
            self.invalid.extend(pairing_problems(out, pending_calls(before)))  # (its results come next)
            if self.on_output:
                self.on_output(out)
            old = self.session_id
            if self.commit:
                e.on_session_end(old, before)
            self.messages = body
            if self.rotate:
                self.session_id = f"{self.sessions[0]}.{len(self.sessions)}"
                self.sessions.append(self.session_id)
            if self.commit:
                e.on_session_start(self.session_id, boundary_reason="compression", old_session_id=old,
                                   platform=self.platform)
            e.last_prompt_tokens = -1
            e.awaiting_real_usage_after_compression = True
        if self.on_pass:
            self.on_pass(self, rec)
        return adopted

    def context(self) -> list[dict[str, Any]]:
        """What the provider would receive next: the system prompt + the host's list."""
        sys_msg = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return sys_msg + self.messages
