"""Property-based and long-session tests: valid output, budget, byte-for-byte recovery, a connected DAG."""

from __future__ import annotations

import base64
import json
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from lossless_context import LCMEngine
from lossless_context.pipeline.validate import pairing_problems, pending_calls
from lossless_context.config import LCMConfig
from lossless_context.demo.sessions import coding_session, turn_ranges
from lossless_context.tokens import estimate_messages_tokens
from tests.support.dagcheck import assert_connected
from tests.support.recall import message_hits, recovered
from lossless_context.demo.host_driver import R19Host

# The reasons a pass over the threshold may leave the list as it is (not failures).
NOTHING_TO_COMPACT = ("nothing outside the protected head and tail", "compaction would not shrink the context")
IMG = "data:image/png;base64," + base64.b64encode(bytes(range(256)) * 40).decode()


def _engine(path, **kw) -> LCMEngine:
    return LCMEngine(config=LCMConfig.load({"store": str(path), "summarizer": "extractive", **kw}, read_file=False))


@st.composite
def conversations(draw):
    n_turns = draw(st.integers(3, 40))
    msgs = []
    call = 0
    words = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=0, max_size=300)
    for t in range(n_turns):
        kind = draw(st.sampled_from(["text", "text", "multimodal", "tools", "huge", "tools"]))
        if kind == "multimodal":
            msgs.append({"role": "user", "content": [{"type": "text", "text": draw(words)},
                                                     {"type": "image_url", "image_url": {"url": IMG}}]})
        else:
            msgs.append({"role": "user", "content": f"turn {t}: " + draw(words)})
        steps = draw(st.integers(0, 3)) if kind in ("tools", "huge") else 0
        for _ in range(steps):
            k = draw(st.integers(1, 3))
            ids = [f"call_{call + i}" for i in range(k)]
            call += k
            msgs.append({"role": "assistant", "content": draw(st.one_of(st.none(), words)),
                         "tool_calls": [{"id": i, "type": "function",
                                         "function": {"name": "terminal", "arguments": json.dumps({"cmd": f"ls {i}"})}}
                                        for i in ids]})
            for i in ids:
                size = draw(st.sampled_from([50, 2000, 20_000])) if kind == "huge" else 200
                msgs.append({"role": "tool", "tool_call_id": i, "content": (f"output of {i} " * size)[: size * 8]})
        msgs.append({"role": "assistant", "content": f"done with turn {t}. " + draw(words) * draw(st.integers(1, 20))})
    return msgs


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(conv=conversations(), ctx_len=st.sampled_from([64_000, 100_000, 200_000]),
       chunk=st.sampled_from([1, 3, 7]), force_every=st.sampled_from([0, 4]))
def test_random_conversations(tmp_path_factory, conv, ctx_len, chunk, force_every):
    path = tmp_path_factory.mktemp("p") / "lcm.db"
    e = _engine(path, leaf_chunk_tokens=3000, fresh_tail_tokens=6000)
    host = R19Host(e)
    host.start(context_length=ctx_len)
    outputs = []
    # (with the calls its input ended waiting for: the host appends their results right after it)
    host.on_output = lambda out: outputs.append((out, pending_calls(host.messages)))
    reasons: list[str] = []  # the engine's reason after each pass
    host.on_pass = lambda h, rec: reasons.append(e.get_status()["lcm_last_reason"] or "")
    for i in range(0, len(conv), chunk):
        host.add(*conv[i:i + chunk])
        force = bool(force_every) and (i // chunk) % force_every == force_every - 1
        host.maybe_compress(force=force)
    host.end()
    assert host.invalid == []
    # A pass over the threshold compacts — a pass that failed returns its input, not adopted — unless
    # the engine says why it could not (all of it protected: the head and the newest turns).
    assert len(reasons) == len(host.passes)
    for p, reason in zip(host.passes, reasons):
        assert not reason.startswith("error"), reason
        if p.tokens_before > e.threshold_tokens and reason not in NOTHING_TO_COMPACT:
            assert p.adopted and p.tokens_after < p.tokens_before, (p, reason)
    for out, waiting in outputs:
        assert pairing_problems(out, waiting) == []
        assert pending_calls(out) == waiting  # a call the input ended waiting for stays last
        reason = e.get_status()["lcm_last_reason"] or ""
        if "unreachable" not in reason:
            assert estimate_messages_tokens(out) <= e.threshold_tokens
    stored = Counter(json.dumps(m.raw, sort_keys=True) for m in e.store.iter_all_messages())
    wanted = Counter(json.dumps(m, sort_keys=True) for m in conv)
    assert wanted - stored == Counter(), "every input message is stored byte-for-byte"
    assert sum(stored.values()) == len(conv), "and nothing is stored twice"
    assert_connected(e.store, host.session_id)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_five_thousand_messages_canaries_and_connected_dag(tmp_path, request, backend):
    sess = coding_session(5000, seed=42)
    e = _engine(request.getfixturevalue("pg_fresh_dsn") if backend == "postgres" else tmp_path / "lcm.db")
    host = R19Host(e, overhead_tokens=2500)
    host.start(context_length=64_000)
    msgs = sess.messages
    for a, b in turn_ranges(msgs):
        host.add(*msgs[a:b])
        host.maybe_compress()
    host.end()
    assert host.compactions >= 10 and host.invalid == []
    st_ = e.store.stats()
    assert st_["messages"] == 5000
    assert max(st_["summaries_by_depth"]) >= 1, "condensed nodes exist"
    assert_connected(e.store, host.session_id)
    for c in sess.canaries:
        res = json.loads(e.handle_tool_call("lcm_grep", {"query": c.value, "limit": 5}))
        ids = message_hits(res)
        assert ids, f"canary {c.key} ({c.value}) not found"
        assert recovered(e, ids, msgs[c.message_index]), f"canary {c.key} not recovered as its original message"
