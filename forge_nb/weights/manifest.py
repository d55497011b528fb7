"""What a published weight version looks like on the wire, and how to checksum weights."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class TensorSlot:
    """Where one named tensor lives inside the flat published buffer (offsets in bytes)."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # torch dtype name, e.g. "float32"
    offset: int
    nbytes: int


@dataclass(frozen=True)
class WeightManifest:
    """One published policy version: the layout plus a handle readers copy the bytes from.

    `buffer` is a Monarch ``RDMABuffer`` over the trainer's flat snapshot (`nbytes` bytes).
    """

    version: int
    slots: tuple[TensorSlot, ...]
    nbytes: int
    buffer: Any


def layout(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> tuple[tuple[TensorSlot, ...], int]:
    """Pack tensors back to back, each aligned to 64 bytes -> (slots, total bytes)."""
    slots, offset = [], 0
    for name, t in named_tensors:
        nbytes = t.numel() * t.element_size()
        slots.append(TensorSlot(name, tuple(t.shape), str(t.dtype).removeprefix("torch."), offset, nbytes))
        offset += -(-nbytes // 64) * 64
    return tuple(slots), offset


def views(flat: torch.Tensor, slots: Iterable[TensorSlot]) -> Iterator[tuple[str, torch.Tensor]]:
    """Named tensor views into a flat uint8 buffer laid out by `layout` (no copies)."""
    for s in slots:
        dtype = getattr(torch, s.dtype)
        yield s.name, flat[s.offset : s.offset + s.nbytes].view(dtype).view(s.shape)


def checksum(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> str:
    """sha256 over names and raw bytes, in name order: equal iff every tensor is bitwise equal."""
    digest = hashlib.sha256()
    for name, t in sorted(named_tensors, key=lambda kv: kv[0]):
        digest.update(name.encode())
        digest.update(t.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]
