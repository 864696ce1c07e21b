"""What a newer Hermes host (0.20, the 0.22 line) asks an engine about its compaction state,
answered for LCM by an object LCMEngine owns (`engine.compaction_state`), and the record of passes.

Every hook here is optional for the host (it calls them through `getattr` with a default; 0.19.0
calls only the preflight deferral) and each means what the host means by it:

* `should_compress_info(tokens)` → `(decision, reason)`: the reason is None unless
  compaction is needed *and* cannot happen now (`"cooldown:<s>"`, `"ineffective"`); the
  host prints "compression is blocked" for any other value, so below the threshold it is None.
* `get_active_compression_failure_cooldown()`: the summariser's circuit breaker, while it
  is open and deferring is safe (the context is below the hard limit); past that limit a
  pass runs at the deterministic level instead, so no cool-down is reported.
* `should_defer_preflight_to_real_usage(rough)` with `last_real_prompt_tokens`: trust the
  provider's last real prompt size over a noisy rough estimate that grew only a little.
* `get_automatic_compaction_status_message(...)`: one LCM line, keeping the host's marker.
* `pending_compression_operation(messages)`: LCM never runs a pure sanitation pass → None.

The attributes the host reads and writes (`threshold_percent`, `summary_target_ratio`, the token
figures) are LCMEngine's own; this object reads them through `EngineFigures`, the summariser's
breaker through `escalator`, and the store's state through the engine's StoreNotices.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Dict, Optional, Protocol

from ..config import LCMConfig
from ..summarizers.summarize import Escalator
from .notices import StoreNotices

log = logging.getLogger("lossless_context")

COMPACTION_MARKER = "Compacting context"  # the host's TUI matches this text to show "summarizing"
DEFAULT_THRESHOLD_PERCENT = 0.75


def finite(value: Any) -> float | None:
    """A finite number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if value != value or value in (float("inf"), float("-inf")):
        return None
    return float(value)


def positive_tokens(value: Any) -> int | None:
    """A positive token count, or None ("no reservation") for anything else."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return None
    return int(value) if 0 < value < 1e12 else None


class EngineFigures(Protocol):
    """The engine's figures and the one decision these hooks read (LCMEngine has them)."""

    last_prompt_tokens: int
    last_completion_tokens: int
    last_real_prompt_tokens: int
    context_length: int
    threshold_tokens: int
    awaiting_real_usage_after_compression: bool
    emit_automatic_compaction_status: bool

    def should_compress(self, prompt_tokens: Optional[int] = None) -> bool: ...


class CompactionState:
    """The newer host's compaction-state hooks, for one engine."""

    def __init__(self, figures: EngineFigures, config: Callable[[], LCMConfig],
                 escalator: Callable[[], Escalator], notices: StoreNotices) -> None:
        self._figures = figures
        self._config = config
        self._escalator = escalator  # the summariser the engine would use now
        self._notices = notices

    # -- should_compress_info / cool-down ------------------------------------------------

    def _summarizer_cooldown(self) -> float:
        """Seconds the summariser's circuit breaker stays open (0: closed or no model)."""
        try:
            esc = self._escalator()
        except Exception:
            return 0.0
        guard = getattr(esc, "guard", None)
        if esc.model is None or guard is None:
            return 0.0
        return guard.cooldown_remaining()

    def _below_hard_limit(self, tokens: float | None = None) -> bool:
        f = self._figures
        window = finite(f.context_length) or 0
        if window <= 0:
            return True
        if tokens is None:
            # The next request holds the last one and the reply it got (a usage-anchored host
            # sends a turn of 15K-token replies on as 49K + 15K): judged by the last prompt
            # alone, a cool-down would let that request past the window.
            tokens = max(0.0, finite(f.last_prompt_tokens) or 0) + max(0.0, finite(f.last_completion_tokens) or 0)
        try:
            hard = float(self._config().hard_threshold)
        except Exception:
            hard = 0.9
        return tokens < hard * window

    def get_active_compression_failure_cooldown(self) -> Optional[Dict[str, Any]]:
        try:
            left = self._summarizer_cooldown()
            if left <= 0 or not self._below_hard_limit():
                return None
            return {"remaining_seconds": left, "cooldown_until": time.time() + left,
                    "error": "LCM summariser circuit breaker open (repeated summariser failures)"}
        except Exception:
            return None

    def should_compress_info(self, prompt_tokens: Optional[int] = None) -> "tuple[bool, str | None]":
        try:
            f = self._figures
            tokens = finite(prompt_tokens if prompt_tokens is not None else f.last_prompt_tokens)
            threshold = finite(f.threshold_tokens) or 0
            if tokens is None or tokens < 0 or threshold <= 0 or tokens < threshold:
                return False, None
            left = self._summarizer_cooldown()
            if left > 0 and self._below_hard_limit(tokens):
                return False, f"cooldown:{left:.0f}"
            if f.should_compress(prompt_tokens):
                return True, None
            return False, "ineffective"  # the last pass could not shrink it; waiting for growth
        except Exception:
            return False, None

    # -- preflight ---------------------------------------------------------------------------

    def should_defer_preflight_to_real_usage(self, rough_tokens: int) -> bool:
        try:
            f = self._figures
            rough = finite(rough_tokens)
            threshold = finite(f.threshold_tokens) or 0
            if rough is None or threshold <= 0 or rough < threshold:
                return False
            if f.awaiting_real_usage_after_compression:
                return True  # a pass just committed: wait one request for the real size
            real = finite(f.last_real_prompt_tokens) or 0
            if real <= 0 or real >= threshold:
                return False
            # The rough estimate counts tool schemas generously; trust the provider while the
            # estimate exceeds its last real figure by no more than estimation noise.
            return rough - real <= max(4096, threshold * 0.05)
        except Exception:
            return False

    # -- status line -------------------------------------------------------------------------

    def get_automatic_compaction_status_message(self, *, phase: str = "compress", default_message: str = "",
                                                **context: Any) -> str | None:
        try:
            if not self._figures.emit_automatic_compaction_status:
                return None
            tokens = finite(context.get("approx_tokens"))
            size = f" (~{int(tokens):,} tokens)" if tokens else ""
            why = {"idle": " after an idle gap", "preflight": " before this turn",
                   "pre_api": " before the next request"}.get(str(phase), "")
            store = self._notices.store_pending_lines()
            if store:
                return f"🗜️ {COMPACTION_MARKER}{why} — {store}{size}"
            return (f"🗜️ {COMPACTION_MARKER}{why} — LCM summarises older turns into its DAG; "
                    f"every message stays stored verbatim{size}")
        except Exception:
            return default_message or f"🗜️ {COMPACTION_MARKER}"


class PassLog:
    """The last passes of an engine family (shared by every copy of the engine: /lcm status)."""

    def __init__(self) -> None:
        self._passes: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def record(self, entry: Dict[str, Any]) -> None:
        """Keep the entry (the last 20) and log the result."""
        with self._lock:
            self._passes.append(dict(entry))
            del self._passes[:-20]
        log.info("lcm: pass %s for %s: %s → %s tokens, %s summariser calls, %.2f s%s",
                 entry.get("pass_id") or "-", entry.get("session_id"), entry.get("tokens_before"),
                 entry.get("tokens_after"), entry.get("calls"), entry.get("seconds", 0.0),
                 f" ({entry['outcome']})" if entry.get("outcome") else "")

    def last(self) -> list[Dict[str, Any]]:
        with self._lock:
            return [dict(p) for p in self._passes]
