"""Whole tensors back from a sharded trainer's ranks: each rank published its own rows of every tensor
(dim 0, as FSDP2 shards), and a reader that copied every rank's buffer puts them together here.

A version is assembled only from copies that all passed their header check (`weights.refresh`), so a
tensor never mixes rows of two versions.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from forge_nb.weights.manifest import WeightManifest, views


class ShardMismatch(ValueError):
    """The ranks' manifests do not describe one model (missing rows, or names one rank lacks)."""


def check_cover(manifests: Sequence[WeightManifest]) -> None:
    """Every rank publishes the same names, and together their rows cover each whole tensor once.
    Raises `ShardMismatch` naming the first tensor that does not add up."""
    ranks = sorted(manifests, key=lambda m: m.rank)
    if [m.rank for m in ranks] != list(range(len(ranks))) or any(m.ranks != len(ranks) for m in ranks):
        raise ShardMismatch(f"manifests of ranks {[m.rank for m in ranks]} of {[m.ranks for m in ranks]}")
    names = [s.name for s in ranks[0].slots]
    for m in ranks[1:]:
        if [s.name for s in m.slots] != names:
            raise ShardMismatch(f"rank {m.rank} publishes other tensors than rank 0")
    for i, name in enumerate(names):
        pieces = sorted((m.slots[i] for m in ranks), key=lambda s: s.row_start)
        whole = pieces[0].whole_rows
        if whole is None:
            if len(ranks) > 1:
                raise ShardMismatch(f"{name}: published whole by one of several ranks")
            continue
        start = 0
        for piece in pieces:
            rows = piece.shape[0] if piece.shape else 0
            if piece.row_start != start and rows:
                raise ShardMismatch(f"{name}: rows from {piece.row_start} where {start} was expected")
            start += rows
        if start != whole:
            raise ShardMismatch(f"{name}: the ranks hold {start} rows of {whole}")


def assembled(
    manifests: Sequence[WeightManifest], staging: Sequence[torch.Tensor]
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, whole tensor) from each rank's copied buffer (`staging[i]` laid out by `manifests[i]`), one
    tensor at a time: a view when one rank holds it whole, else its rows concatenated (one copy)."""
    if len(manifests) == 1 and all(s.whole_rows is None for s in manifests[0].slots):
        yield from views(staging[0], manifests[0].slots)
        return
    order = sorted(range(len(manifests)), key=lambda i: manifests[i].rank)
    per_rank = [list(views(staging[i], manifests[i].slots)) for i in order]
    slots = [manifests[i].slots for i in order]
    for k, (name, _) in enumerate(per_rank[0]):
        pieces = sorted(range(len(order)), key=lambda r: slots[r][k].row_start)
        parts = [per_rank[r][k][1] for r in pieces if per_rank[r][k][1].numel()]
        yield name, parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)


def whole_shapes(manifests: Sequence[WeightManifest]) -> dict[str, tuple[int, ...]]:
    """name -> the shape of the whole tensor the ranks of `manifests` publish (a shard's rows: all of them)."""
    return {
        slot.name: slot.shape if slot.whole_rows is None else (slot.whole_rows, *slot.shape[1:])
        for slot in manifests[0].slots
    }
