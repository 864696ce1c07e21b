"""Shared test setup. Keep this small: fixtures live in tests/support/ modules."""

from __future__ import annotations

import pytest

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.errorwatch import ErrorWatch, verdict, watching  # noqa: E402
from tests.support.requires import OPTIONAL_HOST, hermes_skip_failure  # noqa: E402
from tests.support.pg import pg_dsn, pg_fresh_dsn, pg_server  # noqa: E402,F401  (PostgreSQL fixtures)
from tests.support import hosts as _hosts  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "hosts(*labels): run only on these Hermes hosts (default: all of "
                            + ", ".join(_hosts.LABELS) + ")")
    # LCM_MUTANT=<name> breaks a named part of the product for this run (tests/support/mutants.py,
    # driven by tests/mutation.py): the tests that must catch it should go red.
    from tests.support.mutants import apply_from_env

    config._lcm_mutant = apply_from_env()


def pytest_generate_tests(metafunc):
    """A test that uses `hermes_host` runs once per Hermes host (tests/support/hosts.py)."""
    if "hermes_host" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker("hosts")
    labels = [lb for lb in _hosts.selected() if marker is None or lb in marker.args]
    if not labels:  # narrowed away (LCM_HOSTS): one skipped instance says so
        skipped = [pytest.param(lb, marks=pytest.mark.skip(reason="host not selected (LCM_HOSTS)"))
                   for lb in _hosts.LABELS if marker is None or lb in marker.args][:1]
        metafunc.parametrize("hermes_host", skipped, indirect=True, ids=[f"hermes{p.values[0]}" for p in skipped])
        return
    metafunc.parametrize("hermes_host", labels, indirect=True, ids=[f"hermes{lb}" for lb in labels])


@pytest.fixture
def hermes_host(request):
    """The Hermes host this run of the test drives (a `tests.support.hosts.Host`); `run_hermes`
    inside the test drives it too. A host that is not available skips the test (fails under
    LCM_REQUIRE_HERMES=1, except the optional 0.20 mirror)."""
    label = getattr(request, "param", "0.19")
    try:
        host = _hosts.get(label)
    except _hosts.HostUnavailable as exc:
        if _hosts.required() and not _hosts.optional_label(label):
            pytest.fail(f"Hermes {label} is required (LCM_REQUIRE_HERMES) but unavailable: {exc}")
        pytest.skip(f"Hermes {label}: {exc}" + (f" {OPTIONAL_HOST}" if _hosts.optional_label(label) else ""))
    with _hosts.driving(host):
        yield host


@pytest.fixture(autouse=True)
def lcm_errors(request, _library_logger_restored):
    """Errors are failures (tests/support/errorwatch.py): the test fails when the
    `lossless_context` logger records an ERROR or a traceback, or a tool answers
    "internal error", unless the test declares it — `@pytest.mark.lcm_errors(*patterns)` for the
    whole test, or `with lcm_errors.expected(*patterns):` for a block (the fixture is this
    watcher; `lcm_errors.records` / `.answers` / `.matched()` show what it saw)."""
    watch = ErrorWatch()
    for mark in request.node.iter_markers("lcm_errors"):
        watch.allow(*mark.args)
    with watching(watch):
        yield watch
    message = verdict(watch)
    if message:
        pytest.fail(message, pytrace=False)


@pytest.fixture(scope="session", autouse=True)
def _net_guard():
    """Outside addresses refused for the whole run (tests/support/netguard.py)."""
    from tests.support import netguard

    with netguard.installed(netguard.Guard()) as guard:
        yield guard


@pytest.fixture(autouse=True)
def no_outside_calls(_net_guard):
    """A test that tried to reach an address outside this machine fails, even when the code
    under test swallowed the refusal (a host falling back to its default providers does)."""
    _net_guard.take()
    yield
    seen = _net_guard.take()
    if seen:
        pytest.fail("the test tried to reach outside addresses: " + "; ".join(sorted(set(seen))[:5]),
                    pytrace=False)


@pytest.fixture(autouse=True)
def _library_logger_restored():
    """The CLI (run in-process by CliRunner) quiets the `lossless_context` logger for its own
    process; a later test in the same process must still see the library's log records."""
    import logging

    lib = logging.getLogger("lossless_context")
    level, propagate, handlers = lib.level, lib.propagate, list(lib.handlers)
    yield
    lib.setLevel(level)
    lib.propagate = propagate
    lib.handlers[:] = handlers


def _require_hermes(report) -> None:
    """While LCM_REQUIRE_HERMES is set, a skip for want of the host is a failure
    (tests/support/requires.py)."""
    if report.skipped and isinstance(report.longrepr, tuple) and len(report.longrepr) == 3:
        failure = hermes_skip_failure(str(report.longrepr[2]))
        if failure:
            report.outcome = "failed"
            report.longrepr = failure


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _require_hermes(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _require_hermes(outcome.get_result())


def pytest_report_header(config):
    name = getattr(config, "_lcm_mutant", None)
    return f"MUTANT APPLIED: {name} (tests are expected to fail)" if name else None
