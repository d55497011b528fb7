"""Rows of tensors in an HF directory's safetensors files, read and written in place: which file holds each
tensor, the rows [start, stop) of one read on their own (only their bytes are read), and files laid out from
shapes alone so that several processes can each write their own rows into them.

The format (safetensors 0.x): an 8-byte little-endian header length n, n bytes of JSON ({name: {"dtype",
"shape", "data_offsets": [begin, end]}, "__metadata__": {...}}, padded with spaces to a multiple of 8),
then the tensors' bytes, row-major, little-endian, back to back in the order of their offsets. Rows of a
tensor are contiguous, so a rank's shard of dim 0 (FSDP2's) is one byte range of the file.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
#: transformers' `save_pretrained(max_shard_size=...)` default (5.x): one file up to 50 GB.
MAX_FILE_BYTES = 50 * 10**9

DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
}
_BY_NAME = {name: dtype for dtype, name in DTYPES.items()}


@dataclass(frozen=True)
class Stored:
    """One tensor of a directory: the file that holds it, its shape and dtype, and where its bytes start."""

    file: Path
    shape: tuple[int, ...]
    dtype: torch.dtype
    start: int  # bytes from the start of the file

    @property
    def row_bytes(self) -> int:
        return _row_bytes(self.shape, self.dtype)


def stored_tensors(folder: str | Path) -> dict[str, Stored] | None:
    """Every tensor of the safetensors files in `folder` (the index's files, or the one model.safetensors)
    by name, from their headers; None when there are none (e.g. a pytorch_model.bin checkpoint) or one
    holds a dtype torch has no name for here."""
    folder = Path(folder)
    if (folder / INDEX).is_file():
        names = sorted(set(json.loads((folder / INDEX).read_text())["weight_map"].values()))
    elif (folder / SINGLE).is_file():
        names = [SINGLE]
    else:
        return None
    out = {}
    for name in names:
        with open(folder / name, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        header.pop("__metadata__", None)
        for key, entry in header.items():
            if entry["dtype"] not in _BY_NAME:
                return None
            begin = 8 + length + entry["data_offsets"][0]
            out[key] = Stored(folder / name, tuple(entry["shape"]), _BY_NAME[entry["dtype"]], begin)
    return out


class RowReader:
    """Reads rows of stored tensors with plain reads (no memory map: what is read is copied once into this
    process's memory and the page cache keeps the file), each file opened once (close it, or use a `with`)."""

    def __init__(self, stored: dict[str, Stored]) -> None:
        self.stored = stored
        self._fds: dict[Path, int] = {}

    def rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Rows [start, stop) of tensor `name` (a 0-dim tensor: the whole), in its stored dtype, on the CPU."""
        t = self.stored[name]
        out = torch.empty((stop - start, *t.shape[1:]) if t.shape else (), dtype=t.dtype)
        self._read(name, start, out)
        return out

    def read_into(self, name: str, start: int, dest: torch.Tensor) -> None:
        """Rows [start, start + len(dest)) of tensor `name` into `dest`, cast to its dtype: read straight into
        it when it is a contiguous CPU tensor of the stored dtype, else through a buffer of those rows."""
        t = self.stored[name]
        if dest.device.type == "cpu" and dest.dtype == t.dtype and dest.is_contiguous():
            self._read(name, start, dest)
        else:
            dest.copy_(self.rows(name, start, start + (dest.shape[0] if dest.dim() else 0)))

    def _read(self, name: str, start: int, out: torch.Tensor) -> None:
        t = self.stored[name]
        if t.file not in self._fds:
            self._fds[t.file] = os.open(t.file, os.O_RDONLY)
        view = memoryview(out.reshape(-1).view(torch.uint8).numpy())
        offset = t.start + (start * t.row_bytes if t.shape else 0)
        while view:
            got = os.preadv(self._fds[t.file], [view], offset)
            if got == 0:
                raise OSError(f"{t.file}: ends before the bytes of {name} (a truncated file)")
            view, offset = view[got:], offset + got

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> RowReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass(frozen=True)
class Planned:
    """A tensor to write: its name, whole shape and dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    @property
    def row_bytes(self) -> int:
        return _row_bytes(self.shape, self.dtype)


def _row_bytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    """Bytes of one row (along dim 0) of a tensor of `shape`; a 0-dim tensor's whole."""
    return math.prod(shape[1:]) * dtype.itemsize


@dataclass
class FileLayout:
    """One safetensors file to write: its name, its header's bytes (length prefix included), and where
    each tensor's bytes start in it (absolute offsets)."""

    name: str
    prefix: bytes
    starts: dict[str, int] = field(default_factory=dict)
    size: int = 0


def layout(tensors: Iterable[Planned], max_file_bytes: int = MAX_FILE_BYTES) -> list[FileLayout]:
    """The files `tensors` go into, in order, each up to `max_file_bytes` (a larger tensor gets a file of
    its own), named as transformers names them (model.safetensors, or model-0000k-of-0000n.safetensors with
    an index). A pure function of names, shapes and dtypes: every rank computes the same layout."""
    groups: list[list[Planned]] = [[]]
    filled = 0
    for tensor in tensors:
        if groups[-1] and filled + tensor.nbytes > max_file_bytes:
            groups.append([])
            filled = 0
        groups[-1].append(tensor)
        filled += tensor.nbytes
    count = len(groups)
    return [
        _file(SINGLE if count == 1 else f"model-{i + 1:05d}-of-{count:05d}.safetensors", g)
        for i, g in enumerate(groups)
    ]


def _file(name: str, tensors: list[Planned]) -> FileLayout:
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for t in tensors:
        header[t.name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    prefix = struct.pack("<Q", len(text)) + text
    starts = {t.name: len(prefix) + header[t.name]["data_offsets"][0] for t in tensors}
    return FileLayout(name, prefix, starts, len(prefix) + offset)


def create(path: Path, file: FileLayout) -> None:
    """`file` at `path`, at its full size with its header written (the leader does this before any rank
    writes its rows)."""
    with open(path, "wb") as out:
        out.write(file.prefix)
        out.truncate(file.size)


def write_index(folder: Path, files: list[FileLayout]) -> None:
    """transformers' index of several files (model.safetensors.index.json: which file holds each tensor)."""
    weight_map = {name: f.name for f in files for name in f.starts}
    total = sum(f.size - len(f.prefix) for f in files)
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (folder / INDEX).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")


def write_at(fd: int, tensor: torch.Tensor, offset: int) -> None:
    """`tensor`'s bytes (row-major, on the CPU) at byte `offset` of the open file `fd`."""
    data = memoryview(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
    while data:
        written = os.pwrite(fd, data, offset)
        data, offset = data[written:], offset + written
