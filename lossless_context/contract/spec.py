"""The host contract, declared: every method Hermes calls on a context engine and every attribute
it reads or writes, with when it happens and what the engine promises.

Every hook the engine implements also takes `**kwargs` (a newer host may pass a keyword this list
does not name yet; tests/test_contract.py calls each one so).

Nothing here runs; it is the list the engine is checked against (tests/test_contract.py: each
declared method and attribute exists on `LCMEngine` with a compatible signature, and every public
method of the installed host's `ContextEngine` is declared here). R19 = hermes-agent 0.19.0 (PyPI);
N = upstream main (0.20.0 and later). Details and observations: docs/host-contract.md.

Where each is implemented: `engine.py` (budgets, compress, status, tools; every method below is
LCMEngine's and delegates to the part that answers it), `contract/lifecycle.py` (binding and
session events), `contract/compaction_state.py` (N's compaction-state hooks, the preflight
deferral), `contract/turn_hooks.py` (N's turn hooks), `contract/base.py` (the host's base class
or a stand-in).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Protocol

# Attributes the host reads (r) and writes (w) directly on the engine.
HOST_ATTRIBUTES: dict[str, str] = {
    "name": "r · R19 — the engine's name, equal to `context.engine` in config.yaml (\"lcm\")",
    "last_prompt_tokens": "rw · R19 — last real prompt size; the host sets -1 after a compaction (waiting for usage)",
    "last_completion_tokens": "rw · R19 — last real completion size",
    "last_total_tokens": "rw · R19 — last real total",
    "threshold_tokens": "rw · R19 — compress above this; the host may lower it to fit its auxiliary model's window",
    "context_length": "r · R19 — the model's window, from update_model",
    "compression_count": "rw · R19 — committed compactions (shown by the host)",
    "threshold_percent": "rw · R19 — threshold as a fraction of the window (0.75)",
    "protect_first_n": "rw · R19 — non-system head messages kept verbatim (3)",
    "protect_last_n": "rw · R19 — tail messages kept verbatim (6)",
    "summary_target_ratio": "r · N — idle compaction compares tokens with threshold_tokens × this",
    "awaiting_real_usage_after_compression": "w · R19 — set after a committed compaction",
    "last_real_prompt_tokens": "r · N — read when should_defer_preflight_to_real_usage says True",
    "model_thresholds": "w · N — per-model threshold fractions, assigned before the first update_model",
    "emit_automatic_compaction_status": "r · N — False: no status line for automatic passes",
    "_last_compress_aborted": "r · R19 — truthy after compress(): the pass aborted, the input is kept",
    "_last_summary_error": "r · R19 — the reason shown for an aborted pass",
}


class HostCalls(Protocol):
    """Every method the host calls, in the order of a session (signatures as the host calls them).
    A Protocol: the bodies are the promises, in words; the engine is what implements them."""

    # -- construction ----------------------------------------------------------------------------
    def update_model(self, model: str, context_length: int, base_url: str = "", api_key: Any = "",
                     provider: str = "", api_mode: str = "", max_tokens: Optional[int] = None) -> None:
        """R19. At construction and on every model switch or fallback; `api_key` may be a callable.
        Recomputes the threshold; never raises. `max_tokens` (newer hosts, forwarded without a
        signature check): the provider's output reservation, taken out of the window first."""

    def bind_session_state(self, session_db: Any = None, session_id: Optional[str] = None) -> None:
        """R19 (when defined). After update_model, and positionally on /new, /resume, /branch: the
        host's own session database (read only) and the session the engine acts on."""

    def on_session_start(self, session_id: str, **kwargs: Any) -> None:
        """R19. Idempotent (gateways build many agents per session). kwargs: hermes_home, platform,
        model, context_length, conversation_id; after a committed pass boundary_reason="compression"
        and old_session_id — the only commit signal: staged work is published here."""

    def clone_for_agent(self) -> Any:
        """N. A fresh engine per agent sharing the durable store (R19 uses copy.deepcopy instead)."""

    def __deepcopy__(self, memo: dict) -> Any:
        """R19. As clone_for_agent; a failing copy makes the host fall back to its built-in."""

    # -- every turn --------------------------------------------------------------------------------
    def should_compress_preflight(self, messages: List[Dict[str, Any]]) -> bool:
        """N. At turn start, for cheap sub-threshold maintenance (never called on R19)."""

    def should_defer_preflight_to_real_usage(self, rough_tokens: int) -> bool:
        """R19/N (when defined). True: the rough estimate is not trusted; wait for real usage."""

    def should_compress(self, prompt_tokens: Optional[int] = None) -> bool:
        """R19. At turn start (rough estimate) and after every tool batch (real size)."""

    def should_compress_info(self, prompt_tokens: Optional[int] = None) -> Any:
        """N (when defined). (should compress, the reason when not)."""

    def get_active_compression_failure_cooldown(self) -> Optional[Dict[str, Any]]:
        """N (when defined). A dict with `remaining_seconds` while passes are cooling down, or None."""

    def pending_compression_operation(self, messages: Optional[List[Dict[str, Any]]] = None) -> Any:
        """N, reported (when defined). "sanitize" for a sanitation-only pass, or None."""

    def get_automatic_compaction_status_message(self, *, phase: str = "compress", default_message: str = "",
                                                **context: Any) -> Optional[str]:
        """N (when defined). The status line shown when an automatic pass starts ("" or None: none);
        keep the marker "Compacting context" in it."""

    def compress(self, messages: List[Dict[str, Any]], current_tokens: Optional[int] = None,
                 focus_topic: Optional[str] = None, force: bool = False,
                 memory_context: str = "") -> List[Dict[str, Any]]:
        """R19. Up to 3 passes per check; `force` for /compress (then `messages` may be a prefix).
        Never raises; returns a valid OpenAI list, never worse than the input; N may run it on a
        worker thread under a timeout, with `_compression_cancelled_check` to poll."""

    def prune_tool_results_only(self, messages: List[Dict[str, Any]], current_tokens: Optional[int] = None) -> Any:
        """N (when defined). (messages with old tool results cut, how many) — no summary."""

    def has_content_to_compress(self, messages: List[Dict[str, Any]]) -> bool:
        """R19 (gateway /compress). Whether a forced pass could do anything."""

    def update_from_response(self, usage: Dict[str, Any]) -> None:
        """R19. After every provider response; `usage` may be {} after a compaction."""

    def select_context(self, request_messages: List[Dict[str, Any]], *, conversation_messages: Any = None,
                       incoming_message: Any = None, budget_tokens: int = 0) -> Optional[List[Dict[str, Any]]]:
        """N. Before every provider call: None, or a replacement list for that one call (the
        system message unchanged and first); stable while nothing changed (the prompt cache)."""

    def on_turn_complete(self, messages: List[Dict[str, Any]], usage: Any = None, **kwargs: Any) -> None:
        """N. After a finished turn (copies, read only); the return value is ignored."""

    # -- tools -------------------------------------------------------------------------------------
    def get_tool_schemas(self) -> List[Dict[str, Any]]:
        """R19. The engine's tools (lcm_grep, lcm_describe, lcm_expand, lcm_expand_query)."""

    def handle_tool_call(self, name: str, args: Dict[str, Any], **kwargs: Any) -> str:
        """R19. One tool call (kwargs: messages=<live list>); returns a JSON string."""

    # -- status and endings ------------------------------------------------------------------------
    def get_status(self) -> Dict[str, Any]:
        """R19. The host's status figures plus ours (`lcm_*` keys)."""

    def on_session_end(self, session_id: str, messages: List[Dict[str, Any]]) -> None:
        """R19. At exit or expiry AND before every committed compaction: flush, never close."""

    def on_session_reset(self) -> None:
        """R19. /new, /resume, /branch (then bind_session_state again)."""
