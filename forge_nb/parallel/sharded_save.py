"""An HF model directory written from a sharded model by every rank at once, each its own rows: nothing is
gathered, no rank holds more than its shards, and the bytes leave through every rank's disk link.

The directory holds the files `save_pretrained` writes (config.json, generation_config.json,
model.safetensors or transformers' numbered files with their index) with the same tensors under the same
names (each tied tensor once; the order of the bytes in a file may differ), so `from_pretrained`, vLLM and a
resume read it as any HF directory. The leader lays the files out from the shapes alone and creates them,
under staging names, at full size with their headers; then every rank writes its shard of each tensor at its
offset (FSDP2 shards dim 0, so a shard is one byte range) and syncs it to disk; then the leader renames the
files into place and writes the index and the config last. A step that fails on any rank fails on every
rank at once (each says which ranks failed), and a folder that held an earlier save keeps it whole until the
renames. Every rank writes into the same files, so all must see one filesystem (one host, or a cluster's
shared one).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from forge_nb.parallel.fsdp import first_row
from forge_nb.parallel.gang import Gang
from forge_nb.parallel.safetensors_rows import (
    INDEX,
    MAX_FILE_BYTES,
    SINGLE,
    FileLayout,
    Planned,
    create,
    layout,
    write_at,
    write_index,
)


@dataclass(frozen=True)
class Piece:
    """What this rank writes of one tensor: its rows from `first_row` on (`local`, or a function that makes
    them when they are written), or the whole tensor when it is not sharded (written by the leader only)."""

    planned: Planned
    local: torch.Tensor | Callable[[], torch.Tensor]
    first_row: int
    sharded: bool

    def rows(self) -> torch.Tensor:
        return self.local() if callable(self.local) else self.local


def pieces(named: list[tuple[str, torch.Tensor]]) -> list[Piece]:
    """(name, tensor) -> this rank's `Piece` of each (a DTensor's local rows; any other tensor whole)."""
    out = []
    for name, tensor in named:
        tensor = tensor.detach()
        planned = Planned(name, tuple(tensor.shape), tensor.dtype)
        if isinstance(tensor, DTensor):
            out.append(Piece(planned, tensor.to_local(), first_row(tensor), True))
        else:
            out.append(Piece(planned, tensor, 0, False))
    return out


def saved_tensors(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """What `save_pretrained` stores of `model`: its state dict, each tied tensor once under its first name,
    without the keys the model ignores on save."""
    ignored = set(getattr(model, "_keys_to_ignore_on_save", None) or ())
    seen: set[int] = set()
    out = []
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) in seen or name in ignored:
            continue
        seen.add(id(tensor))
        out.append((name, tensor))
    return out


def write(model: nn.Module, gang: Gang, folder: str | Path, max_file_bytes: int = MAX_FILE_BYTES) -> None:
    """`model` (FSDP2-sharded over `gang`, or whole) as an HF directory at `folder`, each rank writing its
    own rows (a collective: every rank calls it)."""
    write_pieces(pieces(saved_tensors(model)), gang, folder, model, max_file_bytes)


def write_pieces(
    parts: list[Piece], gang: Gang, folder: str | Path, model: nn.Module, max_file_bytes: int = MAX_FILE_BYTES
) -> None:
    """The safetensors files of `parts` in `folder`, and the config of `model` (a collective: every rank
    passes its pieces of the same tensors, in the same order)."""
    folder = Path(folder)
    files = layout([p.planned for p in parts], max_file_bytes)
    try:
        _together(gang, folder, "create the files", lambda: _create(folder, files) if gang.leader else None)
        _together(gang, folder, "write its rows", lambda: _write_rows(folder, files, parts, gang.leader))
        if gang.leader:
            _finish(folder, files, model)
    finally:
        if gang.leader:
            for f in files:
                _staged(folder, f).unlink(missing_ok=True)


def _create(folder: Path, files: list[FileLayout]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for f in files:
        create(_staged(folder, f), f)


def _write_rows(folder: Path, files: list[FileLayout], parts: list[Piece], leader: bool) -> None:
    by_name = {p.planned.name: p for p in parts}
    for f in files:
        fd = os.open(_staged(folder, f), os.O_WRONLY)
        try:
            for name, start in f.starts.items():
                piece = by_name[name]
                if piece.sharded or leader:
                    write_at(fd, piece.rows(), start + piece.first_row * piece.planned.row_bytes)
            os.fsync(fd)
        finally:
            os.close(fd)


def _finish(folder: Path, files: list[FileLayout], model: nn.Module) -> None:
    """The leader, once every rank's rows are on disk: the files into place, an earlier save's other weights
    files out, then the index and the config."""
    names = {f.name for f in files}
    for f in files:
        os.replace(_staged(folder, f), folder / f.name)
    for path in folder.iterdir():
        numbered = path.name.startswith("model-") and path.suffix == ".safetensors"
        if (numbered or path.name in (INDEX, SINGLE)) and path.name not in names:
            path.unlink()
    if len(files) > 1:
        write_index(folder, files)
    write_config(model, folder)


def write_config(model: nn.Module, folder: str | Path) -> None:
    """config.json (with the weights' dtype and the model's class, as `save_pretrained` sets them) and the
    generation settings."""
    model.config.dtype = str(model.dtype).removeprefix("torch.")
    model.config.architectures = [type(model).__name__.removeprefix("FSDP")]  # FSDP2 renames the class
    model.config.save_pretrained(str(folder))
    if model.can_generate() and model.generation_config is not None:
        model.generation_config.save_pretrained(str(folder))


def _staged(folder: Path, file: FileLayout) -> Path:
    return folder / f".{file.name}.partial"


def _together(gang: Gang, folder: Path, what: str, step: Callable[[], None]) -> None:
    """Run `step` on every rank, then wait for all (a sum over the CPU group: gloo, whatever the devices);
    if it failed anywhere, raise on every rank: its own error where it failed, else which ranks failed."""
    error = None
    try:
        step()
    except Exception as e:  # reported to the others before it is raised
        error = e
    failed = torch.zeros(gang.world)
    failed[gang.rank] = error is not None
    gang.sum_across(failed)
    if error is not None:
        raise error
    if failed.any():
        ranks = [r for r in range(gang.world) if failed[r]]
        raise OSError(f"saving {folder}: rank(s) {ranks} could not {what} (their own errors say why)")
