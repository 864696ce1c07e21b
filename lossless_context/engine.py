"""LCMEngine: the Hermes context engine named "lcm".

Host → engine → store/DAG → summariser → assembled context. The engine owns budgets and
the host contract; ingestion, compaction and the store do the work. `compress()` never
raises: every failure falls back to returning the host's own list unchanged.
"""

from __future__ import annotations

import copy
import functools
import json
import logging
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, Optional, cast

from . import tools
from .ops import retention
from .store import owners
from .contract.base import base_class
from .pipeline.assemble import Slot
from .pipeline.background import (BackgroundWorker, SessionGrowth, UpgradeQueue, counting, leftover_outlines,
                                  presummarize, upgrade_nodes)
from .pipeline.compaction import Budget, Compactor, PassResult
from .config import LCMConfig, model_threshold
from .pipeline.ingest import cheap_slots
from .contract.ingestion import SessionIngest
from .contract.lifecycle import SessionBusy, SessionLifecycle, held, session_lock
from .messages import role_of, summary_node_ids
from .contract.compaction_state import DEFAULT_THRESHOLD_PERCENT, CompactionState, PassLog, finite, positive_tokens
from .contract.turn_hooks import TurnHooks
from .contract.notices import StoreNotices
from .contract.units import ProviderUnits
from .contract.passbudget import MIN_OVER_WINDOW_CUT, plan_budget, effective_host, over_window, pass_budget, plausible_overhead
from .store import Store, open_store
from .summarizers.costs import SpendLedger
from .pipeline.stubs import stub_policy
from .pipeline.stub_prep import pass_running
from .retrieval.semantic import SemanticArm, SemanticUnavailable, load_embedder
from .pipeline.assemble import trim_without_store
from .store.guard import GuardedStore, StoreUnavailable
from .summarizers.summarize import Escalator, HostSummarizer, build_escalator, safe_call
from .tokens import estimate_messages_tokens, measured_messages

log = logging.getLogger("lossless_context")


