"""The layout of a published weight buffer, and how to checksum weights.

A published buffer is flat bytes: a 64-byte header whose first 8 bytes hold the policy version
(int64), then every tensor back to back, each 64-byte aligned. Readers check the header, so a
generator always knows which version it actually copied.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

HEADER_BYTES = 64


@dataclass(frozen=True)
class TensorSlot:
    """Where one named tensor lives inside the flat buffer (offsets in bytes)."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # torch dtype name, e.g. "float32"
    offset: int
    nbytes: int


@dataclass(frozen=True)
class WeightManifest:
    """Layout of a trainer's published buffer plus the handle readers copy it from.

    `buffer` is a Monarch ``RDMABuffer`` over the trainer's flat snapshot (`nbytes` bytes). The
    manifest is handed to a generator once; each refresh then moves only bytes.
    """

    slots: tuple[TensorSlot, ...]
    nbytes: int
    buffer: Any


def layout(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> tuple[tuple[TensorSlot, ...], int]:
    """Pack tensors after the header, each aligned to 64 bytes -> (slots, total bytes)."""
    slots, offset = [], HEADER_BYTES
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


def version_view(flat: torch.Tensor) -> torch.Tensor:
    """The int64 version stored in the header of a flat buffer (a one-element view)."""
    return flat[:8].view(torch.int64)


def checksum(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> str:
    """sha256 over names and raw bytes, in name order: equal iff every tensor is bitwise equal."""
    digest = hashlib.sha256()
    for name, t in sorted(named_tensors, key=lambda kv: kv[0]):
        digest.update(name.encode())
        digest.update(t.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]
