"""An HF model directory written from a sharded model by every rank at once, each its own rows: nothing is
gathered, no rank holds more than its shards, and the bytes leave through every rank's disk link.

The files are the ones `save_pretrained` writes (config.json, generation_config.json, model.safetensors or
transformers' numbered files with their index), the same tensors under the same names (each tied tensor
once), so `from_pretrained`, vLLM and a resume read them as they read any HF directory. The leader lays the
files out from the shapes alone and creates them at full size with their headers; after a barrier every
rank writes its shard of each tensor at its offset (FSDP2 shards dim 0, so a shard is one byte range) and
syncs its writes to disk; after a second barrier the directory is whole. All ranks see one filesystem
(one host, or a cluster's shared one, as `torch.distributed.checkpoint` assumes).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from forge_nb.parallel.gang import Gang
from forge_nb.parallel.safetensors_rows import INDEX, MAX_FILE_BYTES, SINGLE, Planned, create, layout, write_at


@dataclass(frozen=True)
class Piece:
    """What this rank writes of one tensor: its rows from `first_row` on (`local`), or the whole tensor
    when it is not sharded (`local` is then written by the leader only)."""

    planned: Planned
    local: torch.Tensor
    first_row: int
    sharded: bool


def pieces(named: list[tuple[str, torch.Tensor]]) -> list[Piece]:
    """(name, tensor) -> this rank's `Piece` of each (a DTensor's local rows; any other tensor whole)."""
    out = []
    for name, tensor in named:
        tensor = tensor.detach()
        planned = Planned(name, tuple(tensor.shape), tensor.dtype)
        if isinstance(tensor, DTensor):
            _, offset = compute_local_shape_and_global_offset(tensor.shape, tensor.device_mesh, tensor.placements)
            out.append(Piece(planned, tensor.to_local(), offset[0] if offset else 0, True))
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
    write_pieces(pieces(saved_tensors(model)), gang, folder, max_file_bytes)
    if gang.leader:
        write_config(model, folder)


def write_pieces(parts: list[Piece], gang: Gang, folder: str | Path, max_file_bytes: int = MAX_FILE_BYTES) -> None:
    """The safetensors files of `parts` in `folder` (a collective: every rank passes its pieces of the same
    tensors, in the same order)."""
    folder = Path(folder)
    files = layout([p.planned for p in parts], max_file_bytes)
    if gang.leader:
        folder.mkdir(parents=True, exist_ok=True)
        _remove_old_weights(folder, {f.name for f in files})
        create(folder, files)
    _barrier(gang)  # the files exist at full size
    by_name = {p.planned.name: p for p in parts}
    for f in files:
        fd = os.open(folder / f.name, os.O_WRONLY)
        try:
            for name, start in f.starts.items():
                piece = by_name[name]
                if piece.sharded or gang.leader:
                    write_at(fd, piece.local, start + piece.first_row * piece.planned.row_bytes)
            os.fsync(fd)
        finally:
            os.close(fd)
    _barrier(gang)  # every rank's rows are on disk


def write_config(model: nn.Module, folder: str | Path) -> None:
    """config.json (with the weights' dtype and the model's class, as `save_pretrained` sets them) and the
    generation settings."""
    model.config.dtype = str(model.dtype).removeprefix("torch.")
    model.config.architectures = [type(model).__name__.removeprefix("FSDP")]  # FSDP2 renames the class
    model.config.save_pretrained(str(folder))
    if model.can_generate() and model.generation_config is not None:
        model.generation_config.save_pretrained(str(folder))


def _remove_old_weights(folder: Path, keep: set[str]) -> None:
    """Weights files of an earlier save into the same folder that this one does not overwrite."""
    for path in folder.iterdir():
        old = (
            path.name == INDEX
            or path.name == SINGLE
            or (path.name.startswith("model-") and path.suffix == ".safetensors")
        )
        if old and path.name not in keep:
            path.unlink()


def _barrier(gang: Gang) -> None:
    """Every rank waits for the others (a sum of nothing over the CPU group: gloo, whatever the devices)."""
    gang.sum_across(torch.zeros(1))
