"""Shared test setup. Keep this small: fixtures live in tests/support/ modules."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.pg import pg_dsn, pg_fresh_dsn, pg_server  # noqa: E402,F401  (PostgreSQL fixtures)
