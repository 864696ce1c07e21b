"""How long one compaction pass may take, and how much of the host's token figure to trust.

A newer host runs the whole pass on a worker thread and throws its result away when the
pass stays *silent* longer than `compression.context_timeout_seconds` (120 s), or runs past
`context_total_ceiling_seconds` (600 s); gateway hygiene uses 30 s. The 0.22 line raises the
silence budget to the compression model's own timeout (`auxiliary.compression.timeout`,
at least 300 s): `effective_host` asks the installed host how it resolves the block, so a
pass is planned against the budget that really applies. Only progress reported
through the host's own auxiliary client extends the silence budget. So a pass plans to end
in half of whatever budget applies: model calls stop at that deadline (each call's own
timeout is cut to what is left), the rest of the pass is summarised deterministically, and
the remaining half is the margin for ingestion, the deterministic work and the commit.

The host's `current_tokens` may legitimately exceed our own estimate of the messages
(system prompt, tool schemas, images); but it is a hint, not truth: the overhead taken
from it is bounded by a share of the window and re-derived on every call.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any

from ..config import HostCompression, LCMConfig
from ..hostapi import compression_timeouts
from ..pipeline.compaction import Budget
from ..pipeline.dag_balance import node_targets

SAFETY = 0.5  # share of a host budget a pass plans to use
# A hygiene pass is huge (5,000 messages): its deterministic rest can itself take seconds.
HYGIENE_SAFETY = 1 / 3
MIN_CALL_SECONDS = 1.0  # below this, a model call is not worth starting
OVERHEAD_SHARE = 0.25  # at most this share of the window is "outside the messages"


@dataclass(frozen=True)
class PassBudget:
    seconds: float  # from the start of compress(): no model call starts after this
    call_timeout: float  # cap on one model call
    host_limit: float  # the host budget that applies (0: the host runs no timeout)
    hygiene: bool  # the pass is as large as a gateway hygiene pass


def effective_host(host: HostCompression) -> HostCompression:
    """`host` with the silence budget and ceiling the installed host applies to a pass (0.22:
    `max(context_timeout_seconds, min(max(auxiliary.compression.timeout, 300), ceiling))`);
    as configured when the host resolves nothing (0.19.0, no host: 0.20's reading)."""
    resolved = _resolved(float(host.context_timeout_seconds), float(host.context_total_ceiling_seconds))
    if resolved is None:
        return host
    idle, ceiling = resolved
    return dataclasses.replace(host, context_timeout_seconds=idle, context_total_ceiling_seconds=ceiling)


@functools.lru_cache(maxsize=8)
def _resolved(idle: float, ceiling: float) -> tuple[float, float] | None:
    # Once per configuration and process: the host reads its auxiliary config to answer.
    return compression_timeouts({"context_timeout_seconds": idle, "context_total_ceiling_seconds": ceiling})


def pass_budget(host: HostCompression, *, time_budget: float, summary_timeout: float,
                progress_visible: bool, message_count: int) -> PassBudget:
    """The deadline and per-call cap for one pass.

    `progress_visible`: the summariser's calls go through the host's auxiliary client on the
    pass's own thread, so a streamed reply counts as progress; then the silence budget bounds
    each call and the ceiling bounds the pass. Otherwise the host sees nothing until the pass
    returns, so the whole pass must fit the silence budget.
    """
    silence = float(host.context_timeout_seconds)
    ceiling = float(host.context_total_ceiling_seconds)
    hygiene = message_count >= max(1, int(host.hygiene_hard_message_limit))
    if hygiene:
        # A gateway force-compresses such a session with its own, shorter budget.
        silence = min(silence, host.hygiene_timeout_seconds) if silence > 0 else host.hygiene_timeout_seconds
        ceiling = min(ceiling, host.hygiene_total_ceiling_seconds)
    time_budget = max(0.0, float(time_budget))
    summary_timeout = max(0.1, float(summary_timeout))
    if silence <= 0:
        return PassBudget(time_budget, summary_timeout, 0.0, hygiene)
    share = HYGIENE_SAFETY if hygiene else SAFETY
    if progress_visible:
        seconds = min(time_budget, share * ceiling)
        call = min(summary_timeout, share * silence)
        limit = ceiling
    else:
        seconds = min(time_budget, share * silence)
        call = min(summary_timeout, seconds)
        limit = silence
    return PassBudget(seconds, max(0.1, call), limit, hygiene)


MIN_OVER_WINDOW_CUT = 0.05  # 0.22 fails a turn closed when a pass over the window cuts less (preflight)


def over_window(current_tokens: Any, window: int) -> bool:
    """Is the host's figure for a request (a usable one) past the model's window? Then the
    pass must cut at least MIN_OVER_WINDOW_CUT of the list, or a 0.22 host sends nothing."""
    if plausible_overhead(current_tokens, 0, 0) is None or not window:
        return False
    return float(current_tokens) > window


def plausible_overhead(current_tokens: Any, ours: int, window: int) -> int | None:
    """Tokens the host counts outside the message list, or None when the figure is unusable.

    Missing, negative, NaN/inf, boolean or non-numeric figures give None (keep what was known);
    a figure below our own estimate gives 0; anything else is capped at `OVERHEAD_SHARE` of
    the window, so one absurd figure cannot make every later pass target the floor.
    """
    if isinstance(current_tokens, bool) or not isinstance(current_tokens, (int, float)):
        return None
    if isinstance(current_tokens, float) and not math.isfinite(current_tokens):
        return None
    if current_tokens < 0:
        return None
    cap = int(max(0, window) * OVERHEAD_SHARE)
    return max(0, min(int(current_tokens) - int(ours), cap))


def plan_budget(cfg: LCMConfig, threshold: int, scale: float, overhead: int, protect_first_n: int) -> Budget:
    """A pass's budget in our estimate's units: `threshold` (already divided by the provider's
    ratio `scale`) less the host's overhead, shrunk to the configured target."""
    usable = max(2000, threshold - overhead)
    target = max(1000, int(usable * cfg.target_ratio))
    block = max(400, min(int(target * 0.25), 8 * cfg.condensed_summary_tokens))
    # Node sizes follow the block (dag_balance.py): small windows get smaller nodes, not a deeper DAG.
    leaf_t, cond_t = node_targets(block, cfg.condense_fanin, cfg.leaf_summary_tokens,
                                  cfg.condensed_summary_tokens)
    return Budget(
        target=target,
        fresh_tail=min(cfg.fresh_tail_tokens, int(target * 0.5)),
        summary_block=block,
        leaf_chunk=max(500, int(cfg.leaf_chunk_tokens / scale)),  # (the summariser's window)
        leaf_summary=leaf_t,
        condensed_summary=cond_t,
        fanin=cfg.condense_fanin,
        protect_first_n=max(0, int(protect_first_n)),
        large_tokens=min(cfg.large_message_tokens, max(500, target // 3)),
    )
