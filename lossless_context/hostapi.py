"""The host adapter: every Hermes symbol the core uses, imported here and only here.

The engine runs inside Hermes Agent but must import without it (tests of the core, the `lcm`
command, other hosts). So no core module imports `agent.*` or `hermes_*` itself; each asks this
module, which imports the host lazily and answers None when the host (or that part of it) is
not installed. No other module imports the host: an import-linter contract in pyproject.toml
(`lint-imports`) checks it. It imports nothing of the package, so it is the lowest layer: the
kernel (config.py), the summarisers and the contract all may use it.

What the engine *offers* the host — every method the host calls and every attribute it reads —
is declared in `contract/spec.py` and answered by LCMEngine and the parts it owns (contract/).
What the engine *uses* of the host:

=================================  ==========================================================
host symbol                        used for
=================================  ==========================================================
agent.context_engine.ContextEngine the engine's base class when the host is installed
                                   (`context_engine_class`), so `isinstance` checks hold
agent.auxiliary_client.call_llm    summarising with the host's own model and credentials
                                   (`llm_call`, summarizers.summarize.HostSummarizer)
agent.redact.redact_sensitive_text the host's secret patterns, applied before ours
                                   (`secret_redactor`, text/redact.py)
agent.memory_manager               removing the host's injected memory blocks from imported
  .sanitize_context                sessions (`memory_sanitizer`, hermes/importer.py)
hermes_constants.get_hermes_home   HERMES_HOME with the host's profile rules (`hermes_home`)
agent.usage_pricing                a price estimate for summariser spend (`usage_pricer`)
agent.model_metadata               the host's rough token estimate, which decides when it
  .estimate_messages_tokens_rough  compresses (`rough_estimator`; the demo's host driver)
resolve_context_compression_       the silence budget and ceiling the host really applies to
  timeouts (agent.conversation_    a pass (`compression_timeouts`; 0.22 raises the silence
  compression_deadline, 0.22;      budget to the compression model's own timeout, 300 s at
  agent.conversation_compression,  least), contract/passbudget.py
  0.20)
=================================  ==========================================================
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Callable, Mapping


def context_engine_class() -> type | None:
    """The host's ContextEngine base class, or None without the host."""
    try:
        from agent.context_engine import ContextEngine
    except Exception:
        return None
    return ContextEngine


def llm_call() -> Callable[..., Any]:
    """The host's auxiliary model call (`call_llm(task=..., main_runtime=..., messages=...)`).

    Raises ImportError (with the reason) when the host's client cannot be imported."""
    try:
        from agent.auxiliary_client import call_llm
    except Exception as exc:
        raise ImportError(f"host auxiliary client unavailable: {exc}") from exc
    return call_llm


def has_llm() -> bool:
    """True when the host's auxiliary model client can be imported."""
    try:
        llm_call()
    except ImportError:
        return False
    return True


def secret_redactor() -> Callable[..., str] | None:
    """The host's `redact_sensitive_text`, or None."""
    try:
        from agent.redact import redact_sensitive_text
    except Exception:
        return None
    return redact_sensitive_text if callable(redact_sensitive_text) else None


def memory_sanitizer() -> Callable[[str], str] | None:
    """The host's `sanitize_context` (strips its injected memory blocks), or None."""
    try:
        from agent.memory_manager import sanitize_context
    except Exception:
        return None
    return sanitize_context if callable(sanitize_context) else None


def hermes_home() -> Path | None:
    """HERMES_HOME as the host resolves it (profiles included), or None without the host."""
    try:
        from hermes_constants import get_hermes_home

        return Path(get_hermes_home())
    except Exception:
        return None


def usage_pricer() -> Callable[[str, str, int, int], float | None] | None:
    """A price estimate (model, provider, tokens in, tokens out) → USD from the host's pricing
    metadata, or None without it."""
    try:
        from agent.usage_pricing import CanonicalUsage, estimate_usage_cost
    except Exception:
        return None

    def price(model: str, provider: str, tokens_in: int, tokens_out: int) -> float | None:
        usage = CanonicalUsage(input_tokens=tokens_in, output_tokens=tokens_out)
        res = estimate_usage_cost(model, usage, provider=provider or None)
        amount = getattr(res, "amount_usd", None)
        return float(amount) if amount is not None and getattr(res, "status", "") == "estimated" else None

    return price


def rough_estimator() -> tuple[Callable[[list], int], Callable[[dict], int] | None] | None:
    """The host's rough estimate of a request (`estimate_messages_tokens_rough(messages)`) and,
    when it has one, its additive per-message part in characters (a driver that appends one
    message at a time keeps a running total instead of re-estimating the whole list); None
    without the host."""
    try:
        from agent.model_metadata import estimate_messages_tokens_rough
    except Exception:
        return None
    try:  # private in the host, but the very function its estimate sums (none of our names)
        from agent.model_metadata import _estimate_message_chars
    except Exception:
        _estimate_message_chars = None
    return estimate_messages_tokens_rough, _estimate_message_chars


_TIMEOUT_MODULES = ("agent.conversation_compression_deadline",  # 0.22
                    "agent.conversation_compression")  # 0.20 (0.19.0 runs no pass under a timeout)


def compression_timeouts(block: Mapping[str, Any]) -> tuple[float, float] | None:
    """(silence budget, ceiling) in seconds as the installed host resolves its `compression:`
    block `block` for a pass, or None when the host has no such resolution (0.19.0, no host)."""
    for name in _TIMEOUT_MODULES:
        try:
            fn = importlib.import_module(name).resolve_context_compression_timeouts
        except Exception:
            continue
        try:
            idle, ceiling = fn(dict(block))
            return float(idle), float(ceiling)
        except Exception:
            return None
    return None
