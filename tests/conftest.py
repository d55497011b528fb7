"""Shared fixtures: one local session per module, and the check that nothing is left running."""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil
import pytest

from forge_nb.launch.forks import server as forkserver
from forge_nb.server import zygote
from forge_nb.session import Session


def child_processes(exclude: frozenset[int] = frozenset()) -> list[psutil.Process]:
    """Live (non-zombie) descendants of this test process, but for the pids in `exclude`, the idle fork server
    that lingers for the next session (conftest.py) and the zygotes that fork session servers (they outlive
    sessions by design: `forge_nb.server.zygote`). A proc or server either forked and left running still counts."""
    alive = []
    exclude = exclude | set(forkserver.idle_pids()) | set(zygote.pids())
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and p.pid not in exclude:
                alive.append(p)
        except psutil.NoSuchProcess:
            pass
    return alive


def worker_fork_servers(worker: int) -> list[int]:
    """The fork servers of the host worker with pid `worker` (`forge_nb.launch.forks.on_workers`: they live as long
    as it does, and their socket is named after it), not the procs they forked (which carry the same command
    line; a server leads a session of its own)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        line = p.info["cmdline"] or []
        if "forge_nb.launch.forks.on_workers" not in line[:-1]:
            continue
        socket_name = Path(line[line.index("forge_nb.launch.forks.on_workers") + 1]).name
        try:
            if socket_name.startswith(f"w{worker}-") and os.getsid(p.pid) == p.pid:
                found.append(p.pid)
        except OSError:  # it ended meanwhile
            pass
    return found


def forked_roles(status: dict, roles: tuple[str, ...] = ("trainer", "generator", "reward")) -> dict[str, bool]:
    """Each of `roles` of a session's `status()` -> whether all its procs were forked from a fork server
    (a forked proc carries the server's command line)."""
    forked: dict[str, bool] = {}
    for r in status["placement"]:
        line = psutil.Process(r["pid"]).cmdline()
        here = "forge_nb.launch.forks.server" in line or "forge_nb.launch.forks.on_workers" in line
        forked[r["role"]] = forked.get(r["role"], True) and here
    return {role: forked[role] for role in roles}


def wait_gone(pids: list[int], timeout: float = 10.0) -> list[int]:
    """Wait up to `timeout` s for the processes `pids` (children or not) to exit -> those still alive."""
    deadline = time.monotonic() + timeout
    while (left := [p for p in pids if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_no_children(timeout: float = 10.0, exclude: frozenset[int] = frozenset()) -> list[psutil.Process]:
    """Wait up to `timeout` s for every descendant (but `exclude`) to exit -> those still alive."""
    deadline = time.monotonic() + timeout
    while (left := child_processes(exclude)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for p in left:  # shown with the failure: which process, started by what, doing what
        print(f"left running: {describe(p)}")
    return left


def describe(p: psutil.Process) -> str:
    """A process for a failure message: its command line, its parent's, and its threads' names and states."""
    try:
        with p.oneshot():
            parent = p.parent()
            threads = []
            for task in sorted(Path(f"/proc/{p.pid}/task").iterdir()):
                name = (task / "comm").read_text().strip()
                state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
                wchan = (task / "wchan").read_text().strip()
                threads.append(f"{name}:{state}:{wchan}")
            return (
                f"pid {p.pid} {p.cmdline()} status {p.status()}, parent {p.ppid()} "
                f"{parent.cmdline() if parent else None}, threads {threads}"
            )
    except (psutil.Error, OSError) as e:
        return f"pid {p.pid} ({type(e).__name__} while describing it)"


@pytest.fixture(scope="module", autouse=True)
def no_process_left_by_the_module(request):
    """Every module stops what it started: checked once its own fixtures are down (this one, autouse, is set
    up before them and torn down after). Processes an earlier module left are not this one's to answer for."""
    before = frozenset(p.pid for p in child_processes())
    yield
    left = wait_no_children(exclude=before)
    assert left == [], f"{request.module.__name__} left processes running (described above)"


@pytest.fixture(scope="module")
def session():
    """A real local mesh with the bundled model (small batch to keep tests quick)."""

    s = Session.up(prompts_per_step=4, group_size=4, threads_per_proc=1)
    yield s
    s.down()
    assert wait_no_children() == []


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """A real three-node Slurm (munge, slurmctld, a slurmd per namespace host), installed if missing,
    stopped after the module (its daemons are this process's children: other modules' no-process-left
    checks must not see them; it starts in ~2 s)."""
    from tests.slurm_cluster import LocalSlurm, unavailable_reason

    reason = unavailable_reason()
    if reason:
        pytest.skip(f"the test Slurm's nodes are network namespaces, which cannot be made here: {reason}")
    cluster = LocalSlurm(tmp_path_factory.mktemp("slurm")).start()
    yield cluster
    cluster.stop()
