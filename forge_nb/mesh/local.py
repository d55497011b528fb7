"""Local mesh: one Monarch proc mesh per role on this host, stopped together, or one role replaced."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import psutil
from monarch.actor import ProcMesh, this_host

from forge_nb.mesh import quiet
from forge_nb.mesh.calls import wait
from forge_nb.mesh.supervision import FAULTS

STOP_TIMEOUT_S = 20.0  # a proc whose actor is wedged (a live function spinning) stops by its cleanup deadline


class LocalMesh:
    """Spawns each role (generator, trainer, reward, ...) into its own procs on this host."""

    def __init__(self) -> None:
        quiet.route_native_output()  # before Monarch's first line and the first proc (which inherits it)
        self.proc_meshes: dict[str, ProcMesh] = {}

    def host(self, role: str) -> Any:
        """The host mesh `role`'s procs start on: this host."""
        return this_host()

    def spawn(self, role: str, actor_class: type, spec: Any, procs: int = 1) -> Any:
        """Start `procs` processes for `role` and one `actor_class(spec=spec)` in each -> the actor mesh."""
        proc_mesh = self.host(role).spawn_procs(per_host={"procs": procs}, name=role)
        self.proc_meshes[role] = proc_mesh
        return proc_mesh.spawn(role, actor_class, spec=spec)

    def replace(self, role: str, actor_class: type, spec: Any, pids: list[int], procs: int = 1) -> Any:
        """Stop `role`'s procs (even with an actor stuck in a call: Monarch's cleanup deadline, then
        SIGKILL to any of `pids` still alive on this host) and start fresh ones -> the new actor mesh."""
        old = self.proc_meshes.pop(role, None)
        if old is not None:
            with FAULTS.expecting(role):
                try:
                    wait(old.stop(), STOP_TIMEOUT_S)  # not .get() on the kernel's loop: Monarch warns in the cell
                except Exception:
                    pass  # the kill below makes sure
                _kill(pids)
        return self.spawn(role, actor_class, spec, procs)

    def stop_role(self, role: str) -> None:
        """Stop `role`'s procs (one that failed to start), leaving the others running."""
        proc_mesh = self.proc_meshes.pop(role, None)
        if proc_mesh is not None:
            with FAULTS.expecting(role):
                wait(proc_mesh.stop())

    def stop(self) -> list[str]:
        """Stop every proc mesh (each stop waits for its processes to exit) -> errors, if any."""
        errors = []
        for role, proc_mesh in reversed(list(self.proc_meshes.items())):
            try:
                wait(proc_mesh.stop())
            except Exception as e:  # keep stopping the others; report what failed
                errors.append(f"{role}: {e}")
        self.proc_meshes.clear()
        return errors


def _kill(pids: list[int], timeout: float = 5.0) -> None:
    """SIGKILL those of `pids` that still run on this host; wait until they are gone."""
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                os.kill(pid, signal.SIGKILL)
        except (psutil.NoSuchProcess, ProcessLookupError):
            pass
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
