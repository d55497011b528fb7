"""Local mesh: one Monarch proc mesh per role on this host, stopped together."""

from __future__ import annotations

from typing import Any

from monarch.actor import ProcMesh, this_host

from forge_nb.mesh import quiet
from forge_nb.mesh.calls import wait


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
