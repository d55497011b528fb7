"""Nobody else's code on the mesh (#59), on network-namespace hosts (`forge_nb.testing.netns_hosts`): a session on
host h1's worker (TLS, the module's credentials); strangers in h2, another namespace on the same bridge, who know
every address. They cannot start a proc or run code on the worker (a marker file they try to write is never
written, and nothing of them is left on h1), they get no byte of the weights from the trainer's stream, and
garbage and floods on every port -- the worker's, the weights stream's, the session's own Monarch port, its
socket, its agents' endpoint -- leave the session stepping, and say so in its events.

The module's session is started once (by its fixture, through `forge_nb.up`: a server process, whose Monarch
listens on TLS at the bridge's address), the tests run in order and share it; the end checks that `down` leaves
nothing on h1 but its worker and the worker's fork server.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest

import forge_nb
from forge_nb.launch.credentials import Credentials
from forge_nb.testing import netns_hosts
from tests.conftest import worker_fork_servers

pytestmark = [pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
PORT = 26620  # inside h1's namespace: its own network stack
MODES = ("plain", "no-cert", "own-ca")


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    """h1 with a worker holding the module's credentials, h2 with nothing (the strangers' host)."""
    reason = netns_hosts.unavailable_reason()
    if reason:
        pytest.skip(f"network namespaces cannot be made here: {reason}")
    hosts = netns_hosts.HostNet(2, f"x{os.getpid() % 100000}")
    folder = tmp_path_factory.mktemp("security")
    credentials = Credentials.new(folder / "credentials")
    worker = None
    try:
        hosts.up()
        h1 = hosts.hosts[0]
        with open(folder / "worker.log", "wb") as log:
            worker = subprocess.Popen(h1.worker_args(PORT, str(credentials.folder)), env=env(), stdout=log, stderr=log)
        yield hosts, worker, credentials
    finally:
        if worker is not None:
            worker.kill()
            worker.wait()
            report = Path(os.environ.get("TMPDIR", "/tmp")) / f"forge_nb-forks-{os.getuid()}"
            for path in report.glob("w*-refusals.json"):  # the worker's (SIGKILLed: it could not remove it)
                path.unlink(missing_ok=True)
        hosts.down()
        assert netns_hosts.namespaces(hosts.tag) == []


@pytest.fixture(scope="module")
def session(net):
    hosts, worker, credentials = net
    h1 = hosts.hosts[0]
    s = forge_nb.up(
        mesh={"kind": "hosts", "hosts": [f"tls://{h1.ip}:{PORT}"], "credentials": str(credentials.folder)},
        weights={"transport": "tcp"},  # the generator reads the trainer's stream, as across hosts
        prompts_per_step=4,
        group_size=4,
        threads_per_proc=1,
        name=f"security-{os.getpid()}",
        persist=False,
    )
    try:
        yield s
        s.down()
        left = on_h1(hosts, worker)
        deadline = time.monotonic() + 20
        while left and time.monotonic() < deadline:
            time.sleep(0.2)
            left = on_h1(hosts, worker)
        assert not left, f"procs left on h1 after down: {left}"
    finally:
        s.down()


def on_h1(hosts, worker) -> set[int]:
    """The processes in h1's namespace but its worker and the worker's fork server."""
    return set(netns_hosts.pids_inside(hosts.hosts[0].netns)) - {worker.pid, *worker_fork_servers(worker.pid)}


def intrude(hosts, mode: str, marker: Path, own_ca: Path) -> subprocess.Popen:
    """An intruder in h2 trying `mode` against h1's worker."""
    h1, h2 = hosts.hosts
    args = [f"{h1.ip}:{PORT}", h2.ip, str(marker), mode, str(own_ca / mode)]
    command = [*h2.exec_args(), sys.executable, "-m", "tests.launch.intruder", *args]
    return subprocess.Popen(command, env=env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT)


def result(intruder: subprocess.Popen) -> dict:
    out, _ = intruder.communicate(timeout=120)
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    return json.loads(lines[-1].removeprefix("RESULT ")) if lines else {"ran": None, "out": out[-2000:]}


def test_a_stranger_who_knows_the_workers_address_cannot_start_a_proc_or_run_code(net, session, tmp_path):
    hosts, worker, _ = net
    before = on_h1(hosts, worker)
    assert before, "the session runs no proc on h1"
    markers = {mode: tmp_path / f"marker-{mode}" for mode in MODES}
    intruders = {mode: intrude(hosts, mode, markers[mode], tmp_path) for mode in MODES}
    results = {mode: result(p) for mode, p in intruders.items()}
    for mode, got in results.items():
        assert got["ran"] is False and "error" in got, (mode, got)
        assert not markers[mode].exists(), f"the intruder ({mode}) wrote its marker: it ran code on h1"
    assert on_h1(hosts, worker) <= before, "an intruder's proc is running on h1"
    assert worker.poll() is None
    assert len(session.step(1)) == 1  # the session never noticed


