"""A host of our own following HOST_CONTRACT.md §4–5 (the newer Hermes contract).

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
