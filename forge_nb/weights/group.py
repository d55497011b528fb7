"""Weights over broadcast groups ("group" transport): each trainer rank broadcasts its own snapshot to every
generator replica through a torch.distributed process group of its own (that rank and the M replicas). NCCL
where the trainer keeps its snapshots on a GPU and every replica runs on a GPU (GPU memory to GPU memory across
hosts, over NVLink or InfiniBand where there is one), gloo otherwise, which is how the CPU tests run the group
path itself.

The groups live beside the trainer's gang (a process has one default torch.distributed group): each is a
process group built directly on a TCPStore that the trainer rank serves (`open_group`), as the weight-sync
groups of vLLM and verl are. The trainer rank is member 0 and the root of every broadcast; replica i is member
i + 1. The rank sends from a thread of its own (`GroupSender`), not from its actor: a refresh asks for a
version through the group's store (replica 1 writes the request, every replica then receives), and the
sender broadcasts that version's snapshot while the trainer goes on with its next step (the double buffer
allows it; a publish into the buffer being sent waits for the send). The receivers check the header as on
every path: a snapshot that holds another version by then is refused, and nothing is loaded. A gloo member
that dies or stalls fails the broadcast on every member after `timeout_s`: the served version stays, and the
session makes new groups when it replaces the procs. (NCCL's own watchdog may end a process whose collective
timed out instead: `TORCH_NCCL_ASYNC_ERROR_HANDLING`.)
"""

from __future__ import annotations

import atexit
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from forge_nb.parallel.gang import interface_towards
from forge_nb.weights.manifest import header


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


REQUEST = "forge_nb/refresh/{}"  # the store key of the n-th refresh: the version asked for
STOP = -1  # asked for instead of a version: the sender's thread ends
IDLE = timedelta(days=365)  # how long the sender waits for a request: for ever, in effect (`stop` ends it)


class GroupEnd:
    """One member's end of a trainer rank's group: member 0 sends (the trainer rank), the others receive.
    `requests` counts the refreshes this end took part in: the n-th is asked for under ``REQUEST.format(n)``."""

    def __init__(self, spec: GroupSpec, member: int) -> None:
        self.spec, self.member = spec, member
        self.store, self.group = open_group(spec, member)
        self.requests = 0

    def broadcast(self, tensor: torch.Tensor) -> None:
        """Member 0's `tensor` into every other member's `tensor` (same size; CUDA with NCCL), finished
        when this returns (on a GPU too: the sender may overwrite its buffer after)."""
        options = dist.BroadcastOptions()
        options.rootRank = 0
        self.group.broadcast([tensor], options).wait()
        if tensor.is_cuda:
            torch.cuda.current_stream(tensor.device).synchronize()

    def receive(self, version: int, staging: torch.Tensor) -> None:
        """A receiver's side of one refresh: replica 1 asks the sender for `version`, every replica receives."""
        if self.member == 1:
            self.store.set(REQUEST.format(self.requests), str(version))
        self.requests += 1
        self.broadcast(staging)


class GroupSender:
    """Member 0 in a thread of its own: it waits for each refresh's request in the store and broadcasts the
    snapshot `snapshot(version)` returns, holding `lock(version)` meanwhile (the publisher's lock of that
    buffer). Joining blocks until every member has joined; `stop` ends the thread (a new group replaces it,
    and the process stops it at exit)."""

    def __init__(self, spec: GroupSpec, snapshot: Callable[[int], torch.Tensor], lock: Callable[[int], Any]) -> None:
        self.end = GroupEnd(spec, 0)
        # The thread waits on a connection of its own: a store connection serves one call at a time, and
        # `stop` must be able to write while the thread waits.
        self.requests = dist.TCPStore(spec.hosts[0], spec.port, is_master=False, timeout=IDLE, wait_for_workers=False)
        self.snapshot, self.lock = snapshot, lock
        self.sent: list[int] = []  # the versions sent, in order (the snapshots' own headers)
        self.error: str | None = None
        self.thread = threading.Thread(target=self._serve, name="forge_nb-weights-group", daemon=True)
        self.thread.start()
        atexit.register(self.stop)

    def _serve(self) -> None:
        while True:
            key = REQUEST.format(self.end.requests)
            # Blocks in the store until the key is set (no polling, so nothing in the logs while idle).
            self.requests.wait([key], IDLE)
            version = int(self.requests.get(key))
            if version == STOP:
                return
            self.end.requests += 1
            try:
                with self.lock(version):
                    snapshot = self.snapshot(version)
                    self.end.broadcast(snapshot)
                    self.sent.append(int(header(snapshot)[0]))
            except RuntimeError as e:  # a member died or stalled: this group is done; the session makes another
                self.error = f"{type(e).__name__}: {e}"
                return

    def stop(self) -> None:
        """End the thread: the request it waits for says STOP (a request in flight is answered first)."""
        if self.thread.is_alive():
            self.end.store.set(REQUEST.format(self.end.requests), str(STOP))
            self.thread.join(timeout=10)
        atexit.unregister(self.stop)


def open_group(spec: GroupSpec, member: int):
    """Join the group (every member must, at once: this blocks until all have) -> (its store, its process
    group)."""
    timeout = timedelta(seconds=spec.timeout_s)
    host = spec.hosts[0] if member == 0 else _reachable(spec.hosts, spec.port, spec.timeout_s)
    store = dist.TCPStore(host, spec.port, spec.members, is_master=member == 0, timeout=timeout)
    if spec.backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return store, dist.ProcessGroupNCCL(store, member, spec.members, options)
    options = dist.ProcessGroupGloo._Options()
    options._timeout = timeout
    # The interface on the route to the trainer's address: a namespace host's name may resolve elsewhere.
    interface = interface_towards(host)
    device = dist.ProcessGroupGloo.create_device(interface=interface) if interface else None
    options._devices = [device or dist.ProcessGroupGloo.create_default_device()]
    return store, dist.ProcessGroupGloo(store, member, spec.members, options)


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
