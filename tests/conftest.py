"""Shared test setup. Keep this small: fixtures live in tests/support/ modules."""

from __future__ import annotations

import pytest

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.pg import pg_dsn, pg_fresh_dsn, pg_server  # noqa: E402,F401  (PostgreSQL fixtures)


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
