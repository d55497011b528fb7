"""Trainer side of a weight refresh: snapshot the parameters into one of two registered buffers.

Buffers are allocated once (in /dev/shm when available, so same-host readers can map them) and
registered with Monarch RDMA in chunks. A publish copies the parameters (converting dtype if
configured) into buffer `version % 2`: header set to WRITING, tensors copied, header set to the
version. Readers copy from a snapshot, never from live parameters, so the optimizer may step as
soon as `publish` returns; a reader of version v is safe until version v + 2 is published.

A trainer on a GPU also keeps the two snapshots in its GPU's memory (`weights.cuda_ipc`), laid out
the same: a generator on a GPU of the same host opens them through CUDA IPC handles and copies device
to device, with no trip through host memory. `host=False` keeps only those (every reader on the host's
GPUs: no copy to host memory at all); `keep_host` turns the host copies off when every reader took CUDA IPC
(on a GPU the copy to host memory is the publish's cost: 574 ms against 2.7 ms for 1.18 GB on an H100,
`make gpu-check`), and on again when one does not.
"""

from __future__ import annotations

import os
import random
import threading
import uuid
import warnings
from collections.abc import Iterable
from pathlib import Path

import torch

from forge_nb.weights.cuda_ipc import GpuSnapshots
from forge_nb.weights.manifest import WRITING, WeightManifest, header, host_id, layout, stamped_copy, views

SHM_DIR = Path("/dev/shm")


