"""Local mesh: one Monarch proc mesh per role on this host, stopped together, or one role replaced."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psutil
from monarch.actor import ProcMesh, default_bootstrap_cmd, this_host

from forge_nb.launch import quiet
from forge_nb.launch.forks import server as forkserver
from forge_nb.launch.placement import Placement
from forge_nb.launch.shared_cores import proc_env
from forge_nb.launch.torchrun import start_gang
from forge_nb.runtime.calls import wait
from forge_nb.runtime.supervision import FAULTS, mesh_name

STOP_TIMEOUT_S = 20.0  # a proc whose actor is wedged (a live function spinning) stops by its cleanup deadline


class LocalMesh:
    """Spawns each role (generator, trainer, reward, ...) into its own procs on this host, each proc
    with the environment the placement plan gives it (its GPUs: `launch.placement`)."""

    shares_cores = True  # every proc on this host's cores (and the kernel's): `proc_env` applies
    forks_procs = True  # procs fork from this mesh's `ForkServer` (this host's), not fresh interpreters

    def __init__(self, placement: Placement | None = None) -> None:
        quiet.route_native_output()  # before Monarch's first line and the first proc (which inherits it)
        self.proc_meshes: dict[str, ProcMesh] = {}
        self.placement = placement
        self.gangs: set[str] = set()  # roles spawned as a torch.distributed gang (respawned as one)
        self.actors: dict[str, Any] = {}  # each role's actor mesh (`retire` names it as Monarch's failures do)
        self.forks = forkserver.acquire(proc_env()) if self._forks(placement) else None  # importing from now

    def _forks(self, placement: Placement | None) -> bool:
        """Whether procs fork from a `ForkServer`: on a Linux host without GPUs (a CUDA driver must not be
        inherited: each GPU proc initialises its own, with its own ``CUDA_VISIBLE_DEVICES``, and its
        start is small next to loading a model onto a GPU), unless ``FORGE_NB_FORK_PROCS=0``
        (`forkserver.forks_here`)."""
        gpus = placement is not None and any(host.gpus > 0 for host in placement.hosts)
        return self.forks_procs and forkserver.forks_here() and not gpus

    def host(self, role: str) -> Any:
        """The host mesh `role`'s procs start on: this host."""
        return this_host()

    def spawn(self, role: str, actor_class: type, spec: Any, procs: int = 1, gang: bool = False) -> Any:
        """Start `procs` processes for `role` and one `actor_class(spec=spec)` in each -> the actor mesh.
        `gang`: the procs form one torch.distributed group (`launch.torchrun`) before the actors start."""
        self._forks_ready()
        proc_mesh = self.host(role).spawn_procs(per_host={"procs": procs}, name=role, **self._bootstrap(role))
        return self._start(role, proc_mesh, actor_class, spec, gang)

    def _start(self, role: str, proc_mesh: ProcMesh, actor_class: type, spec: Any, gang: bool) -> Any:
        self.proc_meshes[role] = proc_mesh
        if gang or role in self.gangs:
            self.gangs.add(role)
            start_gang(proc_mesh, self.master_addr(role))
        actors = self.actors[role] = proc_mesh.spawn(role, actor_class, spec=spec)
        return actors

    def _forks_ready(self) -> None:
        """Wait for this mesh's fork server to finish its imports (`ForkServer.wait_ready`), outside the 30 s
        Monarch gives a proc to start; one that does not (it died, or is still importing after
        `forkserver.READY_TIMEOUT_S`) is stopped, and procs start as fresh interpreters."""
        if self.forks is not None and not self.forks.wait_ready():
            forks, self.forks = self.forks, None
            forks.stop()

    def retire(self, *roles: str) -> None:
        """Failures of these roles' actor meshes are no faults from now on: they are being stopped
        (`supervision.FaultLog.retire`)."""
        for role in roles:
            actors = self.actors.pop(role, None)
            if actors is not None:  # its name is asked for here, not at spawn: that waited for the mesh to exist
                FAULTS.retire(mesh_name(actors))

    def _bootstrap(self, role: str) -> dict[str, Any]:
        """spawn_procs' bootstrap command: through this mesh's fork server when it has one, with each
        proc's environment (`proc_env` on shared cores, and the placement's ``CUDA_VISIBLE_DEVICES`` /
        ``LOCAL_RANK`` of that proc)."""
        env = proc_env() if self.shares_cores else {}
        command = default_bootstrap_cmd()
        forks = self.fork_args(role)
        if forks:
            command.args = forks
        placement = self.placement
        if placement is None:
            return {"bootstrap_command": command.with_env(env)} if env or forks else {}
        return {"bootstrap_command": lambda point: command.with_env({**env, **placement.env(role, point.rank)})}

    def fork_args(self, role: str) -> list[str]:
        """The bootstrap command's arguments (after the Python executable) when `role`'s procs fork from a
        server: this mesh's (`ForkServer`), if it has one."""
        return self.forks.command_args() if self.forks is not None else []

    def master_addr(self, role: str) -> str | None:
        """Where `role`'s gang meets (its first proc's host): this host's loopback."""
        return "127.0.0.1"

    def addresses_of(self, role: str, procs: int) -> tuple[str, ...]:
        """The address of the host of each of `role`'s `procs` procs on the mesh's network (where the others
        dial it): this host's loopback."""
        return ("127.0.0.1",) * procs

    def replace(
        self, role: str, actor_class: type, spec: Any, pids: list[int], procs: int = 1, kill: bool = False
    ) -> Any:
        """Stop `role`'s procs (even with an actor stuck in a call: Monarch's cleanup deadline, then
        SIGKILL to any of `pids` still alive on this host) and start fresh ones -> the new actor mesh.
        `kill`: SIGKILL `pids` first (nothing of theirs is worth a clean stop; a stopped or hung proc
        would hold the stop for the whole deadline)."""
        old = self.proc_meshes.pop(role, None)
        self.retire(role)
        if old is not None:
            with FAULTS.expecting(role):
                if kill:
                    _kill(pids)
                try:
                    wait(old.stop(), STOP_TIMEOUT_S)  # not .get() on the kernel's loop: Monarch warns in the cell
                except Exception:
                    pass  # the kill below makes sure
                _kill(pids)
        return self.spawn(role, actor_class, spec, procs)

    def stop_role(self, role: str) -> None:
        """Stop `role`'s procs (one that failed to start), leaving the others running."""
        proc_mesh = self.proc_meshes.pop(role, None)
        self.retire(role)
        if proc_mesh is not None:
            with FAULTS.expecting(role):
                wait(proc_mesh.stop())

    def stop(self, timeout: float | None = None, excused: Callable[[str, Exception], bool] | None = None) -> list[str]:
        """Stop every proc mesh, all at once (each stop waits ~1 s for its processes to exit: one after
        the other, a session's down took 4 s), each waited `timeout` s at most -> errors, if any (not those
        `excused(role, error)` expects)."""

        def stop(role: str) -> str | None:
            try:
                self.proc_meshes[role].stop().get(timeout)
            except Exception as e:  # keep stopping the others; report what failed
                if excused is not None and excused(role, e):
                    return None
                return f"{role}: not stopped in {timeout:g} s" if isinstance(e, TimeoutError) else f"{role}: {e}"
            return None

        roles = list(reversed(self.proc_meshes))
        self.retire(*roles)
        try:
            with ThreadPoolExecutor(max(1, len(roles)), thread_name_prefix="forge_nb-stop") as pool:
                errors = [e for e in pool.map(stop, roles) if e]  # a future's get() drives it: one thread each
        except RuntimeError:  # at interpreter exit (the atexit hook) no pool takes work: one after the other
            errors = [e for e in map(stop, roles) if e]
        self.proc_meshes.clear()
        forks, self.forks = self.forks, None
        if forks is not None:
            forkserver.release(forks)
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
