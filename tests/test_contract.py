"""The declared host contract (lossless_context/contract/spec.py) against the engine and the host.

Each declared method exists on LCMEngine and accepts every argument the host passes; each declared
attribute is readable on an engine; every public member of the installed host's ContextEngine is
declared; and every public method LCMEngine defines is either declared or named below as our
own (called by our CLI, plugin, tools or tests, never by the host).
"""

from __future__ import annotations

import copy
import inspect

from lossless_context import LCMEngine
from lossless_context.config import LCMConfig
from lossless_context.contract.spec import HOST_ATTRIBUTES, HostCalls

DECLARED = {n for n, v in vars(HostCalls).items() if callable(v) and (not n.startswith("_") or n == "__deepcopy__")}
OURS = {  # public methods and properties of LCMEngine the host never calls: who does
    "current_session": "tools and /lcm: the session this engine acts on",
    "live_engine": "/lcm: the copy the user's agent drives",
    "sync_from_host": "/lcm: store the host's latest turns before a command",
    "explicit_threshold_percent": "config: a threshold the user set",
    "input_window": "update_model and tests: the window less the provider's output reservation",
    "config": "every part of the engine, the CLI and the plugin: the configuration (loaded lazily)",
    "store": "every part of the engine, the CLI and the plugin: the store (opened lazily)",
    "store_busy_for": "the plugin: how long the running store call has waited",
    "semantic_arm": "lcm_grep and ingestion: the semantic search arm when on",
    "summary_escalator": "`lcm resummarize` and the compaction-state hooks: the summariser in use",
    "ingest": "the tools, the lifecycle, the turn hooks, the CLI: store a host list",
    "upgrade_leftovers": "the lifecycle: outlines a process that ended left",
    "wait_background": "`lcm demo` and tests: wait for the background worker",
    "maybe_presummarize": "the turn hooks: summarise ahead between turns",
    "provider_ratio": "/lcm status and tests: provider tokens per token of our estimate",
    "summary_block_tokens": "the turn hooks: the summary block's size select_context renders within",
    "overhead": "the provider units: host tokens outside the message list",
    "pass_clock": "the pass budget's clock (a simulated host's tests share theirs)",
}


def _engine(tmp_path) -> LCMEngine:
    e = LCMEngine(config=LCMConfig.load({"store": str(tmp_path / "c.db")}, read_file=False))
    e.update_model(model="m", context_length=64_000)
    return e


def _accepts(impl, spec) -> list[str]:
    """Arguments the host passes (spec's parameters) that impl would refuse."""
    ip = inspect.signature(impl).parameters
    named_ok = any(p.kind is p.VAR_KEYWORD for p in ip.values())
    bad = []
    for name, p in list(inspect.signature(spec).parameters.items())[1:]:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if name not in ip and not named_ok:
            bad.append(name)
    return bad


def test_every_declared_method_is_implemented_with_a_compatible_signature(tmp_path):
    e = _engine(tmp_path)
    for name in sorted(DECLARED):
        impl = getattr(e, name, None)
        assert callable(impl), f"LCMEngine has no {name}"
        assert _accepts(impl, getattr(HostCalls, name)) == [], name


def test_every_declared_attribute_is_there(tmp_path):
    e = _engine(tmp_path)
    for name in HOST_ATTRIBUTES:
        if name in ("model_thresholds",):  # assigned by the host before use; we read it with a default
            continue
        assert hasattr(e, name), f"LCMEngine has no attribute {name}"


def test_every_member_of_the_hosts_context_engine_is_declared():
    from agent.context_engine import ContextEngine

    members = {n for n in vars(ContextEngine) if not n.startswith("_")}
    assert members - DECLARED - set(HOST_ATTRIBUTES) == set()


def test_the_engine_defines_only_declared_or_named_public_methods():
    """LCMEngine's own public names are the host's (declared) or listed in OURS; the parts it owns
    (contract/: sessions, turn hooks, compaction state, units, notices) are not mixed into it."""
    assert LCMEngine.__mro__[1] is not object and all(  # its bases: the host's ContextEngine (or our stand-in)
        c.__module__.split(".")[0] != "lossless_context" or c.__module__ == "lossless_context.contract.base"
        for c in LCMEngine.__mro__[1:])
    defined = {n for n in vars(LCMEngine) if not n.startswith("_")}
    assert defined - DECLARED - set(HOST_ATTRIBUTES) - set(OURS) == set()
    assert set(OURS) <= defined, "a name listed as ours is gone: drop it from OURS"


