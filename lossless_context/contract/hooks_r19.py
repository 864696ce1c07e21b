"""What a newer Hermes host asks an engine about its compaction state, answered for LCM.

Every hook here is optional for the host (it calls them through `getattr` with a default)
and each means what the host means by it:

* `should_compress_info(tokens)` → `(decision, reason)`: the reason is None unless
  compaction is needed *and* cannot happen now (`"cooldown:<s>"`, `"ineffective"`); the
  host prints "compression is blocked" for any other value, so below the threshold it is None.
* `get_active_compression_failure_cooldown()`: the summariser's circuit breaker, while it
  is open and deferring is safe (the context is below the hard limit); past that limit a
  pass runs at the deterministic level instead, so no cool-down is reported.
* `should_defer_preflight_to_real_usage(rough)` with `last_real_prompt_tokens`: trust the
  provider's last real prompt size over a noisy rough estimate that grew only a little.
* `get_automatic_compaction_status_message(...)`: one LCM line, keeping the host's marker.
* `summary_target_ratio`: the share of the threshold a pass shrinks the context to, so the
  host's idle compaction fires only when a pass would actually shrink something.
* `threshold_percent`: a value set on the engine by the host or a caller is explicit and
  wins over `model_thresholds` and the configured threshold (see `update_model`).
* `pending_compression_operation(messages)`: LCM never runs a pure sanitation pass → None.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Dict, List, Optional

log = logging.getLogger("lossless_context")

COMPACTION_MARKER = "Compacting context"  # the host's TUI matches this text to show "summarizing"
DEFAULT_THRESHOLD_PERCENT = 0.75


def _number(value: Any) -> float | None:
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


class HostSignals:
    """Mixin for LCMEngine: the newer host's compaction-state hooks and the per-pass record."""

    last_real_prompt_tokens: int = 0
    emit_automatic_compaction_status: bool = True
    _max_output_tokens: int | None = None  # the provider's output reservation (update_model's max_tokens)

    def input_window(self) -> int:
        """Tokens a request may take: the window less the output the provider reserves of it
        (the whole window when no reservation is known or it would leave nothing)."""
        reserve = self._max_output_tokens or 0
        window = int(getattr(self, "context_length", 0) or 0)
        return window - reserve if 0 < reserve < window else window

    # -- threshold_percent / summary_target_ratio ---------------------------------------

    @property
    def threshold_percent(self) -> float:
        return self.__dict__.get("_threshold_percent", DEFAULT_THRESHOLD_PERCENT)

    @threshold_percent.setter
    def threshold_percent(self, value: float) -> None:
        # Anyone assigning the attribute (the host lowering it to fit its compression
        # model, a caller, a contract test) makes it explicit for later update_model calls.
        self.__dict__["_threshold_percent"] = value
        self.__dict__["_threshold_explicit"] = True

    def _set_threshold_percent(self, value: float) -> None:
        """Our own resolution (config / model_thresholds): not an explicit setting."""
        self.__dict__["_threshold_percent"] = value

    def explicit_threshold_percent(self) -> float | None:
        """The explicitly set fraction, when usable (0 < f <= 1)."""
        if not self.__dict__.get("_threshold_explicit"):
            return None
        v = _number(self.__dict__.get("_threshold_percent"))
        return v if v is not None and 0 < v <= 1 else None

    @property
    def summary_target_ratio(self) -> float:
        v = self.__dict__.get("_summary_target_ratio")
        if v is not None:
            return v
        try:
            return float(self.config.target_ratio)  # type: ignore[attr-defined]
        except Exception:
            return 0.55

    @summary_target_ratio.setter
    def summary_target_ratio(self, value: float) -> None:
        v = _number(value)
        if v is not None and 0 < v < 1:
            self.__dict__["_summary_target_ratio"] = v

    # -- should_compress_info / cool-down ------------------------------------------------

    def _summarizer_cooldown(self) -> float:
        """Seconds the summariser's circuit breaker stays open (0: closed or no model)."""
        try:
            esc = self._get_escalator()  # type: ignore[attr-defined]
        except Exception:
            return 0.0
        guard = getattr(esc, "guard", None)
        if esc.model is None or guard is None:
            return 0.0
        return guard.cooldown_remaining()

    def _below_hard_limit(self, tokens: float | None = None) -> bool:
        window = _number(getattr(self, "context_length", 0)) or 0
        if window <= 0:
            return True
        if tokens is None:
            # The next request holds the last one and the reply it got (a usage-anchored host
            # sends a turn of 15K-token replies on as 49K + 15K): judged by the last prompt
            # alone, a cool-down would let that request past the window.
            tokens = max(0.0, _number(getattr(self, "last_prompt_tokens", 0)) or 0) + \
                max(0.0, _number(getattr(self, "last_completion_tokens", 0)) or 0)
        try:
            hard = float(self.config.hard_threshold)  # type: ignore[attr-defined]
        except Exception:
            hard = 0.9
        return tokens < hard * window

    def get_active_compression_failure_cooldown(self, *args: Any, **kwargs: Any) -> Optional[Dict[str, Any]]:
        try:
            left = self._summarizer_cooldown()
            if left <= 0 or not self._below_hard_limit():
                return None
            import time

            return {"remaining_seconds": left, "cooldown_until": time.time() + left,
                    "error": "LCM summariser circuit breaker open (repeated summariser failures)"}
        except Exception:
            return None

    def should_compress_info(self, prompt_tokens: Optional[int] = None, *args: Any,
                             **kwargs: Any) -> "tuple[bool, str | None]":
        try:
            tokens = _number(prompt_tokens if prompt_tokens is not None else self.last_prompt_tokens)  # type: ignore[attr-defined]
            threshold = _number(self.threshold_tokens) or 0  # type: ignore[attr-defined]
            if tokens is None or tokens < 0 or threshold <= 0 or tokens < threshold:
                return False, None
            left = self._summarizer_cooldown()
            if left > 0 and self._below_hard_limit(tokens):
                return False, f"cooldown:{left:.0f}"
            if self.should_compress(prompt_tokens):  # type: ignore[attr-defined]
                return True, None
            return False, "ineffective"  # the last pass could not shrink it; waiting for growth
        except Exception:
            return False, None

    # -- preflight ---------------------------------------------------------------------------

    def should_defer_preflight_to_real_usage(self, rough_tokens: int, *args: Any, **kwargs: Any) -> bool:
        try:
            rough = _number(rough_tokens)
            threshold = _number(self.threshold_tokens) or 0  # type: ignore[attr-defined]
            if rough is None or threshold <= 0 or rough < threshold:
                return False
            if getattr(self, "awaiting_real_usage_after_compression", False):
                return True  # a pass just committed: wait one request for the real size
            real = _number(self.last_real_prompt_tokens) or 0
            if real <= 0 or real >= threshold:
                return False
            # The rough estimate counts tool schemas generously; trust the provider while the
            # estimate exceeds its last real figure by no more than estimation noise.
            return rough - real <= max(4096, threshold * 0.05)
        except Exception:
            return False

    def pending_compression_operation(self, messages: List[Dict[str, Any]] | None = None, *args: Any,
                                      **kwargs: Any) -> None:
        return None  # every LCM pass is a compaction; it never asks for a sanitation-only pass

    # -- status line -------------------------------------------------------------------------

    def get_automatic_compaction_status_message(self, *, phase: str = "compress", default_message: str = "",
                                                **context: Any) -> str | None:
        try:
            if not self.emit_automatic_compaction_status:
                return None
            tokens = _number(context.get("approx_tokens"))
            size = f" (~{int(tokens):,} tokens)" if tokens else ""
            why = {"idle": " after an idle gap", "preflight": " before this turn",
                   "pre_api": " before the next request"}.get(str(phase), "")
            store = self._store_pending_lines()  # type: ignore[attr-defined]  # (notices.py)
            if store:
                return f"🗜️ {COMPACTION_MARKER}{why} — {store}{size}"
            return (f"🗜️ {COMPACTION_MARKER}{why} — LCM summarises older turns into its DAG; "
                    f"every message stays stored verbatim{size}")
        except Exception:
            return default_message or f"🗜️ {COMPACTION_MARKER}"

    # -- the record of each pass -------------------------------------------------------------

    def _pass_log(self) -> tuple[list[dict[str, Any]], threading.Lock]:
        fam = self._family  # type: ignore[attr-defined]
        if "passes" not in fam:
            fam.setdefault("passes_lock", threading.Lock())
            fam.setdefault("passes", [])
        return fam["passes"], fam["passes_lock"]

    def record_pass(self, entry: Dict[str, Any]) -> None:
        """Keep the last passes (shared by every copy of the engine) and log the result."""
        passes, lock = self._pass_log()
        with lock:
            passes.append(dict(entry))
            del passes[:-20]
        log.info("lcm: pass %s for %s: %s → %s tokens, %s summariser calls, %.2f s%s",
                 entry.get("pass_id") or "-", entry.get("session_id"), entry.get("tokens_before"),
                 entry.get("tokens_after"), entry.get("calls"), entry.get("seconds", 0.0),
                 f" ({entry['outcome']})" if entry.get("outcome") else "")

    def last_passes(self) -> list[Dict[str, Any]]:
        passes, lock = self._pass_log()
        with lock:
            return [dict(p) for p in passes]
