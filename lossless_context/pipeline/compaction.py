"""Compaction: pick the span to summarise, build leaf and condensed nodes, assemble output.

The protected head and a token-bounded fresh tail (whole tool groups) stay verbatim; the
span between them becomes leaf summaries (chunks bounded in tokens), and summaries that
pile up at one depth are condensed into a deeper node. Everything is *staged*: the host
publishes it by committing the pass. Model calls happen before any write transaction.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from .assemble import (Slot, choose_summary_role, groups, large_representation, pending_start, render_summary,
                       repair, reply_anchor)
from . import continuity
from ..summarizers.costs import Spend
from .dag_balance import next_condensation
from .digest import digest
from ..records import Source
from ..messages import content_ident
from ..store.owners import new_pass_id
from ..records import MessageRecord, NewSummary, SummaryRecord
from ..store.base import Store
from .stubs import StubPolicy, apply_stubs, is_stub, swap_stubs
from ..summarizers.summarize import OUTLINE, Escalator, SummaryRequest, deterministic_summary, outline_summary
from ..tokens import estimate_message_tokens, estimate_text_tokens

log = logging.getLogger("lossless_context.pipeline.compaction")

SOURCE_TEXT_LIMIT = 24_000  # chars of one message given to a summariser
MIN_MODEL_TOKENS = 300  # spans smaller than this are summarised deterministically


@dataclass
class Budget:
    target: int  # tokens the assembled messages should fit in
    fresh_tail: int
    summary_block: int
    leaf_chunk: int
    leaf_summary: int
    condensed_summary: int
    fanin: int
    protect_first_n: int
    large_tokens: int


@dataclass
class PassResult:
    output: list[dict[str, Any]]
    pass_id: str | None = None
    progressed: bool = False
    new_nodes: int = 0
    calls: int = 0
    failures: int = 0
    tokens_before: int = 0
    tokens_after: int = 0
    reason: str = ""
    levels: dict[str, int] = field(default_factory=dict)
    upgrade_ids: list[int] = field(default_factory=list)
    adopted: int = 0
    stubs: int = 0  # tool results shown as tier-0 stubs in the output
    spend: Spend = field(default_factory=Spend)  # the pass's summariser calls (costs.py)


@dataclass
class _Node:
    key: str | int  # int = existing published/staged id, str = new
    depth: int
    tokens: int
    text: str
    t_start: float | None
    t_end: float | None
    n_messages: int


class Compactor:
    def __init__(self, store: Store, escalator: Escalator, *,
                 cancelled: Callable[[], bool] | None = None, time_budget: float = 240.0,
                 clock: Callable[[], float] = time.monotonic,
                 fast: bool = False, outlines: bool = True, owner: str | None = None,
                 stubs: StubPolicy | None = None,
                 continuity_tokens: int = 0, call_timeout: float | None = None, min_cut: float = 0.0,
                 token_memo: dict[int, tuple[Any, int]] | None = None) -> None:
        self.store = store
        # The share of the context a pass must cut (a newer host refuses a pass over the window
        # that cuts less): short of it, the reply the host just delivered is summarised too.
        self.min_cut = min_cut
        self.continuity_tokens = continuity_tokens  # 0: no continuity section
        self._cont: tuple[continuity.State, dict[int, list[str]]] | None = None
        self.stub_policy = stubs  # tier 0 (stubs.py); None: no stubs
        self.owner = owner  # the engine that will commit the staged pass (owners.py)
        self.fast = fast  # background mode: no model calls on the critical path
        self.outlines = outlines  # (fast) a new leaf is an outline; else the extractive summary
        self.to_upgrade: list[str] = []  # keys of deterministic nodes the worker should upgrade
        self.adopted = 0  # leaves taken from summaries prepared ahead of time
        self.esc = escalator
        self.cancelled = cancelled
        self.clock = clock  # (the engine's pass clock: the budget and the deadline are on it)
        self.deadline = clock() + time_budget
        self.call_timeout = call_timeout  # cap on one model call (the host's silence budget)
        self.new: list[NewSummary] = []
        self.calls = 0
        self.failures = 0
        self.levels: dict[str, int] = {}
        self.spend = Spend()
        self.node_spend: dict[str, Spend] = {}  # new node key → its model calls
        self.budget: Budget | None = None  # the pass's budget (the block is rendered within it)
        # Token estimates of the message objects this pass has measured: the output is measured
        # several times (tier 0, each round, the final list) and is mostly the same objects.
        # (`token_memo`: the caller's estimates of the host's message objects, same form)
        self._tok: dict[int, tuple[Any, int]] = token_memo if token_memo is not None else {}
        self._reply_folded = False  # the pass had to summarise the reply the host just delivered
        self._pinned: Slot | None = None  # that reply, shown right after the head (_reply_mode)
        self._pin_at = -1  # the index the pinned reply had among the slots the pass works on
        self._min_tail = 0  # the tail starts after every summary slot
        self._pending_end = False  # the list ends in a tool call waiting for its results (kept last)

    def _total(self, messages: Sequence[Any]) -> int:
        """total_tokens(messages), each object estimated once per pass."""
        memo, n = self._tok, 0
        for m in messages:
            hit = memo.get(id(m))
            if hit is None or hit[0] is not m:
                hit = memo[id(m)] = (m, estimate_message_tokens(m))  # (the object kept: its id stays its own)
            n += hit[1]
        return n

    # -- planning ------------------------------------------------------------------

    @staticmethod
    def head_end(slots: Sequence[Slot], protect_first_n: int) -> int:
        end = count = 0
        for a, b in groups(slots):
            if count >= protect_first_n or any(s.kind == "s" for s in slots[a:b]):
                break
            end = b
            count += sum(1 for s in slots[a:b] if s.kind == "m")
        return end

    @staticmethod
    def tail_start(slots: Sequence[Slot], head_end: int, budget: int) -> int:
        start = len(slots)
        used = 0
        gs = [g for g in groups(slots) if g[0] >= head_end]
        for a, b in reversed(gs):
            if any(s.kind == "s" for s in slots[a:b]):
                break
            gt = sum(s.tokens for s in slots[a:b])
            if start < len(slots) and used + gt > budget:
                break
            start, used = a, used + gt
        return start

    # -- the pass ------------------------------------------------------------------------

    def run(self, session_id: str, system: dict | None, slots: list[Slot], budget: Budget,
            *, focus: str | None, memory_context: str, force: bool, base_version: int,
            base_len: int, tokens_before: int, host_messages: list[Any] | None = None,
            hold: int | None = None) -> PassResult:
        """One pass over the aligned slots. ``hold``: the first slot the pass must leave as it
        is (a leaf whose span a replaying host's list ends inside: ingest_replay.py); nothing
        from there on is summarised."""
        self.budget = budget
        ids = [s.refs[0] for s in slots if s.kind in ("m", "x")]
        records = self.store.get_messages(ids)
        originals = [s.msg for s in slots]
        h = self.head_end(slots, budget.protect_first_n)  # (stubs change no slot's kind or group)
        stubbed = apply_stubs(self.store, slots, records, self.stub_policy, head_end=h) if self.stub_policy else 0
        if self.continuity_tokens > 0:
            self._cont = continuity.gather(continuity.State.from_json(self.store.get_continuity(session_id)),
                                           slots, records)
        # The reply the host just delivered stays verbatim (a 0.22 host checks it survived):
        # never shown by a representation, and the tail starts at or before it.
        anchor = reply_anchor(slots)
        self._represent_large(slots, records, budget.large_tokens, keep=anchor)
        if stubbed and not force and host_messages is not None:
            done = swap_stubs(host_messages, originals, slots, self.store)
            if done is not None and self._total(done) <= budget.target:
                # Tier 0 alone reached the target: no model call and no new node, but the pass is
                # staged like any other (the same context, its stubs held by the message rows),
                # so the host's commit publishes it — into a rotation child too, which must
                # know the stubbed list it is handed as the messages it already stores.
                pass_id = new_pass_id(self.owner)
                items: list[tuple[str, Any]] = []
                for s in slots:
                    if s.kind == "s":
                        items.extend(("s", r) for r in s.refs)
                    elif s.kind in ("m", "x"):
                        items.append(("m", s.refs[0]))
                self.store.stage_pass(session_id, pass_id, [], items, base_version, base_len)
                return PassResult(done, pass_id, True, tokens_before=tokens_before,
                                  tokens_after=self._total(done), reason="", stubs=stubbed)
        sys_tokens = estimate_message_tokens(system) if system else 0
        head_tokens = sum(s.tokens for s in slots[:h])
        existing = self._existing_nodes(slots)
        tail_budget = max(0, min(budget.fresh_tail,
                                 budget.target - sys_tokens - head_tokens - budget.summary_block))
        nodes: list[_Node] = []
        region_end = h  # everything before this index (after head) is already in `nodes`
        hard_cap = len(slots) if hold is None else max(h, hold)
        wait = pending_start(slots)
        self._pending_end = wait is not None
        if wait is not None:
            # The host appends this call's results right after it: it is the tail's, never folded.
            hard_cap = min(hard_cap, max(h, wait))
        all_slots = slots  # (the pass's input, for the lists returned unchanged)
        t = min(hard_cap, self.tail_start(slots, h, tail_budget))
        self._reply_folded, self._pinned = False, None
        mode = self._reply_mode(slots, h, t, anchor, hard_cap, tail_budget, budget)
        if mode == "pin" and anchor is not None:
            # The reply stands right after the head and the block right after it (it summarises
            # what came before and after the reply): the slots the pass works on skip it.
            self._pinned = slots[anchor]
            self._pin_at = anchor  # (where it stood: no leaf spans it, see _summarize_region)
            slots = slots[:anchor] + slots[anchor + 1:]
            hard_cap, t = hard_cap - 1, max(h, t - 1)
            if self._cont is not None:
                st, edits = self._cont
                self._cont = (st, {i - (i > anchor): v for i, v in edits.items() if i != anchor})
        keep_reply = mode == "keep"
        cap = anchor if keep_reply and anchor is not None else hard_cap
        # The tail never holds a summary slot (its summaries would leave the context with it).
        self._min_tail = next((i + 1 for i in range(len(slots) - 1, -1, -1) if slots[i].kind == "s"), 0)
        cap = max(cap, min(self._min_tail, hard_cap))
        t = min(cap, t)
        output: list[dict[str, Any]] = []
        if self.fast:
            t = min(cap, self._cached_prefix_end(session_id, slots, h, t, records, budget))
        while True:
            for _round in range(4):
                t = max(t, region_end)
                t = self._fix_roles(slots, h, t, cap, region_end)
                if _round and t <= region_end:
                    break  # no later start can take the block: the last round's list stands
                nodes = self._summarize_region(session_id, slots, records, region_end, t, nodes,
                                               existing, budget, focus, memory_context)
                region_end = t
                nodes = self._condense(session_id, nodes, budget, focus, memory_context)
                output, role_ok = self._assemble(system, slots, h, t, nodes, records)
                if self._total(output) <= budget.target or t >= len(slots) - 1 or t >= cap:
                    break
                # Over target: give the tail's oldest groups to the region and go again.
                gs = [g for g in groups(slots) if g[0] >= t]
                if len(gs) <= 1:
                    break
                half = max(1, len(gs) // 2)
                t = min(hard_cap, gs[half][0] if half < len(gs) else gs[-1][0])
            # The tail starts where the last round's list was assembled: messages between the
            # region's end and a start chosen for a round that never ran were in neither.
            t = region_end
            if cap >= hard_cap or (nodes and self._total(output) < tokens_before * (1 - self.min_cut)):
                break
            # Keeping the just-delivered reply verbatim leaves this pass nothing to shrink: it
            # is folded like any older turn (the host lets it go then too), and the block
            # takes no assistant role where the host would look for it.
            log.info("lcm: the just-delivered reply alone keeps the context from shrinking enough; summarised too")
            cap, self._reply_folded = hard_cap, True
            t = max(t, (anchor or 0) + 1)
        if not nodes:
            return PassResult(self._plain(system, all_slots), reason="nothing outside the protected head and tail",
                              tokens_before=tokens_before, tokens_after=tokens_before)
        tokens_after = self._total(output)
        if tokens_after >= tokens_before and not force:
            return PassResult(self._plain(system, all_slots), reason="compaction would not shrink the context",
                              tokens_before=tokens_before, tokens_after=tokens_before, calls=self.calls,
                              failures=self.failures, spend=self.spend)
        if self.cancelled is not None and _safe(self.cancelled):
            return PassResult(self._plain(system, all_slots), reason="cancelled by the host",
                              tokens_before=tokens_before, tokens_after=tokens_before, calls=self.calls,
                              failures=self.failures, spend=self.spend)
        pass_id = new_pass_id(self.owner)
        held = self._cover_unemitted(slots, h, t, output, nodes, records)
        items = []
        for s in slots[:h]:
            if s.refs[0] not in held:
                items.append(("m", s.refs[0]) if s.kind != "s" else ("s", s.refs[0]))
        if self._pinned is not None:
            items.append(("m", self._pinned.refs[0]))
        items.extend(("s", n.key) for n in nodes)
        for s in slots[t:]:
            if s.kind in ("m", "x") and s.refs[0] not in held:
                items.append(("m", s.refs[0]))
        keymap, _ = self.store.stage_pass(session_id, pass_id, self.new, items, base_version, base_len)
        if self.node_spend:
            self.store.put_summary_costs([(keymap[k], sp.model, sp.calls, sp.input_tokens, sp.output_tokens,
                                           round(sp.seconds * 1000, 1)) for k, sp in self.node_spend.items()
                                          if k in keymap])
        if self.new:
            # Real ids are known only now: re-render the block with them.
            for n in nodes:
                if isinstance(n.key, str):
                    n.key = keymap[n.key]
            output, _ = self._assemble(system, slots, h, t, nodes, records)
            tokens_after = self._total(output)
        self._record_aliases(slots, output)
        if self._cont is not None:
            self.store.set_continuity(session_id, continuity.with_files(*self._cont, h, t).to_json())
        reason = ""
        if tokens_after > budget.target and keep_reply and not self._reply_folded and t <= cap:
            # The host's rule, not a failure: the reply the user is reading stays in view.
            reason = (f"target {budget.target} not reached: the reply the host just delivered "
                      f"({slots[cap].tokens} tokens) and what follows it stay verbatim")
            log.info("lcm: %s", reason)
        elif tokens_after > budget.target:
            reason = (f"target {budget.target} unreachable: head {head_tokens} + system {sys_tokens} tokens "
                      "are protected; returned the smallest valid list")
            log.warning("lcm: %s", reason)
        return PassResult(output, pass_id, True, len(self.new), self.calls, self.failures,
                          tokens_before, tokens_after, reason, dict(self.levels),
                          [keymap[k] for k in self.to_upgrade if k in keymap], self.adopted, stubbed, self.spend)

    # -- pieces ------------------------------------------------------------------------

    def _represent_large(self, slots: list[Slot], records: dict[int, MessageRecord], large: int,
                         keep: int | None = None) -> None:
        show_representations(slots, records, keep)

    def _existing_nodes(self, slots: Sequence[Slot]) -> dict[int, SummaryRecord]:
        ids = [r for s in slots if s.kind == "s" for r in s.refs]
        return self.store.get_summaries(ids, include_staged=True) if ids else {}

    def _block_prev(self, slots: Sequence[Slot], h: int) -> str | None:
        """The role just before the summary block: the pinned reply's, else the head's last."""
        if self._pinned is not None:
            return self._pinned.role
        return slots[h - 1].role if h > 0 else None

    def _reply_mode(self, slots: Sequence[Slot], h: int, t: int, anchor: int | None, hard_cap: int,
                    tail_budget: int, budget: Budget) -> str:
        """Where the reply the host just delivered (`anchor`) stays in view: "keep" — the tail
        starts at or before it, when the fresh tail `t` holds it already or what follows it is
        small (a pass at the start of a turn: only the new question follows); "pin" — it stands
        right after the head, before the block, when a long tool loop follows it (a pass in
        the middle of a turn), the block can be a user message between it and the tail (that
        starts with an assistant), and it is small next to the target; "free" otherwise (no
        reply to keep, or it is in the head, the fresh tail or a part the pass must not touch)."""
        if anchor is None or anchor < h or anchor >= hard_cap:
            return "free"
        head_last = slots[h - 1].role if h > 0 else None
        if any(x.kind == "s" for x in slots[anchor + 1:]):
            # An earlier pass pinned it before its block: it stays there (a tail cannot hold the block).
            small = slots[anchor].tokens <= budget.target // 2
            return "pin" if head_last != "assistant" and small else "free"
        if anchor >= t:
            return "keep"  # (in the fresh tail already: a round over the target must not take it)
        after = sum(x.tokens for x in slots[anchor + 1:])
        if after <= tail_budget or head_last == "assistant" or slots[anchor].tokens > budget.target // 2:
            return "keep"
        starts = [a for a, _b in groups(slots) if anchor < a < hard_cap]
        if any(next((x.role for x in slots[a:] if x.kind == "m"), None) == "assistant" for a in starts):
            return "pin"
        return "keep"

    def _fix_roles(self, slots: Sequence[Slot], h: int, t: int, cap: int, floor: int) -> int:
        """Where the tail starts, near `t`, so the block can take a role differing from both
        neighbours: one of the next three group starts up to `cap`, else — when `cap` (the
        reply the pass keeps) cut those short — an earlier one, not before `floor`."""
        prev = self._block_prev(slots, h)
        floor = max(floor, getattr(self, "_min_tail", 0))
        starts = [a for a, _b in groups(slots)] + [len(slots)]
        ahead = [a for a in starts if a >= t]
        fwd = [a for a in ahead if a <= cap][:3]
        back = [a for a in reversed(starts) if floor <= a < t] if len(fwd) < min(3, len(ahead)) else []
        for start in fwd + back:
            nxt = next((x.role for x in slots[start:] if x.kind == "m"), None)
            if choose_summary_role(prev, nxt, assistant_ok=not self._reply_folded) is not None:
                return start
        return min(t, cap)

    def _summarize_region(self, session_id: str, slots: Sequence[Slot], records: dict[int, MessageRecord],
                          a: int, b: int, nodes: list[_Node], existing: dict[int, SummaryRecord],
                          budget: Budget, focus: str | None, memory: str) -> list[_Node]:
        nodes = list(nodes)
        cut = self._pin_at if self._pinned is not None else -1
        # A leaf never spans the pinned reply: its span stays one run of the host's list (where
        # the reply still stands between its neighbours), so a replay of the list folds it back.
        plan = (plan_region(slots, a, cut, records, budget.leaf_chunk) + plan_region(slots, cut, b, records,
                                                                                   budget.leaf_chunk)
                if a < cut < b else plan_region(slots, a, b, records, budget.leaf_chunk))
        for kind, item, _full in plan:
            if kind == "s":
                for ref in item:
                    rec = existing.get(ref)
                    if rec is not None:
                        nodes.append(_Node(ref, rec.depth, rec.tokens, rec.text, rec.t_start, rec.t_end,
                                           rec.n_messages))
            else:
                nodes.append(self._leaf(session_id, item, records, budget, focus, memory))
        return nodes

    def _leaf(self, session_id: str, chunk: Sequence[Slot], records: dict[int, MessageRecord],
              budget: Budget, focus: str | None, memory: str) -> _Node:
        sources = []
        mids = []
        for s in chunk:
            mid = s.refs[0]
            mids.append(mid)
            text = source_text(s, records)
            if text is None:
                log.info("lcm: message m%s left out of its summary (unparseable input; stored verbatim)", mid)
                continue
            rec = records.get(mid)
            sources.append(Source(f"m{mid}", rec.role if rec else s.role, text, None))
        times = [records[m].created_at for m in mids if m in records]
        src_tokens = sum(estimate_text_tokens(x.text) for x in sources)
        target = min(budget.leaf_summary, max(32, src_tokens // 2))
        cached = None if focus else self.store.get_presummary(session_id, span_key(mids))
        key = f"new{len(self.new)}"
        if cached is not None:
            # Summarised ahead of time by the background worker for exactly these messages.
            text, level, summarizer = cached["text"], cached["level"], cached["summarizer"]
            self.adopted += 1
            self.levels[level] = self.levels.get(level, 0) + 1
        elif self.fast and self.esc.model is not None:
            # The worker summarises this leaf with the model right after the pass; the host waits
            # for no model. Below hard_threshold the leaf is an outline (microseconds); above it
            # (one tool batch can take the list from under the threshold past the window, and the
            # agent's next request follows at once, before the worker is done) the extractive
            # summary (milliseconds), which carries the span's content.
            if self.outlines:
                text = outline_summary(SummaryRequest(sources, target, "leaf", focus, memory), self.esc.do_redact)
                level, summarizer = "deterministic", OUTLINE
                self.levels[level] = self.levels.get(level, 0) + 1
            else:
                text, level, summarizer = self._summarize(sources, target, "leaf", focus, memory, deterministic=True)
            self.to_upgrade.append(key)
        else:
            text, level, summarizer = self._summarize(sources, target, "leaf", focus, memory)
        tokens = estimate_text_tokens(text)
        self.new.append(NewSummary(key, "leaf", 0, text, tokens, src_tokens, level, summarizer,
                                   min(times) if times else None, max(times) if times else None,
                                   len(mids), message_ids=mids))
        return _Node(key, 0, tokens, text, min(times) if times else None, max(times) if times else None,
                     len(mids))

    def _summarize(self, sources: list[Source], target: int, kind: str, focus: str | None,
                   memory: str, deterministic: bool = False) -> tuple[str, str, str]:
        if not sources:
            return "(no summarisable content: the covered messages are stored verbatim)", "deterministic", "extractive"
        if not deterministic and sum(estimate_text_tokens(x.text) for x in sources) < MIN_MODEL_TOKENS:
            deterministic = True  # too small to be worth a call (a model could not shorten it)
        if deterministic:
            self.levels["deterministic"] = self.levels.get("deterministic", 0) + 1
            return deterministic_summary(SummaryRequest(sources, target, kind, focus, memory),
                                         self.esc.do_redact), "deterministic", "extractive"
        res = self.esc.summarize(SummaryRequest(sources, target, kind, focus, memory),
                                 cancelled=self.cancelled, deadline=self.deadline, clock=self.clock,
                                 call_timeout=self.call_timeout)
        self.calls += res.calls
        self.failures += res.failures
        self.spend.add(res.spend)
        if res.spend.calls:
            # (_leaf and _condense name their node f"new{len(self.new)}" and append it next)
            self.node_spend[f"new{len(self.new)}"] = res.spend
        self.levels[res.level] = self.levels.get(res.level, 0) + 1
        return res.text, res.level, res.summarizer

    def _condense(self, session_id: str, nodes: list[_Node], budget: Budget, focus: str | None,
                  memory: str) -> list[_Node]:
        nodes = list(nodes)
        while True:
            run = self._condense_run(nodes, budget)
            if run is None:
                return nodes
            a, b = run
            group = nodes[a:b]
            sources = [Source(f"s{n.key}" if isinstance(n.key, int) else n.key, "summary", n.text, None)
                       for n in group]
            src_tokens = sum(n.tokens for n in group)
            target = min(budget.condensed_summary, max(32, src_tokens // 2))
            key = f"new{len(self.new)}"
            fast = self.fast and self.esc.model is not None
            text, level, summarizer = self._summarize(sources, target, "condensed", focus, memory, deterministic=fast)
            if fast:
                self.to_upgrade.append(key)
            tokens = estimate_text_tokens(text)
            starts = [n.t_start for n in group if n.t_start]
            ends = [n.t_end for n in group if n.t_end]
            depth = max(n.depth for n in group) + 1
            total = sum(n.n_messages for n in group)
            self.new.append(NewSummary(key, "condensed", depth, text, tokens, src_tokens, level, summarizer,
                                       min(starts) if starts else None, max(ends) if ends else None, total,
                                       child_keys=[n.key for n in group]))
            nodes[a:b] = [_Node(key, depth, tokens, text, min(starts) if starts else None,
                                max(ends) if ends else None, total)]

    def _condense_run(self, nodes: Sequence[_Node], budget: Budget) -> tuple[int, int] | None:
        """The run to condense next, or None while the summary block fits its budget.

        Condensing costs a model call, so it waits until the block is over budget; then
        `fanin` adjacent nodes of one depth are merged, shallowest first (dag_balance.py:
        a balanced tree, so early facts are not re-summarised once per pass). Without such
        a run the block fits by showing nodes shorter, not by merging across depths."""
        return next_condensation([n.depth for n in nodes], [n.tokens for n in nodes], budget.summary_block,
                                 budget.fanin, lambda: self._block_fits(nodes, budget))

    def _block_fits(self, nodes: Sequence[_Node], budget: Budget) -> bool:
        """Does the shortest rendering of `nodes` fit the block budget?"""
        msg = render_summary(self._records(nodes), sum(n.n_messages for n in nodes), "user",
                             max_tokens=block_limit(budget))
        return estimate_message_tokens(msg) <= budget.summary_block

    @staticmethod
    def _records(nodes: Sequence[_Node]) -> list[SummaryRecord]:
        return [SummaryRecord(n.key if isinstance(n.key, int) else -1, "", "", n.depth, n.text, n.tokens,
                              0, "", "", n.t_start, n.t_end, n.n_messages, "", None, 0.0) for n in nodes]

    def _assemble(self, system: dict | None, slots: Sequence[Slot], h: int, t: int,
                  nodes: Sequence[_Node], records: dict[int, MessageRecord]) -> tuple[list[dict[str, Any]], bool]:
        out: list[dict[str, Any]] = [system] if system else []
        out.extend(s.msg for s in slots[:h] if s.kind == "m" and s.msg is not None)
        if self._pinned is not None and self._pinned.msg is not None:
            out.append(self._pinned.msg)
        if nodes:
            prev = self._block_prev(slots, h)
            nxt = next((s.role for s in slots[t:] if s.kind == "m"), None)
            role = choose_summary_role(prev, nxt, assistant_ok=not getattr(self, "_reply_folded", False))
            role_ok = role is not None
            covered = sum(n.n_messages for n in nodes)
            limit = block_limit(self.budget) if self.budget is not None else None
            out.append(render_summary(self._records(nodes), covered, role or "user", max_tokens=limit, extra=self._continuity_text(slots, h, t)))
        else:
            role_ok = True
        out.extend(s.msg for s in slots[t:] if s.kind == "m" and s.msg is not None)
        self._changes: list[tuple[dict, dict]] = []
        return repair(out, self._changes, pending_end=self._pending_end), role_ok

    def _continuity_text(self, slots: Sequence[Slot], h: int, t: int) -> str:
        if self._cont is None:
            return ""
        visible = {s.refs[0] for s in list(slots[:h]) + list(slots[t:]) if s.kind == "m"}
        if self._pinned is not None:
            visible.add(self._pinned.refs[0])
        return continuity.render(continuity.with_files(*self._cont, h, t), visible, self.continuity_tokens)

    def _cached_prefix_end(self, session_id: str, slots: Sequence[Slot], h: int, t: int,
                           records: dict[int, MessageRecord], budget: Budget) -> int:
        """Background mode: compact only what the worker already summarised, leaving the
        rest verbatim; the over-target loop takes more only when the result would not fit."""
        end = h
        for kind, item, _full in plan_region(slots, h, t, records, budget.leaf_chunk):
            if kind == "chunk":
                if self.store.get_presummary(session_id, span_key([s.refs[0] for s in item])) is None:
                    break
                end = slots.index(item[-1]) + 1
            else:
                end = next(i for i in range(end, len(slots)) if slots[i].kind == "s") + 1
        return end if end > h else t

    def _cover_unemitted(self, slots: Sequence[Slot], h: int, t: int, output: list[dict[str, Any]],
                         nodes: list[_Node], records: dict[int, MessageRecord]) -> set[int]:
        """Head/tail messages that cannot be sent (orphan results, unparseable input) are
        put under a leaf, so every stored message stays reachable from the DAG: one leaf per
        run of adjacent held messages, never a region's leaf (a leaf's span is one run of the
        list, or a replay of the list cannot fold it back: ingest_replay.py)."""
        emitted = {id(m) for m in output}
        repaired = {id(o) for o, _ in getattr(self, "_changes", [])}
        runs: list[list[int]] = []
        last = -2
        for i in [*range(h), *range(t, len(slots))]:
            s = slots[i]
            if s.kind in ("m", "x") and (s.msg is None or (id(s.msg) not in emitted and id(s.msg) not in repaired)):
                if i == last + 1:
                    runs[-1].append(s.refs[0])
                else:
                    runs.append([s.refs[0]])
                last = i
        if not runs:
            return set()
        held = [m for run in runs for m in run]
        log.info("lcm: %d message(s) held back from the context (not valid to send); covered by a leaf", len(held))
        for run in runs:
            text = (f"({len(run)} message(s) held back from the context because they cannot be sent "
                    "as they are (orphan tool results or unparseable input); stored verbatim: "
                    + ", ".join(f"m{m}" for m in run[:20]) + ")")
            times = [records[m].created_at for m in run if m in records]
            key = f"new{len(self.new)}"
            tokens = estimate_text_tokens(text)
            self.new.append(NewSummary(key, "leaf", 0, text, tokens, tokens, "deterministic", "extractive",
                                       min(times) if times else None, max(times) if times else None,
                                       len(run), message_ids=run))
            nodes.append(_Node(key, 0, tokens, text, min(times) if times else None,
                               max(times) if times else None, len(run)))
        return set(held)

    def _record_aliases(self, slots: Sequence[Slot], output: list[dict[str, Any]]) -> None:
        """Messages we had to repair come back from the host in that form: remember them."""
        changes = getattr(self, "_changes", [])
        if not changes:
            return
        by_obj = {id(s.msg): s.refs[0] for s in slots if s.kind == "m" and s.msg is not None}
        pairs = [(content_ident(new), by_obj[id(orig)]) for orig, new in changes if id(orig) in by_obj]
        self.store.add_aliases(pairs)

    @staticmethod
    def _plain(system: dict | None, slots: Sequence[Slot]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = [system] if system else []
        out.extend(s.msg for s in slots if s.kind == "m" and s.msg is not None)
        return out


def block_limit(budget: Budget) -> int:
    """Tokens the summary block's message may take."""
    return budget.summary_block


