"""The 0.22 host's rules for an engine's pass (issue #38 item 3): the reply it just delivered.

After every committed pass a 0.22 host looks for the assistant reply it had just delivered in
the list the engine returned (word for word); when the engine folded it away and left another
assistant row where it stood, the host logs `conversation_compression_reply_anchor` and the
reply drops out of what the user sees. A pass keeps that reply verbatim — before the block
(mid-turn, a long tool loop after it) or in the tail (at a turn's start) — and summarises it
only when keeping it would leave nothing to shrink; then the block takes no assistant role.

Checked with the host's own check when it is installed (0.22), else with the same rule
written out here, and through the real agent loop of the installed host.
"""

from __future__ import annotations

import hashlib
import json
import logging

import pytest

from lossless_context import LCMEngine
from lossless_context.config import LCMConfig
from lossless_context.messages import flatten_content, is_summary_message
from lossless_context.pipeline.validate import pairing_problems
from lossless_context.tokens import estimate_messages_tokens
from tests.support.fake_openai import (FakeOpenAI, Reply, Router, SummariserResponder, _usage, estimate_tokens,
                                       last_message, message_text, prompt_tokens_for)
from tests.support.dagcheck import assert_connected
from tests.support.hermes_host import hermes_available, run_hermes

try:  # the 0.22 host's own check (agent/conversation_compression_reply_anchor.py)
    from agent.conversation_compression_reply_anchor import (  # type: ignore[import-not-found]
        _ensure_compressed_keeps_last_assistant_reply as host_reply_check)
except Exception:  # 0.19.0 / 0.20.0: no such check
    host_reply_check = None

ANCHOR_LOGGER = "agent.conversation_compression_reply_anchor"


def long_text(n: int, chars: int) -> str:
    """A reply of about `chars` characters whose lines never repeat (the 0.22 host cuts a
    stream that repeats one line as a runaway)."""
    lines = [f"Answer #{n}."]
    i = 0
    while sum(len(x) + 1 for x in lines) < chars:
        h = hashlib.sha1(f"{n}-{i}".encode()).hexdigest()
        lines.append(f"Point {n}.{i}: item {h[:12]} in src/m{h[12:16]}.py line {i * 7 % 997} uses {h[16:24]}.")
        i += 1
    return "\n".join(lines)


class VariedReplies:
    """Chat replies of about `chars` characters, each different, with usage from the request."""

    def __init__(self, chars: int) -> None:
        self.chars, self.calls = chars, 0
        self.texts: list[str] = []  # every reply to the agent loop (a request with tools), in order

    def __call__(self, req):
        self.calls += 1
        user = last_message(req, "user")
        text = f"[re: {message_text(user)[:40]}]\n" + long_text(self.calls, self.chars)
        if req.get("tools"):  # (not the host's side calls, e.g. a title)
            self.texts.append(text)
        return Reply(content=text, usage=_usage(prompt_tokens_for(req), estimate_tokens(text)))


def _engine(tmp_path, **kw) -> LCMEngine:
    e = LCMEngine(config=LCMConfig.load({"store": str(tmp_path / "r.db"), "summarizer": "extractive", **kw},
                                        read_file=False))
    e.update_model(model="m", context_length=64_000)
    e.bind_session_state(None, "rules")
    return e


def last_reply(messages):
    """The reply the host anchors on: the last assistant message with text and no tool calls."""
    for m in reversed(messages):
        if m.get("role") == "assistant" and not m.get("tool_calls") and flatten_content(m.get("content")).strip() \
                and not is_summary_message(m):
            return m
    return None


