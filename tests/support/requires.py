"""Skips that CI turns into failures: `LCM_REQUIRE_HERMES`, `LCM_REQUIRE_POSTGRES`,
`LCM_REQUIRE_CHROMIUM`.

On a developer's machine a test whose outside part is missing (the host package, a PostgreSQL
server, Chromium) skips with a reason. `.ci/run` sets the three variables, and then a missing part
is a failure: a suite that silently skipped the host would be green without testing it.

PostgreSQL (tests/support/pg.py) and Chromium (tests/test_viewer.py) check their variable where
they skip. The host is needed by many files in many ways (`pytest.importorskip("hermes_state")`,
`skipif(not hermes_available())`, ...), so its rule is kept in one place: `tests/conftest.py` passes
every skip report through `hermes_skip_failure`, which turns a skip whose reason is about the host
(`HOST_SKIP`) into a failure while `LCM_REQUIRE_HERMES` is set. A new test that skips without the
host needs only a reason that names `hermes` (e.g. "hermes-agent not importable").
"""

from __future__ import annotations

import os
import re
from typing import Optional

HOST_SKIP = re.compile(r"hermes|run_agent|hermes_state|agent\.context", re.IGNORECASE)
# A host that is optional even in CI (the 0.20 mirror, tests/support/hosts.py) says so in its
# skip reason, and stays a skip.
OPTIONAL_HOST = "(optional host)"


def required(part: str) -> bool:
    """True when `LCM_REQUIRE_<PART>` is set to something other than empty/0/false/no."""
    return os.environ.get(f"LCM_REQUIRE_{part.upper()}", "").strip().lower() not in ("", "0", "false", "no")


def hermes_skip_failure(reason: str) -> Optional[str]:
    """The failure text for a skip whose `reason` is the missing host while it is required."""
    if required("hermes") and HOST_SKIP.search(reason or "") and OPTIONAL_HOST not in (reason or ""):
        return f"LCM_REQUIRE_HERMES is set, but the test skipped: {reason}"
    return None