def shown_text(s: Slot, records: dict[int, MessageRecord]) -> str | None:
    """The text of one message as the model is shown it (a stub or an exploration summary for
    a represented message), the size leaf chunks are planned by; None: not summarisable."""
    rec = records.get(s.refs[0])
    if s.kind == "x" or rec is None or rec.role in ("invalid", "unknown"):
        return None
    if rec.large and rec.exploration:
        return rec.exploration
    return _limited(rec.text)


def source_text(s: Slot, records: dict[int, MessageRecord]) -> str | None:
    """What a summariser is sent of one message: the digest of what the model is shown
    (None: not summarisable, stored verbatim only)."""
    rec = records.get(s.refs[0])
    if s.kind == "x" or rec is None or rec.role in ("invalid", "unknown"):
        return None
    if rec.large and rec.exploration:
        # A stub is cut further (its head/tail lines); an exploration summary goes in whole.
        return digest(rec.role, rec.raw, rec.text, f"m{rec.id}", rec.exploration) if is_stub(rec.exploration) \
            else rec.exploration
    return _limited(digest(rec.role, rec.raw, rec.text, f"m{rec.id}"))


def _limited(text: str) -> str:
    if len(text) > SOURCE_TEXT_LIMIT:
        half = SOURCE_TEXT_LIMIT // 2
        text = text[:half] + f"\n…[{len(text) - SOURCE_TEXT_LIMIT} chars omitted]…\n" + text[-half:]
    return text