class LCMEngine(base_class()):  # type: ignore[misc]  # the host's ContextEngine or our stand-in, chosen at import
    """Lossless Context Management: verbatim store + summary DAG + recall tools.

    It owns the parts that answer the host (contract/): `sessions`, `ingestion`, `turn_hooks` and
    `compaction_state` (newer hosts), `units`, `notices`; each gets the store, the config and the
    few engine operations it uses through its constructor; the host's methods here delegate."""

    protect_first_n: int = 3
    protect_last_n: int = 6
    last_real_prompt_tokens: int = 0  # the provider's last real prompt size (read by newer hosts)
    emit_automatic_compaction_status: bool = True  # (newer hosts read it; False: no status line)
    # A pass's time budget is measured on this clock (a simulated host's tests share theirs)
    pass_clock: Callable[[], float] = staticmethod(time.monotonic)

    def __init__(self, context_length: int = 0, *, config: LCMConfig | None = None,
                 **overrides: Any) -> None:
        # Nothing here touches the disk: the config file and the store open lazily.
        self._config = config
        self._overrides = dict(overrides)
        # Shared by every copy made for an agent: lets the registered engine (the one a
        # plugin slash command holds) find the session the agents are working on.
        self._family: dict[str, Any] = {"last_session": None, "live": None, "bound_with_db": False,
                                        "stores": {}, "store_lock": threading.Lock()}
        self._init_runtime_state()
        self.last_prompt_tokens = 0
        self.last_completion_tokens = 0
        self.last_total_tokens = 0
        self.compression_count = 0
        self.context_length = int(context_length or 0)
        frac = overrides.get("threshold", config.threshold if config else None)
        if isinstance(frac, (int, float)) and 0 < frac < 1:
            self._set_threshold_percent(float(frac))
        self.threshold_tokens = int(self.context_length * self.threshold_percent)
        self.model_thresholds: dict[str, Any] = {}

    def _init_runtime_state(self) -> None:
        self._store: Store | None = None
        self._escalator: Escalator | None = None
        self._runtime: dict[str, Any] = {}
        self._model = ""
        self._provider = ""
        self._overhead = 0  # host tokens outside the message list (system prompt, tool schemas)
        self._max_output_tokens: int | None = None  # the provider's output reservation (update_model)
        self._no_progress_at: int | None = None
        self._owner = owners.register(self)  # names this engine in the passes it stages
        self._growth = SessionGrowth()  # each session's recent growth, for the spend bound (background.py)
        self._upgrades: UpgradeQueue = self._family.setdefault("upgrades", UpgradeQueue())
        # Shared by every copy of the registered engine: /lcm status shows the figures of
        # the agents the user talks to, not of the never-driven registered object.
        fam = self._family
        self._stats = fam.setdefault("stats", {"compactions": 0, "summarizer_calls": 0, "summarizer_failures": 0,
                                               "last_pass_ms": 0.0, "last_reason": ""})
        self._stats_lock = fam.setdefault("stats_lock", threading.Lock())
        self._spend = SpendLedger()  # summariser spend per pass and per session (costs.py)
        self._last_compress_aborted = False
        self._last_summary_error: str | None = None
        self._last_compression_made_progress = False
        self._last_summary_fallback_used = False
        self.awaiting_real_usage_after_compression = False
        # The parts this engine owns (they reach it, and its lazy store and config, through a weak proxy)
        eng = cast("LCMEngine", weakref.proxy(self))
        store, config = (lambda: eng.store), (lambda: eng.config)
        published = functools.partial(_count_compaction, self._stats, self._stats_lock)
        self.sessions = SessionLifecycle(eng, weakref.ref(self), store, config, fam, self._owner, published)
        self.units = ProviderUnits(fam, self.sessions.sid, eng)
        self.notices = StoreNotices(fam, store)
        self.compaction_state = CompactionState(eng, config, lambda: eng.summary_escalator(), self.notices)
        self.turn_hooks = TurnHooks(eng, store, config, self.sessions.sid)
        self.ingestion = SessionIngest(store, config, self.sessions, lambda: eng.semantic_arm(), self._owner, published)
        self.passes: PassLog = fam.setdefault("pass_log", PassLog())  # (shared by every copy)

    # -- identity & config ------------------------------------------------------------

    @property
    def name(self) -> str:
        return "lcm"

    # -- threshold_percent / summary_target_ratio (the host reads and writes them) ---------------

    @property
    def threshold_percent(self) -> float:
        return self.__dict__.get("_threshold_percent", DEFAULT_THRESHOLD_PERCENT)

    @threshold_percent.setter
    def threshold_percent(self, value: float) -> None:
        # Anyone assigning the attribute (the host lowering it to fit its compression model, a
        # caller, a contract test) makes it explicit: it wins over model_thresholds and the config.
        self.__dict__["_threshold_percent"] = value
        self.__dict__["_threshold_explicit"] = True

    def _set_threshold_percent(self, value: float) -> None:
        """Our own resolution (config / model_thresholds): not an explicit setting."""
        self.__dict__["_threshold_percent"] = value

    def explicit_threshold_percent(self) -> float | None:
        """The explicitly set fraction, when usable (0 < f <= 1)."""
        if not self.__dict__.get("_threshold_explicit"):
            return None
        v = finite(self.__dict__.get("_threshold_percent"))
        return v if v is not None and 0 < v <= 1 else None

    @property
    def summary_target_ratio(self) -> float:
        """The share of the threshold a pass shrinks to (a newer host's idle compaction reads it)."""
        v = self.__dict__.get("_summary_target_ratio")
        if v is not None:
            return v
        try:
            return float(self.config.target_ratio)
        except Exception:
            return 0.55

    @summary_target_ratio.setter
    def summary_target_ratio(self, value: float) -> None:
        v = finite(value)
        if v is not None and 0 < v < 1:
            self.__dict__["_summary_target_ratio"] = v

    def input_window(self) -> int:
        """Tokens a request may take: the window less the output the provider reserves of it
        (the whole window when no reservation is known or it would leave nothing)."""
        reserve = self._max_output_tokens or 0
        window = int(self.context_length or 0)
        return window - reserve if 0 < reserve < window else window

    @property
    def overhead(self) -> int:
        """Host tokens outside the message list (system prompt, tool schemas), last seen."""
        return self._overhead

    @property
    def config(self) -> LCMConfig:
        if self._config is None:
            self._config = LCMConfig.load(self._overrides)
        return self._config

    @property
    def store(self) -> Store:
        if self._store is None:
            fam = self._family
            with fam["store_lock"]:
                if self._store is None:
                    # One store per location for every copy of this engine: a gateway makes a
                    # copy per agent, and a store per copy would open a connection pool per
                    # agent (PostgreSQL refuses clients past max_connections).
                    location = self.config.store_location()
                    shared = fam["stores"].get(location)
                    if shared is None:
                        # Every call goes through the location's circuit breaker (store/guard.py).
                        bound = self.config.store_timeout
                        shared = fam["stores"][location] = GuardedStore(
                            location, lambda loc: open_store(loc, call_timeout=bound),
                            self.config.store_retry_seconds)
                        # the `retention:` policy, applied on a thread of its own (ops/retention.py)
                        retention.schedule(shared, self.config.retention, owners.live_sessions)
                    self._store = shared
        return self._store

    def store_busy_for(self, thread_id: int | None = None) -> float:
        """Seconds the store call now running on `thread_id` (any thread: the oldest) has
        waited; 0 when none runs or the store is not open."""
        store = self._store
        fn = getattr(store, "busy_for", None) if store is not None else None
        return float(fn(thread_id)) if callable(fn) else 0.0

    def semantic_arm(self) -> SemanticArm | None:
        """The semantic arm of lcm_grep (retrieval/semantic.py) when ``semantic`` is on and its
        model loads, else None. One per store location and process, shared by every copy of
        the engine; it embeds new messages in its own thread, and stops when the store closes."""
        if not self.config.semantic:
            return None
        store = self.store
        location = self.config.store_location()
        fam = self._family
        with fam["store_lock"]:
            arms = fam.setdefault("semantic", {})
            if location not in arms:
                try:
                    made = SemanticArm(store, load_embedder(self.config.semantic_model))
                except (SemanticUnavailable, ImportError) as exc:
                    log.warning("lcm: semantic search is off: %s", exc)  # once per location
                    arms[location] = None
                else:
                    made.notify()  # what is stored without vectors yet (e.g. history from before)

                    def closing(arm: SemanticArm = made) -> None:
                        arm.close()
                        with fam["store_lock"]:
                            if arms.get(location) is arm:
                                arms.pop(location)

                    if isinstance(store, GuardedStore):  # (the engine's store always is)
                        store.add_close_hook(closing)
                    arms[location] = made
            return arms[location]

    # -- copies: each agent gets a fresh engine sharing the durable store --------------

    def _fresh(self) -> "LCMEngine":
        new = type(self).__new__(type(self))
        new._config = self._config
        new._overrides = dict(self._overrides)
        new._family = self._family
        new._init_runtime_state()
        for attr in ("last_prompt_tokens", "last_completion_tokens", "last_total_tokens",
                     "threshold_tokens", "context_length", "compression_count",
                     "protect_first_n", "protect_last_n", "last_real_prompt_tokens", "_max_output_tokens"):
            setattr(new, attr, getattr(self, attr))
        for key in ("_threshold_percent", "_threshold_explicit", "_summary_target_ratio"):
            if key in self.__dict__:  # explicit settings survive the copy, and stay explicit
                new.__dict__[key] = self.__dict__[key]
        new.model_thresholds = copy.deepcopy(getattr(self, "model_thresholds", {}))
        new._runtime = dict(self._runtime)
        new._model, new._provider = self._model, self._provider
        return new

    def __deepcopy__(self, memo: dict) -> "LCMEngine":
        new = self._fresh()
        memo[id(self)] = new
        return new

    def clone_for_agent(self, *args: Any, **kwargs: Any) -> "LCMEngine":
        return self._fresh()

    # -- budgets ---------------------------------------------------------------------------

    def update_model(self, model: str, context_length: int, base_url: str = "", api_key: Any = "",
                     provider: str = "", api_mode: str = "", max_tokens: Any = None, **kwargs: Any) -> None:
        """A model (re)configured. `max_tokens`, the output the provider reserves out of the same
        window (newer hosts pass it), leaves `context_length - max_tokens` for the request: the
        threshold is taken from that. None keeps the reservation already known (as the host's
        own compressor does); unknown keywords of a newer host are accepted and ignored."""
        self._model, self._provider = model or "", provider or ""
        self._runtime = {"model": model, "provider": provider, "base_url": base_url,
                         "api_key": api_key, "api_mode": api_mode}
        self.context_length = int(context_length or 0)
        if max_tokens is not None:
            self._max_output_tokens = positive_tokens(max_tokens)
        # An explicitly set threshold_percent > compression.model_thresholds > our config.
        frac = self.explicit_threshold_percent()
        if frac is None:
            frac = model_threshold(getattr(self, "model_thresholds", None), self._model, self._provider)
        if frac is None:
            frac = self.config.threshold
        self._set_threshold_percent(frac)
        self.threshold_tokens = int(self.input_window() * frac)
        self._escalator = None  # the host summariser follows the new runtime

    def update_from_response(self, usage: Dict[str, Any], *args: Any, **kwargs: Any) -> None:
        if not isinstance(usage, dict) or not usage:
            return
        def _int(*keys: str) -> int | None:
            for k in keys:
                v = usage.get(k)
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    return int(v)
            return None
        p = _int("prompt_tokens", "input_tokens")
        c = _int("completion_tokens", "output_tokens")
        t = _int("total_tokens")
        if p is not None:
            self.last_prompt_tokens = p
            self.awaiting_real_usage_after_compression = False
            if p > 0:
                self.last_real_prompt_tokens = p
                self.units.observe_usage(p)  # (the count of the list a pass returned: units.py)
        if c is not None:
            self.last_completion_tokens = c
        if t is not None:
            self.last_total_tokens = t
        elif p is not None and c is not None:
            self.last_total_tokens = p + c

    def should_compress(self, prompt_tokens: Optional[int] = None, *args: Any, **kwargs: Any) -> bool:
        tokens = prompt_tokens if prompt_tokens is not None else self.last_prompt_tokens
        if not isinstance(tokens, (int, float)) or tokens < 0 or self.threshold_tokens <= 0:
            return False
        return self._over_threshold(self.units.in_provider_units(tokens))  # (a rough figure: units.py)

    def _over_threshold(self, tokens: float) -> bool:
        """`tokens` (the provider's units) calls for a pass."""
        if tokens < self.threshold_tokens:
            return False
        # After a pass that could not shrink anything, wait for real growth: no loops.
        if self._no_progress_at is not None and tokens < self._no_progress_at * 1.05:
            return False
        return True

    def should_compress_preflight(self, messages: List[Dict[str, Any]], *args: Any, **kwargs: Any) -> bool:
        try:
            rough = estimate_messages_tokens(messages) + self._overhead
            return self.threshold_tokens > 0 and self._over_threshold(rough * self.units.provider_ratio())
        except Exception:
            return False

    def has_content_to_compress(self, messages: List[Dict[str, Any]], *args: Any, **kwargs: Any) -> bool:
        try:
            slots = cheap_slots(messages)
            h = Compactor.head_end(slots, self.protect_first_n)
            t = Compactor.tail_start(slots, h, self._forced_tail(self._budget(0), sum(s.tokens for s in slots)))
            # the last protect_last_n messages are protected too
            t = min(t, max(h, len(slots) - self.protect_last_n))
            return any(s.kind == "m" for s in slots[h:t]) or sum(len(s.refs) for s in slots[h:t] if s.kind == "s") > 1
        except Exception:
            return False

    @staticmethod
    def _forced_tail(budget: Budget, tokens: int) -> int:
        """A manual /compress on a context already under target still has to shrink it."""
        return min(budget.fresh_tail, int(tokens * 0.3)) if tokens <= budget.target else budget.fresh_tail

    def _budget(self, overhead: int, scale: float | None = None) -> Budget:
        """A pass's budget in our estimate's units (passbudget.plan_budget): the threshold divided
        by the provider's ratio (`scale`, this session's by default: contract/units.py), less the overhead."""
        scale = max(1.0, self.units.provider_ratio() if scale is None else scale)
        threshold = self.threshold_tokens or int((self.context_length or 128_000) * self.threshold_percent)
        return plan_budget(self.config, int(threshold / scale), scale, overhead, self.protect_first_n)

    # -- summariser ------------------------------------------------------------------------------

    def _get_escalator(self) -> Escalator:
        if self._escalator is None:  # (the host's runtime: known once update_model ran)
            self._escalator = build_escalator(self.config, bool(self._runtime), self._host_runtime)
        return self._escalator

    def summary_escalator(self) -> Escalator:
        """The summariser this engine would use now (for `lcm resummarize`)."""
        return self._get_escalator()

    def _host_runtime(self) -> dict[str, Any]:
        rt = dict(self._runtime)
        key = rt.get("api_key")
        if callable(key):
            try:
                rt["api_key"] = key()
            except Exception:
                rt["api_key"] = ""
        return rt

    # -- ingestion -----------------------------------------------------------------------------------

    def ingest(self, messages: List[Any], session_id: str | None = None,
               lock_wait: float | None = None, flush: bool = False) -> list[Slot]:
        """Store whatever is new in `messages` and return the aligned slots. Waits at most
        `lock_wait` (default `lock_timeout`) seconds behind a pass on the same session, then
        raises SessionBusy (the host hands the whole list again later: nothing is lost).
        `flush` (on_session_end): no slots wanted; the list the last pass aligned is not
        aligned again (ingest_resume.PassEcho), and [] is returned for it."""
        sid = self.sessions.route(session_id or self.sessions.sid(), messages)
        wait = self.config.lock_timeout if lock_wait is None else lock_wait
        with held(self.store.location, sid, wait):
            return self.ingestion.align_locked(sid, messages, flush=flush)[0]

    # -- compress -------------------------------------------------------------------------------------

    def compress(self, messages: List[Dict[str, Any]], current_tokens: Optional[int] = None,
                 focus_topic: Optional[str] = None, force: bool = False, memory_context: str = "",
                 **kwargs: Any) -> List[Dict[str, Any]]:
        self._last_compress_aborted = False
        self._last_summary_error = None
        self._last_compression_made_progress = False
        self._last_summary_fallback_used = False
        if not isinstance(messages, list):
            try:
                messages = list(messages)
            except Exception:
                return []
        started = time.perf_counter()
        try:
            result = self._compress(messages, current_tokens, focus_topic, bool(force),
                                    memory_context if isinstance(memory_context, str) else "", kwargs,
                                    self.pass_clock())  # the pass budget counts from here (ingest included)
        except StoreUnavailable as exc:
            # The session survives without its store: keep it within the window (store/guard.py).
            with self._stats_lock:
                self._stats["last_reason"] = f"store unavailable: {exc.reason}"
            out = self._trim_without_store(messages)
            if out != messages:  # (the host prints it only after a pass that changed something)
                self._last_summary_error = self.notices.store_stopped_line(exc)  # once per outage: notices.py
            return out
        except Exception as exc:
            log.exception("lcm: compress failed; returning the conversation unchanged")
            with self._stats_lock:
                self._stats["last_reason"] = f"error: {type(exc).__name__}: {exc}"
            return messages
        finally:
            with self._stats_lock:
                self._stats["last_pass_ms"] = (time.perf_counter() - started) * 1000
        return result

    def _summary_levels(self, output: List[Any]) -> int:
        ids: set[int] = set()
        for m in output:
            ids.update(summary_node_ids(m))
        try:
            recs = self.store.get_summaries(sorted(ids), include_staged=True) if ids else {}
        except Exception:
            return 1
        return max((r.depth for r in recs.values()), default=0) + 1 if recs else 1

    def _trim_without_store(self, messages: List[Any]) -> List[Any]:
        try:
            out = trim_without_store(messages, self._budget(self._overhead).target, self.protect_first_n)
        except Exception:
            log.exception("lcm: trimming without the store failed; returning the conversation unchanged")
            return messages
        if len(out) < len(messages):
            self._last_compression_made_progress = True
        return out

    def _compress(self, messages: List[Any], current_tokens: Optional[int], focus: Optional[str],
                  force: bool, memory: str, kwargs: dict[str, Any], t0: float) -> List[Dict[str, Any]]:
        sid = self.sessions.route(self.sessions.sid(kwargs), messages)
        system = messages[0] if messages and role_of(messages[0]) == "system" else None
        cfg = self.config
        lock = session_lock(self.store.location, sid)
        if not lock.acquire(timeout=cfg.lock_timeout):
            self._note("another pass for this session is running")
            return messages
        try:
            with pass_running(), self.store.compaction_lock(sid, cfg.lock_timeout) as got:
                if not got:
                    self._note("another process is compacting this session")
                    return messages
                stored: dict[int, tuple[Any, int]] = {}  # (the ingest's estimates: not made again)
                slots, version, base_len, hold = self.ingestion.align_locked(sid, messages, True, token_memo=stored)
                ours, memo = measured_messages(messages, stored)  # (the pass's memo: its output is mostly these)
                # The host's figure in the provider's units teaches the session's ratio
                # (units.py); one that exceeds ours by more than any overhead says nothing
                # about the overhead. Otherwise it is a hint: a bounded overhead, re-derived
                # on every call.
                ratio = self.units.observe_figure(sid, current_tokens, ours)
                oh = None if self.units.figure_is_inflated(current_tokens, ours) else plausible_overhead(
                    current_tokens, ours, self.context_length or
                    int(self.threshold_tokens / max(self.threshold_percent, 0.05)))
                overhead = self._overhead if oh is None else oh
                self._overhead = overhead
                budget = self._budget(overhead, ratio)
                # A session past the host's hygiene message limit is force-compressed by a
                # gateway: it must shrink (its message count) even when its tokens are few.
                by_count = len(messages) >= max(1, cfg.host.hygiene_hard_message_limit)
                # Over the window a newer host fails the turn closed unless the pass cuts 5 %
                # (passbudget.py): it shrinks like a forced one, whatever our estimate says.
                over = over_window(current_tokens, self.context_length)
                shrink = force or by_count or over
                if ours <= budget.target:
                    if not shrink:
                        # Nothing to shrink however large the host's figure: wait for growth.
                        self._no_progress_at = self._host_figure(current_tokens, ours + overhead, ratio)
                        self._note(f"{ours} tokens already within target {budget.target}"
                                   + (f" (provider ratio {ratio:.2f})" if ratio > 1 else ""))
                        return messages
                    budget.fresh_tail = self._forced_tail(budget, ours)
                esc = self._get_escalator()
                # With the worker on no pass waits for the model (a manual /compress does: compaction.py)
                fast = self._background_on() and esc.model is not None and not force
                outlines = not over and int((ours + overhead) * ratio) < cfg.hard_threshold * (self.context_length or 0)
                pb = pass_budget(effective_host(cfg.host), time_budget=cfg.compaction_time_budget,
                                 summary_timeout=cfg.summary_timeout,
                                 progress_visible=isinstance(esc.model, HostSummarizer),
                                 message_count=len(messages))
                left = pb.seconds - (self.pass_clock() - t0)
                comp = Compactor(self.store, esc, owner=self._owner, cancelled=self._cancel_check(),
                                 time_budget=max(0.0, left), clock=self.pass_clock, fast=fast, outlines=outlines,
                                 call_timeout=pb.call_timeout, stubs=stub_policy(cfg), continuity_tokens=cfg.continuity_tokens,
                                 min_cut=MIN_OVER_WINDOW_CUT if over else 0.0, token_memo=memo)
                res: PassResult = comp.run(sid, system, slots, budget, focus=focus or None,
                                           memory_context=memory, force=force, base_version=version,
                                           base_len=base_len, tokens_before=ours, host_messages=messages,
                                           hold=hold)
        finally:
            lock.release()
        with self._stats_lock:
            self._stats["summarizer_calls"] += res.calls
            self._stats["summarizer_failures"] += res.failures
            self._stats["last_reason"] = res.reason
            self._spend.record(sid, res.spend, res.stubs, res.progressed and res.new_nodes == 0 and res.calls == 0)
        cancel = self._cancel_check()
        if res.progressed and cancel is not None and safe_call(cancel):
            # The host gave up on this pass: its result would be discarded, so stage nothing.
            self._discard_stage(res.pass_id)
            res = PassResult(messages, reason="cancelled by the host", calls=res.calls,
                             tokens_before=res.tokens_before, tokens_after=res.tokens_before)
        # (a staged pass measured its output with the memo: the same sum, not measured again)
        after = res.tokens_after if res.progressed else ours
        if res.progressed and after >= ours and not by_count:
            # A pass with too little to fold (a manual /compress over one short message) would
            # put a summary block larger than what it replaces: change nothing instead.
            self._discard_stage(res.pass_id)
            res = PassResult(messages, reason=f"the pass could not shrink the context ({ours} -> {after} tokens)",
                             calls=res.calls, tokens_before=res.tokens_before, tokens_after=res.tokens_before)
        self._record(sid, res, pb, self.pass_clock() - t0, overhead)
        if not res.progressed:
            self._no_progress_at = self._host_figure(current_tokens, ours + overhead, ratio)
            self._note(res.reason)
            return messages
        if res.output == messages:
            # (a manual /compress with nothing to do): no compaction, and no stage left behind
            if res.pass_id:
                self.store.discard_pass(res.pass_id)
            self._note("the pass changed nothing")
            return messages
        self._no_progress_at = None
        self.units.note_pass_output(sid, after)  # (res.output as measured above: unchanged since)
        self.sessions.staged(sid, res.pass_id)
        self.sessions.settle_fork_pass(sid)  # (a background fork's pass waits for no commit: lifecycle.py)
        if res.upgrade_ids:
            self._submit_upgrade(sid, res.upgrade_ids, budget)
        # The host warns "compressed N times — accuracy may degrade" from N >= 2. Nothing is
        # lost here, but what the model reads of the oldest turns went through N summary
        # levels: N = the deepest summary level in the context we return (1: leaf summaries).
        self.compression_count = self._summary_levels(res.output)
        self._last_compression_made_progress = True
        self._last_summary_fallback_used = bool(res.failures)
        return res.output

    def _host_figure(self, current_tokens: Any, fallback: int, ratio: float = 1.0) -> int:
        """The host's token figure for the no-progress guard, in the provider's units (as
        should_compress compares it), bounded by the window."""
        if plausible_overhead(current_tokens, 0, 0) is None:
            return int(fallback * ratio)
        figure = int(self.units.in_provider_units(current_tokens))
        return int(min(figure, self.context_length)) if self.context_length else figure

    def _record(self, sid: str, res: PassResult, pb: Any, seconds: float, overhead: int) -> None:
        self.passes.record({"overhead": overhead,
            "session_id": sid, "pass_id": res.pass_id, "tokens_before": res.tokens_before,
            "tokens_after": res.tokens_after if res.progressed else res.tokens_before,
            "calls": res.calls, "failures": res.failures, "new_nodes": res.new_nodes,
            "levels": dict(res.levels), "seconds": round(seconds, 3),
            "budget_seconds": round(pb.seconds, 3), "host_limit_seconds": pb.host_limit,
            "hygiene": pb.hygiene, "outcome": "staged" if res.progressed else res.reason,
            "at": time.time()})

    def _discard_stage(self, pass_id: str | None) -> None:
        if not pass_id:
            return
        try:
            self.store.discard_pass(pass_id)
        except Exception as exc:
            log.debug("lcm: cannot discard the abandoned pass %s: %s", pass_id, exc)

    # -- background compaction -----------------------------------------------------------------

    def _background_on(self) -> bool:
        """on, off, or auto: on when a model summarises (the extractive one takes milliseconds)."""
        mode = self.config.background_compaction
        if mode == "auto":
            return self._get_escalator().model is not None
        return mode == "on"

    def _worker(self) -> BackgroundWorker | None:
        if not self._background_on():
            return None
        return BackgroundWorker.for_store(self.store.location, self.config.background_concurrency)

    def _submit_upgrade(self, sid: str, node_ids: list[int], budget: Budget) -> None:
        worker = self._worker()
        if worker is None:
            return
        pending, store, esc = self._upgrades, self.store, self._get_escalator()
        seen = counting(self._stats, self._stats_lock, self._spend, sid)
        pending.add(sid, node_ids)
        worker.submit(f"{sid}#upgrade", lambda stop: upgrade_nodes(store, esc, sid, pending.take(sid), budget, stop, seen),
                      store)

    def upgrade_leftovers(self, sid: str) -> None:
        """Queue the outlines a process that ended before its worker left in `sid`'s context."""
        if not self.sessions.fork and self._worker() is not None:
            self._submit_upgrade(sid, leftover_outlines(self.store, sid), self._budget(self._overhead))

    def wait_background(self, timeout: float = 60.0) -> bool:
        """Wait (bounded) until the worker has nothing left for this store (`lcm demo`, tests)."""
        worker = self._worker()
        return worker is None or worker.wait_idle(timeout)

    def maybe_presummarize(self, messages: List[Any], session_id: str | None = None) -> bool:
        """Between turns, above the soft threshold: summarise ahead what the next pass takes."""
        worker, esc = self._worker(), self._get_escalator()
        if worker is None or not self.context_length or esc.model is None:
            return False
        tokens = (estimate_messages_tokens(messages) + self._overhead) * self.units.provider_ratio(session_id)
        sid = session_id or self.sessions.sid()
        growing = self._growth.note(sid, int(tokens))
        if tokens < self.config.soft_threshold * self.context_length:
            return False
        if self.config.background_spend_bound and not growing(self.threshold_tokens):
            return False  # not growing, or its pass is not near: a summary made now may never be used
        store, budget = self.store, self._budget(self._overhead)
        stubs = stub_policy(self.config) if self.config.tool_stubs else None
        seen = counting(self._stats, self._stats_lock, self._spend, sid)
        return worker.submit(sid, lambda stop: presummarize(store, esc, sid, budget, stop, stubs, seen), store)

    def _cancel_check(self) -> Callable[[], bool] | None:
        fn = getattr(self, "_compression_cancelled_check", None)
        return fn if callable(fn) else None

    def _note(self, reason: str) -> None:
        log.info("lcm: no compaction: %s", reason)
        with self._stats_lock:
            self._stats["last_reason"] = reason

    # -- the host's calls answered by the parts this engine owns (contract/) -------------------------------

    def bind_session_state(self, session_db: Any = None, session_id: str | None = None, *args: Any,
                           **kwargs: Any) -> None:
        self.sessions.bind(session_db, session_id)

    def on_session_start(self, session_id: str, **kwargs: Any) -> None:
        self.sessions.start(session_id, **kwargs)

    def on_session_end(self, session_id: str, messages: List[Dict[str, Any]], *args: Any, **kwargs: Any) -> None:
        self.sessions.end(session_id, messages)

    def on_session_reset(self, *args: Any, **kwargs: Any) -> None:
        super().on_session_reset()  # the host's counters
        self.sessions.reset()
        self._no_progress_at = None
        self._overhead = 0
        self.last_real_prompt_tokens = 0

    def current_session(self) -> str:
        """The session this engine acts on now (the tools' and /lcm's scope)."""
        return self.sessions.sid()

    def live_engine(self) -> "LCMEngine":
        """The copy of this engine the user's agent drives (this one when none did yet)."""
        live = self.sessions.live_engine()
        return live if live is not None else self

    def sync_from_host(self, lock_wait: float | None = None) -> int:
        """Store the host's record of the current session (lifecycle.py); how many messages it holds."""
        return self.sessions.sync_from_host(lock_wait)

    def select_context(self, request_messages: List[Dict[str, Any]], *,
                       conversation_messages: Optional[List[Dict[str, Any]]] = None, incoming_message: Any = None,
                       budget_tokens: int = 0, **kwargs: Any) -> Optional[List[Dict[str, Any]]]:
        return self.turn_hooks.select_context(request_messages, budget_tokens, kwargs)

    def on_turn_complete(self, messages: List[Dict[str, Any]], usage: Any = None, **kwargs: Any) -> None:
        self.turn_hooks.on_turn_complete(messages, kwargs)

    def prune_tool_results_only(self, messages: List[Dict[str, Any]], current_tokens: Optional[int] = None,
                                *args: Any, **kwargs: Any) -> Any:
        return self.turn_hooks.prune_tool_results_only(messages)

    def should_compress_info(self, prompt_tokens: Optional[int] = None, *args: Any,
                             **kwargs: Any) -> "tuple[bool, str | None]":
        return self.compaction_state.should_compress_info(prompt_tokens)

    def get_active_compression_failure_cooldown(self, *args: Any, **kwargs: Any) -> Optional[Dict[str, Any]]:
        return self.compaction_state.get_active_compression_failure_cooldown()

    def should_defer_preflight_to_real_usage(self, rough_tokens: int, *args: Any, **kwargs: Any) -> bool:
        return self.compaction_state.should_defer_preflight_to_real_usage(rough_tokens)

    def pending_compression_operation(self, messages: Optional[List[Dict[str, Any]]] = None, *args: Any,
                                      **kwargs: Any) -> None:
        return None  # every LCM pass is a compaction; it never asks for a sanitation-only pass

    def get_automatic_compaction_status_message(self, *, phase: str = "compress", default_message: str = "",
                                                **context: Any) -> Optional[str]:
        return self.compaction_state.get_automatic_compaction_status_message(
            phase=phase, default_message=default_message, **context)

    def provider_ratio(self, session_id: str | None = None) -> float:
        """Provider tokens per token of our estimate in this session (1: they agree)."""
        return self.units.provider_ratio(session_id)

    def summary_block_tokens(self) -> int:
        """The summary block's size in a pass planned now (select_context renders within it)."""
        return self._budget(self._overhead).summary_block

    # -- status -------------------------------------------------------------------------------------------

    def get_status(self, *args: Any, **kwargs: Any) -> Dict[str, Any]:
        status = super().get_status()
        with self._stats_lock:
            status.update({f"lcm_{k}": v for k, v in self._stats.items()})
        status["lcm_session_id"] = self.sessions.session_id
        status["lcm_provider_ratio"] = round(self.units.provider_ratio(), 3)
        status.update(self._spend.status(self.sessions.session_id, self._provider))
        passes = self.passes.last()
        status["lcm_last_pass"] = passes[-1] if passes else None
        status["lcm_recent_passes"] = passes[-5:]
        try:
            status["lcm_config_warnings"] = list(self.config.warnings)
        except Exception:
            pass
        worker = _worker_or_none(self)
        if worker is not None:
            status.update({"lcm_background_backlog": worker.backlog, "lcm_background_jobs": worker.jobs_done,
                           "lcm_background_seconds": round(worker.model_seconds, 3)})
        try:
            st = self.store.stats()
            status.update({
                "lcm_store": st["location"], "lcm_backend": st["backend"], "lcm_messages": st["messages"],
                "lcm_summaries_by_depth": st["summaries_by_depth"], "lcm_staged_summaries": st["staged_summaries"],
                "lcm_sessions": st["sessions"], "lcm_store_compactions": st["compactions"],
                "lcm_unindexed_messages": st.get("unindexed_messages", 0),
                "lcm_presummaries": self.store.count_presummaries(),
                "lcm_retention": retention.scheduled(self.store.location) or {
                    "policy": self.config.retention.as_dict(), "alive": False},
            })
        except Exception as exc:
            status["lcm_store_error"] = str(exc)
        return status

    # -- tools (lcm_grep, lcm_describe, lcm_expand, lcm_expand_query) ----------------------------------

    def get_tool_schemas(self, *args: Any, **kwargs: Any) -> List[Dict[str, Any]]:
        return copy.deepcopy(tools.TOOL_SCHEMAS)

    def handle_tool_call(self, name: str, args: Dict[str, Any], **kwargs: Any) -> str:
        if not self.sessions.fork:
            self.sessions.mark_live()
        live = kwargs.get("messages")
        current: set[int] = set()
        if name in tools.TOOL_NAMES and isinstance(live, list) and live:
            try:
                # the live list first: search sees the current turn too (not behind a running pass)
                slots = self.ingest(live, lock_wait=tools.LIVE_LOCK_WAIT)
                current = tools.current_turn(live, slots)
            except StoreUnavailable as exc:
                return tools.unavailable_answer(exc)
            except SessionBusy as exc:
                log.debug("lcm: %s searches what is stored: %s", name, exc)
            except Exception as exc:  # (unexpected: with its traceback)
                log.warning("lcm: live ingestion before %s failed: %s", name, exc, exc_info=exc)
        try:
            source = tools.ToolSource(self.store, self.config, self.semantic_arm() if name == "lcm_grep" else None,
                                      self._get_escalator() if name == "lcm_expand_query" else None)
        except StoreUnavailable as exc:
            return tools.unavailable_answer(exc)
        except Exception as exc:  # a tool answers JSON whatever happens
            log.exception("lcm: tool %s failed", name)
            return json.dumps({"error": f"internal error in {name}: {type(exc).__name__}"})
        return tools.dispatch(source, name, args, session_id=self.sessions.sid(), current=current)


def _worker_or_none(engine: "LCMEngine") -> BackgroundWorker | None:
    try:
        return engine._worker() if engine._config is not None and engine._store is not None else None
    except Exception:
        return None


def _count_compaction(stats: dict[str, Any], lock: Any) -> None:
    """A staged pass was published (the engine family's figures behind /lcm status)."""
    with lock:
        stats["compactions"] += 1
