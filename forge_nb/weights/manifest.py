"""The layout of published weight buffers, and how to checksum weights.

A trainer publishes into two buffers (double buffering: version v goes to buffer v % 2, so a
reader of v is never overwritten by v + 1). Each buffer is flat bytes: a 64-byte header -- the
policy version as int64 (-1 while being written), then a 64-bit nonce naming the publisher --
followed by every tensor back to back, each 64-byte aligned.

A sharded trainer (a gang of N ranks, FSDP2) publishes shard by shard: each rank its own rows of each
tensor (FSDP2 shards dim 0), in buffers of its own, with one manifest per rank; a slot then says which
rows of the whole tensor it holds (`row_start`, of `whole_rows`), and a reader puts the whole tensor
back together from every rank's slot (`weights.shards`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

HEADER_BYTES = 64
WRITING = -1  # header version while a publish is in progress


@dataclass(frozen=True)
class TensorSlot:
    """Where one named tensor lives inside a flat buffer (offsets in bytes)."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # torch dtype name, e.g. "float32"
    offset: int
    nbytes: int
    row_start: int = 0  # a shard: the first row (dim 0) of the whole tensor it holds
    whole_rows: int | None = None  # a shard: the whole tensor's rows; None: the slot is the whole tensor


@dataclass(frozen=True)
class WeightManifest:
    """Everything a generator needs to pull versions from one trainer, handed over once.

    `rdma[b]` holds Monarch ``RDMABuffer``s over buffer b: first its 64-byte header, then its
    chunks in order (read in parallel). `shm_paths`, when set, name the same two buffers as files in
    /dev/shm, which a reader on the same host (`host`) maps instead of going through RDMA. `stream`,
    when set, is where the trainer serves both buffers over TCP (`weights.stream`: the cross-host path).
    `ipc`, when set, opens the GPU copies of both buffers on the trainer's host (`weights.cuda_ipc`);
    `rdma`, `shm_paths` and `stream` are empty when the trainer keeps its snapshots on its GPU only.
    """

    slots: tuple[TensorSlot, ...]
    nbytes: int
    nonce: int
    host: str
    chunk_bytes: int
    rdma: tuple[tuple[Any, ...], ...]
    shm_paths: tuple[str, ...] | None
    stream: Any = None  # weights.stream.StreamSpec
    rank: int = 0  # which of the trainer's `ranks` publishes these buffers (their shards, when ranks > 1)
    ranks: int = 1
    ipc: Any = None  # weights.cuda_ipc.IpcSpec: the same snapshots in the trainer's GPU memory, when it has one
    group: Any = None  # weights.group.GroupSpec: this rank's broadcast group, when the transport is "group"


def layout(
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    dtype: torch.dtype | None = None,
    rows: dict[str, tuple[int, int]] | None = None,
) -> tuple[tuple[TensorSlot, ...], int]:
    """Pack tensors after the header, each aligned to 64 bytes -> (slots, total bytes).
    With `dtype`, floating tensors are laid out in that dtype (e.g. bf16 serving of fp32 training).
    `rows`: for tensors that are shards, name -> (first row, the whole tensor's rows)."""
    slots, offset = [], HEADER_BYTES
    for name, t in named_tensors:
        out = dtype if dtype is not None and t.is_floating_point() else t.dtype
        nbytes = t.numel() * torch.empty((), dtype=out).element_size()
        start, whole = (rows or {}).get(name, (0, None))
        slots.append(TensorSlot(name, tuple(t.shape), str(out).removeprefix("torch."), offset, nbytes, start, whole))
        offset += -(-nbytes // 64) * 64
    return tuple(slots), offset


def views(flat: torch.Tensor, slots: Iterable[TensorSlot]) -> Iterator[tuple[str, torch.Tensor]]:
    """Named tensor views into a flat uint8 buffer laid out by `layout` (no copies)."""
    for s in slots:
        dtype = getattr(torch, s.dtype)
        yield s.name, flat[s.offset : s.offset + s.nbytes].view(dtype).view(s.shape)


def header(flat: torch.Tensor) -> torch.Tensor:
    """[version, nonce] as an int64 view of a buffer's header."""
    return flat[:16].view(torch.int64)


def stamped_copy(
    buffer: torch.Tensor,
    targets: dict[str, torch.Tensor],
    named: Sequence[tuple[str, torch.Tensor]],
    version: int,
    nonce: int,
) -> None:
    """Copy `named` into their `targets` (views of `buffer`): the header says WRITING meanwhile, then
    (version, nonce)."""
    stamp = header(buffer)
    stamp[0] = WRITING
    for name, t in named:
        targets[name].copy_(t)
    stamp[1] = nonce
    stamp[0] = version


def checksum(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> str:
    """sha256 over names and raw bytes, in name order: equal iff every tensor is bitwise equal."""
    digest = hashlib.sha256()
    for name, t in sorted(named_tensors, key=lambda kv: kv[0]):
        digest.update(name.encode())
        digest.update(t.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


def host_id() -> str:
    """This machine's boot id: equal only for processes that can share /dev/shm memory."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        import socket

        return socket.gethostname()
