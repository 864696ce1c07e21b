"""`lcm doctor` on both backends: a healthy store passes; an unreachable message and stale
staged work are found and repaired without deleting user data."""

from __future__ import annotations

import pytest

from lossless_context import LCMEngine
from lossless_context.config import LCMConfig
from lossless_context.ops.doctor import run_doctor
from lossless_context.pipeline.ingest import new_message
from lossless_context.records import NewSummary
from lossless_context.demo.sessions import coding_session, turn_ranges
from lossless_context.demo.host_driver import R19Host


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_doctor_finds_and_repairs(tmp_path, request, backend):
    location = request.getfixturevalue("pg_fresh_dsn") if backend == "postgres" else str(tmp_path / "l.db")
    e = LCMEngine(config=LCMConfig.load({"store": location, "summarizer": "extractive"}, read_file=False))
    host = R19Host(e)
    host.start(context_length=64_000)
    msgs = coding_session(600, seed=8).messages
    for a, b in turn_ranges(msgs):
        host.add(*msgs[a:b])
        host.maybe_compress()
    host.end()
    assert host.compactions >= 1
    rep = run_doctor(e.store)
    assert rep.ok, rep.render_text()

    # a stored message outside every context and summary, and a stage left by a dead process
    [orphan] = e.store.append_messages(host.session_id, [new_message({"role": "user", "content": "stray"}, 25_000, 600)])
    version, ctx = e.store.get_context(host.session_id)
    e.store.stage_pass(host.session_id, "dead-pass", [NewSummary("k", "leaf", 0, "x", 1, 1, "deterministic",
                       "extractive", None, None, 1, message_ids=[orphan])], [("s", "k")], version, len(ctx))
    # a fresh stage covers the orphan: reachable (its pass may still be committed)
    assert run_doctor(e.store).ok
    e.store.discard_pass("dead-pass")
    rep = run_doctor(e.store)
    assert not rep.ok and "unreachable" in rep.render_text()
    rep = run_doctor(e.store, repair=True)
    assert rep.ok, rep.render_text()
    assert run_doctor(e.store).ok
    assert e.store.get_messages([orphan])[orphan].raw == {"role": "user", "content": "stray"}


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_turn_the_host_did_not_keep_is_information_not_failure(tmp_path, request, backend):
    """A turn handed to the engine, then killed before the host saved it: the resumed host
    continues without it. Its messages stay stored (and searchable); the doctor says so as
    information and stays healthy; a real gap (the newest rows, no context) still fails."""
    location = request.getfixturevalue("pg_fresh_dsn") if backend == "postgres" else str(tmp_path / "l.db")
    cfg = LCMConfig.load({"store": location, "summarizer": "extractive"}, read_file=False)
    msgs = coding_session(300, seed=2).messages
    users = [i for i, m in enumerate(msgs) if m["role"] == "user"]
    e = LCMEngine(config=cfg)
    e.on_session_start("s1")
    e.on_session_end("s1", msgs[:users[3]])
    e.on_session_end("s1", msgs[:users[4]])  # the turn the kill lost on the host's side
    e.store.close()
    e2 = LCMEngine(config=cfg)
    e2.on_session_start("s1")
    e2.on_session_end("s1", msgs[:users[3]] + msgs[users[5]:users[6]])  # the resumed host's list
    rep = run_doctor(e2.store)
    assert rep.ok, rep.render_text()
    # To the engine the lost turn looks like a rollback at the end of the context (the host's
    # list goes on from before it): its messages are kept as retracted records (hidden from
    # search, restored if the host sends them again), which the doctor does not count as damage.
    hidden = e2.store.retracted(e2.store.session_message_ids("s1"))
    assert len(hidden) == users[4] - users[3]
    assert not [c for c in rep.checks if not c.ok]
    # still stored
    assert e2.store.stats()["messages"] == users[4] + (users[6] - users[5])
    # the newest rows outside every context are still a failure
    [orphan] = e2.store.append_messages("s1", [new_message({"role": "user", "content": "stray"}, 25_000, 900)])
    rep = run_doctor(e2.store)
    assert not rep.ok and "1 unreachable" in rep.render_text()