def plan_region(slots: Sequence[Slot], a: int, b: int, records: dict[int, MessageRecord],
                leaf_chunk: int) -> list[tuple[str, Any, bool]]:
    """The region's items in order: ("s", node ids, _) for existing summaries and
    ("chunk", slots, full) for leaf chunks bounded in source tokens. Deterministic, so the
    background worker and compress() cut the same chunks; `full` chunks are stable."""
    out: list[tuple[str, Any, bool]] = []
    chunk: list[Slot] = []
    used = 0
    for ga, gb in groups(list(slots[a:b])):
        grp = list(slots[a + ga: a + gb])
        if grp[0].kind == "s":
            if chunk:
                out.append(("chunk", chunk, False))
            chunk, used = [], 0
            out.append(("s", list(grp[0].refs), True))
            continue
        for s in grp:
            # Chunks are cut by what the model is shown, not by the (smaller) digest a
            # summariser is sent: a leaf stands for as much of the context as before.
            text = shown_text(s, records)
            st = estimate_text_tokens(text) if text else 1
            if chunk and used + st > leaf_chunk:
                out.append(("chunk", chunk, True))
                chunk, used = [], 0
            chunk.append(s)
            used += st
    if chunk:
        out.append(("chunk", chunk, False))
    return out


def show_representations(slots: list[Slot], records: dict[int, MessageRecord], keep: int | None = None) -> None:
    """Slots of huge messages and tier-0 stubs show their representation (and its size):
    what the model is shown, and what a pass plans its chunks by. The slot at `keep` (the
    reply the host just delivered: assemble.reply_anchor) stays as the host holds it."""
    for i, s in enumerate(slots):
        if s.kind != "m" or i == keep:
            continue
        rec = records.get(s.refs[0])
        if rec is not None and rec.large and rec.exploration and s.msg is not None:
            rep = large_representation(s.msg, rec.id, rec.tokens, rec.exploration)
            s.msg = rep
            s.tokens = estimate_message_tokens(rep)


def span_key(message_ids: Sequence[int]) -> str:
    """Identity of a leaf's span: the exact stored messages it covers, in order."""
    data = ",".join(str(m) for m in message_ids).encode()
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def _safe(fn: Callable[[], bool]) -> bool:
    try:
        return bool(fn())
    except Exception:
        return False
