"""Generator side of a weight refresh: pull a published version and load it.

Transport is chosen once per receiver: a reader on the publisher's host maps the /dev/shm buffers
and copies from them (memcpy speed); anywhere else it reads over the trainer's TCP streams
(`weights.stream`, several in parallel), or over Monarch RDMA, chunks in parallel ("rdma": the path
for real RDMA NICs; over Monarch's TCP fallback it is the slower of the two).
Either way the bytes land in a staging buffer and are checked before anything is loaded: the
header must hold the requested version and the publisher's nonce both before and after the copy,
so a version overwritten mid-read (the trainer two versions ahead) is refused, never half-loaded.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from forge_nb.weights.manifest import WeightManifest, header, host_id, views

TRANSPORTS = ("auto", "shm", "tcp", "rdma")


class RefreshError(RuntimeError):
    """The bytes read are not the version that was asked for; nothing was loaded."""


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
    """Tracks the version a generator serves and refreshes it from one publisher's buffers."""

    def __init__(self, manifest: WeightManifest, version: int = 0, transport: str = "auto") -> None:
        if transport not in TRANSPORTS:
            raise ValueError(f"weights transport must be one of {TRANSPORTS}, got {transport!r}")
        self.manifest = manifest
        self.version = version
        self._staging = torch.empty(manifest.nbytes, dtype=torch.uint8)
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

    def _map_shm(self) -> list[torch.Tensor] | None:
        m = self.manifest
        if m.shm_paths is None or m.host != host_id() or not all(Path(p).exists() for p in m.shm_paths):
            return None
        mapped = [torch.from_file(p, shared=True, size=m.nbytes, dtype=torch.uint8) for p in m.shm_paths]
        # Same boot id but another /dev/shm (a container): the nonce tells.
        return mapped if any(int(header(b)[1]) == m.nonce for b in mapped) else None

    async def refresh(self, version: int, load: Callable[[Iterable[tuple[str, torch.Tensor]]], None]) -> RefreshReport:
        """Copy published `version`, check it, then `load` the named views of the copy.

        A refresh to the version already served moves nothing and reports ``skipped=True``.
        """
        previous = self.version
        if version == previous:
            return RefreshReport(previous, previous, 0, 0.0, 0.0, True, self.transport)
        start = time.perf_counter()
        index = version % 2
        if self._mapped is not None:
            after = await self._copy_shm(index)
        elif self._stream is not None:
            after = await self._copy_stream(index)
        else:
            after = await self._copy_rdma(index)
        transferred = time.perf_counter()
        self._check(version, header(self._staging), after)
        load(views(self._staging, self.manifest.slots))
        self.version = version
        end = time.perf_counter()
        return RefreshReport(
            version, previous, self.manifest.nbytes, end - start, transferred - start, False, self.transport
        )

    async def _copy_shm(self, index: int) -> torch.Tensor:
        source = self._mapped[index]
        self._staging.copy_(source)
        return header(source).clone()

    async def _copy_stream(self, index: int) -> torch.Tensor:
        # In a thread: the actor's loop stays free (it answers `generate` with the version it serves).
        try:
            return header(await asyncio.to_thread(self._stream.read, index, self._staging)).clone()
        except OSError as e:
            raise RefreshError(f"policy v{self.version} stays live; {e}") from None

    async def _copy_rdma(self, index: int) -> torch.Tensor:
        head, *chunks = self.manifest.rdma[index]
        size = self.manifest.chunk_bytes
        await asyncio.gather(
            *(c.read_into(self._staging[i * size : i * size + c.size()]) for i, c in enumerate(chunks))
        )
        after = torch.empty(64, dtype=torch.uint8)
        await head.read_into(after)
        return header(after).clone()

    def _check(self, version: int, before: torch.Tensor, after: torch.Tensor) -> None:
        nonce = self.manifest.nonce
        for what, stamp in (("at the start of the copy", before), ("at its end", after)):
            found, found_nonce = int(stamp[0]), int(stamp[1])
            if found_nonce != nonce or found != version:
                raise RefreshError(
                    f"asked for policy version {version}, the published buffer held version {found} {what} "
                    f"(the trainer is 2+ versions ahead, or another publisher); nothing was loaded"
                )
