"""The namespace hosts themselves: own addresses, reachable over the bridge, a link that goes down,
and a `down` that removes everything and can run twice."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from forge_nb.testing import netns_hosts

REASON = netns_hosts.unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"network namespaces cannot be made here: {REASON}")

CONNECT = "import socket,sys; socket.create_connection((sys.argv[1], 22222), timeout=1).close(); print('ok')"
LISTEN = "import socket,time; s=socket.create_server(('0.0.0.0', 22222)); time.sleep(30)"


def _connect(host: netns_hosts.Host, to: str) -> bool:
    out = subprocess.run([*host.exec_args(), sys.executable, "-c", CONNECT, to], capture_output=True, text=True)
    return out.stdout.strip() == "ok"


def test_hosts_reach_each_other_until_a_link_goes_down_and_down_removes_everything():
    net = netns_hosts.HostNet(2, f"u{os.getpid() % 100000}")
    try:
        net.up()
        a, b = net.hosts
        assert a.ip != b.ip
        listener = subprocess.Popen([*b.exec_args(), sys.executable, "-c", LISTEN])
        for _ in range(50):
            if _connect(a, b.ip):
                break
        else:
            pytest.fail(f"{a.name} could not reach {b.name} at {b.ip}")
        net.link("h2", up=False)
        assert not _connect(a, b.ip)
        net.link("h2", up=True)
        assert _connect(a, b.ip)
    finally:
        net.down()
        net.down()  # idempotent
    assert listener.wait(timeout=10) is not None  # killed with its namespace
    assert netns_hosts.namespaces(net.tag) == []
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert f"fnb{net.tag}" not in links