def listening(pid: int, address: str | None = None, netns: str | None = None) -> set[int]:
    """TCP ports process `pid` listens on (at `address`), as `ss` sees them in its namespace `netns`."""
    prefix = ["ip", "netns", "exec", netns] if netns else []
    out = subprocess.run([*prefix, "ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    found = set()
    for line in out.splitlines():
        if f"pid={pid}," in line:
            ip, _, port = line.split()[3].rpartition(":")
            if address in (None, ip):
                found.add(int(port))
    return found


def read_without_the_secret(h2, address: str, port: int) -> dict:
    """From h2: the bytes a reader that does not know the secret gets from the weights stream."""
    code = (
        "import socket, struct, sys, os\n"
        "s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)\n"
        "first = s.recv(64)\n"
        "s.sendall(os.urandom(64) + struct.pack('!BQQ', 0, 0, 1 << 20))\n"
        "rest = b''\n"
        "try:\n"
        "    while chunk := s.recv(1 << 16):\n"
        "        rest += chunk\n"
        "except ConnectionResetError:\n"
        "    pass\n"
        "print(len(first), len(rest))\n"
    )
    out = subprocess.run([*h2.exec_args(), sys.executable, "-c", code, address, str(port)], capture_output=True)
    first, rest = map(int, out.stdout.split())
    return {"challenge": first, "after": rest}


FLOOD = """
import os, socket, sys, time
address, ports, hold = sys.argv[1], [int(p) for p in sys.argv[2].split(",")], float(sys.argv[3])
held = []
for port in ports:
    for _ in range(10):  # garbage
        try:
            with socket.create_connection((address, port), timeout=5) as g:
                g.sendall(os.urandom(4096))
        except OSError:
            pass
    for _ in range(150):  # a flood of connections that never say a word
        try:
            held.append(socket.create_connection((address, port), timeout=5))
        except OSError:
            pass
print(len(held), flush=True)
time.sleep(hold)
"""


def flood(prefix: list[str], address: str, ports: list[int], hold_s: float) -> subprocess.Popen:
    """Garbage, then 150 silent connections held `hold_s`, on each of `ports` (from a namespace: `prefix`)."""
    command = [*prefix, sys.executable, "-c", FLOOD, address, ",".join(map(str, ports)), str(hold_s)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, text=True)


def test_no_byte_of_the_weights_without_the_secret_and_floods_leave_the_session_stepping(net, session):
    hosts, worker, _ = net
    h1, h2 = hosts.hosts
    trainer = session.pids["trainer"][0]
    (stream,) = listening(trainer, h1.ip, h1.netns)  # the weights stream, at h1's address only
    assert listening(trainer, None, h1.netns) == {stream}
    got = read_without_the_secret(h2, h1.ip, stream)
    assert got == {"challenge": 32, "after": 0}  # the server's nonce, then nothing: not a byte of a buffer

    server = session._folder.info().pid
    monarch = sorted(listening(server, hosts.gateway))  # the session's Monarch port: the workers dial it back
    assert monarch
    endpoint = urlparse(session.endpoint().url)  # http://127.0.0.1:PORT/v1
    before = len(session.metrics_stream.rows("event"))
    floods = [
        flood(h2.exec_args(), h1.ip, [PORT, stream], hold_s=8),  # the worker's port and the weights stream
        flood(h2.exec_args(), hosts.gateway, monarch, hold_s=8),  # the session's own Monarch port
        flood([], "127.0.0.1", [endpoint.port], hold_s=1),  # its agents' endpoint
    ]
    for _ in range(20):  # its socket (the user's own: strangers cannot open it)
        with socket.socket(socket.AF_UNIX) as conn:
            conn.connect(str(session._folder.socket))
            conn.sendall(os.urandom(256))
    assert all(int(f.stdout.readline()) > 0 for f in floods)
    rows = session.step(2)  # while the connections are held
    assert list(rows["policy_version"]) == [session.trainer_version - 1, session.trainer_version]
    for f in floods:
        f.wait(timeout=60)
    expected = [
        f"worker {h1.ip}:{PORT}: handshake not finished",
        f"weights stream {h1.ip}:{stream}: no secret",
        f"session's Monarch port {hosts.gateway}:",
        f"agents endpoint 127.0.0.1:{endpoint.port}: not HTTP",
        "session socket: ",
    ]
    deadline = time.monotonic() + 60
    while True:  # the session asks its procs at a step boundary, `refusals.POLL_S` after it last did
        events = [e for e in session.metrics_stream.rows("event")[before:] if e["role"] == "security"]
        missing = [e for e in expected if e not in " ".join(row["what"] for row in events)]
        if not missing or time.monotonic() > deadline:
            break
        session.step(1)
        time.sleep(1.0)
    assert not missing, (missing, events)
    times = [e["time"] for e in events]
    assert all(b - a >= 0.99 for a, b in zip(times, times[1:])), times  # at most one a second
    assert worker.poll() is None
    sums = session.checksums()
    assert sums["generator"] == sums["trainer"]
