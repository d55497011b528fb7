"""One trainer rank's place in its gang: a torch.distributed process group over the gang's procs.

Gloo carries the CPU tensors (and is what CPU tests run on); NCCL the GPU ones. Every collective a
gang runs waits at most `timeout_s`: a rank that died or hangs makes the others' next collective fail
(`GangError` in the trainer) instead of blocking the step forever.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh


class GangError(RuntimeError):
    """A collective of the gang failed: a rank died, hangs past the timeout, or lost its link. The
    whole gang must be restarted (the survivors' group is unusable)."""


def collective_failed(error: BaseException) -> bool:
    """Whether `error` came out of a collective whose peers are gone (gloo's and NCCL's errors, or a
    timeout), rather than out of the computation itself."""
    if isinstance(error, dist.DistError):
        return True
    text = str(error).lower()
    return any(s in text for s in ("gloo", "nccl", "connection closed by peer", "connection reset by peer"))


@contextmanager
def collectives(rank: int, role: str = "trainer") -> Iterator[None]:
    """Turn an error out of a collective whose peers are gone into `GangError` ("`role` rank `rank`: ...";
    the session restarts the gang on it); any other error passes unchanged."""
    try:
        yield
    except GangError:
        raise
    except Exception as e:
        if collective_failed(e):
            raise GangError(f"{role} rank {rank}: {type(e).__name__}: {e}") from None
        raise


@dataclass
class Gang:
    """Rank `rank` of `world`; `mesh` is the 1-D device mesh FSDP2 shards over (None: no group)."""

    rank: int = 0
    world: int = 1
    mesh: DeviceMesh | None = None

    @property
    def leader(self) -> bool:
        """Rank 0: the one that answers for the gang and lays out the files the ranks write together."""
        return self.rank == 0

    @classmethod
    def join(cls, device: torch.device, timeout_s: float = 600.0) -> Gang:
        """Join the group torchrun's variables describe (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; set
        by `forge_nb.launch.torchrun` in each proc). Without them: a group of one on this host."""
        if "RANK" not in os.environ:
            os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        if "GLOO_SOCKET_IFNAME" not in os.environ:
            interface = interface_towards(os.environ["MASTER_ADDR"])
            if interface:  # else gloo binds the address the host name resolves to, which may not be this host's
                os.environ["GLOO_SOCKET_IFNAME"] = interface
        if not dist.is_initialized():
            backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
            dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
        world = dist.get_world_size()
        return cls(dist.get_rank(), world, init_device_mesh(device.type, (world,), mesh_dim_names=("fsdp",)))

    def sum_across(self, values: torch.Tensor) -> None:
        """Sum `values` over the ranks, in place (exact for rows that are 0 on every rank but one)."""
        if self.world > 1:
            dist.all_reduce(values, op=dist.ReduceOp.SUM)

    def leave(self) -> None:
        if self.mesh is not None and dist.is_initialized():
            dist.destroy_process_group()


def free_port() -> int:
    """A TCP port free on this host's loopback now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def interface_towards(address: str) -> str | None:
    """The name of this host's network interface on the route to `address` (loopback: "lo"), or None."""
    import psutil

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((socket.gethostbyname(address), 9))  # a UDP connect sends nothing: it only routes
            local = probe.getsockname()[0]
    except OSError:
        return None
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == local for a in addresses):
            return name
    return None
