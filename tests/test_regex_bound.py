"""lcm_grep's regex mode is bounded in time without private stdlib APIs (issue #42 item 4).

A user pattern is matched in a matcher process of its own (search/regex.py, regex_worker.py),
which stops at its time limit; the engine's process never runs one. The hostile patterns here
cost astronomically much (``.*.*.*=`` over 100,000 characters without ``=`` takes ~n**4/24 =
4e18 steps), so a call that returns at all went through the bound. No test asserts a time: a
thread join or a poll with a generous timeout only keeps a broken bound from hanging the run.
"""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest

import lossless_context
from lossless_context import LCMEngine
from lossless_context.config import LCMConfig
from lossless_context.search import regex as rx_mod
from lossless_context.search.regex import compile_regex, regex_search_bounded

PACKAGE = Path(lossless_context.__file__).parent
HANG_GUARD = 60.0  # seconds; a bounded call takes a few
SLOW = r".*.*.*="  # passes compile_regex (polynomial), hopeless over a long line without "="
LONG_LINE = "a" * 100_000


def _returns(fn: Callable[[], Any]) -> Any:
    """fn()'s result, failing (instead of hanging) when it does not return within HANG_GUARD."""
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    t.join(HANG_GUARD)
    assert not t.is_alive(), "the regex search did not return: its time bound is broken"
    return out[0]


# ------------------------------------------------------------------ no private stdlib modules
PRIVATE_RE = {"sre_parse", "sre_compile", "sre_constants"}
DOCUMENTED = {"os._exit"}  # public, documented names that start with "_"


def private_stdlib_uses(source: str) -> list[str]:
    """Private standard-library modules or names `source` uses: ``re._parser``, ``sre_parse``,
    ``from re import _parser``, ``importlib.import_module("re._parser")``, ``re._compile``..."""
    stdlib = set(sys.stdlib_module_names)
    found: list[str] = []
    imported: set[str] = set()

    def private(mod: str) -> bool:
        parts = mod.split(".")
        return parts[0] in PRIVATE_RE or (mod not in DOCUMENTED and parts[0] in stdlib and any(
            p.startswith("_") and not p.startswith("__") for p in parts[1:]))

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for a in node.names:
                imported.add((a.asname or a.name).split(".")[0])
                if private(a.name):
                    found.append(a.name)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if private(node.module) or any(private(f"{node.module}.{a.name}") for a in node.names):
                found.append(node.module)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and private(node.value) \
                and "." in node.value and " " not in node.value:
            found.append(node.value)  # import_module("re._parser"), __import__("sre_parse")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                node.value.id in imported and node.value.id in stdlib and private(f"{node.value.id}.{node.attr}"):
            found.append(f"{node.value.id}.{node.attr}")
    return found


def test_the_scanner_finds_private_stdlib_uses() -> None:
    for bad in ("import sre_parse", "import re._parser", "from re import _parser", "from re._parser import parse",
                "import importlib\nimportlib.import_module('re._parser')", "import re\nre._parser.parse('a')",
                "import re as r\nre = r\nimport re\nre._compile('a', 0)", "import sre_compile as c"):
        assert private_stdlib_uses(bad), bad
    for fine in ("import re\nre.compile('a')", "from os import path", "import os\nos.__name__",
                 "x = 'lossless_context._private'", "from . import _mine"):
        assert not private_stdlib_uses(fine), fine


def test_the_package_uses_no_private_stdlib_module() -> None:
    uses = {str(p.relative_to(PACKAGE)): private_stdlib_uses(p.read_text(encoding="utf-8"))
            for p in sorted(PACKAGE.rglob("*.py"))}
    assert len(uses) > 50  # the whole package was read
    assert {k: v for k, v in uses.items() if v} == {}


# ------------------------------------------------------------------ the matcher process
def test_a_pattern_too_slow_for_any_text_is_rejected_and_a_polynomial_one_is_bounded() -> None:
    rx, err = _returns(lambda: compile_regex(r"(a+)+$"))
    assert rx is None and err is not None and err.startswith("regex rejected")
    rx, err = compile_regex(SLOW)
    assert err is None and rx is not None
    assert regex_search_bounded(rx, "x = 1") == (0, 3)
    spans, done = _returns(lambda: rx.search_many(["b=", LONG_LINE, "c="], 0.5))
    assert spans == [(0, 2)] and done is False  # what matched before the limit
    assert _returns(lambda: regex_search_bounded(rx, LONG_LINE, seconds=0.5)) is None
    assert rx.search_many(["q = 2", "none"], 5.0) == ([(0, 3), None], True)  # the process goes on


def test_the_matcher_works_in_a_process_with_many_descriptors_open() -> None:
    """A busy host holds more than 1,024 descriptors (connections, files): the matcher's pipes
    then get numbers select() cannot watch. Its waits use poll()."""
    rx_mod.shutdown()  # (the next search starts a matcher whose pipes get high numbers)
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        rx, err = compile_regex(r"retry\s+\d+")
        assert rx is not None, err
        assert rx.search_many(["a retry 3", "none"], 5.0) == ([(2, 9), None], True)
    finally:
        rx_mod.shutdown()
        for fd in held:
            os.close(fd)