def test_the_checks_fail_on_a_missing_argument():
    class Spec:
        def f(self, a, b=0): ...

    class Impl:
        def f(self, a): ...

    class Loose:
        def f(self, a, **kw): ...

    assert _accepts(Impl().f, Spec.f) == ["b"]
    assert _accepts(Loose().f, Spec.f) == []


# What the host passes to each declared method (a realistic call), for the check below.
_MSGS = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi there"}]
_CALLS = {
    "update_model": ((), {"model": "m", "context_length": 64_000, "max_tokens": 8_192}),
    "bind_session_state": ((), {"session_db": None, "session_id": "s-kw"}),
    "on_session_start": (("s-kw",), {"platform": "cli"}),
    "clone_for_agent": ((), {}),
    "should_compress_preflight": ((_MSGS,), {}),
    "should_defer_preflight_to_real_usage": ((1_000,), {}),
    "should_compress": ((1_000,), {}),
    "should_compress_info": ((1_000,), {}),
    "get_active_compression_failure_cooldown": ((), {}),
    "pending_compression_operation": ((_MSGS,), {}),
    "get_automatic_compaction_status_message": ((), {"phase": "compress", "default_message": "x"}),
    "compress": ((list(_MSGS),), {"current_tokens": 100}),
    "prune_tool_results_only": ((list(_MSGS),), {"current_tokens": 100}),
    "has_content_to_compress": ((_MSGS,), {}),
    "update_from_response": (({"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12},), {}),
    "select_context": ((list(_MSGS),), {"budget_tokens": 0}),
    "on_turn_complete": ((list(_MSGS),), {"usage": None}),
    "get_tool_schemas": ((), {}),
    "handle_tool_call": (("lcm_describe", {"id": "m1"}), {"messages": list(_MSGS)}),
    "get_status": ((), {}),
    "on_session_end": (("s-kw", list(_MSGS)), {}),
    "on_session_reset": ((), {}),
}


def test_every_host_hook_takes_keywords_a_newer_host_adds(tmp_path, caplog):
    """A newer host may pass a keyword nobody declared yet (upstream forwards `max_tokens` to
    update_model without a signature check): every hook takes **kwargs and still works."""
    import logging

    e = _engine(tmp_path)
    hooks = sorted(DECLARED - {"__deepcopy__"})  # (copy.deepcopy passes the memo only)
    assert set(_CALLS) == set(hooks), "a declared hook has no sample call here"
    caplog.set_level(logging.WARNING, logger="lossless_context")
    for name in hooks:
        impl = getattr(e, name)
        assert any(p.kind is p.VAR_KEYWORD for p in inspect.signature(impl).parameters.values()), name
        args, kw = _CALLS[name]
        impl(*args, **kw, hermes_future_keyword=1)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


def test_update_model_reserves_the_output_it_is_given(tmp_path):
    """`max_tokens` is carved out of the window before the threshold is taken (as the host's own
    compressor does); None keeps the reservation already known; junk means no reservation."""
    e = _engine(tmp_path)
    assert e.threshold_tokens == int(64_000 * 0.75)
    e.update_model(model="m", context_length=64_000, max_tokens=16_000)
    assert e.threshold_tokens == int(48_000 * 0.75) and e.input_window() == 48_000
    e.update_model(model="m2", context_length=64_000)  # a switch that does not say: kept
    assert e.threshold_tokens == int(48_000 * 0.75)
    assert copy.deepcopy(e).threshold_tokens == e.threshold_tokens and e.clone_for_agent().input_window() == 48_000
    e.update_model(model="m", context_length=64_000, max_tokens=True)  # not a number: no reservation
    assert e.threshold_tokens == int(64_000 * 0.75)
    e.update_model(model="m", context_length=64_000, max_tokens=64_000)  # would leave nothing: the window
    assert e.threshold_tokens == int(64_000 * 0.75)