def host_check(original, compressed, caplog) -> list[str]:
    """What the host says about `compressed`: its warnings, and "reinserted"/"folded" when it
    had to put the reply back itself or could not find it."""
    out = list(compressed)
    if host_reply_check is not None:
        caplog.clear()
        with caplog.at_level(logging.INFO, logger=ANCHOR_LOGGER):
            again = host_reply_check(original, out, session_id="rules")
        said = [r.getMessage() for r in caplog.records if r.name == ANCHOR_LOGGER and r.levelno >= logging.WARNING]
        return said + (["reinserted"] if again is not None else [])
    # The same rule, written out (hosts before 0.22 do not check): the reply is there word for
    # word; or it was folded with no assistant beside the place it would go back to, and putting
    # it back would stop the list from shrinking (then the host lets it go too).
    reply = last_reply(original)
    text = message_text(reply).strip() if reply is not None else ""
    if reply is None or any(m.get("role") == "assistant" and not m.get("tool_calls")
                            and message_text(m).strip() == text for m in out):
        return []
    followers = [message_text(f) for f in original[original.index(reply) + 1:]]
    slot = next((i for f in followers for i in range(len(out) - 1, -1, -1) if message_text(out[i]) == f), len(out))
    if any(out[i].get("role") == "assistant" for i in (slot - 1, slot) if 0 <= i < len(out)):
        return ["a different assistant row in its slot"]
    if estimate_messages_tokens(original) >= estimate_messages_tokens(out) + estimate_messages_tokens([reply]):
        return ["reinserted"]
    return []


def _turn_start(n_turns: int, chars: int) -> list[dict]:
    msgs = []
    for i in range(1, n_turns + 1):
        msgs += [{"role": "user", "content": f"Turn {i}: fact KILO-{i}, go on."},
                 {"role": "assistant", "content": long_text(i, chars)}]
    return msgs + [{"role": "user", "content": f"Turn {n_turns + 1}: and now?"}]


def _mid_turn(n_rounds: int) -> list[dict]:
    """Two finished turns, then a turn whose tool loop is long: the reply to keep is the
    second turn's, far behind the end of the list."""
    msgs = [{"role": "user", "content": "Objective: get the billing service green."},
            {"role": "assistant", "content": "I will start with the failing tests."},
            {"role": "user", "content": "Turn 2: what did the logs say?"},
            {"role": "assistant", "content": "The logs show a timeout in the invoice exporter; REPLY-ANCHOR-7."},
            {"role": "user", "content": "Turn 3: fix it and run everything."}]
    for r in range(n_rounds):
        cid = f"call_{r}"
        msgs += [{"role": "assistant", "content": "", "tool_calls": [
                     {"id": cid, "type": "function", "function": {"name": "terminal",
                                                                  "arguments": json.dumps({"command": f"make t{r}"})}}]},
                 {"role": "tool", "tool_call_id": cid, "content": long_text(100 + r, 6_000)}]
    return msgs


@pytest.mark.parametrize("case", ["turn_start", "mid_turn", "reply_too_large"])
def test_the_reply_the_host_just_delivered_stays_in_view(tmp_path, caplog, case):
    e = _engine(tmp_path, tool_stubs=False)
    if case == "turn_start":  # the session: ~15K-token replies on a 64K window
        msgs = _turn_start(4, 60_000)
    elif case == "mid_turn":
        msgs = _mid_turn(40)
    else:  # one reply larger than the rest of the list together: keeping it would shrink nothing
        msgs = [{"role": "user", "content": "Turn 1: hi"}, {"role": "assistant", "content": "hello"},
                {"role": "user", "content": "Turn 2: write the whole report"},
                {"role": "assistant", "content": long_text(9, 240_000)},
                {"role": "user", "content": "Turn 3: thanks; shorter next time"}]
        e.update_model(model="m", context_length=128_000)
    reply = last_reply(msgs)
    out = e.compress([dict(m) for m in msgs], current_tokens=estimate_messages_tokens(msgs) + 1_500)
    assert pairing_problems(out) == []
    assert estimate_messages_tokens(out) < estimate_messages_tokens(msgs), "the pass shrank nothing"
    assert host_check(msgs, out, caplog) == []
    kept = [m for m in out if m.get("role") == "assistant" and m.get("content") == reply["content"]]
    if case == "reply_too_large":
        assert not kept  # folded, as the host allows; and the block is no assistant in its place
        block = next(m for m in out if is_summary_message(m))
        assert block["role"] == "user"
    else:
        assert len(kept) == 1
        roles = [m["role"] for m in out]
        assert all(a != b for a, b in zip(roles, roles[1:]) if "tool" not in (a, b)), roles
    # committed: every message is in view or under a summary (once)
    e.on_session_start("rules", boundary_reason="compression", old_session_id="rules")
    assert_connected(e.store, "rules")
    if case == "mid_turn":  # the long tool loop was summarised, the reply stands before the block
        i = out.index(kept[0])
        assert is_summary_message(out[i + 1]) and out[i + 1]["role"] == "user"
        assert estimate_messages_tokens(out) < estimate_messages_tokens(msgs) / 2