def _chain_session(store, n_leaves: int) -> tuple[str, int, list[int]]:
    """A 0.1.x-style chain: each node condenses the previous top with the newest leaf."""
    from lossless_context.store.owners import new_pass_id

    msgs = coding_session(20 * n_leaves, seed=4).messages
    e = LCMEngine(config=LCMConfig.load({"store": store.location, "summarizer": "extractive"}, read_file=False))
    e.on_session_start("old")
    e.on_session_end("old", msgs)
    e.store.close()
    version, ctx = store.get_context("old")
    mids = [c.ref for c in ctx if c.kind == "m"]
    per = len(mids) // (n_leaves + 1)
    new = []
    for i in range(n_leaves):
        span = mids[i * per:(i + 1) * per]
        new.append(NewSummary(f"l{i}", "leaf", 0, f"leaf {i} about ERR_CHAIN_{i}", 8, 100, "deterministic",
                              "extractive", None, None, len(span), message_ids=span))
    top: str = "l0"
    for i in range(1, n_leaves):
        new.append(NewSummary(f"c{i}", "condensed", i, f"chain {i}", 4, 10, "deterministic", "extractive",
                              None, None, (i + 1) * per, child_keys=[top, f"l{i}"]))
        top = f"c{i}"
    rest = mids[n_leaves * per:]
    pid = new_pass_id("chain-maker")
    keymap, _ = store.stage_pass("old", pid, new, [("s", top)] + [("m", m) for m in rest], version, len(ctx))
    assert store.publish_pass(pid)
    return "old", keymap[top], [keymap[f"c{i}"] for i in range(1, n_leaves)]


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_doctor_reports_depth_against_bound_and_rebalances_a_chain(tmp_path, request, backend):
    from lossless_context.pipeline.dag_balance import depth_bound
    from lossless_context.store import open_store
    from tests.support.dagcheck import assert_connected

    location = request.getfixturevalue("pg_fresh_dsn") if backend == "postgres" else str(tmp_path / "l.db")
    store = open_store(location)
    sid, top, chain = _chain_session(store, 12)
    name = "summary DAG depth within ⌈log_4(leaves)⌉ + 1"
    rep = run_doctor(store)
    [chk] = [c for c in rep.checks if c.name == name]
    assert rep.ok and chk.info and "depth 11 over 12 leaves, bound 3" in chk.detail
    ids_before = set(store.get_summaries(chain + [top]))

    rep = run_doctor(store, repair=True)
    assert rep.ok, rep.render_text()
    [chk] = [c for c in rep.checks if c.name == name]
    assert chk.repaired and not chk.info
    rec = store.get_summaries([top])[top]
    assert rec.depth <= depth_bound(12, 4) and rec.text == "chain 11"  # same id, same text
    assert set(store.get_summaries(chain + [top])) == ids_before  # no id lost
    assert_connected(store, sid)  # every message reached exactly once from the context
    # every node under the top has children of one depth, one below its own
    stack = [top]
    while stack:
        nid = stack.pop()
        kids, _mids = store.summary_children(nid)
        if kids:
            depths = {r.depth for r in store.get_summaries(kids).values()}
            assert depths == {store.get_summaries([nid])[nid].depth - 1}, (nid, depths)
            assert 2 <= len(kids) <= 4
        stack.extend(kids)
    again = run_doctor(store)
    assert again.ok and not [c for c in again.checks if c.info]
    # the chain's old nodes still open (ids valid) and search still finds the leaves' facts
    e = LCMEngine(config=LCMConfig.load({"store": location, "summarizer": "extractive"}, read_file=False))
    e.on_session_start(sid)
    assert "error" not in e.handle_tool_call("lcm_describe", {"id": f"s{chain[3]}"})
    assert "ERR_CHAIN_5" in e.handle_tool_call("lcm_grep", {"query": "ERR_CHAIN_5"})


