"""Hosts mesh: the session's roles in procs on hosts a user already has (`mesh.kind="hosts"`).

Each host runs a Monarch worker (``python -m forge_nb.mesh.worker tcp://ADDRESS:PORT``, started over
ssh, by a scheduler, or in a network namespace by `forge_nb.tools.netns_hosts`), and `mesh.hosts`
lists their addresses. The kernel attaches to them (`monarch.actor.attach_to_workers`, as Monarch's
own SSH and process jobs do) and spawns each role's procs there, exactly as `LocalMesh` does on this
host, on the hosts the placement plan gives (`mesh.placement`: the trainer and a reference model on
the first host; generator replicas on the others, round robin; reward procs, judges and the live-code
checker on the last host; with one host every role runs on it).

The workers dial the kernel back, so the kernel must listen on TCP at an address they reach: the one
its routing table picks towards the first host. Monarch fixes a process's transport at its first
call, so a hosts session must be the first Monarch use of its kernel (`HostsError` otherwise).
"""

from __future__ import annotations

import socket
from typing import Any
from urllib.parse import urlparse

from monarch.actor import attach_to_workers, enable_transport

from forge_nb.mesh.calls import wait
from forge_nb.mesh.local import LocalMesh
from forge_nb.mesh.placement import Placement

ATTACH_TIMEOUT_S = 60.0


class HostsError(RuntimeError):
    """The hosts in `mesh.hosts` could not be used; the message says which and why."""


def parse_host(address: str) -> tuple[str, int]:
    """ "tcp://10.0.0.2:26600" or "10.0.0.2:26600" -> ("10.0.0.2", 26600)."""
    url = urlparse(address if "://" in address else f"tcp://{address}")
    if url.scheme != "tcp" or not url.hostname or not url.port:
        raise HostsError(f"mesh.hosts entry {address!r}: expected tcp://HOST:PORT of a running forge_nb worker")
    return url.hostname, url.port


def route_source(host: str, port: int) -> str:
    """This machine's address on the route to `host` (no packet is sent: a UDP connect only routes)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((socket.gethostbyname(host), port))
        except OSError as e:
            raise HostsError(f"no route to mesh host {host}: {e}") from None
        return probe.getsockname()[0]


class HostsMesh(LocalMesh):
    """`LocalMesh` whose roles start on the workers at `hosts` (tcp://HOST:PORT each)."""

    shares_cores = False  # other hosts: their workers keep their own environment

    def __init__(self, hosts: list[str], placement: Placement) -> None:
        super().__init__(placement)
        self.addresses = [parse_host(h) for h in hosts]
        if not self.addresses:
            raise HostsError("mesh.kind='hosts' needs mesh.hosts: the tcp://HOST:PORT of each host's worker")
        listen = route_source(*self.addresses[0])
        try:
            enable_transport(f"tcp://{listen}:0")
        except RuntimeError as e:
            raise HostsError(
                f"mesh.kind='hosts' needs this kernel to use Monarch over TCP (at {listen}), but Monarch "
                f"already runs here over another transport ({e}). Restart the kernel and start the hosts "
                "session before any local one."
            ) from None
        self._placed: dict[str, list[int]] = {}
        self.hosts = attach_to_workers(
            ca="trust_all_connections", workers=[f"tcp://{h}:{p}" for h, p in self.addresses]
        )
        try:
            wait(self.hosts.initialized, ATTACH_TIMEOUT_S)
        except Exception as e:
            raise HostsError(
                f"could not attach to the workers at {hosts} in {ATTACH_TIMEOUT_S:.0f} s ({type(e).__name__}: {e}); "
                "is `python -m forge_nb.mesh.worker tcp://HOST:PORT` running on each, reachable from "
                f"{listen}?"
            ) from None

    def host_indices(self, role: str, procs: int) -> list[int]:
        """The hosts `role`'s `procs` procs start on (one entry per proc, host-major: the plan's)."""
        return self.placement.host_indices(role, procs)

    def master_addr(self, role: str) -> str | None:
        """Where `role`'s gang meets: the address of its first proc's host (which the other hosts reach)."""
        return self.addresses[self.placement.host_indices(role)[0]][0]

    def placed(self) -> dict[str, list[str]]:
        """Each running role -> the hosts (HOST:PORT) of its procs, for `Session.status`."""
        return {
            role: [f"{h}:{p}" for h, p in (self.addresses[i] for i in where)] for role, where in self._placed.items()
        }

    def spawn(self, role: str, actor_class: type, spec: Any, procs: int = 1, gang: bool = False) -> Any:
        """Start `procs` procs for `role` on its hosts -> the actor mesh, one dimension "procs"."""
        indices = self.host_indices(role, procs)
        first, count = indices[0], len(set(indices))
        if sorted(set(indices)) == list(range(first, first + count)) and procs % count == 0:
            host_mesh = self.hosts.slice(hosts=slice(first, first + count))
        else:  # a layout hosts cannot slice to: all on the first (the plan never makes one)
            host_mesh, count = self.hosts.slice(hosts=slice(first, first + 1)), 1
        per_host = {"procs": procs // count}
        proc_mesh = host_mesh.spawn_procs(per_host=per_host, name=role, **self._bootstrap(role))
        self._placed[role] = [first + i for i in range(count) for _ in range(procs // count)]
        return self._start(role, proc_mesh, actor_class, spec, gang).flatten("procs")