@pytest.mark.e2e
def test_the_agent_loop_with_large_replies_keeps_every_delivered_reply(tmp_path, hermes_host):
    """The issue's run, through each host's real agent loop: ~15K-token replies on a 64K window. Every request still carries the reply delivered just before it, verbatim
    (the host's check is silent on 0.22: no `conversation_compression_reply_anchor` warning),
    and the engine compacted."""
    chat = VariedReplies(60_000)
    with FakeOpenAI(responder=Router(chat=chat, summariser=SummariserResponder(max_chars=2000))) as srv:
        run = run_hermes(srv, [f"Turn {i}: fact KILO-{i}, please continue the analysis" for i in range(1, 9)],
                         workdir=tmp_path, timeout=600, env={"LCM_SUMMARIZER": "extractive"})
        assert run.ok, run.describe()
        assert run.engine_name == "lcm"
        warnings = [ln for ln in run.stderr.splitlines() if ANCHOR_LOGGER in ln and ln.startswith("WARNING")]
        assert warnings == []
        assert "reinserted it into the active set" not in run.stderr
        assert len(run.calls_named("compress")) >= 2
        agent_requests = [r for r in srv.chat_requests if r.body.get("tools")]
        assert len(agent_requests) == 8
        assert len(chat.texts) == 8
        for delivered, req in zip(chat.texts, agent_requests[1:]):
            assert any(m.get("role") == "assistant" and message_text(m) == delivered for m in req.messages), \
                "a request lost the reply delivered just before it"
        assert any(is_summary_message(m) for m in agent_requests[-1].messages)



# -- B. our block on either side of a host merge (issue #39 item 3) ---------------------------------


class SizedReplies(VariedReplies):
    """VariedReplies whose size the user message picks: "[long]" asks for `long` characters."""

    def __init__(self, chars: int, long: int) -> None:
        super().__init__(chars)
        self.long = long

    def __call__(self, req):
        user = message_text(last_message(req, "user"))
        self.chars, chars = (self.long if "[long]" in user.rsplit("</lcm-summary>", 1)[-1] else self.chars), self.chars
        try:
            return super().__call__(req)
        finally:
            self.chars = chars


def _stored_block_copies(store) -> list[int]:
    return [m.id for m in store.iter_all_messages() if '<lcm-summary nodes="' in m.text]


MERGE_TURNS = [
    "Turn 1: fact KILO-1, keep it in mind.",
    "Turn 2: fact KILO-2; now write the complete report [long]",
    {"command": "/compress"},
    "Turn 3: fact KILO-3, go on.",
    "Turn 4: fact KILO-4, go on.",
    "Turn 5: fact KILO-5, go on.",
    "Turn 6: fact KILO-6, go on.",
    "Turn 7: fact KILO-7, go on.",
    {"command": "/lcm doctor"},
]


