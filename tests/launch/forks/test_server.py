"""The fork server and its client (`forge_nb.launch.forks.server`, `forkclient`), on a test module in place
of Monarch's proc main: what a forked proc sees, how it ends, and that nothing outlives its client."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from forge_nb.launch.forks import server as forkserver
from forge_nb.launch.forks.server import ForkServer
from tests.conftest import wait_gone

MODULE = "tests.launch.forks.forked_main"
ROOT = Path(__file__).parents[3]


@pytest.fixture(scope="module")
def server():
    forks = ForkServer({"PYTHONPATH": str(ROOT)})  # one for the module: it takes each test's client as a proc's
    yield forks
    forks.stop()
    assert not forks.folder.exists() and forks.proc.poll() is not None


def client(forks: ForkServer, tmp_path: Path, **env: str) -> subprocess.Popen:
    """A proc started the way Monarch starts one: the bootstrap command, its own environment and cwd."""
    path = forks.path if forks is not None else str(tmp_path / "no-server" / "sock")
    return subprocess.Popen(
        [sys.executable, "-m", "forge_nb.launch.forks.client", path, MODULE],
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        cwd=tmp_path,
        stdout=subprocess.PIPE,
    )


def test_a_forked_proc_has_the_clients_environment_directory_and_output_and_its_exit_code(server, tmp_path):
    proc = client(server, tmp_path, FORKED="report", FOO="bar")
    out, _ = proc.communicate(timeout=60)
    seen = json.loads(out)
    assert proc.returncode == 3
    assert seen["foo"] == "bar" and seen["cwd"] == str(tmp_path)
    assert seen["torch"] and seen["pid"] != proc.pid  # forked from the server, torch already imported


def test_a_server_is_ready_once_its_imports_are_done_and_forks_for_a_client_after_the_probe(server, tmp_path):
    assert server.wait_ready()
    assert any("libtorch" in m.path for m in psutil.Process(server.proc.pid).memory_maps())  # imported by now
    proc = client(server, tmp_path, FORKED="report")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 3 and json.loads(out)["torch"]


def test_a_server_that_ended_is_not_ready():
    forks = ForkServer()
    forks.proc.kill()
    forks.proc.wait(30)
    try:
        assert not forks.wait_ready()
    finally:
        forks.stop()


def test_without_a_server_the_client_runs_the_module_itself(tmp_path):
    proc = client(None, tmp_path, FORKED="report", FOO="plain")
    out, _ = proc.communicate(timeout=60)
    seen = json.loads(out)
    assert proc.returncode == 3 and seen["foo"] == "plain" and seen["pid"] == proc.pid and not seen["torch"]


def _started(proc: subprocess.Popen, pidfile: Path) -> int:
    deadline = time.monotonic() + 60
    while not pidfile.exists() or not pidfile.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, "the forked proc did not start"
        time.sleep(0.05)
    return int(pidfile.read_text())


def test_a_signal_to_the_client_reaches_the_proc_and_the_client_exits_as_it_did(server, tmp_path):
    pidfile = tmp_path / "pid"
    proc = client(server, tmp_path, FORKED="wait", FORKED_PIDFILE=str(pidfile))
    child = _started(proc, pidfile)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 7
    assert wait_gone([child]) == []


def test_a_killed_client_takes_its_proc_with_it(server, tmp_path):
    pidfile = tmp_path / "pid"
    proc = client(server, tmp_path, FORKED="wait", FORKED_PIDFILE=str(pidfile))
    child = _started(proc, pidfile)
    proc.kill()  # SIGKILL: nothing forwarded; the proc's lifeline sees the client gone
    proc.wait(30)
    assert wait_gone([child]) == []


def test_a_killed_proc_ends_its_client_by_the_same_signal(server, tmp_path):
    pidfile = tmp_path / "pid"
    proc = client(server, tmp_path, FORKED="wait", FORKED_PIDFILE=str(pidfile))
    os.kill(_started(proc, pidfile), signal.SIGKILL)
    assert proc.wait(30) == -signal.SIGKILL


def test_the_server_exits_when_the_process_that_started_it_is_gone(tmp_path):
    starter = (
        "import sys; from forge_nb.launch.forks.server import ForkServer; "
        "forks = ForkServer(); print(forks.proc.pid, forks.folder, flush=True); sys.stdin.read()"
    )
    parent = subprocess.Popen([sys.executable, "-c", starter], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    pid, folder = parent.stdout.readline().split()
    assert psutil.pid_exists(int(pid))
    parent.kill()  # no stop(): the server's standard input closes with its parent
    parent.wait(30)
    assert wait_gone([int(pid)], timeout=30) == []
    assert not Path(folder.decode()).exists()  # the server took its socket's folder with it


def test_a_server_given_a_socket_in_a_shared_folder_removes_only_its_socket(tmp_path):
    (tmp_path / "keep.txt").write_text("someone else's")
    sock = tmp_path / "sock"
    server = subprocess.Popen([sys.executable, "-m", "forge_nb.launch.forks.server", str(sock)], stdin=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not sock.exists():
        assert server.poll() is None and time.monotonic() < deadline, "the server did not bind its socket"
        time.sleep(0.05)
    server.stdin.close()  # as when its kernel is gone
    assert server.wait(30) == 0
    assert not sock.exists() and (tmp_path / "keep.txt").read_text() == "someone else's"


def test_a_released_server_lingers_for_the_next_acquire_with_the_same_environment(monkeypatch):
    monkeypatch.setenv(forkserver.LINGER_ENV, "60")
    first = forkserver.acquire({"FORKED": "a"})
    forkserver.release(first)
    assert forkserver.idle_pids() == [first.proc.pid]
    assert forkserver.acquire({"FORKED": "a"}) is first and forkserver.idle_pids() == []
    forkserver.release(first)
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "another")  # read by no import: the server still serves
    assert forkserver.acquire({"FORKED": "a"}) is first
    forkserver.release(first)
    second = forkserver.acquire({"OMP_NUM_THREADS": "3"})  # read when torch loads: a new server
    assert second is not first and first.proc.poll() is not None and not first.folder.exists()
    monkeypatch.setenv(forkserver.LINGER_ENV, "0.2")
    forkserver.release(second)
    assert wait_gone([second.proc.pid]) == [] and forkserver.idle_pids() == []


def test_without_linger_a_released_server_stops(monkeypatch):
    monkeypatch.setenv(forkserver.LINGER_ENV, "0")
    forks = forkserver.acquire({})
    forkserver.release(forks)
    assert forks.proc.poll() is not None and forkserver.idle_pids() == []


def test_a_client_whose_server_died_runs_the_module_itself_within_a_second(tmp_path):
    dead = ForkServer({"PYTHONPATH": str(ROOT)})
    while not Path(dead.path).exists():
        time.sleep(0.02)
    dead.proc.kill()  # its socket file stays, no one listens
    dead.proc.wait()
    start = time.monotonic()
    proc = client(dead, tmp_path, FORKED="report", FOO="after")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 3 and json.loads(out)["pid"] == proc.pid
    assert time.monotonic() - start < 10
    dead.stop()
