"""Named mutants: parts of the product broken on purpose, to prove the tests see it (issue #37).

A mutant is applied to the running test process when `LCM_MUTANT=<name>` is set
(tests/conftest.py calls `apply_from_env()` before any test runs); `tests/mutation.py` runs, for
each mutant, the tests that must catch it and reports which went red. Every mutant must be caught.

Mutants patch the package in this process only: a test whose engine runs in a child process
(tests/support/engine_worker.py, the e2e host harness) does not see them, so the catching tests
listed for each mutant are in-process ones.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

ENV = "LCM_MUTANT"


@dataclass(frozen=True)
class Mutant:
    name: str
    what: str
    apply: Callable[[], None]
    catchers: tuple[str, ...]  # pytest node ids (or files) that must go red
    extra: dict[str, Any] = field(default_factory=dict)


def _tools_raise() -> None:
    from lossless_context import tools

    def broken(self: Any) -> Any:
        raise RuntimeError("mutant: the tool broke")

    for name in ("grep", "describe", "expand", "expand_query"):
        setattr(tools._Ctx, name, broken)


def _pass_raises() -> None:
    from lossless_context.pipeline.compaction import Compactor

    def broken(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("mutant: the pass broke")

    Compactor.run = broken  # type: ignore[method-assign]


def _undo_noop() -> None:
    from lossless_context.edits import forget

    forget.retract_rolled_back = lambda *args, **kwargs: []


def _append_drops_row() -> None:
    from lossless_context.store.sqlite.store import SQLiteStore

    stores: list[type] = [SQLiteStore]
    try:
        from lossless_context.store.postgres.store import PostgresStore

        stores.append(PostgresStore)
    except Exception:  # psycopg missing: SQLite only
        pass

    def dropping(rows: Iterable[Any]) -> Iterable[Any]:
        if isinstance(rows, (list, tuple)):
            return [r for i, r in enumerate(rows) if i != 1]
        return (r for i, r in enumerate(rows) if i != 1)

    for cls in stores:
        original = cls.append_messages

        def append_messages(self: Any, session_id: str, rows: Iterable[Any], *args: Any,
                            _original: Any = original, **kwargs: Any) -> Any:
            return _original(self, session_id, dropping(rows), *args, **kwargs)

        cls.append_messages = append_messages  # type: ignore[method-assign]


def _stale_select() -> None:
    from lossless_context.contract.turn_hooks import TurnHooks

    # The version select_context keys its cache on never moves: a committed pass is not seen.
    TurnHooks._context_version = lambda self, sid: 0  # type: ignore[method-assign]


def _no_redaction() -> None:
    from lossless_context.text import redact

    redact.redact = lambda text: text
    redact.redact_builtin = lambda text: text


MUTANTS: dict[str, Mutant] = {m.name: m for m in (
    Mutant("tools-raise", "every agent tool raises inside its handler", _tools_raise, (
        "tests/test_hostile_input.py::test_fuzz_tool_arguments",
        "tests/test_hostile_input.py::test_every_tool_on_every_id_answers_json",
        "tests/test_tools.py::test_canaries_found_grouped_and_recovered_verbatim[sqlite]",
    )),
    Mutant("pass-raises", "every compaction pass raises", _pass_raises, (
        "tests/test_hostile_input.py::test_fuzz_message_lists_through_every_hook",
        "tests/test_lossless_properties.py::test_random_conversations",
        "tests/test_engine_core.py",
    )),
    Mutant("undo-noop", "the undo rule does nothing (rolled-back messages stay searchable)", _undo_noop, (
        "tests/test_branch_undo_forget.py::test_undo_takes_the_message_out_of_search_and_a_resend_brings_it_back[sqlite]",
    )),
    Mutant("append-drops-row", "the store's append drops the second row of every batch", _append_drops_row, (
        "tests/test_lossless_properties.py::test_random_conversations",
        "tests/test_hostile_input.py::test_fuzz_message_lists_through_every_hook",
    )),
    Mutant("stale-select", "select_context never sees a committed pass (returns a stale context)", _stale_select, (
        "tests/test_newer_host.py::test_the_same_request_after_a_commit_gets_the_new_context",
    )),
    Mutant("no-redaction", "secrets are not redacted before a summariser sees the text", _no_redaction, (
        "tests/test_secrets.py",
    )),
)}


def apply_from_env() -> str | None:
    """Apply the mutant named by LCM_MUTANT (if any) to this process; its name."""
    name = os.environ.get(ENV, "").strip()
    if not name:
        return None
    if name not in MUTANTS:
        raise SystemExit(f"{ENV}={name!r}: no such mutant (known: {', '.join(MUTANTS)})")
    MUTANTS[name].apply()
    return name