def _state(pid: int) -> str | None:
    """The process's state letter, None once it is gone (a zombie is reported as "Z")."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _gone(pid: int) -> bool:
    return _state(pid) in (None, "Z", "X")


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_a_late_matcher_is_killed_and_reaped_and_the_next_search_starts_another() -> None:
    rx, err = compile_regex(r"retry\s+\d+")
    assert rx is not None, err
    pid = rx_mod.matcher_pid()
    assert pid is not None and not _gone(pid)
    os.kill(pid, signal.SIGSTOP)  # a process that does not answer, whatever its timer says
    try:
        assert _returns(lambda: rx.search_many(["retry 3"], 0.2)) == ([], False)
    finally:
        if not _gone(pid):
            os.kill(pid, signal.SIGCONT)
    assert _state(pid) is None  # killed and reaped: no zombie left
    assert rx_mod.matcher_pid() is None
    assert rx.search_many(["retry 3"], 5.0) == ([(0, 7)], True)  # started anew, lazily
    assert rx_mod.matcher_pid() not in (None, pid)
    rx_mod.shutdown()
    assert rx_mod.matcher_pid() is None


_CHILD = """
import sys, threading, time
from lossless_context.search import regex
rx, err = regex.compile_regex({slow!r})
pid = regex.matcher_pid()
if sys.argv[1] == "busy":  # the matcher is matching when this process is killed
    threading.Thread(target=rx.search_many, args=([{long!r}], 55.0), daemon=True).start()
    while open(f"/proc/{{pid}}/stat").read().rsplit(")", 1)[1].split()[0] != "R":
        time.sleep(0.01)
print(pid, flush=True)
sys.stdin.read()
"""


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
@pytest.mark.parametrize("when", ["idle", "busy"])
def test_the_matcher_ends_when_the_engine_process_dies(when: str) -> None:
    code = _CHILD.format(slow=SLOW, long=LONG_LINE)
    child = subprocess.Popen([sys.executable, "-c", code, when], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, cwd=str(PACKAGE.parent))
    try:
        assert child.stdout is not None
        pid = int(child.stdout.readline())
        assert not _gone(pid)
    finally:
        child.kill()  # SIGKILL: no atexit, no cleanup; only the matcher's own checks remain
        child.wait()
    for _ in range(int(20 / 0.05)):  # a hang guard: it ends within a tick (regex_worker.TICK), not 55 s
        if _gone(pid):
            break
        time.sleep(0.05)
    assert _gone(pid), f"the matcher process {pid} outlived its parent"


# ------------------------------------------------------------------ lcm_grep on both stores
@pytest.fixture(params=["sqlite", "postgres"])
def location(request, tmp_path):
    if request.param == "sqlite":
        return str(tmp_path / "lcm.db")
    return request.getfixturevalue("pg_fresh_dsn")


def test_lcm_grep_answers_within_its_bound_with_what_it_found(location: str, monkeypatch) -> None:
    e = LCMEngine(config=LCMConfig.load({"store": location, "summarizer": "extractive"}, read_file=False))
    e.update_model("m", 64_000)
    e.on_session_start("s")
    e.ingest([{"role": "user", "content": "an early value: limit = 5"}])
    e.ingest([{"role": "tool", "content": LONG_LINE}])  # the pattern cannot get past this one
    e.ingest([{"role": "user", "content": "set retry = 3"}, {"role": "assistant", "content": "done"}])
    monkeypatch.setattr(rx_mod, "SCAN_SECONDS", 1.0)

    def grep(**args: Any) -> dict[str, Any]:
        return json.loads(e.handle_tool_call("lcm_grep", {"mode": "regex", "scope": "messages", **args}))

    got = _returns(lambda: grep(query=SLOW))
    hits = [h for g in got["groups"] for h in g["hits"]]
    assert [h["message"]["content"] for h in hits] == ["set retry = 3"]  # newest first, up to the limit
    assert "stopped at its time limit" in got["note"]
    assert "retry = 3" in hits[0]["snippet"]
    # the same pattern over the rows before the long one finds the early value: nothing was lost
    older = _returns(lambda: grep(query=SLOW, until="2999-01-01T00:00:00Z", role="user"))
    assert [h["message"]["content"] for g in older["groups"] for h in g["hits"]] == \
        ["set retry = 3", "an early value: limit = 5"]
    assert "note" not in older
    bad = _returns(lambda: grep(query=r"(\w+\s?)*$"))
    assert bad["error"].startswith("invalid regex: regex rejected") and "internal error" not in bad["error"]
    fine = grep(query=r"retry\s*=\s*\d")
    assert fine["hits"] == 1 and "note" not in fine