@pytest.mark.e2e
def test_compress_and_the_hosts_merge_keep_every_head_message(tmp_path, hermes_host):
    """The /compress scenario through the real host's /compress command: right after a reply
    too large to keep, the pass leaves a user-role block after the head's last user message;
    the host merges it with that message and the next question. Later passes still see the
    head message (its row stays in the context), nothing of the block is stored as a message,
    and `lcm doctor` is healthy with nothing "left out"."""
    chat = SizedReplies(40_000, 150_000)
    with FakeOpenAI(responder=Router(chat=chat, summariser=SummariserResponder(max_chars=1500))) as srv:
        run = run_hermes(srv, MERGE_TURNS, workdir=tmp_path, timeout=600, env={"LCM_SUMMARIZER": "extractive"})
        assert run.ok, run.describe()
        assert run.engine_name == "lcm"
        sent = [r for r in srv.chat_requests if r.body.get("tools")]
    # the host did merge our block into the head's last user message (what this test is about)
    merged = [m for r in sent for m in r.messages
              if m.get("role") == "user" and "KILO-2" in message_text(m) and is_summary_message(m)]
    assert merged, "the scenario did not produce the host's merge"
    assert len(run.calls_named("compress")) >= 2  # /compress, then automatic passes over the merge
    from lossless_context.store import open_store

    store = open_store(str(run.hermes_home / "lcm" / "lcm.db"))
    try:
        sid = run.result["session_id"]
        assert _stored_block_copies(store) == []
        assert_connected(store, sid)
        _, ctx = store.get_context(sid)
        texts = {m.id: m.text for m in store.get_messages([e.ref for e in ctx if e.kind == "m"]).values()}
        assert any("KILO-2" in t for t in texts.values()), "the head message left the model's view"
    finally:
        store.close()
    doctor = run.turns[-1]["command_output"]
    assert "healthy" in doctor and "left out" not in doctor, doctor


def _host_merge(messages: list[dict]) -> list[dict]:
    """The installed host's own repair before a request (it merges same-role neighbours)."""
    from agent.agent_runtime_helpers import repair_message_sequence  # type: ignore[import-not-found]

    out = [dict(m) for m in messages]
    repair_message_sequence(None, out)
    return out


def _committed(e: LCMEngine, sid: str, msgs: list[dict]) -> list[dict]:
    out = e.compress([dict(m) for m in msgs], current_tokens=estimate_messages_tokens(msgs) + 1_000)
    assert any(is_summary_message(m) for m in out)
    e.on_session_start(sid, boundary_reason="compression", old_session_id=sid)
    return out


@pytest.mark.skipif(not hermes_available(), reason="hermes-agent not importable")
@pytest.mark.parametrize("case", ["user_both_sides", "assistant_both_sides_with_calls"])
def test_a_block_the_host_merged_is_recognised_and_never_stored(tmp_path, case):
    """The host's own merge (its repair before every request) puts our block into a neighbour:
    a user-role block between the head's last question and the next one becomes one user
    message; an assistant-role block between a reply and a tool call becomes one assistant
    message carrying the call. The engine splits it back: nothing of the block is stored as a
    message, the neighbours keep their rows (in view), and the next pass is valid."""
    e = _engine(tmp_path, tool_stubs=False)
    sid = "rules"
    if case == "user_both_sides":
        msgs = _turn_start(4, 30_000)
        out = _committed(e, sid, msgs)
        i = next(k for k, m in enumerate(out) if is_summary_message(m))
        assert out[i - 1]["role"] == out[i + 1]["role"] == "user"
        host = out[:i] + [{**out[i], "role": "user"}] + out[i + 1:]
    else:
        e.protect_first_n = 2  # the head: the question and its plain reply
        msgs = _mid_turn(40)[2:]  # (the session starts at turn 2: no reply after the head)
        out = _committed(e, sid, msgs)
        i = next(k for k, m in enumerate(out) if is_summary_message(m))
        assert out[i - 1]["role"] == "assistant" and out[i + 1].get("tool_calls")
        host = out[:i] + [{**out[i], "role": "assistant"}] + out[i + 1:]
    merged = _host_merge(host)
    assert len(merged) == len(host) - 2 and sum(is_summary_message(m) for m in merged) == 1
    assert not any(m.get("content", "").lstrip().startswith("<lcm-summary") for m in merged)  # truly merged
    merged.append({"role": "user", "content": "Next question after the merge."})
    e.ingest(merged, session_id=sid)  # (what on_session_end / a tool call / the next pass stores)
    again = e.compress([dict(m) for m in merged], current_tokens=estimate_messages_tokens(merged) + 1_000, force=True)
    assert pairing_problems(again) == []
    assert [m.id for m in e.store.iter_all_messages() if '<lcm-summary nodes="' in m.text] == []
    e.on_session_start(sid, boundary_reason="compression", old_session_id=sid)
    assert_connected(e.store, sid)
    _v, ctx = e.store.get_context(sid)
    head = {m.text for m in e.store.get_messages([x.ref for x in ctx if x.kind == "m"]).values()}
    assert message_text(out[i - 1]) in head  # the message the block was merged into: still in view


