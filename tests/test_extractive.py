"""Tests for lossless_context.summarizers.extractive: budget, determinism, what survives, hostile input."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lossless_context.summarizers.extractive import Source, extractive_summary


def est(text: str) -> int:
    return (len(text) + 3) // 4


BORING = [
    "ok sounds good", "let me look at that", "sure, one moment please", "thanks!", "I see.",
    "hmm, interesting", "right, that makes sense", "okay, continuing with the next part now",
    "alright, give me a second to think about it", "yes", "great, thank you very much",
]


def boring_transcript(n: int, plant: dict[int, str] | None = None) -> list[Source]:
    plant = plant or {}
    out = []
    for i in range(1, n + 1):
        role = ("user", "assistant", "tool")[i % 3]
        lines = [BORING[(i * 7 + k) % len(BORING)] for k in range(4)]
        if i in plant:
            lines.insert(2, plant[i])
        out.append(Source(f"m{i}", role, "\n".join(lines), f"2024-05-01T10:{i % 60:02d}:00Z"))
    return out


CANARIES = {
    40: "The failing config is at src/uploader/retry_policy.py line 88",
    90: "RuntimeError: upload aborted with ERR_STORAGE_TIMEOUT (HTTP 503)",
    130: "the retry budget must stay under 4500 ms per request",
    170: "This is tracked in QX-1234 and blocks the release",
}


def test_source_is_a_small_frozen_dataclass() -> None:
    s = Source("m1", "user", "hi", None)
    assert (s.id, s.role, s.text, s.timestamp) == ("m1", "user", "hi", None)
    assert Source("s7", "summary", "x") .timestamp is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.text = "changed"  # type: ignore[misc]


def test_canaries_survive_a_long_boring_transcript() -> None:
    sources = boring_transcript(200, CANARIES)
    out = extractive_summary(sources, 300)
    assert est(out) <= 300
    for needle in ("src/uploader/retry_policy.py", "ERR_STORAGE_TIMEOUT", "4500 ms", "QX-1234"):
        assert needle in out, needle
    # ...each cited with its source id and role, so it can be expanded later.
    assert "[m40 assistant] The failing config is at src/uploader/retry_policy.py" in out
    assert "[m90 user] RuntimeError: upload aborted" in out


def test_header_gives_span_count_and_time_range() -> None:
    out = extractive_summary(boring_transcript(50), 400)
    header = out.split("\n", 1)[0]
    assert header.startswith("[m1..m50: 50 sources")
    assert "2024-05-01T10:01:00Z .. 2024-05-01T10:50:00Z" in header
    assert "lines kept" in header


def test_header_without_timestamps() -> None:
    out = extractive_summary([Source("m3", "user", "fix the bug in app.py please")], 100)
    assert out.split("\n")[0] == "[m3: 1 source, 1/1 lines kept]"
    assert out.split("\n")[1] == "[m3 user] fix the bug in app.py please"


def test_kept_lines_stay_in_original_order() -> None:
    out = extractive_summary(boring_transcript(200, CANARIES), 300)
    ids = [int(m) for m in re.findall(r"^\[m(\d+) \w+\]", out, re.MULTILINE)]
    assert ids == sorted(ids) and len(ids) >= 4


def test_first_user_request_and_last_state_are_kept() -> None:
    sources = [Source("m1", "user", "Please migrate the billing service to Postgres 16.")]
    sources += boring_transcript(100)[1:]
    sources.append(Source("m999", "assistant", "Status: migration done, only the backfill job remains."))
    out = extractive_summary(sources, 120)
    assert "Please migrate the billing service to Postgres 16." in out
    assert "backfill job remains" in out


def test_traceback_keeps_the_exception_line() -> None:
    tb = ("Traceback (most recent call last):\n"
          '  File "/srv/app/main.py", line 10, in <module>\n    main()\n'
          '  File "/srv/app/main.py", line 6, in main\n    run(cfg)\n'
          "KeyError: 'database_url'")
    sources = boring_transcript(30) + [Source("m31", "tool", tb)]
    out = extractive_summary(sources, 60)
    assert "KeyError: 'database_url'" in out


def test_decisions_and_todos_outrank_chatter() -> None:
    sources = boring_transcript(60, {
        20: "We decided to use SQLite WAL mode instead of a lock file.",
        45: "TODO: add a migration for the sessions table",
    })
    out = extractive_summary(sources, 90)
    assert "We decided to use SQLite WAL mode" in out
    assert "TODO: add a migration" in out


def test_focus_bias() -> None:
    plant = {
        30: "The cache eviction policy is LRU with a 512 MB cap in cache/policy.py",
        70: "The auth token refresh runs every 15 minutes in auth/refresh.py",
    }
    sources = boring_transcript(100, plant)
    budget = 45  # room for roughly one planted line
    plain = extractive_summary(sources, budget)
    on_auth = extractive_summary(sources, budget, focus="auth token refresh")
    on_cache = extractive_summary(sources, budget, focus="cache eviction")
    assert "auth/refresh.py" in on_auth
    assert "cache/policy.py" in on_cache
    assert on_auth != on_cache
    assert est(plain) <= budget and est(on_auth) <= budget and est(on_cache) <= budget


def test_aggressive_is_shorter_and_terse() -> None:
    sources = boring_transcript(300, CANARIES)
    normal = extractive_summary(sources, 400)
    terse = extractive_summary(sources, 400, aggressive=True)
    assert len(terse) < len(normal)
    assert est(terse) <= 200
    assert all(line.startswith("- [") for line in terse.split("\n")[1:])
    assert re.search(r"^- \[m\d+ [uat]\] ", terse, re.MULTILINE)


def test_small_inputs_fit_whole() -> None:
    sources = [Source("m1", "user", "rename foo() to bar()"), Source("m2", "assistant", "Done: renamed in lib/x.py")]
    out = extractive_summary(sources, 500)
    assert "rename foo() to bar()" in out and "Done: renamed in lib/x.py" in out


def test_repeated_log_lines_collapse() -> None:
    log = "".join(f"12:00:{i % 60:02d} INFO worker processed batch {i}\n" for i in range(3000))
    log += "12:59:59 ERROR worker crashed: MemoryError in batch 2999\n"
    out = extractive_summary([Source("m5", "tool", log)], 100)
    assert "MemoryError" in out
    assert out.count("processed batch") <= 2


@pytest.mark.parametrize("target", [0, -1, -1000])
def test_non_positive_target_is_empty(target: int) -> None:
    assert extractive_summary(boring_transcript(5), target) == ""


@pytest.mark.parametrize("target", [1, 2, 3, 5, 8, 13, 40])
def test_tiny_targets_stay_in_bound(target: int) -> None:
    out = extractive_summary(boring_transcript(100, CANARIES), target)
    assert est(out) <= target
    assert out  # something, even if only the span


@pytest.mark.parametrize("sources", [
    [], [Source("m1", "user", "")], [Source("", "", "")], [Source("m1", "tool", "\x00\x00\x00")],
    [Source("m1", "tool", "\ud800\udfff lone \udc00 surrogates ERR_X")],
    [Source("m\x00", "us\ud800er", "text\x00with NUL", "\ud800")],
    [Source("m1", "tool", "=" * 5000)], [Source("m1", "tool", "\n" * 10000)],
    [Source("m1", "tool", "x" * 300_000)],
    [Source("m1", "tool", "a. " * 100_000)],
])
def test_hostile_inputs_never_raise(sources: list[Source]) -> None:
    for target in (0, 1, 10, 100, 1000):
        for aggressive in (False, True):
            out = extractive_summary(sources, target, focus="x\ud800", aggressive=aggressive)
            assert isinstance(out, str)
            assert est(out) <= max(0, target)
            out.encode("utf-8")  # no lone surrogates leak into the summary
            assert "\x00" not in out


def test_garbage_arguments_never_raise() -> None:
    assert extractive_summary(None, 100) == "[no sources]"  # type: ignore[arg-type]
    assert isinstance(extractive_summary([Source("m1", "user", 123)], 100), str)  # type: ignore[arg-type]
    assert extractive_summary(boring_transcript(3), "abc") == ""  # type: ignore[arg-type]
    out = extractive_summary([{"id": "m1"}], 50)  # type: ignore[list-item]
    assert isinstance(out, str) and est(out) <= 50


_text = st.text(st.characters(min_codepoint=0, max_codepoint=0x10FFFF, blacklist_categories=()),
                max_size=400)
_line = st.one_of(_text, st.sampled_from(BORING + list(CANARIES.values())))
_source = st.builds(
    Source,
    id=st.from_regex(r"[ms][0-9]{1,5}", fullmatch=True),
    role=st.sampled_from(["user", "assistant", "tool", "system", "summary", "weird"]),
    text=st.lists(_line, max_size=12).map("\n".join),
    timestamp=st.one_of(st.none(), st.just("2024-05-01T10:00:00Z"), _text),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_source, max_size=25), st.integers(-5, 600), st.booleans(),
       st.one_of(st.none(), _text))
def test_property_budget(sources: list[Source], target: int, aggressive: bool, focus: str | None) -> None:
    out = extractive_summary(sources, target, focus=focus, aggressive=aggressive)
    if target <= 0:
        assert out == ""
        return
    assert est(out) <= target
    if aggressive:
        assert est(out) <= max(1, target // 2)
    in_tokens = sum(est(s.text) for s in sources)
    if in_tokens > target:
        assert len(out) < sum(len(s.text) for s in sources)
    assert out == extractive_summary(sources, target, focus=focus, aggressive=aggressive)


def test_deterministic_across_processes() -> None:
    # Set iteration order depends on PYTHONHASHSEED; the output must not.
    script = (
        "import json, sys\n"
        "from tests.test_extractive import boring_transcript, CANARIES\n"
        "from lossless_context.summarizers.extractive import extractive_summary\n"
        "src = boring_transcript(150, CANARIES)\n"
        "print(json.dumps([extractive_summary(src, t, focus=f, aggressive=a)\n"
        "  for t in (20, 200) for f in (None, 'retry budget QX-1234') for a in (False, True)]))\n"
    )
    root = Path(__file__).resolve().parents[1]
    outs = []
    for seed in ("1", "2", "3"):
        env = dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=str(root))
        res = subprocess.run([sys.executable, "-c", script], cwd=root, env=env,
                             capture_output=True, text=True, check=True)
        outs.append(json.loads(res.stdout))
    assert outs[0] == outs[1] == outs[2]


def test_two_megabytes_is_fast() -> None:
    # CPU time of this process: robust on a loaded machine.
    log = "".join(f"2024-05-01 12:{i // 60 % 60:02d}:{i % 60:02d} INFO worker-{i % 7} batch {i} ok in {i % 300} ms\n"
                  for i in range(6000))
    prose = "We went through the migration plan and the open questions again. " * 1500
    sources = []
    i = 0
    while sum(len(s.text) for s in sources) < 2_000_000:
        text = (log, prose, "short reply: ok, running the tests now")[i % 3]
        sources.append(Source(f"m{i}", ("tool", "assistant", "user")[i % 3], text))
        i += 1
    sources.append(Source(f"m{i}", "tool", "x" * 500_000))
    t0 = time.process_time()
    out = extractive_summary(sources, 2000)
    assert time.process_time() - t0 < 1.0
    assert est(out) <= 2000


def test_many_small_messages_are_fast_enough() -> None:
    sources = [Source(f"m{i}", ("user", "assistant", "tool")[i % 3],
                      f"step {i}: edited src/pkg/mod_{i}.py; retry limit now {i} ms (see QX-{i})")
               for i in range(20_000)]
    t0 = time.process_time()
    out = extractive_summary(sources, 1500)
    assert time.process_time() - t0 < 5.0  # generous: shared CI machines
    assert est(out) <= 1500


def test_markers_are_never_cut_and_redacting_again_keeps_the_budget() -> None:
    from lossless_context.text.redact import redact

    secret_lines = {i: f"export API_TOKEN=tok_{i:04d}abcdef and password=hunter{i}" for i in range(5, 95, 7)}
    sources = [Source(s.id, s.role, redact(s.text), s.timestamp) for s in boring_transcript(100, secret_lines)]
    for target in range(8, 200, 7):
        out = extractive_summary(sources, target)
        assert re.search(r"\[REDACTED(?![^\]]*\])", out) is None, out  # no clipped marker
        again = redact(out)
        assert est(again) <= target
        assert "hunter" not in again and "tok_" not in again
