"""Issue #40 item 5: `lcm doctor --repair` removes the message copies an earlier `lcm import
hermes` stored (0.19.0's archived rows and re-persisted head imported as new turns), on both
backends; a short exchange the user really repeated is not a copy.
"""

from __future__ import annotations

from lossless_context.ops.doctor import run_doctor
from lossless_context.pipeline.ingest import new_message
from lossless_context.records import ContextEntry
from tests import test_branch_undo_forget as undo
from tests.test_branch_undo_forget import _engine, _grep, _turns

location = undo.location  # the fixture: SQLite and PostgreSQL

NAME = "no message stored twice by an import"


def _check(rep):
    return next(c for c in rep.checks if c.name == NAME)


def test_doctor_repairs_copies_and_keeps_real_repeats(location):
    e = _engine(location)
    e.bind_session_state(None, "D")
    base = [{"role": "user", "content": "start with HEADTOKEN-771"}] + _turns("work", 4, big=400)[1:] + [{"role": "user", "content": "continue"}, {"role": "assistant", "content": "ok"},
                                         {"role": "user", "content": "continue"}, {"role": "assistant", "content": "ok"}]
    e.on_session_end("D", base)
    assert _check(run_doctor(e.store)).ok  # "continue" / "ok" said twice for real
    # what an earlier importer appended: the head again, as new rows, into the context
    copies = e.store.append_messages("D", [new_message(m, 10**9, 0) for m in base[:3]])
    _v, ctx = e.store.get_context("D")
    e.store.set_context("D", list(ctx) + [ContextEntry("m", i, "", "", 1) for i in copies])
    assert len(_grep(e, "HEADTOKEN-771")) == 2
    rep = run_doctor(e.store)
    assert not rep.ok and not _check(rep).ok
    rep = run_doctor(e.store, repair=True)
    assert _check(rep).repaired, _check(rep)
    assert run_doctor(e.store).ok
    assert len(_grep(e, "HEADTOKEN-771")) == 1
    assert e.store.get_messages(copies) == {}
    _v, ctx = e.store.get_context("D")
    refs = [(x.kind, x.ref) for x in ctx]
    assert len(refs) == len(set(refs)) == len(base)
