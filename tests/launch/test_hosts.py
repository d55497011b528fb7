"""A session across three hosts (network namespaces on one bridge, `forge_nb.testing.netns_hosts`):
generator, trainer (a gang of 2 procs, each publishing its shards) and reward procs each on a host of
its own, weights over both trainer ranks' TCP streams, the trainer's link taken down mid-refresh, a
slow link, and the generator's proc killed on its host. The module's session is started by its
fixture, so each test runs alone and in any order; the fixture's end checks that `%forge down` leaves
no proc on any host.

The session runs in a real kernel started by the test: Monarch fixes a process's transport at its
first call, and a hosts session listens on TCP, so it must be the first Monarch use of its process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from forge_nb.launch.credentials import Credentials
from forge_nb.testing import netns_hosts
from tests.conftest import forked_roles, worker_fork_servers
from tests.notebook.kernel import Kernel

ROOT = Path(__file__).resolve().parents[2]
PORT = 26600  # inside each namespace: its own network stack, so no other test can hold it


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    """Three namespace hosts, each running a forge_nb worker holding the module's credentials; everything
    removed after the module."""
    reason = netns_hosts.unavailable_reason()
    if reason:
        pytest.skip(f"network namespaces cannot be made here: {reason}")
    hosts = netns_hosts.HostNet(3, f"t{os.getpid() % 100000}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    credentials = str(Credentials.new(tmp_path_factory.mktemp("hosts") / "credentials").folder)
    workers = []
    try:
        hosts.up()
        workers = [
            subprocess.Popen(h.worker_args(PORT, credentials), env=env, stdout=subprocess.DEVNULL) for h in hosts.hosts
        ]
        yield hosts, workers, credentials
    finally:
        for w in workers:
            w.kill()
            w.wait()
        hosts.down()
        assert netns_hosts.namespaces(hosts.tag) == []


@pytest.fixture(scope="module")
def kernel(net):
    """A real kernel holding a session across the three hosts (trainer, generator, reward procs on h1, h2,
    h3); at the end `%forge down` must leave no proc on any host but its worker (and the worker's fork server,
    which lives as long as the worker: `forge_nb.launch.forks.on_workers`)."""
    hosts, workers, credentials = net
    k = Kernel()
    try:
        k.ok("%load_ext forge_nb")
        k.ok("from forge_nb.runtime import lifecycle; import json")
        addresses = ",".join(f"tls://{h.ip}:{PORT}" for h in hosts.hosts)
        k.ok(
            f"%forge up --hosts {addresses} --credentials {credentials} trainer_procs=2 prompts_per_step=4 "
            "group_size=4 threads_per_proc=1 weights.stream_timeout_s=1.0",
            timeout=300,
        )
        k.ok("s = lifecycle.current()")
        yield k
        k.ok("%forge down", timeout=120)
        _assert_only_workers_left(hosts, workers)
    finally:
        k.run("%forge down")
        k.stop()


def _assert_only_workers_left(hosts, workers) -> None:
    deadline = time.monotonic() + 20
    while True:
        inside = {h.netns: set(netns_hosts.pids_inside(h.netns)) for h in hosts.hosts}
        left = {ns: pids - {w.pid, *worker_fork_servers(w.pid)} for (ns, pids), w in zip(inside.items(), workers)}
        if not any(left.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not any(left.values()), f"procs left on the hosts after %forge down: {left}"


def test_session_across_three_hosts_steps_and_refreshes(net, kernel):
    hosts, _, _ = net
    status = kernel.json("s.status()")
    placed = {role: status["hosts"][role][0].split(":")[0] for role in ("trainer", "generator", "reward")}
    assert placed == {"trainer": hosts.hosts[0].ip, "generator": hosts.hosts[1].ip, "reward": hosts.hosts[2].ip}
    assert status["weights_transport"] == "tcp"
    # Each worker forked the trainer's and the generator's procs from its fork server; the reward worker
    # (no torch) started fresh (`PlacedMesh.fork_args`).
    assert forked_roles(status) == {"trainer": True, "generator": True, "reward": False}
    version = kernel.json("s.trainer_version")
    kernel.ok("%forge step 2", timeout=300)
    sums = kernel.json("s.checksums()")
    assert sums["generator"] == sums["trainer"] and sums["trainer"][0] == version + 2


def test_trainer_link_down_mid_refresh_keeps_the_served_version_then_recovers(net, kernel):
    hosts, _, _ = net
    served = kernel.json("s.checksums()['generator']")
    replaced = "len([e for e in s.metrics_stream.rows('event') if e['role'] != 'security'])"
    v, events = kernel.json(f"[s.trainer_version, {replaced}]")
    kernel.ok("m = s.train(s.rollout())", timeout=300)  # the trainer publishes v + 1; the generator serves v
    hosts.slow("h1", rate_mbit=16)  # the 1.7 MB copy takes ~1 s: the link goes down in the middle of it
    threading.Timer(0.3, hosts.link, ("h1", False)).start()
    try:
        text = kernel.ok("try:\n    s.sync()\nexcept Exception as e:\n    print('SYNC FAILED', e)", timeout=120)
        assert "SYNC FAILED" in text and f"policy v{v} stays live" in text and "failed 3 times" in text
        # the generator's alone: the trainer's host is away
        assert kernel.json("s.checksums('generator')['generator']") == served  # not a byte loaded
    finally:
        hosts.link("h1", True)
        hosts.slow("h1")
    report = kernel.json("s.sync()")
    assert report["version"] == v + 1 and report["transport"] == "tcp"
    sums = kernel.json("s.checksums()")
    assert sums["generator"] == sums["trainer"] and sums["trainer"][0] == v + 1
    assert kernel.json(replaced) == events  # no proc was replaced


def test_brief_outage_mid_refresh_is_retried(net, kernel):
    hosts, _, _ = net
    kernel.ok("m = s.train(s.rollout())", timeout=300)
    v = kernel.json("s.trainer_version")
    hosts.slow("h1", rate_mbit=16)
    threading.Timer(0.3, hosts.link, ("h1", False)).start()
    threading.Timer(1.5, hosts.link, ("h1", True)).start()
    try:
        report = kernel.json("s.sync()")
    finally:
        time.sleep(1.5)
        hosts.link("h1", True)
        hosts.slow("h1")
    assert report["version"] == v and report["seconds"] > 1.0  # the copy stalled, then went through
    assert len(kernel.json("s.step(1)['policy_version'].tolist()")) == 1


def test_a_generator_killed_on_its_host_is_started_afresh_there(net, kernel):
    hosts, workers, _ = net
    host = hosts.hosts[1]  # the generator's
    procs = set(netns_hosts.pids_inside(host.netns)) - {workers[1].pid}
    assert procs, "the generator's host runs no proc besides its worker"
    for pid in procs:
        os.kill(pid, signal.SIGKILL)
    version = kernel.json("s.trainer_version")
    kernel.ok("rows = s.step(1, progress=False)", timeout=300)
    status = kernel.json("s.status()")
    assert any(e["role"] == "generator" for e in status["events"]), status["events"]
    assert status["hosts"]["generator"][0].split(":")[0] == host.ip  # its host's worker started it again
    sums = kernel.json("s.checksums()")
    assert sums["generator"] == sums["trainer"] and sums["trainer"][0] == version + 1


def test_a_slow_link_slows_the_refresh_and_the_run_goes_on(net, kernel):
    hosts, _, _ = net
    fast = kernel.json("s.step(1, progress=False)[['refresh_s', 'refresh_gbps']].iloc[-1].tolist()")
    hosts.slow("h1", rate_mbit=16)  # the trainer's host sends at 2 MB/s: ~1 s for the ~1.7 MB refresh
    try:
        slow = kernel.json("s.step(1, progress=False)[['refresh_s', 'refresh_gbps']].iloc[-1].tolist()")
    finally:
        hosts.slow("h1")
    assert slow[0] > max(0.5, 3 * fast[0]) and slow[1] < fast[1] / 3, (fast, slow)  # the step row says it
    sums = kernel.json("s.checksums()")
    assert sums["generator"] == sums["trainer"]
