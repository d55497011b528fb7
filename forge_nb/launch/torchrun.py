"""A role's procs as one torch.distributed gang: torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT, ...) set in each proc through the mesh, so no torchrun is needed.

Monarch's `monarch.spmd.SPMDActor` sets them (as `setup_torch_elastic_env` does, whose blocking
`.get()` Monarch warns about inside a notebook's event loop; here the waits go through `runtime.calls`).
The rendezvous is rank 0's proc: at the address the kernel gives (a hosts mesh: the worker's address,
which its namespace or host answers on), else the host name rank 0 reports, on a port free there.
"""

from __future__ import annotations

from typing import Any

from monarch.spmd import SPMDActor

from forge_nb.runtime.calls import wait


def start_gang(proc_mesh: Any, master_addr: str | None = None) -> None:
    """Set torchrun's variables in every proc of `proc_mesh` (before the role's actor is spawned there:
    its constructor joins the group)."""
    actors = proc_mesh.spawn("gang_env", SPMDActor)
    flat = actors.flatten("procs") if len(actors.extent.labels) > 1 else actors
    host, port = wait(flat.slice(procs=0).get_host_port.call_one(None))
    wait(actors.setup_env.call(master_addr or host, port))
