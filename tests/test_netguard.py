"""The suite's guard against outside addresses (tests/support/netguard.py) refuses and records
them, and leaves this machine's addresses alone."""

from __future__ import annotations

import socket
import urllib.request

import pytest

from tests.support import netguard
from tests.support.fake_openai import FakeOpenAI


def test_outside_addresses_are_refused_and_recorded():
    with netguard.installed(netguard.Guard()) as guard:
        with pytest.raises(OSError):
            socket.create_connection(("192.0.2.1", 80), timeout=1)  # (TEST-NET-1: never routed)
        with pytest.raises(OSError):
            urllib.request.urlopen("http://example.invalid/", timeout=1)
        s = socket.socket()
        try:
            assert s.connect_ex(("2001:db8::1", 80) if s.family == socket.AF_INET6 else ("198.51.100.7", 443))
        except OSError:
            pass
        finally:
            s.close()
        seen = guard.take()
    assert any("192.0.2.1" in a for a in seen) and any("example.invalid" in a for a in seen)
    assert any("198.51.100.7" in a for a in seen)
    assert guard.take() == []


def test_this_machines_addresses_pass():
    with netguard.installed(netguard.Guard()) as guard:
        with FakeOpenAI() as srv:
            with urllib.request.urlopen(f"{srv.base_url}/models", timeout=5) as resp:
                assert resp.status == 200
            port = int(srv.base_url.rsplit(":", 1)[1].split("/", 1)[0])
            socket.create_connection(("localhost", port), timeout=5).close()
        assert guard.take() == []

