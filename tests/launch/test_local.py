"""The local mesh's procs: their OpenMP spin is short unless the user chose a wait policy (`launch.shared_cores`)."""

from __future__ import annotations

import os

from forge_nb.launch import shared_cores
from forge_nb.launch.local import LocalMesh
from forge_nb.launch.shared_cores import proc_env
from forge_nb.runtime.calls import wait
from tests.conftest import child_processes, wait_no_children
from tests.fleet.probe import EnvProbe


def test_procs_spin_briefly_unless_the_user_set_a_wait_policy(monkeypatch):
    for name in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY"):  # the suite sets OMP_WAIT_POLICY (conftest.py)
        monkeypatch.delenv(name, raising=False)
    assert proc_env() == {"GOMP_SPINCOUNT": shared_cores.SPINCOUNT}
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert proc_env() == {}
    monkeypatch.delenv("OMP_WAIT_POLICY")
    monkeypatch.setenv("GOMP_SPINCOUNT", "5")
    assert proc_env() == {}


def test_a_spawned_proc_has_the_short_spin_and_the_kernel_keeps_its_own(monkeypatch):
    for name in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY"):
        monkeypatch.delenv(name, raising=False)
    before = frozenset(p.pid for p in child_processes())
    mesh = LocalMesh()
    try:
        probe = mesh.spawn("probe", EnvProbe, None)
        assert wait(probe.env.call_one("GOMP_SPINCOUNT")) == shared_cores.SPINCOUNT
        assert "GOMP_SPINCOUNT" not in os.environ  # set in the procs only
    finally:
        assert mesh.stop() == []
    assert wait_no_children(exclude=before) == []


def test_a_mesh_whose_fork_server_ended_before_its_first_spawn_starts_fresh_procs():
    import psutil

    before = frozenset(p.pid for p in child_processes())
    mesh = LocalMesh()
    server = mesh.forks
    server.proc.kill()
    server.proc.wait(30)
    try:
        probe = mesh.spawn("probe", EnvProbe, None)
        line = psutil.Process(wait(probe.pid.call_one())).cmdline()
        assert mesh.forks is None and "forge_nb.launch.forks.server" not in line and not server.folder.exists()
    finally:
        assert mesh.stop() == []
    assert wait_no_children(exclude=before) == []


def test_procs_a_replace_killed_are_no_fault_when_monarch_reports_them_later_and_the_new_ones_are():
    """Monarch reports a killed proc ~10 s after the kill, after `replace` returned: that report is of the
    old actor mesh (retired), not of the role's new procs; a kill of a new proc is still a fault."""
    import signal
    import time

    from forge_nb.runtime.supervision import FAULTS, install, mesh_name

    install()
    before = frozenset(p.pid for p in child_processes())
    mesh, seen = LocalMesh(), len(FAULTS)
    try:
        old = mesh.spawn("probe", EnvProbe, None, procs=2)
        old_name = mesh_name(old)
        new = mesh.replace("probe", EnvProbe, None, list(wait(old.pid.call()).values()), procs=2, kill=True)
        assert mesh_name(new) not in (None, old_name)
        os.kill(wait(new.slice(procs=1).pid.call_one()), signal.SIGKILL)
        deadline = time.monotonic() + 60
        while not FAULTS.since(seen) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(2.0)  # the old procs were killed first: their report, were it kept, would be in by now
        assert [f.mesh for f in FAULTS.since(seen) if f.role == "probe"] == [mesh_name(new)]
    finally:
        mesh.stop()
    assert wait_no_children(exclude=before) == []