# -- C. review forks (issues #38 item 3, #40 item 5) -----------------------------------------------

REVIEW = "Review the conversation above and consider saving to memory if appropriate."


class _SessionDB:
    """Stands for the host's session database the user's agent is bound with (the fork gets none)."""

    def get_session(self, sid):
        return None

    def get_messages_as_conversation(self, sid):
        return []


@pytest.mark.parametrize("host", ["0.20", "0.22"])
def test_a_review_fork_stores_only_what_is_new_and_never_publishes_into_the_parent(tmp_path, host):
    """The background memory review: a copy of the engine for a fork that gets the user's whole
    conversation (our block included) plus the host's review prompt. 0.20 hands it over through
    on_turn_complete; 0.22 also detaches the fork (`bind_session_state(session_db=None,
    session_id="")`), compresses its list (the agent shares the parent's session id) and never
    sends a commit signal. The fork stores only its own messages — the prompt as the host's
    instruction, not user speech — and the parent's context, rows and summaries stay as they were."""
    registered = LCMEngine(config=LCMConfig.load({"store": str(tmp_path / "f.db"), "summarizer": "extractive",
                                                  "tool_stubs": False}, read_file=False))
    live = registered.clone_for_agent()
    live.update_model("m", 64_000)
    live.bind_session_state(_SessionDB(), "parent")
    live.on_session_start("parent", platform="cli")
    conv = _turn_start(4, 30_000)
    out = _committed(live, "parent", conv)
    conv = out + [{"role": "assistant", "content": "Done with turn five."}]
    live.on_turn_complete([dict(m) for m in conv])
    store = live.store
    before = (store.get_context("parent"), sorted(store.session_message_ids("parent")),
              sorted(store.session_summary_ids("parent")))

    fork = registered.clone_for_agent()
    fork.update_model("m", 64_000)
    fork.bind_session_state(None, "review-1")
    fork.on_session_start("review-1", platform="cli")
    if host == "0.22":
        fork.bind_session_state(session_db=None, session_id="")
    review = [dict(m) for m in conv] + [{"role": "user", "content": REVIEW}]
    fork.on_turn_complete([dict(m) for m in review])
    reply = {"role": "assistant", "content": "Saved two facts (KILO-1, KILO-4) to memory."}
    if host == "0.22":  # the fork compacts its own list, under the parent's session id
        big = review + [reply, {"role": "user", "content": "One more review step " + long_text(7, 90_000)}]
        squeezed = fork.compress([dict(m) for m in big], current_tokens=estimate_messages_tokens(big) + 1_000,
                                 session_id="parent")
        assert pairing_problems(squeezed) == [] and estimate_messages_tokens(squeezed) < estimate_messages_tokens(big)
        assert any(m.get("content") == REVIEW for m in squeezed)  # the fork's instruction stays in its view
        fork.on_turn_complete([dict(m) for m in squeezed])
    else:
        fork.on_turn_complete([dict(m) for m in review] + [reply])

    rows = {s["id"]: s for s in store.list_sessions()}
    assert rows["review-1"]["boundary_reason"] == "background" and rows["review-1"]["parent_id"] == "parent"
    after = (store.get_context("parent"), sorted(store.session_message_ids("parent")),
             sorted(store.session_summary_ids("parent")))
    assert after == before, "the fork wrote into the parent's session"
    parent_idents = {r.ident for r in store.get_messages(before[1]).values()}
    own = list(store.get_messages(store.session_message_ids("review-1")).values())
    assert [r for r in own if r.ident in parent_idents] == []  # no copy of the parent's messages
    assert [r for r in own if '<lcm-summary nodes="' in r.text] == []  # our block was recognised
    prompts = [r for r in own if r.text.startswith("Review the conversation above")]
    assert len(prompts) == 1 and prompts[0].role == "system"  # the host's, never the user's
    assert not [r for r in own if r.role == "user" and "Review the conversation" in r.text]
    assert any(r.text == reply["content"] for r in own)
    assert fork.current_session() == "review-1" and live.current_session() == "parent"
    from lossless_context.ops.doctor import run_doctor

    assert run_doctor(store).ok, run_doctor(store).render_text()
    # the user goes on; the parent's next pass summarises what the fork's pass may have summarised too
    more = conv + [m for i in (6, 7, 8) for m in ({"role": "user", "content": f"Turn {i}: go on."},
                                                   {"role": "assistant", "content": long_text(i, 40_000)})]
    live.on_turn_complete([dict(m) for m in more])
    _committed(live, "parent", more)
    assert run_doctor(store).ok, run_doctor(store).render_text()
    assert_connected(store, "parent")


