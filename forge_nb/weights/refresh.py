"""Generator side of a weight refresh: pull a published version and load it.

Transport is chosen once per receiver: a reader on a GPU of the publisher's host, when the trainer
keeps its snapshots on that GPU, opens them by CUDA IPC and copies device to device ("cuda_ipc",
`weights.cuda_ipc`); with "group", each trainer rank broadcasts its snapshot to every reader through a
process group of its own (NCCL on GPUs, gloo on CPUs: `weights.group`); a reader on the publisher's host
maps the /dev/shm buffers and copies from them (memcpy speed); anywhere else it reads over the trainer's TCP streams
(`weights.stream`, several in parallel), or over Monarch RDMA, chunks in parallel ("rdma": the path
for real RDMA NICs; over Monarch's TCP fallback it is the slower of the two).
Either way the bytes land in a staging buffer and are checked before anything is loaded: the
header must hold the requested version and the publisher's nonce both before and after the copy,
so a version overwritten mid-read (the trainer two versions ahead) is refused, never half-loaded.
A load that fails part way (out of memory, a vLLM rank's load raising) leaves the replica `torn` until a
later refresh loads a whole version: its generator refuses to sample from a mix of two versions meanwhile.
From a sharded trainer every rank's buffers are copied at once (each rank's link carries its share)
and a version is loaded only when every rank's copy passed that check (`weights.shards`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from forge_nb.weights.cuda_ipc import copy_stamped, open_snapshots
from forge_nb.weights.group import GroupEnd
from forge_nb.weights.manifest import WeightManifest, header, host_id
from forge_nb.weights.shards import assembled, check_cover

TRANSPORTS = ("auto", "cuda_ipc", "shm", "tcp", "rdma", "group")


class RefreshError(RuntimeError):
    """The bytes read are not the version that was asked for; nothing was loaded."""


class TornWeights(RuntimeError):
    """A load failed part way: the weights served are neither the version before nor the one asked for."""


@dataclass(frozen=True)
class RefreshReport:
    """What one refresh did. `seconds` covers transfer and load; GB/s is bytes / seconds (1e9 B)."""

    version: int
    previous_version: int
    bytes: int
    seconds: float
    transfer_seconds: float
    skipped: bool
    transport: str
    replicas: int = 1

    @property
    def gbps(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 and not self.skipped else 0.0

    def as_dict(self) -> dict:
        return {**self.__dict__, "gbps": self.gbps}

    @classmethod
    def combine(cls, reports: Sequence[RefreshReport]) -> RefreshReport:
        """The reports of replicas that refreshed in parallel: bytes add up, times are the slowest's."""
        versions = {r.version for r in reports}
        if len(versions) != 1:
            raise RefreshError(f"generator replicas refreshed to different versions {sorted(versions)}")
        if len(reports) == 1:
            return reports[0]
        first = reports[0]
        return cls(
            first.version,
            first.previous_version,
            sum(r.bytes for r in reports),
            max(r.seconds for r in reports),
            max(r.transfer_seconds for r in reports),
            all(r.skipped for r in reports),
            "+".join(sorted({r.transport for r in reports})),
            len(reports),
        )


