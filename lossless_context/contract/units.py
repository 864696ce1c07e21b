"""The host's token figures in the provider's units (an object LCMEngine owns: `engine.units`).

The window, the threshold and every figure the provider reports are in the provider's tokens;
our estimate is ~chars/4, which a denser tokenizer (CJK: about one token per character; code)
exceeds several times. So the engine learns, per session, how many provider tokens one of
ours is (:class:`~lossless_context.tokens.ProviderRatio`, shared by every copy of the engine)
from each figure it is handed with the messages it counts — `compress(current_tokens=)` with
its list, and the first real usage after a pass with the list that pass returned — and:

* a pass plans with the threshold divided by the ratio (`_budget`'s scale), so what it keeps
  fits the window as the provider counts it;
* a rough chars/4 figure (0.19.0's preflight, well below the provider's last count) is
  multiplied by the ratio before it is compared with the threshold; a figure already in the
  provider's units (its own count, 0.22's usage-anchored one) is taken as it is.

With a provider that counts like our estimate the ratio stays 1 and nothing changes.

The object receives the family the copies of one engine share (the ratios live there), the
session a call acts on, and the engine's figures it compares with (`EngineFigures`): the window,
the threshold, the host's overhead and the provider's last real prompt.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Protocol

from ..tokens import ProviderRatio
from .passbudget import OVERHEAD_SHARE

ROUGH_SHARE = 0.9  # a figure below this share of the provider's last count is a rough one
MAX_WINDOWS = 2.0  # a figure above this many windows is absurd, not a provider's count


class EngineFigures(Protocol):
    """The engine's figures the conversions read (LCMEngine's attributes)."""

    context_length: int
    threshold_tokens: int
    last_real_prompt_tokens: int

    @property
    def threshold_percent(self) -> float: ...

    @property
    def overhead(self) -> int: ...


class ProviderUnits:
    """The learned ratio and the conversions that use it, for one engine."""

    def __init__(self, family: dict[str, Any], sid: Callable[[], str], figures: EngineFigures) -> None:
        self._family = family
        self._sid = sid  # the session a call without one acts on
        self._figures = figures
        self._after_pass: tuple[str, int] | None = None  # (session, our estimate of the list a pass returned)

    def _ratios(self) -> ProviderRatio:
        fam = self._family
        ratios = fam.get("provider_ratio")
        if ratios is None:
            with fam.setdefault("ratio_lock", threading.Lock()):
                ratios = fam.setdefault("provider_ratio", ProviderRatio())
        return ratios

    def provider_ratio(self, session_id: str | None = None) -> float:
        """Provider tokens per token of our estimate in this session (1: they agree)."""
        return self._ratios().get(session_id or self._sid())

    def _units_cap(self) -> int:
        f = self._figures
        window = f.context_length or int(f.threshold_tokens / max(f.threshold_percent, 0.05))
        return int(window * OVERHEAD_SHARE)

    def _plausible(self, figure: Any) -> bool:
        """A count a provider can have reported: no provider accepts a request of several
        windows, so a larger figure teaches nothing (it is only capped, passbudget.py)."""
        window = self._units_cap() / OVERHEAD_SHARE
        return (isinstance(figure, (int, float)) and not isinstance(figure, bool)
                and 0 < figure <= MAX_WINDOWS * window)

    def observe_figure(self, session_id: str, figure: Any, estimate: int) -> float:
        """One host or provider figure for messages we estimate at `estimate` tokens."""
        if not self._plausible(figure):
            return self.provider_ratio(session_id)
        return self._ratios().observe(session_id, figure, estimate, self._figures.overhead, self._units_cap())

    def figure_is_inflated(self, figure: Any, estimate: int) -> bool:
        """More than the host's overhead can explain: the provider counts denser than we do
        (its excess over our estimate then says nothing about the system prompt's size)."""
        return self._plausible(figure) and figure - estimate > self._units_cap()

    def in_provider_units(self, tokens: Any) -> Any:
        """A figure the host passed to `should_compress`, in the provider's units."""
        r = self.provider_ratio()
        real = self._figures.last_real_prompt_tokens or 0
        if r > 1.0 and isinstance(tokens, (int, float)) and not isinstance(tokens, bool) \
                and 0 <= tokens < ROUGH_SHARE * real:
            return tokens * r  # a rough chars/4 figure, far below what the provider counts
        return tokens

    def note_pass_output(self, session_id: str, estimate: int) -> None:
        """The provider's next count is of the list a pass just returned: learn from it."""
        self._after_pass = (session_id, int(estimate))

    def observe_usage(self, prompt_tokens: int) -> None:
        """The provider's real prompt size (update_from_response)."""
        pending, self._after_pass = self._after_pass, None
        if pending is not None and prompt_tokens > 0:
            self.observe_figure(pending[0], prompt_tokens, pending[1])
