"""A small host simulator following HOST_CONTRACT.md (R19 call order by default).

It keeps the conversation list the way the host does, asks `should_compress` with its own
rough estimate, calls `compress()`, treats an equal list as "no progress", and sends the
commit signal (`on_session_end` then `on_session_start(boundary_reason="compression")`)
only when it adopts a result.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Callable

from lossless_context.pipeline.assemble import problems
from lossless_context.tokens import estimate_messages_tokens


@dataclass
class HostSim:
    engine: Any
    session_id: str = "sess-1"
    system_prompt: str = "You are Hermes, a helpful coding agent."
    overhead_tokens: int = 0  # tool schemas etc. counted by the host's estimate
    messages: list[dict[str, Any]] = field(default_factory=list)
    compactions: int = 0
    no_progress: int = 0
    invalid: list[str] = field(default_factory=list)
    max_passes: int = 3
    commit: bool = True
    on_output: Callable[[list[dict[str, Any]]], None] | None = None

    def start(self, context_length: int = 64_000, model: str = "test-model") -> None:
        self.engine.update_model(model=model, context_length=context_length, base_url="http://127.0.0.1:9/v1",
                                 api_key="k", provider="custom", api_mode="chat_completions")
        if hasattr(self.engine, "bind_session_state"):
            self.engine.bind_session_state(None, self.session_id)
        self.engine.on_session_start(self.session_id, platform="cli", model=model, context_length=context_length)

    def estimate(self) -> int:
        sys = (len(self.system_prompt) + 3) // 4
        return sys + self.overhead_tokens + estimate_messages_tokens(self.messages)

    def add(self, *msgs: dict[str, Any]) -> None:
        self.messages.extend(copy.deepcopy(list(msgs)))

    def end(self) -> None:
        """CLI exit: the host hands the whole list over once more."""
        self.engine.on_session_end(self.session_id, copy.deepcopy(self.messages))

    def maybe_compress(self, force: bool = False, focus: str | None = None) -> bool:
        did = False
        for _ in range(self.max_passes):
            if not force and not self.engine.should_compress(self.estimate()):
                break
            before = copy.deepcopy(self.messages)
            out = self.engine.compress(self.messages, current_tokens=self.estimate(), focus_topic=focus,
                                       force=force)
            if getattr(self.engine, "_last_compress_aborted", False) or out == before:
                self.no_progress += 1
                break
            if not out:
                break
            errs = problems(out)
            if errs:
                self.invalid.extend(errs)
            if self.on_output:
                self.on_output(out)
            if self.commit:
                self.engine.on_session_end(self.session_id, before)
            self.messages = [m for m in out if m.get("role") != "system"]
            self.compactions += 1
            did = True
            if self.commit:
                self.engine.on_session_start(self.session_id, boundary_reason="compression",
                                             old_session_id=self.session_id, platform="cli")
            force = False
        return did