class WeightReceiver:
    """Tracks the version a generator serves and refreshes it from a trainer's published buffers: one
    publisher's, or every rank's of a sharded trainer (read at once, each over its own transport, and
    put together only when every rank's copy is the version asked for)."""

    def __init__(
        self,
        manifests: WeightManifest | Sequence[WeightManifest],
        version: int = 0,
        transport: str = "auto",
        device: torch.device | str = "cpu",
        member: int = 0,
    ) -> None:
        """`device`: where the engine's weights live; a CUDA one lets "auto" take CUDA IPC, whose copies
        are staged there (the other transports stage in host memory). With "group", this reader joins every
        trainer rank's group as `member` (replica i: i + 1), which blocks until each group is whole."""
        if transport not in TRANSPORTS:
            raise ValueError(f"weights transport must be one of {TRANSPORTS}, got {transport!r}")
        self.manifests = [manifests] if isinstance(manifests, WeightManifest) else list(manifests)
        if len(self.manifests) > 1:
            check_cover(self.manifests)
        self.version = version
        self.torn: str | None = None  # why a load failed part way, until one loads a whole version
        self.sources = [_Source(m, transport, torch.device(device), member) for m in self.manifests]
        self.collective = transport == "group"  # every refresh is a broadcast the trainer sends: never skipped
        self.nbytes = sum(m.nbytes for m in self.manifests)
        self.transport = "+".join(sorted({s.transport for s in self.sources}))

    def needs(self, version: int) -> bool:
        """The refresh-skip rule: a replica needs `version` unless it serves it, whole, already."""
        return version != self.version or self.torn is not None

    async def refresh(self, version: int, load: Callable[[Iterable[tuple[str, torch.Tensor]]], None]) -> RefreshReport:
        """Copy published `version` from every rank, check each copy, then `load` the named whole tensors.

        A refresh this replica does not `need` moves nothing and reports ``skipped=True``; over a broadcast
        group ("group") every refresh is one the trainer sends (the session asks each replica's `needs` first).
        A `load` that raises leaves this receiver `torn` and raises `TornWeights`: whatever it replaced, the
        served weights are a mix until a load completes.
        """
        previous = self.version
        if not self.collective and not self.needs(version):
            return RefreshReport(previous, previous, 0, 0.0, 0.0, True, self.transport)
        start = time.perf_counter()
        # What a failed copy leaves (nothing is loaded): the version served, or a torn replica torn still.
        kept = f"policy v{previous} stays live" if self.torn is None else f"this replica stays torn ({self.torn})"
        if any(source.nccl for source in self.sources):
            # One NCCL communicator per trainer rank: every replica must use them in the same order.
            afters = [await source.copy(version, kept) for source in self.sources]
        else:
            afters = await asyncio.gather(*(source.copy(version, kept) for source in self.sources))
        transferred = time.perf_counter()
        for source, after in zip(self.sources, afters):
            source.check(version, after)
        try:
            load(assembled(self.manifests, [source.staging for source in self.sources]))
        except Exception as e:
            self.torn = f"loading v{version} over v{previous} failed part way ({type(e).__name__}: {e})"
            raise TornWeights(self.torn) from e
        self.version, self.torn = version, None
        end = time.perf_counter()
        return RefreshReport(version, previous, self.nbytes, end - start, transferred - start, False, self.transport)