class WeightPublisher:
    """Owns the two flat snapshots of one model's parameters and their RDMA registrations."""

    def __init__(
        self,
        named_tensors: Iterable[tuple[str, torch.Tensor]],
        version: int = 0,
        dtype: torch.dtype | None = None,
        chunk_mb: int = 16,
        use_shm: bool = True,
        rows: dict[str, tuple[int, int]] | None = None,
        rank: int = 0,
        ranks: int = 1,
        device: torch.device | None = None,
        host: bool = True,
        stream_secret: bytes = b"",
        stream_host: str = "127.0.0.1",
    ) -> None:
        """Buffers laid out for `named_tensors` (their shapes and dtypes), holding them as `version`.
        A sharded trainer's rank `rank` of `ranks` publishes its shards: `rows` says which rows of each
        whole tensor they are (`weights.manifest.layout`). A CUDA `device`: two more buffers in its memory,
        for CUDA IPC readers; `host` False: those only. With the session's `stream_secret`, the host buffers
        are also served over TCP streams at `stream_host` (`weights.stream`) to readers that prove it."""
        named = list(named_tensors)
        self.rank, self.ranks = rank, ranks
        self.slots, self.nbytes = layout(named, dtype, rows)
        self.nonce = random.getrandbits(62)
        self.chunk_bytes = chunk_mb << 20
        self.shm_paths = self._shm_paths() if use_shm and host else None
        self.buffers = [self._allocate(i) for i in range(2)] if host else []
        self.host_live = host  # whether each publish also writes the host buffers
        self.gpu = GpuSnapshots(self.nbytes, device) if device is not None and device.type == "cuda" else None
        if self.gpu is None and not host:
            raise ValueError("a publisher with no host buffers needs a CUDA device for its GPU ones")
        self._targets = [dict(views(b, self.slots)) for b in self.buffers]
        self._rdma: tuple | None = None
        self._server = None  # weights.stream.ChunkServer, started with the first manifest
        self._stream_secret, self._stream_host = stream_secret, stream_host
        for buffer in self.buffers:
            header(buffer)[0] = WRITING  # no version until one is published there
        self.version: int | None = None
        self._locks = (threading.Lock(), threading.Lock())  # a publish into a buffer waits for a send from it
        self.publish(named, version)

    def _shm_paths(self) -> tuple[str, str] | None:
        if not SHM_DIR.is_dir() or not os.access(SHM_DIR, os.W_OK):
            return None
        stem = f"forge_nb-weights-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        return (str(SHM_DIR / f"{stem}-0"), str(SHM_DIR / f"{stem}-1"))

    def _allocate(self, index: int) -> torch.Tensor:
        if self.shm_paths is None:
            return torch.zeros(self.nbytes, dtype=torch.uint8)
        return torch.from_file(self.shm_paths[index], shared=True, size=self.nbytes, dtype=torch.uint8)

    @torch.no_grad()
    def publish(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Copy `named_tensors` into buffer `version % 2` and stamp it as `version`."""
        if version == self.version:
            return
        named = list(named_tensors)
        with self.lock(version):
            if self.gpu is not None:
                self.gpu.publish(named, self.slots, version, self.nonce)
            if self.host_live:
                stamped_copy(self.buffers[version % 2], self._targets[version % 2], named, version, self.nonce)
        self.version = version

    def drop_gpu(self) -> bool:
        """Free the GPU snapshots when no reader opened them (generators on other hosts or GPUs it cannot see
        read the host buffers): two model copies of GPU memory back -> whether they are gone. A publisher
        without host buffers keeps them (they are its only ones)."""
        if self.gpu is not None and self.buffers:
            with self.lock(0), self.lock(1):
                self.gpu = None
        return self.gpu is None

    def lock(self, version: int) -> threading.Lock:
        """Held while buffer `version % 2` is written, or sent by a broadcast (`weights.group.GroupSender`)."""
        return self._locks[version % 2]

    @torch.no_grad()
    def keep_host(self, on: bool, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Write the host buffers at every publish (`on`), or not: only a publisher with GPU snapshots
        may stop. Turned on again, the version published last is copied there now (`named_tensors`)."""
        if on == self.host_live or not self.buffers or (not on and self.gpu is None):
            return
        if on:
            index = self.version % 2
            stamped_copy(self.buffers[index], self._targets[index], list(named_tensors), self.version, self.nonce)
        self.host_live = on

    def snapshot(self, version: int, on_gpu: bool = False) -> torch.Tensor:
        """The flat buffer that holds (or held) `version`: in GPU memory with `on_gpu`, else in host memory."""
        buffers = self.gpu.buffers if on_gpu else self.buffers
        return buffers[version % 2]

    def manifest(self, rdma: bool = True) -> WeightManifest:
        """The layout and the handles readers pull from (RDMA registered on first use; `rdma` False: none,
        for a process without Monarch)."""
        if self._rdma is None and rdma and self.buffers:
            self._rdma = tuple(self._register(b) for b in self.buffers)
        if self._server is None and self.buffers and self._stream_secret:
            from forge_nb.weights.stream import ChunkServer

            self._server = ChunkServer(self.buffers, self._stream_secret, self._stream_host)
        return WeightManifest(
            self.slots,
            self.nbytes,
            self.nonce,
            host_id(),
            self.chunk_bytes,
            self._rdma or (),
            self.shm_paths,
            self._server.spec if self._server is not None else None,
            self.rank,
            self.ranks,
            self.gpu.handles() if self.gpu is not None else None,
        )

    def _register(self, buffer: torch.Tensor) -> tuple:
        from monarch.rdma import RDMABuffer, RDMATcpFallbackWarning

        with warnings.catch_warnings():
            # Without ibverbs Monarch moves the bytes over TCP; the refresh report shows the rate.
            warnings.simplefilter("ignore", RDMATcpFallbackWarning)
            chunks = [buffer[i : i + self.chunk_bytes] for i in range(0, self.nbytes, self.chunk_bytes)]
            return (RDMABuffer(buffer[:64]), *(RDMABuffer(c) for c in chunks))

    def unlink(self) -> None:
        """Remove the /dev/shm names (mapped memory lives on until every mapping is gone)."""
        for path in self.shm_paths or ():
            Path(path).unlink(missing_ok=True)
