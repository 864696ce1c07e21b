"""What summarising costs: calls, input and output tokens, seconds, model, and a price.

Token figures are the provider's `usage` when it reports one, else chars/4 estimates of
what was sent and received. A price is estimated only when the host knows the model's
price: the Hermes adapter registers a pricer (`set_pricer`) backed by Hermes' pricing
metadata; without one (or for an unknown model) only tokens are shown. The core never
imports the host for this.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass
from typing import Any, Callable, Mapping

# (model, provider, input tokens, output tokens) -> estimated USD, or None when unknown
Pricer = Callable[[str, str, int, int], "float | None"]

_PRICER: Pricer | None = None
_LOCK = threading.Lock()


@dataclass
class Spend:
    """Summariser spend over some calls (a node, a pass, a session)."""

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    seconds: float = 0.0
    model: str = ""

    def add(self, other: "Spend") -> "Spend":
        self.calls += other.calls
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.seconds += other.seconds
        if other.model:
            self.model = other.model if not self.model or self.model == other.model else "mixed"
        return self

    def as_dict(self, provider: str = "") -> dict[str, Any]:
        d = asdict(self)
        d["seconds"] = round(self.seconds, 3)
        usd = estimate_usd(self.model, provider, self.input_tokens, self.output_tokens)
        if usd is not None:
            d["estimated_usd"] = round(usd, 6)
        return d


def set_pricer(fn: Pricer | None) -> None:
    """Install (or remove) the host's price lookup."""
    global _PRICER
    with _LOCK:
        _PRICER = fn


def estimate_usd(model: str, provider: str, input_tokens: int, output_tokens: int) -> float | None:
    fn = _PRICER
    if fn is None or not model or model == "mixed" or (input_tokens <= 0 and output_tokens <= 0):
        return None
    try:
        v = fn(model, provider, int(input_tokens), int(output_tokens))
    except Exception:  # a price is a convenience; it must never break a status call
        return None
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def describe(spend: Mapping[str, Any] | None) -> str:
    """One line for a status display."""
    if not spend or not spend.get("calls"):
        return "no summariser calls"
    line = (f"{spend.get('calls', 0)} summariser calls, {spend.get('input_tokens', 0):,} tokens in / "
            f"{spend.get('output_tokens', 0):,} out, {float(spend.get('seconds') or 0):.1f} s"
            f"{', model ' + str(spend['model']) if spend.get('model') else ''}")
    if spend.get("estimated_usd") is not None:
        line += f", ~${float(spend['estimated_usd']):.4f}"
    return line


class SpendLedger:
    """An engine's spend: the last pass, each session, and everything (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.last_pass: Spend = Spend()
        self.total: Spend = Spend()
        self.sessions: dict[str, Spend] = {}
        self.tier0_passes = 0  # passes that reached their target with stubs alone (no model call)
        self.stubbed = 0  # tool results shown as stubs by the last pass

    def record(self, session_id: str, spend: Spend, stubs: int, stubs_only: bool) -> None:
        with self._lock:
            self.last_pass = Spend().add(spend)
            self.total.add(spend)
            self.sessions.setdefault(session_id, Spend()).add(spend)
            self.stubbed = stubs
            if stubs_only and stubs:
                self.tier0_passes += 1

    def record_background(self, session_id: str, spend: Spend) -> None:
        """The worker's model calls between passes: the session's and the total spend."""
        with self._lock:
            self.total.add(spend)
            self.sessions.setdefault(session_id, Spend()).add(spend)

    def status(self, session_id: str | None, provider: str = "") -> dict[str, Any]:
        with self._lock:
            sess = self.sessions.get(session_id or "", Spend())
            return {"lcm_cost_last_pass": self.last_pass.as_dict(provider),
                    "lcm_cost_session": Spend().add(sess).as_dict(provider),
                    "lcm_cost_total": Spend().add(self.total).as_dict(provider),
                    "lcm_tier0_passes": self.tier0_passes, "lcm_stubbed_results": self.stubbed}
