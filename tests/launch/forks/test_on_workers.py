"""A host worker's fork server (`forge_nb.launch.forks.on_workers`): the first proc a worker starts starts it, the
worker's other procs (now and in later sessions) fork from it, procs whose import variables differ get one
of their own, a dead server's socket is replaced, and the servers end with their worker."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from forge_nb.launch.forks import on_workers as workerforks
from forge_nb.launch.hosts import PlacedMesh
from forge_nb.launch.placement import Host, Placement, Slot
from tests.conftest import wait_gone, worker_fork_servers

ROOT = Path(__file__).parents[3]


class Worker:
    """tests/launch/fake_worker.py: starts procs as its own children, the way Monarch's worker does."""

    def __init__(self, **env: str) -> None:
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), "FORKED": "report", **env}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.launch.fake_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=self.env,
        )
        try:
            self.pid = json.loads(self.proc.stdout.readline())["pid"]
        except Exception:
            self.kill()
            raise

    def start(self, *envs: dict) -> list[dict]:
        """Start one proc per env at once -> what each saw (each exits 3, as tests.launch.forks.forked_main does)."""
        self.proc.stdin.write(json.dumps(list(envs)) + "\n")
        self.proc.stdin.flush()
        done = json.loads(self.proc.stdout.readline())
        assert [code for code, _ in done] == [3] * len(envs), done
        return [seen for _, seen in done]

    def servers(self) -> list[int]:
        return worker_fork_servers(self.pid)

    def sockets(self) -> list[Path]:
        return sorted(workerforks.folder().glob(f"w{self.pid}-*"))

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(30)


def test_a_workers_procs_fork_from_one_server_it_starts_which_ends_with_the_worker():
    worker = Worker()
    try:
        seen = worker.start({"FOO": "0"}, {"FOO": "1"}, {"FOO": "2"})  # a role's procs start together
        servers = worker.servers()
        assert len(servers) == 1, servers
        assert all(s["torch"] and s["ppid"] == servers[0] for s in seen), seen  # forked, torch imported
        assert [s["foo"] for s in seen] == ["0", "1", "2"] and all(s["cwd"] == str(ROOT) for s in seen)
        again = worker.start({"FOO": "next session"})  # the worker's next session: the same server
        assert again[0]["ppid"] == servers[0] and worker.servers() == servers
        other = worker.start({"OMP_NUM_THREADS": "1"})[0]  # read by torch's import: a server of its own
        assert other["torch"] and other["ppid"] not in servers and len(worker.servers()) == 2
        everything = worker.servers()
    finally:
        worker.kill()  # SIGKILL: nothing is told; each server watches its worker
    assert wait_gone(everything, timeout=30) == []
    assert worker.sockets() == []  # each removed its socket and lock file


def test_a_dead_servers_socket_is_replaced_by_a_new_server():
    worker = Worker()
    try:
        path = workerforks.socket_path(worker.pid, worker.env)
        stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stale.bind(path)  # a server killed with its host: the socket file stays, no one listens
        stale.close()
        seen = worker.start({})[0]
        assert seen["torch"] and seen["ppid"] in worker.servers()
    finally:
        worker.kill()
    assert wait_gone([seen["ppid"]], timeout=30) == [] and worker.sockets() == []


def test_a_server_idle_past_its_limit_ends_and_the_next_proc_starts_another():
    worker = Worker(**{workerforks.IDLE_ENV: "1"})
    try:
        first = worker.start({})[0]["ppid"]
        assert wait_gone([first], timeout=30) == []  # no proc for 1 s: it ended, its worker runs on
        assert [p.suffix for p in worker.sockets()] == [".lock"]  # its socket removed, the lock kept
        second = worker.start({})[0]  # (its server may be idle past 1 s again by the time it is looked for)
        assert second["torch"] and second["ppid"] != first
    finally:
        worker.kill()
    assert wait_gone([second["ppid"]], timeout=30) == [] and worker.sockets() == []


def test_a_mesh_over_hosts_names_the_workers_server_for_its_cpu_hosts_only(monkeypatch):
    hosts = (Host("cpu", 0), Host("gpu", 1))
    slots = (Slot("trainer", 0, 0, (), 0), Slot("generator", 0, 1, (0,), 0))
    mesh = PlacedMesh(Placement(hosts, slots))  # not attached to any worker: only its plan is asked here
    assert mesh.fork_args("trainer") == ["-m", "forge_nb.launch.forks.client", "--worker"]
    assert mesh.fork_args("generator") == []  # a host with GPUs: each proc starts CUDA itself
    assert mesh.fork_args("reward") == []  # no torch in a reward worker: no server for it
    monkeypatch.setenv("FORGE_NB_FORK_PROCS", "0")
    assert mesh.fork_args("trainer") == []


def test_a_socket_folder_open_to_others_is_refused_and_the_proc_starts_fresh(tmp_path):
    """Another user could listen there and be sent the proc's environment and standard streams."""
    shared = tmp_path / f"forge_nb-forks-{os.getuid()}"
    shared.mkdir()
    shared.chmod(0o755)
    worker = Worker(XDG_RUNTIME_DIR=str(tmp_path))
    try:
        seen = worker.start({})[0]
    finally:
        worker.kill()
    assert seen["ppid"] == worker.pid and not seen["torch"] and list(shared.iterdir()) == []