def _staged_rows(path) -> list[tuple]:
    import sqlite3

    with sqlite3.connect(path) as c:
        return c.execute("SELECT pass_id, session_id FROM staged_passes").fetchall()


def _an_hour_later(path) -> None:
    """`lcm doctor` calls a stage older than an hour stale work: age every row by two hours."""
    import sqlite3

    with sqlite3.connect(path) as c:
        c.execute("UPDATE staged_passes SET created_at = created_at - 7200")
        c.execute("UPDATE summaries SET created_at = created_at - 7200")


@pytest.mark.parametrize("ending", ["pass_last", "list_after_the_pass", "two_passes"])
def test_a_review_forks_passes_leave_no_staged_work(tmp_path, ending):
    """0.22 compacts a review fork's transcript in memory and never sends a commit signal, and
    the fork may end right after a pass (its last call, or cancelled by the user's next turn):
    the host calls nothing when it does. A fork's pass has nothing to wait for: it is published
    into the fork's own session when it is made (never into the parent), so no stage is left
    for `lcm doctor` to find an hour later, and the parent's own passes go on as before."""
    from lossless_context.ops.doctor import run_doctor

    path = tmp_path / "f.db"
    registered = LCMEngine(config=LCMConfig.load({"store": str(path), "summarizer": "extractive",
                                                  "tool_stubs": False}, read_file=False))
    live = registered.clone_for_agent()
    live.update_model("m", 64_000)
    live.bind_session_state(_SessionDB(), "parent")
    live.on_session_start("parent", platform="cli")
    conv = _committed(live, "parent", _turn_start(4, 30_000)) + [{"role": "assistant", "content": "Done."}]
    live.on_turn_complete([dict(m) for m in conv])
    store = live.store
    parent_before = (store.get_context("parent"), sorted(store.session_summary_ids("parent")))

    fork = registered.clone_for_agent()
    fork.update_model("m", 64_000)
    fork.bind_session_state(None, "review-2")
    fork.on_session_start("review-2", platform="cli")
    fork.bind_session_state(session_db=None, session_id="")  # 0.22 detaches the fork
    review = [dict(m) for m in conv] + [{"role": "user", "content": REVIEW}]
    fork.on_turn_complete([dict(m) for m in review])
    big = review + [{"role": "assistant", "content": "Saving."},
                    {"role": "user", "content": "One more review step " + long_text(7, 90_000)}]
    squeezed = fork.compress([dict(m) for m in big], current_tokens=estimate_messages_tokens(big) + 1_000,
                             session_id="parent")
    assert estimate_messages_tokens(squeezed) < estimate_messages_tokens(big)
    if ending in ("list_after_the_pass", "two_passes"):
        more = squeezed + [{"role": "assistant", "content": "Step " + long_text(8, 90_000)},
                           {"role": "user", "content": "And the last step."}]
        if ending == "two_passes":
            again = fork.compress([dict(m) for m in more], current_tokens=estimate_messages_tokens(more) + 1_000,
                                  session_id="parent")
            assert estimate_messages_tokens(again) < estimate_messages_tokens(more)
            assert pairing_problems(again) == []
        else:
            fork.on_turn_complete([dict(m) for m in more])
    assert _staged_rows(path) == [], "a fork's pass waits for a commit that never comes"
    assert fork.store.session_summary_ids("review-2"), "the fork's pass was not kept in its own session"
    assert (store.get_context("parent"), sorted(store.session_summary_ids("parent"))) == parent_before
    _an_hour_later(path)
    report = run_doctor(store)
    assert report.ok, report.render_text()
    # the user goes on in the parent: its passes still wait for the host's commit
    more = conv + [m for i in (6, 7, 8) for m in ({"role": "user", "content": f"Turn {i}: go on."},
                                                   {"role": "assistant", "content": long_text(i, 40_000)})]
    live.on_turn_complete([dict(m) for m in more])
    live.compress([dict(m) for m in more], current_tokens=estimate_messages_tokens(more) + 1_000)
    assert [sid for _p, sid in _staged_rows(path)] == ["parent"], "the parent's pass must wait for its commit"
    live.on_session_start("parent", boundary_reason="compression", old_session_id="parent")
    assert _staged_rows(path) == []
    assert run_doctor(store).ok, run_doctor(store).render_text()
    assert_connected(store, "parent")


