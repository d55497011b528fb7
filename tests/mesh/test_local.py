"""The local mesh's procs: their OpenMP spin is short unless the user chose a wait policy."""

from __future__ import annotations

import os

from forge_nb.mesh import local
from forge_nb.mesh.calls import wait
from forge_nb.mesh.local import LocalMesh, proc_env
from tests.conftest import child_processes, wait_no_children
from tests.mesh.probe import EnvProbe


def test_procs_spin_briefly_unless_the_user_set_a_wait_policy(monkeypatch):
    for name in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY"):  # the suite sets OMP_WAIT_POLICY (conftest.py)
        monkeypatch.delenv(name, raising=False)
    assert proc_env() == {"GOMP_SPINCOUNT": local.SPINCOUNT}
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
        assert wait(probe.env.call_one("GOMP_SPINCOUNT")) == local.SPINCOUNT
        assert "GOMP_SPINCOUNT" not in os.environ  # set in the procs only
    finally:
        assert mesh.stop() == []
    assert wait_no_children(exclude=before) == []
