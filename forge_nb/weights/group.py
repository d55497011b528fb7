"""Weights over broadcast groups ("group" transport): each trainer rank broadcasts its own snapshot to every
generator replica through a torch.distributed process group of its own (that rank and the M replicas). NCCL
where the trainer keeps its snapshots on a GPU and the replicas run on GPUs (GPU memory to GPU memory across
hosts, over NVLink or InfiniBand where there is one), gloo on CPUs, which is how the CPU tests run the group
path itself.

The groups live beside the trainer's gang (a process has one default torch.distributed group): each is a
process group built directly on a TCPStore that the trainer rank serves (`open_group`), as the weight-sync
groups of vLLM and verl are. The trainer rank is member 0 and the root of every broadcast; replica i is member
i + 1. A broadcast is a collective, so the session starts the trainer's send and the replicas' refresh
together (`mesh.roles`), and the trainer sends the snapshot it published of that version: a receiver checks
its header as on any path, and loads nothing from a buffer that holds another version. A member that dies
or stalls fails the broadcast on every member after `timeout_s`; the served version stays.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from forge_nb.parallel.gang import interface_towards


@dataclass(frozen=True)
class GroupSpec:
    """Where one trainer rank's group meets (`hosts`: the rank's addresses, tried in order; `port`: its
    store), how many members it has (the rank and the replicas), its backend and its timeout."""

    hosts: tuple[str, ...]
    port: int
    members: int
    backend: str  # "nccl" or "gloo"
    timeout_s: float


def group_spec(hosts: tuple[str, ...], members: int, backend: str, timeout_s: float) -> GroupSpec:
    """A spec for a group that the calling trainer rank will serve, on a port free now."""
    return GroupSpec(hosts, free_port_any(), members, backend, timeout_s)


def free_port_any() -> int:
    """A TCP port free on every interface of this host now."""
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


class GroupEnd:
    """One member's end of a trainer rank's group: member 0 sends (the trainer rank), the others receive."""

    def __init__(self, spec: GroupSpec, member: int) -> None:
        self.spec, self.member = spec, member
        self.group = open_group(spec, member)

    def broadcast(self, tensor: torch.Tensor) -> None:
        """Member 0's `tensor` into every other member's `tensor` (same size; CUDA with NCCL)."""
        options = dist.BroadcastOptions()
        options.rootRank = 0
        self.group.broadcast([tensor], options).wait()


def open_group(spec: GroupSpec, member: int):
    """Join the group (every member must, at once: this blocks until all have) -> its process group."""
    timeout = timedelta(seconds=spec.timeout_s)
    host = spec.hosts[0] if member == 0 else _reachable(spec.hosts, spec.port, spec.timeout_s)
    store = dist.TCPStore(host, spec.port, spec.members, is_master=member == 0, timeout=timeout)
    if spec.backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(store, member, spec.members, options)
    options = dist.ProcessGroupGloo._Options()
    options._timeout = timeout
    # The interface on the route to the trainer's address: a namespace host's name may resolve elsewhere.
    interface = interface_towards(host)
    device = dist.ProcessGroupGloo.create_device(interface=interface) if interface else None
    options._devices = [device or dist.ProcessGroupGloo.create_default_device()]
    return dist.ProcessGroupGloo(store, member, spec.members, options)


def _reachable(hosts: tuple[str, ...], port: int, timeout_s: float) -> str:
    """The first of `hosts` whose `port` accepts a connection, tried until `timeout_s` has passed (the
    trainer rank opens its store as the members join; it listens on every interface, and a reader on
    another host reaches only some of its addresses)."""
    deadline = time.monotonic() + timeout_s
    while True:
        for host in hosts:
            try:
                with socket.create_connection((host, port), timeout=1.0):
                    return host
            except OSError:
                continue
        if time.monotonic() > deadline:
            raise ConnectionError(f"no address of the trainer's weights group answers on port {port}: {list(hosts)}")
        time.sleep(0.1)