# -- a pass over the window cuts at least 5 % --------------------------------------------------------


def _rough(messages) -> int:
    """The host's own rough estimate when it is installed (it measures a pass's cut with it)."""
    from lossless_context.hostapi import rough_estimator

    est = rough_estimator()
    return est[0](messages) if est is not None else estimate_messages_tokens(messages)


@pytest.mark.parametrize("case", ["host_counts_more", "huge_reply_just_delivered", "summariser_fails"])
def test_a_pass_over_the_window_cuts_at_least_five_percent(tmp_path, case):
    """A newer host runs the turn-start pass on a request over the model's window and, when the
    pass cuts less than 5 % (or times out), does not send the turn at all. Over the window a pass
    always cuts at least that much: when our own estimate finds the list within target (the
    provider counts more than chars/4), when keeping the reply just delivered would leave too
    little to cut, and when the model path fails (the deterministic level then)."""
    kw = {}
    srv = None
    if case == "summariser_fails":
        from tests.support.fake_openai import Fail, FailureSequence

        srv = FakeOpenAI(responder=FailureSequence([Fail.server_error()], cycle=True)).start()
        kw = {"summarizer": "openai", "summary_base_url": srv.base_url, "summary_timeout": 5}
    try:
        e = _engine(tmp_path, tool_stubs=False, **kw)
        if case == "host_counts_more":  # ~12K tokens by chars/4 (within our target); the provider: 70K
            msgs = _turn_start(3, 16_000)
            current = 70_000
        elif case == "huge_reply_just_delivered":
            msgs = [{"role": "user", "content": "Turn 1: hi"}, {"role": "assistant", "content": "hello"},
                    {"role": "user", "content": "Turn 2: the plan?"}, {"role": "assistant", "content": long_text(2, 4_000)},
                    {"role": "user", "content": "Turn 3: the whole log, please"},
                    {"role": "assistant", "content": long_text(3, 250_000)},
                    {"role": "user", "content": "Turn 4: thanks."}]
            current = estimate_messages_tokens(msgs) + 1_500
        else:
            msgs = _turn_start(18, 16_000)  # ~72K tokens
            current = estimate_messages_tokens(msgs) + 1_500
        assert current > 64_000
        out = e.compress([dict(m) for m in msgs], current_tokens=current)
        assert pairing_problems(out) == []
        assert _rough(out) <= 0.95 * _rough(msgs), (_rough(out), _rough(msgs), e.get_status()["lcm_last_reason"])
        e.on_session_start("rules", boundary_reason="compression", old_session_id="rules")
        assert_connected(e.store, "rules")
    finally:
        if srv is not None:
            srv.stop()