def _old_style_merge_damage(e: LCMEngine, sid: str) -> tuple[int, list[int]]:
    """What engines before this one did when the host merged a user-role block into the head's
    last user message (issue #39): stored the merged text as a message, took that head message
    out of the context (under no summary) and listed the block's summaries again. Returns (the
    head message, the copies)."""
    store = e.store
    _v, ctx = store.get_context(sid)
    recs = store.get_messages([x.ref for x in ctx if x.kind == "m"])
    first_s = next(i for i, x in enumerate(ctx) if x.kind == "s")
    head = ctx[first_s - 1]
    assert head.kind == "m" and recs[head.ref].role == "user"
    nodes = [x.ref for x in ctx if x.kind == "s"]
    block = f'<lcm-summary nodes="{",".join(f"s{n}" for n in nodes)}">\n[Lossless context: …]\n</lcm-summary>'
    merged = {"role": "user", "content": recs[head.ref].raw["content"] + "\n\n" + block}
    after = next(x for x in ctx[first_s:] if x.kind == "m" and recs[x.ref].role == "user")
    both = {"role": "user", "content": block + "\n\n" + recs[after.ref].raw["content"]}
    copies = store.append_messages(sid, [new_message(merged, 25_000, 600), new_message(both, 25_000, 600)])
    damaged = [x for x in ctx if x.ref != head.ref or x.kind != "m"]
    damaged = damaged[:first_s - 1] + [x for x in damaged if x.kind == "s"] + damaged[first_s - 1:]
    store.set_context(sid, damaged)
    return head.ref, copies


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_doctor_tells_a_merge_from_a_turn_not_kept_and_repairs_block_copies(tmp_path, request, backend):
    from lossless_context.pipeline.unmerge import split
    from tests.support.dagcheck import assert_connected

    location = request.getfixturevalue("pg_fresh_dsn") if backend == "postgres" else str(tmp_path / "m.db")
    e = LCMEngine(config=LCMConfig.load({"store": location, "summarizer": "extractive"}, read_file=False))
    host = R19Host(e)
    host.start(context_length=64_000)
    for i in range(40):  # plain turns: the head ends with the second question
        host.add({"role": "user", "content": f"Turn {i}: fact KILO-{i}; go on."},
                 {"role": "assistant", "content": f"Noted KILO-{i}. " + " ".join(f"w{i}x{k}" for k in range(1500))})
        host.maybe_compress()
    host.end()
    sid = host.session_id
    assert host.compactions >= 1 and run_doctor(e.store).ok
    head, copies = _old_style_merge_damage(e, sid)
    # a copy holding text stored nowhere else is kept: deleting it would lose that text
    [unique] = e.store.append_messages(sid, [new_message(
        {"role": "user", "content": "only here\n\n" + split(e.store.get_messages([copies[0]])[copies[0]].raw)[1]},
        25_000, 600)])

    rep = run_doctor(e.store)
    text = rep.render_text()
    assert not rep.ok and "no summary block stored as a message" in text
    assert f"m{head}" in text and "not a turn the host did not keep" in text
    assert "left out" not in text  # (the old report: "a turn the host did not keep")

    rep = run_doctor(e.store, repair=True)
    assert rep.ok, rep.render_text()
    assert "2 copies deleted" in rep.render_text() and f"m{unique}" in rep.render_text()
    assert "info" in run_doctor(e.store).render_text().split("no summary block stored as a message")[0][-12:]
    after = run_doctor(e.store)
    assert after.ok and "FAIL" not in after.render_text(), after.render_text()
    left = [m.id for m in e.store.iter_all_messages() if '<lcm-summary nodes="' in m.text]
    assert left == [unique] and not set(copies) & {m.id for m in e.store.iter_all_messages()}
    _v, ctx = e.store.get_context(sid)
    kinds = [(x.kind, x.ref) for x in ctx]
    assert ("m", head) in kinds and kinds.index(("m", head)) == next(i for i, k in enumerate(kinds) if k[0] == "s") - 1
    assert len({k for k in kinds if k[0] == "s"}) == sum(1 for k in kinds if k[0] == "s")  # no summary twice
    e.store.forget_records([], [unique], [], {})  # (the test's own extra row)
    assert_connected(e.store, sid)


def _stored(location: str, n: int = 200) -> LCMEngine:
    e = LCMEngine(config=LCMConfig.load({"store": location, "summarizer": "extractive"}, read_file=False))
    host = R19Host(e)
    host.start(context_length=64_000)
    msgs = coding_session(n, seed=3).messages
    for a, b in turn_ranges(msgs):
        host.add(*msgs[a:b])
        host.maybe_compress()
    host.end()
    return e


def test_one_doctor_the_same_checks_on_both_backends(tmp_path, pg_fresh_dsn):
    """One doctor: after the lines only the backend can tell (`Store.self_checks`), both
    backends report the same checks in the same order."""
    names = {}
    for backend, location in (("sqlite", str(tmp_path / "l.db")), ("postgres", pg_fresh_dsn)):
        e = _stored(location)
        own = [c.name for c in e.store.self_checks()]
        got = [c.name for c in run_doctor(e.store).checks]
        assert own and got[:len(own)] == own, (backend, got)
        names[backend] = got[len(own):]
    assert names["sqlite"] == names["postgres"]
    assert {"every summary has sources", "summary DAG has no cycles", "no stale staged work",
            "every message reachable from a context or the DAG", "schema migrations",
            "no interrupted prune"} <= set(names["sqlite"])


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_one_repair_drops_a_stale_pass_and_reattaches_what_it_held(tmp_path, request, backend):
    """A stage left by a dead process an hour ago held the only reference to a message: one
    `--repair` discards the stage and re-attaches the message (the next doctor is healthy)."""
    location = request.getfixturevalue("pg_fresh_dsn") if backend == "postgres" else str(tmp_path / "l.db")
    e = _stored(location, 120)
    sid = e.store.list_sessions()[0]["id"]
    [orphan] = e.store.append_messages(sid, [new_message({"role": "user", "content": "stray"}, 25_000, 600)])
    version, ctx = e.store.get_context(sid)
    e.store.stage_pass(sid, "dead-pass", [NewSummary("k", "leaf", 0, "x", 1, 1, "deterministic", "extractive", None,
                                                     None, 1, message_ids=[orphan])], [("s", "k")], version, len(ctx))
    e.store.write_rows(lambda ex: ex("UPDATE staged_passes SET created_at = 0 WHERE pass_id = ?", ("dead-pass",)))
    rep = run_doctor(e.store)
    assert [c.name for c in rep.checks if not c.ok] == ["no stale staged work"], rep.render_text()
    rep = run_doctor(e.store, repair=True)
    assert rep.ok, rep.render_text()
    assert {c.name for c in rep.checks if c.repaired} == {"no stale staged work",
                                                          "every message reachable from a context or the DAG"}
    assert run_doctor(e.store).ok, run_doctor(e.store).render_text()
    assert ("m", orphan) in [(x.kind, x.ref) for x in e.store.get_context(sid)[1]]
