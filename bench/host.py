"""The benchmarks' host: the one R19 host driver (`lossless_context.demo.host_driver`) with the
host's own rough estimator deciding when to compress (as the real loop does) and the bench's
defaults; and `estimate`, the host's rough estimate of a list of messages.

The driver is engine-agnostic: the side-by-side bench drives the host's built-in
`ContextCompressor` with it too, so both engines see the same call sequence.
"""

from __future__ import annotations

from typing import Any, Sequence

from lossless_context.hostapi import rough_estimator
from lossless_context.demo.host_driver import PassRecord, R19Host

__all__ = ["HostDriver", "PassRecord", "estimate"]

_ROUGH = rough_estimator()


def HostDriver(engine: Any, **kw: Any) -> R19Host:  # noqa: N802 - reads like the class it makes
    """An R19Host with the bench's defaults (the host's estimator, a 128K window, a fake model)."""
    for k, v in (("session_id", "bench-session"), ("context_length", 128_000), ("model", "fake-model"),
                 ("api_key", "sk-fake"), ("estimator", "host")):
        kw.setdefault(k, v)
    return R19Host(engine, **kw)


def estimate(messages: Sequence[dict]) -> int:
    """The host's rough estimate of `messages` (ours without the host)."""
    if _ROUGH is not None:
        return int(_ROUGH[0](list(messages)))
    from lossless_context.tokens import estimate_messages_tokens

    return estimate_messages_tokens(messages)
