"""Stage ownership (lossless_context/store/owners.py): who may discard or publish a staged pass."""

from __future__ import annotations

import gc
import subprocess
import sys
import time

from lossless_context.store import owners


class _Engine:  # any object stands for an engine: ownership only needs it to be alive
    pass


def test_own_and_legacy_stages_are_never_held_by_another():
    e = _Engine()
    me = owners.register(e)
    assert not owners.held_by_other(owners.new_pass_id(me), time.time(), me)
    assert not owners.held_by_other("0123abcd", time.time(), me)  # from before owners were recorded
    assert owners.pass_owner(owners.new_pass_id(None)) is None


def test_live_engine_of_this_process_holds_its_stage_until_it_is_gone():
    me = owners.register(_Engine())
    other = _Engine()
    pid = owners.new_pass_id(owners.register(other))
    assert owners.pass_owner(pid) and owners.held_by_other(pid, time.time(), me)
    del other
    gc.collect()
    assert not owners.held_by_other(pid, time.time(), me)


def test_dead_process_holds_nothing_and_another_machine_holds_for_a_while():
    p = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(p.stdout)
    host = owners._HOST
    dead = f"deadbeef@{host}:{dead_pid}:tok"
    assert not owners.held_by_other(dead, time.time(), None)
    remote = "cafe@other-machine:1:tok"
    assert owners.held_by_other(remote, time.time(), None)
    assert not owners.held_by_other(remote, time.time() - owners.REMOTE_STAGE_TTL - 1, None)
    assert not owners.held_by_other("cafe@garbage", time.time(), None)