class _Source:
    """One publisher's two buffers (a trainer rank's) and how this receiver copies them into `staging`:
    opened by CUDA IPC on a GPU of its host, else mapped from /dev/shm on its host, else over its TCP
    streams, else Monarch RDMA."""

    def __init__(self, manifest: WeightManifest, transport: str, device: torch.device, member: int = 0) -> None:
        self.manifest = manifest
        self._group, self.nccl = None, False
        if transport == "group":
            self._join_group(member, device)
            return
        self._gpu = self._open_gpu(transport, device)
        if self._gpu is not None:
            self.staging, self.transport = torch.empty(manifest.nbytes, dtype=torch.uint8, device=device), "cuda_ipc"
            self._mapped = self._stream = None
            return
        if not manifest.shm_paths and not manifest.rdma and manifest.stream is None:
            raise ValueError(f"{self._who()}the trainer's snapshots are on its GPU only: this reader cannot open them")
        self.staging = torch.empty(manifest.nbytes, dtype=torch.uint8)
        self._mapped = self._map_shm() if transport in ("auto", "shm") else None
        if transport == "shm" and self._mapped is None:
            raise ValueError("weights transport 'shm' asked for, but the publisher's /dev/shm buffers are not here")
        self._stream = None
        if self._mapped is None and transport in ("auto", "tcp") and manifest.stream is not None:
            from forge_nb.weights.stream import StreamReader

            self._stream = StreamReader(manifest.stream, manifest.chunk_bytes)
        if transport == "tcp" and self._stream is None:
            raise ValueError("weights transport 'tcp' asked for, but the publisher serves no TCP stream")
        self.transport = "shm" if self._mapped is not None else "tcp" if self._stream is not None else "rdma"

    def _join_group(self, member: int, device: torch.device) -> None:
        spec = self.manifest.group
        if spec is None or member < 1:
            raise ValueError(
                "weights transport 'group' needs the trainer's group (the session sets it up) and a member"
            )
        on = device if spec.backend == "nccl" else torch.device("cpu")
        self.staging = torch.empty(self.manifest.nbytes, dtype=torch.uint8, device=on)
        self._gpu = self._mapped = self._stream = None
        self._group, self.transport, self.nccl = GroupEnd(spec, member), "group", spec.backend == "nccl"

    def _open_gpu(self, transport: str, device: torch.device) -> list[torch.Tensor] | None:
        if transport not in ("auto", "cuda_ipc"):
            return None
        try:
            opened = open_snapshots(self.manifest.ipc) if device.type == "cuda" else None
        except (RuntimeError, OSError):  # IPC refused (e.g. another container with the same boot id)
            if transport == "cuda_ipc":
                raise
            opened = None  # "auto": the next path down
        if transport == "cuda_ipc" and opened is None:
            raise ValueError(
                "weights transport 'cuda_ipc' asked for, but the trainer's GPU snapshots cannot be opened here "
                "(it takes a trainer on a GPU and a generator on a GPU of its host that sees the trainer's GPU)"
            )
        return opened

    def _map_shm(self) -> list[torch.Tensor] | None:
        m = self.manifest
        if m.shm_paths is None or m.host != host_id() or not all(Path(p).exists() for p in m.shm_paths):
            return None
        mapped = [torch.from_file(p, shared=True, size=m.nbytes, dtype=torch.uint8) for p in m.shm_paths]
        # Same boot id but another /dev/shm (a container): the nonce tells.
        return mapped if any(int(header(b)[1]) == m.nonce for b in mapped) else None

    async def copy(self, version: int, kept: str) -> torch.Tensor:
        """The buffer that holds `version` (`version % 2`) into `staging` -> its header as it was after the
        copy (`kept`: what a failed copy leaves served, for its `RefreshError`)."""
        index = version % 2
        if self._group is not None:
            try:  # in a thread: the actor's loop stays free, as for the TCP streams
                await asyncio.to_thread(self._group.receive, version, self.staging)
            except (RuntimeError, dist.DistError) as e:
                raise RefreshError(f"{kept}; {self._who()}the weights group failed: {e}") from None
            # The sender held the buffer's lock while it sent: no publish moved the header meanwhile.
            return header(self.staging).cpu().clone()
        if self._gpu is not None:
            return copy_stamped(self._gpu[index], self.staging)
        if self._mapped is not None:
            source = self._mapped[index]
            self.staging.copy_(source)
            return header(source).clone()
        if self._stream is not None:
            # In a thread: the actor's loop stays free (it answers `generate` with the version it serves).
            try:
                return header(await asyncio.to_thread(self._stream.read, index, self.staging)).clone()
            except OSError as e:
                raise RefreshError(f"{kept}; {self._who()}{e}") from None
        head, *chunks = self.manifest.rdma[index]
        size = self.manifest.chunk_bytes
        await asyncio.gather(*(c.read_into(self.staging[i * size : i * size + c.size()]) for i, c in enumerate(chunks)))
        after = torch.empty(64, dtype=torch.uint8)
        await head.read_into(after)
        return header(after).clone()

    def check(self, version: int, after: torch.Tensor) -> None:
        """The copy holds `version` of this publisher: its header said so before and after the copy."""
        nonce = self.manifest.nonce
        for what, stamp in (("at the start of the copy", header(self.staging)), ("at its end", after)):
            found, found_nonce = int(stamp[0]), int(stamp[1])
            if found_nonce != nonce or found != version:
                raise RefreshError(
                    f"asked for policy version {version}, {self._who()}the published buffer held version {found} "
                    f"{what} (the trainer is 2+ versions ahead, or another publisher); nothing was loaded"
                )

    def _who(self) -> str:
        return f"trainer rank {self.manifest.rank}: " if self.manifest.ranks > 1 else ""
