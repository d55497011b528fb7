"""Left padding of token rows into one batch, as every forward pass over prompts needs it.

Its own module, importing nothing of forge_nb: the trainer's batches (`rl.prefix_batch`), the torch engine
and the judge model all pad prompts this way, and those packages import one another only downwards
(engines -> rl -> rewards).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def left_padded(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows right-aligned to the longest -> (ids [B, W] long, `pad_id` before each row's tokens;
    mask [B, W] long, 1 on the tokens)."""
    lengths = torch.tensor([len(r) for r in rows])
    width = int(lengths.max())
    mask = (torch.arange(width) >= width - lengths[:, None]).long()
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    ids[mask.bool()] = torch.tensor([t for r in rows for t in r], dtype=torch.long)
    return ids, mask
